"""The probe judged before it is seen: its recommendation for a new task family, written down before that
family's sweep, then scored against the sweep.

    python benchmarks/probe_preregister.py                       # probe rg-chain's warm starts; write the record
    python benchmarks/probe_preregister.py --score benchmarks/results/horizon_sweep_rg_chain.json   # after its sweep

The probe's thresholds were calibrated on four families (Vault, Hanoi, TextWorld, FrozenLake) and its gate was
redesigned after their sweeps were seen, so its leave-one-family-out regret there is not a test it had not seen.
This one is: the probe, frozen under `agentrl.probe.thresholds.PROBE_VERSION` (the digests of its thresholds and
rules are recorded), rolls out the warm start of each horizon of a family no sweep has run on, exactly the warm
start that family's sweep will train from (`horizon_sweep.warm_horizon`, cached by its key), and its picks are
written to `benchmarks/results/probe_preregistered.json` with the command of the sweep that will judge them.
That file is committed on its own, so its commit precedes the sweep's.

The family (`--family`, default `rg-chain`: reasoning-gym's chain_sum one calculator operation a turn,
`agentrl/RG-Chain-v0`) is the first without step scores. On the four families steppo, reading the env's step
scores, was best or tied at every horizon and the probe reduced to "steppo unless at most 4 turns"; here steppo
has no step score to read (it falls back to a learned or implicit PRM), so the best fixed choice can differ, and
a probe that only ever says steppo would show it.

`--score SWEEP`: the sweep's result against the record, regret as in benchmarks/probe_lofo.py (the sweep-best
assigner's mean final pass rate minus the pick's, mean over horizons) for the probe and for every fixed choice;
written into the same file beside the recommendation, which it leaves as it was.
Baseline and ratio (`--score`): the fixed choices are the baseline; `ratio` is the best fixed choice's regret
over the probe's, each plus 0.005 (as probe_lofo.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import RESULTS, announce, parser, save  # noqa: E402
from horizon_sweep import ALGOS, FAMILIES, warm_horizon  # noqa: E402

RECORD = RESULTS / "probe_preregistered.json"
REGRET_FLOOR = 0.005  # as probe_lofo.py: a zero regret stays finite in the ratio
# the four families' budget (docs/benchmarks.md, "Four families"): 12 updates x 4 groups x 8, 64 held-out episodes
SWEEP_ARGS = {"updates": 12, "groups": 4, "group_size": 8, "eval_episodes": 64, "lock_examples": 9000,
              "band_tries": 3}


def sweep_command(family: str, horizons: list[int], tag: str = "") -> str:
    return (f"python benchmarks/horizon_sweep.py --family {family} --horizons {' '.join(map(str, horizons))} "
            f"--seeds 0 1 2 --updates {SWEEP_ARGS['updates']} --eval-episodes {SWEEP_ARGS['eval_episodes']} "
            f"--jobs 2 --out runs/horizon-sweep-{family}{tag} && cp runs/horizon-sweep-{family}{tag}/sweep.json "
            f"benchmarks/results/horizon_sweep_{family.replace('-', '_')}{tag.replace('-', '_')}.json")


def preregister(family_name: str, horizons: list[int], groups: int,
                dropped: dict[str, str] | None = None, tag: str = "") -> dict[str, Any]:
    from agentrl.policy import Policy
    from agentrl.probe import probe_env
    from agentrl.probe.thresholds import probe_fingerprint

    family = FAMILIES[family_name]
    args = {**SWEEP_ARGS, "band": list(family.band) if family.band else None, "sft_epochs": family.sft_epochs}
    rows = {}
    for n in horizons:
        t0 = time.perf_counter()
        h, base, folder, warm = warm_horizon(family, n, args)
        result = probe_env(base, groups=groups, policy=Policy.load(folder))
        rec = result.recommendation
        rows[str(n)] = {
            family.knob: n, "max_turns": h["max_turns"], "slack": h["slack"], "noise": h["noise"],
            "expert_pass_rate": h["expert_pass_rate"], "warm_start_pass_rate": h["warm_start_pass_rate"],
            "warm_start_tries": h["warm_start_tries"], "warm_start": folder.name,
            "recommendation": rec.algo, "rule": rec.rule,
            "reason": rec.reason, "probe_episodes": result.stats.episodes, "budget_episodes": result.budget_episodes,
            "stats": result.stats.model_dump(mode="json"), "seconds": round(time.perf_counter() - t0, 1),
        }
        print(f"[{family.knob} {n}] {h['max_turns']} turns, warm start {warm.pass_rate:.3f}: probe says {rec.algo} "
              f"({rec.rule})", flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {
        "family": family_name, "env_id": family.env_id, "knob": family.knob, "horizons": horizons,
        "recommendation": {k: r["recommendation"] for k, r in rows.items()},
        **probe_fingerprint(),
        "written_before_sweep": True,
        "code_commit": commit,
        "sweep_command": sweep_command(family_name, horizons, tag),
        "score_command": f"python benchmarks/probe_preregister.py{f' --tag {tag}' if tag else ''} --score benchmarks/"
                         f"results/horizon_sweep_{family_name.replace('-', '_')}{tag.replace('-', '_')}.json",
        "why_this_family": "the first family without step scores: on the four calibration families steppo read "
                           "the env's step scores and was best or tied at every horizon, so the probe reduced to "
                           "'steppo unless at most 4 turns'; here steppo has no step score to read, so the best "
                           "fixed choice can differ",
        "regret_rule": "per horizon, the sweep-best assigner's mean final pass rate minus the pick's; mean over "
                       "horizons (benchmarks/probe_lofo.py); every fixed choice scored the same way",
        "probe_groups": groups,
        # horizons of the family left out before anything was probed, each with why (warm starts only)
        "dropped_horizons": dropped or {},
        "horizon_rows": rows,
    }


def score(sweep_path: str, record_path: Path = RECORD) -> dict[str, Any]:
    from probe_lofo import horizon_finals, regret

    record = json.loads(record_path.read_text())
    sweep = json.loads(Path(sweep_path).read_text())
    if sweep.get("family") != record["family"]:
        raise SystemExit(f"{sweep_path} is a sweep of {sweep.get('family')}, the record is {record['family']}'s")
    finals = horizon_finals(sweep)
    missing = sorted(set(record["recommendation"]) - set(finals))
    if missing:
        raise SystemExit(f"{sweep_path}: no runs at the recorded horizons {missing}")
    finals = {k: finals[k] for k in record["recommendation"]}
    fixed = {a: regret(finals, {k: a for k in finals})[0] for a in ALGOS if all(a in f for f in finals.values())}
    probe, per = regret(finals, record["recommendation"])
    best = min(fixed, key=fixed.get)
    record["scored"] = {
        "sweep": sweep_path, "sweep_started": sweep.get("started"),
        "probe_regret": round(probe, 4), "probe_regret_per_horizon": {k: round(v, 4) for k, v in per.items()},
        "fixed_regret": {a: round(v, 4) for a, v in sorted(fixed.items(), key=lambda kv: kv[1])},
        "best_fixed_choice": best,
        "ratio": round((fixed[best] + REGRET_FLOOR) / (probe + REGRET_FLOOR), 3),
    }
    return record


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--family", choices=sorted(FAMILIES), default="rg-chain")
    ap.add_argument("--horizons", type=int, nargs="+", default=None, help="default: the family's")
    ap.add_argument("--groups", type=int, default=8, help="tasks the probe rolls out per horizon (x 8 episodes: "
                    "the 64 probe episodes of the four families' probes)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads: 1, as the sweep's workers, so that a "
                    "warm start rebuilt by either is the same")
    ap.add_argument("--dropped", nargs=2, action="append", default=[], metavar=("N", "WHY"),
                    help="a horizon of the family's default left out of the record, and why (its warm starts below "
                    "the band, say): written into the record, so that a reader sees what was not predicted")
    ap.add_argument("--tag", default="", help="a second prediction for the same family (e.g. -5terms): its own "
                    "record (probe_preregistered<TAG>.json) and sweep folder, so a scored record stays as it was")
    ap.add_argument("--score", metavar="SWEEP", help="score the committed record against this sweep.json")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.tag and not all(c.isalnum() or c == "-" for c in args.tag):
        raise SystemExit(f"--tag {args.tag!r}: letters, digits and '-' only (it names files)")
    path = RESULTS / f"probe_preregistered{args.tag.replace('-', '_')}.json"
    if args.score:
        record = score(args.score, path)
    else:
        if path.exists() and json.loads(path.read_text()).get("scored"):
            raise SystemExit(f"{path} is already scored: a new prediction needs a new --tag, family or probe version")
        horizons = args.horizons or list(FAMILIES[args.family].horizons)
        dropped = {}
        for n, why in args.dropped:
            if not n.isdigit() or int(n) in horizons:
                raise SystemExit(f"--dropped {n!r}: a dropped horizon is a knob value not among the probed {horizons}")
            dropped[n] = why
        record = preregister(args.family, horizons, args.groups, dropped, args.tag)
    save("probe_preregistered", record, path=path)
    announce("probe_preregistered", {k: v for k, v in record.items() if k != "horizon_rows"})


if __name__ == "__main__":
    main()
