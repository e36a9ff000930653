"""Every assigner on `agentrl train`'s defaults: held-out pass rate after the default 40 updates, from one warm start.

The README's first command, once per assigner (`agentrl train --algo X`, seed 0, 40 updates x 64 episodes on
Vault, 128 held-out episodes). The baseline each run is measured against is its own warm start, evaluated on the
same held-out seeds in the same run; the first run builds the warm start (cached), the others find it. This is
the check that a change left training as it was: the figures sit beside the ones docs/benchmarks.md records
("Every assigner on the defaults") and their spread.

    python benchmarks/defaults.py                        # the five assigners (~6 minutes on a quiet 2-core machine)
    python benchmarks/defaults.py --algos grpo turn-ppo  # some of them
    python benchmarks/defaults.py --quick                # grpo, 10 updates, 32 held-out episodes

Last line: one JSON object (`ratio` = mean final pass rate over the mean warm start's); also written to
benchmarks/results/defaults.json (a quick run to defaults_quick.json).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import parser, report  # noqa: E402
from train_runs import train  # noqa: E402

ALGOS = ["turn-ppo", "grpo", "arpo", "steppo", "gigpo"]


def main() -> None:
    ap = parser(__doc__, quick="grpo alone, 10 updates, 32 held-out episodes (a check, not figures)")
    ap.add_argument("--algos", nargs="+", default=None, choices=ALGOS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--updates", type=int, default=None, help="default 40, agentrl train's own (quick 10)")
    ap.add_argument("--eval-episodes", type=int, default=None, help="default 128, agentrl train's own (quick 32)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    algos = a.algos or (["grpo"] if a.quick else ALGOS)
    updates = a.updates or (10 if a.quick else 40)
    episodes = a.eval_episodes or (32 if a.quick else 128)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="agentrl-defaults-") as tmp:
        for algo in algos:
            runs[algo] = train(Path(tmp) / algo, a.seed, updates, episodes, ["--algo", algo], a.threads)
            r = runs[algo]
            print(f"{algo:9s} warm start {r['warm_start_pass_rate']:.3f} -> {r['final_pass_rate']:.3f} after {updates} "
                  f"updates ({r['loop_s']:.0f} s of RL, {r['wall_s']:.0f} s in all)", flush=True)
    warm = statistics.mean(r["warm_start_pass_rate"] for r in runs.values())
    final = statistics.mean(r["final_pass_rate"] for r in runs.values())
    print(f"mean over {len(runs)} assigners: {warm:.3f} -> {final:.3f} ({final / warm:.2f}x the warm start)")
    report("defaults", {"quick": a.quick, "seed": a.seed, "updates": updates, "eval_episodes": episodes,
                        "runs": runs, "warm_start_pass_rate": round(warm, 4), "final_pass_rate": round(final, 4),
                        "ratio": round(final / warm, 3) if warm else None}, quick=a.quick)


if __name__ == "__main__":
    main()
