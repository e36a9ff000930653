"""Rollouts that run ahead of training (rollout.max_staleness 1) against on-policy, on `agentrl train`'s default run.

For each seed, the default run (Vault-v0, the tiny policy's cached warm start, grpo, 40 updates of 8 x 8
episodes) is trained on-policy (the baseline, max_staleness 0), and with the next update's rollout running
in a thread while this one trains (max_staleness 1, the ratio against the stored behaviour log-probs), and
optionally with the decoupled correction (loss.off_policy decoupled). Reported: the RL loop's wall time
(the updates' own time, held-out evaluations aside) and the final held-out pass rate of each, with the
seeds' spread.

    python benchmarks/pipelined.py             # seeds 0 1 2, on-policy vs ahead (about 12 minutes on 2 cores)
    python benchmarks/pipelined.py --decoupled # and the decoupled correction too
    python benchmarks/pipelined.py --quick     # 10 updates, one seed

On 2 CPU cores the rollout thread and the learner share the same two cores (and Python's lock), so the
overlap can only win the time the rollout spends waiting; on a GPU with slow tools it wins more.
Last line: one JSON object, `ratio` = on-policy loop time / ahead loop time (> 1: ahead is faster);
also benchmarks/results/pipelined.json (a quick run: pipelined_quick.json).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import parser, report  # noqa: E402
from train_runs import spread, train  # noqa: E402

VARIANTS = {"on-policy": [], "ahead": ["--rollout.max-staleness", "1"],
            "ahead-decoupled": ["--rollout.max-staleness", "1", "--loss.off-policy", "decoupled"]}


def main() -> None:
    p = parser(__doc__, quick="10 updates, one seed, 64 held-out episodes")
    p.add_argument("--decoupled", action="store_true", help="also run max_staleness 1 with the decoupled loss")
    p.add_argument("--seeds", type=int, nargs="+", default=None)
    p.add_argument("--updates", type=int, default=None)
    p.add_argument("--eval-episodes", type=int, default=None)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    seeds = a.seeds or ([0] if a.quick else [0, 1, 2])
    updates = a.updates or (10 if a.quick else 40)
    eval_episodes = a.eval_episodes or (64 if a.quick else 128)
    variants = [v for v in VARIANTS if a.decoupled or v != "ahead-decoupled"]
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for v in variants:  # the first run of a seed builds its cached warm start, outside the updates' time
                r = train(Path(tmp) / f"{v}-s{seed}", seed, updates, eval_episodes, VARIANTS[v], a.threads)
                runs[v].append(r)
                print(f"seed {seed}  {v:<16} loop {r['loop_s']:6.1f}s (waiting on rollouts "
                      f"{r['exposed_rollout_s']:5.1f}s)  staleness {r['staleness_mean']:.2f}  held-out "
                      f"{r['warm_start_pass_rate']:.3f} -> {r['final_pass_rate']:.3f}", flush=True)
    summary = {}
    for v, rs in runs.items():
        finals = [r["final_pass_rate"] for r in rs]
        summary[v] = {"loop_s_mean": round(statistics.mean(r["loop_s"] for r in rs), 2),
                      "final_pass_rate": finals, "final_mean": round(statistics.mean(finals), 4),
                      "final_spread": spread(finals)}
        print(f"{v:<16} loop {summary[v]['loop_s_mean']:.1f}s  final {finals} (mean {summary[v]['final_mean']:.3f})")
    ratio = summary["on-policy"]["loop_s_mean"] / summary["ahead"]["loop_s_mean"]
    print(f"on-policy / ahead loop time: {ratio:.2f}x")
    figures = {"benchmark": "pipelined", "quick": a.quick, "updates": updates, "seeds": seeds,
               "eval_episodes": eval_episodes, "variants": summary, "runs": runs,
               "ratio": round(ratio, 3)}
    report("pipelined", figures, a.quick)  # adds the machine and the command


if __name__ == "__main__":
    main()
