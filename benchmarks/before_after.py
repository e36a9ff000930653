"""Behaviour unchanged, shown: the same `agentrl train` command run from two trees of this repository (each in
its own process, `PYTHONPATH` and the working directory pointing at the tree), every figure a run's behaviour
decides compared for equality, and the trained weights compared byte for byte.

Lockstep rollouts (`--rollout.schedule lockstep`) make a run's episodes independent of thread timing, so two runs
of one tree agree bit for bit: any difference is the code's. Timings (`time/`, `*_per_s`, `*_s`) are not
compared. A refactor that claims "no behaviour change" runs this against the commit before it:

    git worktree add /tmp/before <commit-before> && python benchmarks/before_after.py --before /tmp/before

Writes results/defaults_before_after.json (quick: results/defaults_before_after_quick.json).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import parser, report

HERE = Path(__file__).resolve().parents[1]
COMMAND = ["train", "--seed", "0", "--rollout.schedule", "lockstep", "--eval.episodes", "16", "--eval.every", "0",
           "--checkpoint.every", "0"]
TIMING = ("time/", "_per_s", "_s", "wall")


def run(tree: Path, algo: str, updates: int, out: Path) -> tuple[list[dict], str]:
    """One run from `tree`; its metrics rows and the sha256 of its trained weights."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "agentrl", *COMMAND, "--algo", algo, "--updates", str(updates), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} in {tree} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    weights = sorted((out / "checkpoint").glob("*.safetensors"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in weights)).hexdigest()
    return rows, digest


def compared(rows: list[dict]) -> dict[str, float]:
    """Every numeric figure of every row that the run's behaviour decides, keyed by step and name."""
    out = {}
    for row in rows:
        step = f"{row.get('step')}{'/final' if row.get('final') else ''}"
        for k, v in row.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "time") \
                    and not any(t in k for t in TIMING):
                out[f"{step}:{k}"] = v
    return out


def main() -> None:
    ap = parser(__doc__, quick="grpo only, 2 updates")
    ap.add_argument("--before", type=Path, required=True, help="the tree before the change (a git worktree)")
    ap.add_argument("--after", type=Path, default=HERE, help="the tree after (default: this checkout)")
    ap.add_argument("--algos", nargs="+", default=["grpo", "turn-ppo"])
    ap.add_argument("--updates", type=int, default=3)
    args = ap.parse_args()
    algos, updates = (["grpo"], 2) if args.quick else (args.algos, args.updates)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    commits = {k: subprocess.run(["git", "rev-parse", "HEAD"], cwd=t, capture_output=True, text=True).stdout.strip()
               for k, t in trees.items()}
    result: dict = {"method": __doc__.split("\n\n")[0].replace("\n", " "), "trees": commits,
                    "train_command": f"agentrl {' '.join(COMMAND)} --algo ALGO --updates {updates}", "lockstep": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for algo in algos:
            t0 = time.perf_counter()
            runs = {k: run(t, algo, updates, Path(tmp) / f"{algo}-{k}") for k, t in trees.items()}
            (rows_b, sha_b), (rows_a, sha_a) = runs["before"], runs["after"]
            b, a = compared(rows_b), compared(rows_a)
            different = sorted(k for k in b.keys() | a.keys() if b.get(k) != a.get(k))
            result["lockstep"][algo] = {"figures_compared": len(b), "different": different[:20],
                                        "weights_sha256_before": sha_b, "weights_sha256_after": sha_a,
                                        "weights_identical": sha_a == sha_b,
                                        "seconds": round(time.perf_counter() - t0, 1)}
            print(f"{algo}: {len(b)} figures compared, {len(different)} differ; weights "
                  f"{'identical' if sha_a == sha_b else 'DIFFER'}", flush=True)
    identical = all(not r["different"] and r["weights_identical"] for r in result["lockstep"].values())
    result.update(identical=identical, ratio=1.0 if identical else 0.0)
    report("defaults_before_after", result, quick=args.quick)
    if not identical:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
