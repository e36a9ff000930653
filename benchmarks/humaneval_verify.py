"""HumanEval through the code verifier: the sandbox pool against one-at-a-time runs.

    nice -n 10 python benchmarks/humaneval_verify.py [--workers 4] [--nulls]

Runs all 164 canonical solutions serially (a pool of one: the baseline) and then through a
`SandboxPool` of `--workers` threads, in the same process, after a warm-up. Every canonical
solution must score 1.0 (and, with ``--nulls``, ``pass`` / ``return None`` / an empty body must
score 0.0 on every task), or the script exits non-zero. Prints tasks/second for both, their ratio,
and, as its last line, one JSON object with the figures (also written to
benchmarks/results/humaneval_verify.json).
"""

from __future__ import annotations

import os
import sys
import time

from benchlib import parser, report

from agentrl.verify.code import NULL_SOLUTIONS, CodeVerifier, humaneval_tasks
from agentrl.verify.sandbox import LocalSandbox


def timed(verifier: CodeVerifier, tasks: list, answers: list, workers: int) -> tuple[float, list]:
    t0 = time.perf_counter()
    verdicts = verifier.verify_many(tasks, answers, workers=workers)
    return time.perf_counter() - t0, verdicts


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--workers", type=int, default=4, help="pool threads (process start-up is partly I/O, so a little "
                    "above the core count helps)")
    ap.add_argument("--nulls", action="store_true", help="also check that the three null solutions score 0.0 on every "
                    "task")
    args = ap.parse_args()

    sandbox = LocalSandbox()
    verifier = CodeVerifier(sandbox)
    tasks = humaneval_tasks()
    answers = [t.solution for t in tasks]
    timed(verifier, tasks[:4], answers[:4], 1)  # warm-up: page cache, first interpreter start

    serial_s, serial = timed(verifier, tasks, answers, 1)
    pool_s, pooled = timed(verifier, tasks, answers, args.workers)
    failures = [(t.task_id, v.reason) for t, v in zip(tasks, serial + pooled) if v.score != 1.0]
    null_max = None
    if args.nulls:
        null_max = 0.0
        for body in NULL_SOLUTIONS.values():
            _, verdicts = timed(verifier, tasks, [body] * len(tasks), args.workers)
            null_max = max(null_max, max(v.score for v in verdicts))

    n = len(tasks)
    ratio = serial_s / pool_s
    print(f"{n} HumanEval canonical solutions, {os.cpu_count()} cores, isolation complete: "
          f"{sandbox.isolation.complete}")
    print(f"  one at a time : {serial_s:6.2f} s  {n / serial_s:6.1f} tasks/s")
    print(f"  pool of {args.workers:<5} : {pool_s:6.2f} s  {n / pool_s:6.1f} tasks/s")
    print(f"  ratio (pool / one at a time): {ratio:.2f}x")
    print(f"  canonical scoring 1.0: {2 * n - len(failures)}/{2 * n}"
          + (f"; null solutions max score: {null_max}" if args.nulls else ""))
    for tid, reason in failures[:10]:
        print(f"  FAILED {tid}: {reason}")
    report("humaneval_verify", {
        "tasks": n, "cores": os.cpu_count(), "workers": args.workers,
        "serial_seconds": round(serial_s, 3), "pool_seconds": round(pool_s, 3),
        "serial_tasks_per_s": round(n / serial_s, 2), "pool_tasks_per_s": round(n / pool_s, 2),
        "ratio": round(ratio, 3),
        "canonical_all_pass": not failures, "null_max_score": null_max,
        "isolation_complete": sandbox.isolation.complete,
    })
    return 0 if not failures and (null_max in (None, 0.0)) else 1


if __name__ == "__main__":
    sys.exit(main())
