"""Is the README's main job collapsing, or converged? `agentrl train` (grpo on Vault, the defaults) on 3 seeds,
watched (`--health.on-alarm warn`, the default), against the same run with the entropy alarm answered
(`--health.on-alarm intervene`: the entropy bonus and the temperature floor switch on when it fires) and with an
entropy bonus from the start (`--loss.entropy-coef 0.01`).

The default run logs ENTROPY COLLAPSE in its last updates (entropy under the floor, 30% of its early level, and
falling, while the pass rate no longer rises). If the policy were collapsing, answering the alarm (or never letting
entropy fall) would lift the plateau; if it has converged near the ceiling, it would not, and the alarm would be
firing on success. Each arm's held-out pass rate at the end, its alarms and its final entropy decide which.

    python benchmarks/collapse_default.py                         # 3 arms x 3 seeds (~1-2 min a run on a quiet machine)
    python benchmarks/collapse_default.py --runs /work/runs50     # reuse finished runs found there, run the rest
    python benchmarks/collapse_default.py --quick                 # seed 0, 10 updates, warn and intervene

Baseline and ratio: the watched default is the baseline; `ratio` is the best other arm's mean final held-out
pass rate over the baseline's. `spread` per arm is max - min over seeds. Last line: one JSON object; also written
to benchmarks/results/collapse_default[_quick].json.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchlib import parser, report

from agentrl.report import read_metrics

ARMS = {
    "warn": [],  # the README's main job as it is
    "intervene": ["--health.on-alarm", "intervene"],
    "entropy-bonus": ["--loss.entropy-coef", "0.01"],
}
# run folders of an earlier session were named by these
FOLDER = {"warn": "grpo-warn", "intervene": "grpo-intervene", "entropy-bonus": "grpo-ent01"}


def run(arm: str, seed: int, folder: Path, updates: int | None) -> None:
    """`agentrl train` with the arm's flags, unless the folder already holds a finished run."""
    if (folder / "summary.json").exists():
        return
    cmd = [sys.executable, "-m", "agentrl", "train", "--seed", str(seed), "--out", str(folder), *ARMS[arm],
           *(["--updates", str(updates)] if updates else [])]
    print(f"{arm} seed {seed}: {' '.join(cmd[2:])}", flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def figures(folder: Path) -> dict:
    """One run's outcome: held-out pass rates (start, each evaluation, final), the updates at which ENTROPY COLLAPSE
    was logged, the interventions, and the entropy at the end."""
    rows, _ = read_metrics(folder / "metrics.jsonl")
    summary = json.loads((folder / "summary.json").read_text())
    evals = [(r["step"], r["eval/pass_rate"]) for r in rows if "eval/pass_rate" in r]
    train = [r for r in rows if "train/entropy" in r]
    collapse = [r["step"] for r in train if r.get("health/status") == "ENTROPY COLLAPSE"]
    return {
        "warm_start_pass_rate": summary.get("warm_start_pass_rate"), "final_pass_rate": summary.get("final_pass_rate"),
        "heldout_curve": evals, "entropy_collapse_steps": collapse,
        "final_entropy": round(statistics.mean(r["train/entropy"] for r in train[-5:]), 4),
        "final_rollout_pass_rate": round(statistics.mean(r["rollout/pass_rate"] for r in train[-5:]), 3),
        "entropy_coef_end": train[-1].get("train/entropy_coef"),
        "temperature_end": train[-1].get("rollout/temperature"),
    }


def main() -> None:
    ap = parser(__doc__, quick="seed 0, 10 updates, the warn and intervene arms")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    ap.add_argument("--runs", default="runs/collapse-default", help="where the run folders go (reused if finished)")
    args = ap.parse_args()
    updates = None
    if args.quick:
        args.seeds, args.arms, updates = [0], ["warn", "intervene"], 10
    root = Path(args.runs)
    per_arm = {}
    for arm in args.arms:
        per_arm[arm] = {}
        for seed in args.seeds:
            folder = root / f"{FOLDER[arm]}-s{seed}{'-quick' if args.quick else ''}"
            run(arm, seed, folder, updates)
            per_arm[arm][str(seed)] = figures(folder)
    arms = {}
    for arm, seeds in per_arm.items():
        finals = [s["final_pass_rate"] for s in seeds.values()]
        arms[arm] = {"final_mean": round(statistics.mean(finals), 3), "spread": round(max(finals) - min(finals), 3),
                     "finals": finals,
                     "seeds_with_collapse": sum(bool(s["entropy_collapse_steps"]) for s in seeds.values()),
                     "final_entropy_mean": round(statistics.mean(s["final_entropy"] for s in seeds.values()), 4),
                     "final_rollout_pass_rate_mean": round(statistics.mean(s["final_rollout_pass_rate"]
                                                                           for s in seeds.values()), 3)}
        print(f"{arm:14s} final held-out {arms[arm]['final_mean']:.3f} (seeds {finals}, spread "
              f"{arms[arm]['spread']:.3f}); ENTROPY COLLAPSE logged in {arms[arm]['seeds_with_collapse']} of "
              f"{len(finals)} seeds; entropy at the end {arms[arm]['final_entropy_mean']:.3f}", flush=True)
    base = arms["warn"]["final_mean"]
    others = {a: v for a, v in arms.items() if a != "warn"}
    best = max(others, key=lambda a: others[a]["final_mean"]) if others else None
    result = {"env": "agentrl/Vault-v0 (the defaults)", "algo": "grpo", "seeds": args.seeds, "arms": arms,
              "runs": per_arm, "best_other_arm": best,
              "ratio": round(others[best]["final_mean"] / base, 3) if best else None,
              "ratio_is": "the best other arm's mean final held-out pass rate over the watched default's"}
    report("collapse_default", result, args.quick,
           summary={k: result[k] for k in ("best_other_arm", "ratio")} | {a: v["final_mean"] for a, v in arms.items()})


if __name__ == "__main__":
    main()
