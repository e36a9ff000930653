"""What benchmarks that compare whole `agentrl train` runs share: run one, read its figures back.

The RL loop's own time is the updates' wall time from metrics.jsonl (`time/update_s`: rollout, credit,
optimizer step), without the held-out evaluations, which the runs compared do alike.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchlib import machine  # noqa: F401 (the benchmarks import it from here too)


def train(out: Path, seed: int, updates: int, eval_episodes: int, extra: list[str], threads: int) -> dict:
    """`agentrl train` on its defaults with `extra` flags, torch on `threads` threads; the run's figures."""
    cmd = [sys.executable, "-m", "agentrl", "train", "--out", str(out), "--seed", str(seed), "--updates",
           str(updates), "--eval.episodes", str(eval_episodes), "--eval.every", "0", *extra]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": str(threads)}, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) > 0 and not r.get("final")]
    summary = json.loads((out / "summary.json").read_text())
    episodes = sum(r["rollout/episodes"] for r in steps)
    loop_s = sum(r["time/update_s"] for r in steps)
    return {"seed": seed, "flags": extra, "episodes": int(episodes), "loop_s": round(loop_s, 2),
            "episodes_per_s": round(episodes / loop_s, 3), "wall_s": round(wall, 1),
            "exposed_rollout_s": round(sum(r["time/rollout_s"] for r in steps), 2),
            "staleness_mean": statistics.mean(r.get("train/staleness_mean", 0.0) for r in steps),
            "warm_start_pass_rate": summary["warm_start_pass_rate"], "final_pass_rate": summary["final_pass_rate"]}


def spread(values: list[float]) -> float | None:
    return max(values) - min(values) if len(values) > 1 else None

