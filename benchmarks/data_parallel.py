"""Two processes of one thread against one process of two threads, on `agentrl train`'s default run.

The same run (Vault-v0, the tiny policy's cached warm start, grpo, 8 groups x 8 episodes per update) is
trained by one process with two torch threads (the baseline: what `agentrl train` does on this 2-core
machine) and by `agentrl train --num-processes 2` (two ranks of one thread each, gloo), for each seed.
Throughput is episodes per second of the RL loop (the updates' own wall time: rollout, credit, optimizer
step; held-out evaluations aside, which both runs do alike); quality is the held-out pass rate after the
same number of episodes, which must stay within the seeds' spread.

    python benchmarks/data_parallel.py            # the default run, seeds 0 1 2 (about 15 minutes on 2 cores)
    python benchmarks/data_parallel.py --quick    # 10 updates, one seed (a few minutes)

The tiny policy is overhead-bound (Python per generated token, per env call), which one thread per
process spends in parallel and two threads in one process cannot. Last line: one JSON object,
`ratio` = the seeds' mean episodes/s with two processes over one; also benchmarks/results/data_parallel.json
(a quick run: data_parallel_quick.json).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import parser, report  # noqa: E402
from train_runs import spread, train  # noqa: E402


def run(out: Path, processes: int, a: argparse.Namespace, seed: int) -> dict:
    extra = ["--num-processes", str(processes)] if processes > 1 else []
    r = train(out, seed, a.updates, a.eval_episodes, extra, threads=a.threads // processes)
    return {"processes": processes, "threads_per_process": a.threads // processes, **r}


def main() -> None:
    p = parser(__doc__, quick="10 updates, one seed, 64 held-out episodes")
    p.add_argument("--seeds", type=int, nargs="+", default=None)
    p.add_argument("--updates", type=int, default=None)
    p.add_argument("--eval-episodes", type=int, default=None)
    p.add_argument("--threads", type=int, default=2, help="the machine's cores: the baseline's torch threads")
    a = p.parse_args()
    a.seeds = a.seeds or ([0] if a.quick else [0, 1, 2])
    a.updates = a.updates or (10 if a.quick else 40)
    a.eval_episodes = a.eval_episodes or (64 if a.quick else 128)
    load_before = os.getloadavg()[0]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in a.seeds:
            # the first run of a seed builds its cached warm start (SFT): untimed, outside the updates' time
            for processes in (1, 2):
                r = run(Path(tmp) / f"p{processes}-s{seed}", processes, a, seed)
                results.append(r)
                print(f"seed {seed}  {processes} process(es) x {r['threads_per_process']} thread(s): "
                      f"{r['episodes_per_s']:.2f} episodes/s over {r['episodes']} episodes ({r['loop_s']:.1f}s of "
                      f"updates), held-out {r['warm_start_pass_rate']:.3f} -> {r['final_pass_rate']:.3f}",
                      flush=True)

    def of(n: int, key: str) -> list[float]:
        return [r[key] for r in results if r["processes"] == n]

    one, two = statistics.mean(of(1, "episodes_per_s")), statistics.mean(of(2, "episodes_per_s"))
    ratio = two / one
    final1, final2 = of(1, "final_pass_rate"), of(2, "final_pass_rate")
    spread1 = spread(final1)
    print(f"episodes/s: 2 processes x 1 thread {two:.2f}, 1 process x 2 threads {one:.2f}: ratio {ratio:.2f}x")
    print(f"held-out pass rate after {results[0]['episodes']} episodes: 1 process {final1}, 2 processes {final2}"
          + (f" (one process's seed spread {spread1:.3f})" if spread1 is not None else ""))
    figures = {
        "benchmark": "data_parallel", "quick": a.quick, "updates": a.updates, "seeds": a.seeds,
        "episodes_per_update": results[0]["episodes"] // a.updates, "eval_episodes": a.eval_episodes,
        "one_process_episodes_per_s": round(one, 3), "two_process_episodes_per_s": round(two, 3),
        "final_pass_rate_one": final1, "final_pass_rate_two": final2,
        "final_mean_one": round(statistics.mean(final1), 4), "final_mean_two": round(statistics.mean(final2), 4),
        "seed_spread_one": spread1, "runs": results,
        "machine": {"loadavg_1min_before": round(load_before, 2)},
        "ratio": round(ratio, 3),
    }
    report("data_parallel", figures, a.quick)  # adds the rest of the machine and the command


if __name__ == "__main__":
    main()
