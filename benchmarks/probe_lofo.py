"""The probe out of sample by construction: leave-one-family-out calibration over several horizon sweeps.

    python benchmarks/probe_lofo.py benchmarks/results/horizon_sweep.json \\
        benchmarks/results/horizon_sweep_hanoi_varied.json benchmarks/results/horizon_sweep_textworld.json \\
        benchmarks/results/horizon_sweep_frozenlake.json --probed benchmarks/results/probe_lofo.json

Each sweep (benchmarks/horizon_sweep.py's sweep.json) is one task family: every assigner trained from one
warm start per horizon, three seeds, equal budgets. For each family in turn, the probe's thresholds are
calibrated on the other families only (`agentrl.probe.calibration.merge_sweeps`, then
`thresholds_from_sweep`: the cut-off, the candidates, the long-horizon pick and the evidence behind the
no-reliable-difference gate), and the probe picks an assigner at each of the held-out family's horizons from
statistics it measured on that horizon's warm start (rolled out once, `--groups` tasks x the sweep's group
size; `benchmarks/probe_vs_sweep.probe_sweep`). So no threshold has seen the family it is scored on.

Regret at a horizon: the sweep-best assigner's mean final pass rate there minus the pick's; a family's
regret is the mean over its horizons (families weigh alike however many horizons they have). Every fixed
choice (always grpo, always steppo, ...) is scored the same way. Intervals: a bootstrap over seeds (each
assigner's seeds at each horizon resampled with replacement, `--boot` times; the best is re-taken in each
resample), 95 % percentile intervals; the probe's own pick is held fixed (its probe rollout is not redrawn).
The mean over families gets the same bootstrap, and so does the probe's difference from each fixed choice.

Baseline and ratio: the fixed choices are the baseline. `ratio` (last line, JSON) is the best fixed choice's
mean regret over the probe's, each plus 0.005 (a tenth of a held-out evaluation's standard error, so a
zero regret stays finite): above 1 the probe beat every fixed choice on families it was not fitted to.
Also recorded: the in-sample figures (thresholds fitted on every family, as the packaged ones are) and the
probe's cost (episodes and seconds) beside a sweep's. Writes `--json-out` (default
benchmarks/results/probe_lofo.json); `--probed` reuses the probed statistics of an earlier run (they depend
on the warm starts only).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import parser, report  # noqa: E402
from probe_vs_sweep import finals_by_algo, probe_sweep  # noqa: E402

REGRET_FLOOR = 0.005
METHOD = ("leave-one-family-out: for each family, thresholds calibrated on the other families' sweeps only; the "
          "probe's pick at each held-out horizon scored by regret against that horizon's sweep-best assigner "
          "(mean over the family's horizons); 95% bootstrap intervals over seeds")


def family_of(sweep: dict[str, Any]) -> str:
    return sweep.get("family", "vault")


def horizon_finals(sweep: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """{horizon key: {algo: [final pass rate per seed]}}."""
    return {k: {a: list(v.values()) for a, v in finals_by_algo(h).items()} for k, h in sweep["horizons"].items()
            if h.get("runs")}


def regret(finals: dict[str, dict[str, list[float]]], picks: dict[str, str]) -> tuple[float, dict[str, float]]:
    """A choice's mean regret over horizons, and per horizon."""
    per = {}
    for k, f in finals.items():
        means = {a: statistics.mean(v) for a, v in f.items()}
        per[k] = max(means.values()) - means[picks[k]]
    return statistics.mean(per.values()), per


def boot_regrets(finals: dict[str, dict[str, list[float]]], choices: dict[str, dict[str, str]], boot: int,
                 rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Each choice's family regret (mean over horizons) in `boot` resamples of the seeds."""
    out = {c: np.zeros(boot) for c in choices}
    for k, f in finals.items():
        algos = list(f)
        arr = [np.asarray(f[a]) for a in algos]
        # resampled means: (boot, algos)
        means = np.stack([x[rng.integers(0, len(x), size=(boot, len(x)))].mean(axis=1) for x in arr], axis=1)
        best = means.max(axis=1)
        for c, picks in choices.items():
            out[c] += (best - means[:, algos.index(picks[k])]) / len(finals)
    return out


def interval(x: np.ndarray) -> list[float]:
    return [round(float(np.percentile(x, 2.5)), 4), round(float(np.percentile(x, 97.5)), 4)]


def sweep_cost(sweep: dict[str, Any]) -> dict[str, float]:
    """What the sweep spent: training and evaluation episodes over all its runs, and seconds (warm starts too)."""
    a = sweep.get("args") or {}
    per_run = int(a.get("updates", 0)) * int(a.get("groups", 0)) * int(a.get("group_size", 0))
    evals = int(a.get("eval_episodes", 0)) * 2  # before (shared, but counted per run: an upper bound) and after
    runs = sum(len(h.get("runs", {})) for h in sweep["horizons"].values())
    seconds = sum(r.get("wall_s", 0.0) for h in sweep["horizons"].values() for r in h.get("runs", {}).values())
    seconds += sum(h.get("warm_start_s", 0.0) for h in sweep["horizons"].values())
    return {"runs": runs, "episodes": runs * (per_run + evals), "seconds": round(seconds)}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("sweeps", nargs="+", help="sweep.json files, one per task family (at least 3)")
    ap.add_argument("--groups", type=int, default=8, help="tasks the probe rolls out per horizon (x the sweep's "
                    "group size)")
    ap.add_argument("--boot", type=int, default=4000, help="bootstrap resamples of the seeds")
    ap.add_argument("--probed", nargs="*", default=[], metavar="JSON", help="earlier probe_lofo.json or "
                    "probe_vs_sweep --json-out files: reuse their probed statistics for the same warm starts")
    ap.add_argument("--out", default="runs/probe-lofo", help="a horizon report per probed horizon")
    ap.add_argument("--json-out", default="benchmarks/results/probe_lofo.json")
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    import agentrl.adapters.textarena_games  # noqa: F401  (registers the TA- ids)
    import agentrl.adapters.textworld_games  # noqa: F401
    from agentrl.probe import ProbeStats, ProbeThresholds, recommend, thresholds_from_sweep
    from agentrl.probe.calibration import merge_sweeps

    t0 = time.perf_counter()
    sweeps = {p: json.loads(Path(p).read_text()) for p in args.sweeps}
    fams = [family_of(s) for s in sweeps.values()]
    if len(set(fams)) != len(fams):
        ap.error(f"one sweep per family: got families {fams}")
    if len(fams) < 3:
        ap.error("leave-one-family-out needs at least 3 families (2 to calibrate on, 1 held out)")
    probed: dict[tuple[str, str], dict[str, Any]] = {}
    for path in args.probed:
        if not Path(path).exists():
            print(f"--probed {path}: not there; probing afresh", flush=True)
            continue
        earlier = json.loads(Path(path).read_text())
        for k in ("rows", "holdout_rows", "calibration_rows"):
            for r in earlier.get(k, []):
                probed[(r["family"], r["key"])] = r

    # the statistics of every horizon's warm start: the thresholds do not change them (any will do here)
    rows: dict[str, list[dict[str, Any]]] = {}
    for sweep in sweeps.values():
        fam = family_of(sweep)
        rows[fam] = probe_sweep(sweep, ProbeThresholds(), args.groups, Path(args.out), fam, probed)
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out + ".partial").write_text(json.dumps({"rows": [r for v in rows.values() for r in v]}))

    def picks_under(th: Any, fam: str) -> dict[str, dict[str, Any]]:
        out = {}
        for r in rows[fam]:
            rec, _ = recommend(ProbeStats.model_validate(r["stats"]), th, r["budget_episodes"])
            out[r["key"]] = {"algo": rec.algo, "rule": rec.rule, "confidence": rec.confidence,
                             "evidence": rec.evidence}
        return out

    rng = np.random.default_rng(0)
    by_fam = {family_of(s): (p, s) for p, s in sweeps.items()}
    algos = sorted(set.intersection(*[{a for f in horizon_finals(s).values() for a in f} for s in sweeps.values()]))
    per_family: dict[str, Any] = {}
    boots: dict[str, dict[str, np.ndarray]] = {}
    in_sample_th = thresholds_from_sweep(merge_sweeps(sweeps), source="all families")
    for fam, (path, sweep) in by_fam.items():
        others = {p: s for p, s in sweeps.items() if p != path}
        th = thresholds_from_sweep(merge_sweeps(others), source=f"all but {fam}")
        picks = picks_under(th, fam)
        finals = horizon_finals(sweep)
        missing = [k for k in finals if k not in picks]
        if missing:
            raise SystemExit(f"{fam}: horizons {missing} were not probed")
        choices = {"probe": {k: picks[k]["algo"] for k in finals}, **{a: {k: a for k in finals} for a in algos}}
        b = boot_regrets(finals, choices, args.boot, rng)
        boots[fam] = b
        point = {c: regret(finals, ch) for c, ch in choices.items()}
        ins = picks_under(in_sample_th, fam)
        knob = sweep.get("knob", "locks")
        per_family[fam] = {
            "sweep": path, "knob": knob,
            "horizons": {k: {knob: sweep["horizons"][k][knob], "max_turns": sweep["horizons"][k]["max_turns"],
                             "best": max(finals[k], key=lambda a: statistics.mean(finals[k][a])),
                             "means": {a: round(statistics.mean(v), 4) for a, v in finals[k].items()},
                             "probe_pick": picks[k], "in_sample_pick": ins[k]["algo"]} for k in finals},
            "thresholds": {"horizon_cutoff": th.horizon_cutoff, "candidates": th.turn_level_candidates,
                           "long_horizon_algo": th.long_horizon_algo,
                           "evidence": {a: e.model_dump() for a, e in th.evidence.items()}},
            "probe_pick": {k: p["algo"] for k, p in picks.items()},
            "probe_regret": round(point["probe"][0], 4), "probe_regret_interval": interval(b["probe"]),
            "probe_regret_per_horizon": {k: round(v, 4) for k, v in point["probe"][1].items()},
            "fixed_regret": {a: round(point[a][0], 4) for a in algos},
            "fixed_regret_interval": {a: interval(b[a]) for a in algos},
            "in_sample_probe_regret": round(regret(finals, {k: ins[k]["algo"] for k in finals})[0], 4),
            "cost": {"probe_episodes": sum(r["stats"]["episodes"] for r in rows[fam]),
                     "probe_seconds": round(sum(r.get("probe_s", 0.0) for r in rows[fam]), 1),
                     "sweep": sweep_cost(sweep)},
        }

    n = len(per_family)
    probe_mean = statistics.mean(v["probe_regret"] for v in per_family.values())
    fixed_mean = {a: round(statistics.mean(v["fixed_regret"][a] for v in per_family.values()), 4) for a in algos}
    mean_boot = {c: sum(boots[f][c] for f in boots) / n for c in ["probe", *algos]}
    best_fixed = min(fixed_mean, key=fixed_mean.__getitem__)
    record = {
        "benchmark": "probe_lofo", "method": METHOD, "families": list(per_family),
        "probe_mean_regret": round(probe_mean, 4), "probe_mean_regret_interval": interval(mean_boot["probe"]),
        "fixed_mean_regret": fixed_mean,
        "fixed_mean_regret_interval": {a: interval(mean_boot[a]) for a in algos},
        "probe_minus_fixed_interval": {a: interval(mean_boot["probe"] - mean_boot[a]) for a in algos},
        "best_fixed": best_fixed, "probe_beats_every_fixed": all(probe_mean < m for m in fixed_mean.values()),
        "in_sample_probe_mean_regret": round(statistics.mean(v["in_sample_probe_regret"]
                                                              for v in per_family.values()), 4),
        "in_sample_thresholds": {"horizon_cutoff": in_sample_th.horizon_cutoff,
                                 "candidates": in_sample_th.turn_level_candidates,
                                 "long_horizon_algo": in_sample_th.long_horizon_algo},
        "cost": {"probe_episodes": sum(v["cost"]["probe_episodes"] for v in per_family.values()),
                 "probe_seconds": round(sum(v["cost"]["probe_seconds"] for v in per_family.values())),
                 "sweep_episodes": sum(v["cost"]["sweep"]["episodes"] for v in per_family.values()),
                 "sweep_seconds": sum(v["cost"]["sweep"]["seconds"] for v in per_family.values())},
        "boot": args.boot, "probe_groups": args.groups,
        "ratio": round((fixed_mean[best_fixed] + REGRET_FLOOR) / (probe_mean + REGRET_FLOOR), 3),
    }

    console = Console(width=200)
    table = Table(title="leave-one-family-out: mean regret over each family's horizons (95% bootstrap interval)")
    table.add_column("choice")
    for fam in per_family:
        table.add_column(fam)
    table.add_column("mean over families")

    def cell(x: float, iv: list[float]) -> str:
        return f"{x:.3f} [{iv[0]:.3f}, {iv[1]:.3f}]"

    table.add_row("probe", *[cell(v["probe_regret"], v["probe_regret_interval"]) for v in per_family.values()],
                  cell(probe_mean, record["probe_mean_regret_interval"]))
    for a in sorted(algos, key=fixed_mean.__getitem__):
        table.add_row(f"always {a}", *[cell(v["fixed_regret"][a], v["fixed_regret_interval"][a])
                                       for v in per_family.values()],
                      cell(fixed_mean[a], record["fixed_mean_regret_interval"][a]))
    console.print(table)
    picks = Table(title="the probe's picks, thresholds from the other families")
    for col in ("family", "horizon", "max turns", "sweep best", "probe pick", "rule", "confidence"):
        picks.add_column(col)
    for fam, v in per_family.items():
        for h in v["horizons"].values():
            p = h["probe_pick"]
            picks.add_row(fam, f"{v['knob']} {h[v['knob']]}", str(h["max_turns"]),
                          f"{h['best']} ({h['means'][h['best']]:.2f})", f"{p['algo']} ({h['means'][p['algo']]:.2f})",
                          p["rule"], p["confidence"])
    console.print(picks)
    record["wall_s"] = round(time.perf_counter() - t0)
    full = {**record, "per_family": per_family, "rows": [r for v in rows.values() for r in v]}
    report("probe_lofo", full, path=args.json_out, summary=record)  # the file keeps every row; the line, the figures
    Path(args.json_out + ".partial").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
