"""Calibrating the probe's horizon thresholds on a horizon sweep, and writing them as package data.

    python -m agentrl.probe calibrate benchmarks/results/horizon_sweep.json   # rewrites agentrl/probe/thresholds.json
    python -m agentrl.probe calibrate a.json b.json c.json                    # several families, merged

The sweep (benchmarks/horizon_sweep.py) trains every registered assigner at several horizons from
the same warm start; `thresholds_from_sweep` reads where turn-level credit first beat grpo by more
than the seeds' spread. `write_thresholds` stores the calibrated fields with their provenance (the
sweep file, its SHA-256, the commit that last changed it, the sweep's command and date, the
derivation in words), which `default_thresholds()` then loads in a checkout and a wheel alike.
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
import statistics
import subprocess
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agentrl.probe.thresholds import (
    BASELINE,
    CALIBRATED,
    PACKAGED,
    PROVENANCE,
    Evidence,
    ProbeThresholds,
    turn_level_assigners,
)


class HorizonSummary(BaseModel):
    """One horizon of a sweep: per-assigner mean final pass rate and the seeds' spread."""

    locks: int | None
    max_turns: float
    means: dict[str, float]
    spread: float
    best: str
    within: list[str]  # assigners whose mean lies within the spread of the best


def horizon_spread(finals: dict[str, list[float]], eval_episodes: int | None) -> float:
    """The seeds' spread at one horizon: the pooled seed std of the final pass rates, floored by the
    binomial standard error of one evaluation (a single seed has no std, but its score still has noise).

    >>> round(horizon_spread({"a": [0.4, 0.6], "b": [0.5, 0.5]}, None), 4)
    0.1
    >>> round(horizon_spread({"a": [0.5]}, 100), 3)
    0.05
    """
    variances = [statistics.variance(v) for v in finals.values() if len(v) > 1]
    pooled = math.sqrt(sum(variances) / len(variances)) if variances else 0.0
    if not eval_episodes:
        return pooled
    p = statistics.mean(x for v in finals.values() for x in v)
    return max(pooled, math.sqrt(max(p * (1 - p), 0.0) / eval_episodes))


def summarize_sweep(sweep: dict[str, Any]) -> list[HorizonSummary]:
    """The sweep's horizons, shortest first (format: benchmarks/horizon_sweep.py's sweep.json)."""
    if not isinstance(sweep, dict) or "horizons" not in sweep:
        raise ValueError("not a horizon sweep: no 'horizons' key (expected benchmarks/horizon_sweep.py's sweep.json)")
    eval_episodes = (sweep.get("args") or {}).get("eval_episodes")
    out = []
    for key, h in sweep["horizons"].items():
        finals: dict[str, list[float]] = defaultdict(list)
        for name, run in h.get("runs", {}).items():
            if "final_pass_rate" not in run:
                raise ValueError(f"sweep horizon {key}, run {name}: no final_pass_rate")
            finals[run.get("algo", name.split("/")[0])].append(float(run["final_pass_rate"]))
        if not finals:
            continue
        if "max_turns" not in h:
            raise ValueError(f"sweep horizon {key}: no max_turns")
        means = {a: statistics.mean(v) for a, v in finals.items()}
        spread = horizon_spread(dict(finals), eval_episodes)
        best = max(means, key=means.__getitem__)
        within = sorted(a for a, m in means.items() if m >= means[best] - spread)
        out.append(
            HorizonSummary(
                locks=h.get("locks"),
                max_turns=float(h["max_turns"]),
                means=means,
                spread=spread,
                best=best,
                within=within,
            )
        )
    return sorted(out, key=lambda s: s.max_turns)


# Arguments that say where a sweep wrote its files, not what it measured: left out of the command
# that reproduces it (a developer's scratch folder does not belong in a shipped file).
_PLACE_ARGS = ("out",)


def sweep_command(sweep: dict[str, Any]) -> str:
    """The command line that reproduces a sweep, rebuilt from its recorded arguments."""
    parts = ["python", "benchmarks/horizon_sweep.py"]
    for k, v in (sweep.get("args") or {}).items():
        if k in _PLACE_ARGS:
            continue
        flag = "--" + k.replace("_", "-")
        parts += [flag, *map(str, v)] if isinstance(v, list) else [flag, str(v)]
    return " ".join(shlex.quote(p) for p in parts)


def thresholds_from_sweep(
    sweep: dict[str, Any], source: str = "sweep", base: ProbeThresholds | None = None
) -> ProbeThresholds:
    """Horizon thresholds fitted to a horizon sweep's measured crossover.

    The crossover is the shortest horizon (by max turns) where some turn-level assigner's mean final
    pass rate beats grpo's by more than the seeds' spread (`horizon_spread`). The cut-off sits halfway
    between that horizon and the one below it (half its turns when it is the shortest); the candidates
    are the turn-level assigners within the spread of the best at or past it; the fallback pick is the
    best of them on average; the budget is the sweep's episodes per run. With no crossover,
    `horizon_cutoff` is None and the horizon rule never recommends a turn-level assigner. Turn-level
    means registered with `turn_level` (`turn_level_assigners()`); unregistered names are ignored.

    >>> run = lambda a, s, p: {"algo": a, "seed": s, "final_pass_rate": p}
    >>> sweep = {"args": {"updates": 10, "groups": 4, "group_size": 8}, "horizons": {
    ...   "1": {"locks": 1, "max_turns": 3, "runs": {"grpo/0": run("grpo", 0, .8), "grpo/1": run("grpo", 1, .9),
    ...                                                "arpo/0": run("arpo", 0, .8), "arpo/1": run("arpo", 1, .9)}},
    ...   "8": {"locks": 8, "max_turns": 18, "runs": {"grpo/0": run("grpo", 0, .3), "grpo/1": run("grpo", 1, .4),
    ...                                                "arpo/0": run("arpo", 0, .6), "arpo/1": run("arpo", 1, .7)}}}}
    >>> t = thresholds_from_sweep(sweep)
    >>> t.horizon_cutoff, t.turn_level_candidates, t.long_horizon_algo, t.min_budget_episodes
    (10.5, ['arpo'], 'arpo', 320)
    >>> e = t.evidence["arpo"]; round(e.lead, 2), e.horizons, e.wins, e.reliable
    (0.3, 1, 1, True)

    `evidence` records, for every turn-level assigner, its mean lead over grpo and the mean spread over
    the horizons at or past the crossover (over all horizons when there is none): what the no-reliable-
    difference gate of `agentrl.probe.rules` reads.
    """
    if not any(
        r.get("algo") == BASELINE for h in sweep.get("horizons", {}).values() for r in h.get("runs", {}).values()
    ):
        raise ValueError(f"the sweep has no {BASELINE} runs: the crossover is measured against {BASELINE}")
    turn_level = set(turn_level_assigners())
    horizons = summarize_sweep(sweep)
    args = sweep.get("args") or {}
    budget = int(args.get("updates", 0)) * int(args.get("groups", 0)) * int(args.get("group_size", 0))
    t = (base or ProbeThresholds()).model_copy()
    t.source = source
    t.sweep_started = sweep.get("started")
    t.sweep_command = sweep_command(sweep)
    if budget:
        t.min_budget_episodes = budget
    cross = None
    for i, h in enumerate(horizons):
        if BASELINE not in h.means:
            continue
        lead = {a: m - h.means[BASELINE] for a, m in h.means.items() if a in turn_level}
        if lead and max(lead.values()) > h.spread:
            cross = i
            break
    measured = ", ".join(
        f"{h.max_turns:g} turns: best {h.best} ({h.means[h.best]:.2f}), {BASELINE} "
        f"{h.means.get(BASELINE, float('nan')):.2f}, spread {h.spread:.2f}"
        for h in horizons
    )
    t.evidence = evidence(horizons[cross:] if cross is not None else horizons, turn_level)
    if cross is None:
        t.horizon_cutoff = None
        t.turn_level_candidates = []
        t.derivation = (
            f"no horizon where a turn-level assigner beat {BASELINE} by more than the seeds' spread ({measured}); "
            "turn-level credit is never recommended by the horizon rule"
        )
        return t
    h = horizons[cross]
    prev = horizons[cross - 1] if cross > 0 else None
    t.horizon_cutoff = (prev.max_turns + h.max_turns) / 2 if prev else h.max_turns / 2
    past = horizons[cross:]
    best_here = max((a for a in h.means if a in turn_level), key=h.means.__getitem__)
    t.turn_level_candidates = sorted({a for p in past for a in p.within if a in turn_level} | {best_here})
    avg = {a: statistics.mean(p.means[a] for p in past if a in p.means) for a in t.turn_level_candidates}
    t.long_horizon_algo = max(avg, key=avg.__getitem__)
    below = (
        f"below it, at {prev.max_turns:g} turns, none did"
        if prev
        else "it is the sweep's shortest horizon, so the cut-off is half its turns"
    )
    t.derivation = (
        f"turn-level credit first beat {BASELINE} by more than the seeds' spread at {h.max_turns:g} max turns "
        f"(locks {h.locks}); {below}; cut-off {t.horizon_cutoff:g} turns; candidates {t.turn_level_candidates}; "
        f"budget {budget} episodes per run. Measured: {measured}"
    )
    return t


def evidence(horizons: list[HorizonSummary], turn_level: set[str]) -> dict[str, Evidence]:
    """Each turn-level assigner's lead over grpo, averaged over `horizons` (those with both run), with the
    spread of that mean: the larger of the seeds' mean spread and the leads' standard deviation across the
    horizons, over the square root of their number.

    >>> h = lambda t, g, s, sp: HorizonSummary(locks=None, max_turns=t, means={"grpo": g, "steppo": s}, spread=sp,
    ...                                        best="steppo", within=["steppo"])
    >>> e = evidence([h(5, .5, .54, .06), h(9, .4, .46, .06), h(20, .2, .22, .06), h(37, .0, .06, .06)], {"steppo"})
    >>> e["steppo"].lead, e["steppo"].stderr, e["steppo"].wins, e["steppo"].reliable  # 0.06 / 2 = 0.03 < 0.045
    (0.045, 0.03, 0, True)
    """
    out = {}
    for a in sorted(turn_level):
        hs = [h for h in horizons if a in h.means and BASELINE in h.means]
        if not hs:
            continue
        leads = [h.means[a] - h.means[BASELINE] for h in hs]
        spread = statistics.mean(h.spread for h in hs)
        across = statistics.stdev(leads) if len(leads) > 1 else 0.0
        out[a] = Evidence(lead=round(statistics.mean(leads), 4), spread=round(spread, 4),
                          stderr=round(max(spread, across) / math.sqrt(len(hs)), 4),
                          horizons=len(hs), wins=sum(d > h.spread for d, h in zip(leads, hs)))
    return out


def merge_sweeps(sweeps: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One sweep holding the horizons of several (keyed "<family>/<knob value>"), for `thresholds_from_sweep`:
    it orders horizons by max turns, so families interleave by horizon. The recorded budget is the smallest
    per-run budget of the sweeps (what every one of them measured), the evaluation size the smallest (the
    binomial floor of the spread is then the widest).

    >>> a = {"family": "a", "args": {"updates": 10, "groups": 4, "group_size": 8}, "horizons": {"1": {}}}
    >>> b = {"family": "b", "args": {"updates": 5, "groups": 4, "group_size": 8}, "horizons": {"2": {}}}
    >>> m = merge_sweeps({"a.json": a, "b.json": b}); sorted(m["horizons"]), m["args"]["updates"], m["family"]
    (['a/1', 'b/2'], 5, 'a+b')
    """
    if not sweeps:
        raise ValueError("merge_sweeps: no sweeps given")

    def budget(s: dict[str, Any]) -> int:
        a = s.get("args") or {}
        return int(a.get("updates", 0)) * int(a.get("groups", 0)) * int(a.get("group_size", 0))

    smallest = min(sweeps.values(), key=budget)
    horizons = {}
    for name, s in sweeps.items():
        if not isinstance(s, dict) or "horizons" not in s:
            raise ValueError(f"{name}: not a horizon sweep (no 'horizons' key)")
        for key, h in s["horizons"].items():
            horizons[f"{s.get('family', 'vault')}/{key}"] = {**h, "sweep": name}
    a = smallest.get("args") or {}
    return {"started": max(s.get("started", "") for s in sweeps.values()),
            "family": "+".join(s.get("family", "vault") for s in sweeps.values()),
            "args": {"updates": a.get("updates"), "groups": a.get("groups"), "group_size": a.get("group_size"),
                     "eval_episodes": min((s.get("args") or {}).get("eval_episodes", 128) for s in sweeps.values())},
            "merged_from": list(sweeps), "horizons": horizons}


# --------------------------------------------------------------------------------------------
# The packaged calibration



def thresholds_from_file(path: str | Path) -> ProbeThresholds:
    """Thresholds fitted to the horizon sweep's results in `path` (benchmarks/horizon_sweep.py's sweep.json),
    or the literature fallback when no file is there."""
    path = Path(path)
    if not path.is_file():
        return ProbeThresholds()
    try:
        sweep = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: the horizon sweep's results are not valid JSON ({e})") from e
    return thresholds_from_sweep(sweep, source=str(path))

def _last_commit(path: Path) -> str | None:
    """The commit that last changed `path`, when it sits in a git checkout (else None)."""
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%H", "--", path.name],
            cwd=path.parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _read_sweep(path: Path) -> tuple[dict[str, Any], bytes]:
    raw = path.read_bytes()
    try:
        return json.loads(raw), raw
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: the horizon sweep's results are not valid JSON ({e})") from e


def calibration_record(sweep_path: str | Path | Sequence[str | Path], name: str | Sequence[str] | None = None
                       ) -> dict[str, Any]:
    """What `write_thresholds` stores: the calibrated fields and their provenance, from one sweep file or
    several (several families: merged by `merge_sweeps`, so the crossover is read across all of them).

    `name` is how the record names each sweep (default: the path as given; the committed ones sit in
    `benchmarks/results/`, named relative to the repository, never by a machine's path). With several
    sweeps, `sweep_sha256` and `sweep_commit` list one value per sweep, space-separated, in order.
    """
    paths = [Path(sweep_path)] if isinstance(sweep_path, (str, Path)) else [Path(p) for p in sweep_path]
    if not paths:
        raise ValueError("calibration: no sweep files given")
    names = [str(p) for p in paths] if name is None else ([name] if isinstance(name, str) else list(name))
    if len(names) != len(paths):
        raise ValueError(f"calibration: {len(paths)} sweep files but {len(names)} names")
    read = [_read_sweep(p) for p in paths]
    sweep = read[0][0] if len(read) == 1 else merge_sweeps({n: sw for n, (sw, _) in zip(names, read)})
    t = thresholds_from_sweep(sweep, source=" + ".join(names))
    t.sweep_sha256 = " ".join(hashlib.sha256(raw).hexdigest() for _, raw in read)
    commits = [_last_commit(p.resolve()) for p in paths]
    t.sweep_commit = None if not any(commits) else " ".join(c or "-" for c in commits)
    fields = t.model_dump()
    return {
        "generated_by": f"python -m agentrl.probe calibrate {' '.join(names)}",
        "thresholds": {k: fields[k] for k in (*CALIBRATED, *PROVENANCE)},
    }


def packaged_path() -> Path:
    """Where the package data lives in this checkout (the file `default_thresholds()` reads)."""
    return Path(__file__).resolve().parent / PACKAGED


def write_thresholds(sweep_path: str | Path | Sequence[str | Path], out: str | Path | None = None,
                     name: str | Sequence[str] | None = None) -> Path:
    """Calibrate on `sweep_path` (one sweep file or several) and write the record to `out` (default: the
    package's thresholds.json)."""
    record = calibration_record(sweep_path, name)
    target = Path(out) if out is not None else packaged_path()
    target.write_text(json.dumps(record, indent=2) + "\n")
    return target
