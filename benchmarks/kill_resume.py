"""Kill -9 at random moments, resume, compare: does a resumed run end as the uninterrupted one did?

A short run of `agentrl train`'s default shape (Vault-v0, the tiny policy's cached warm start, grpo)
runs once uninterrupted (the baseline). Then, N times, the same run is started in a fresh folder,
killed with SIGKILL after a random number of seconds within the baseline's wall time (so during a
rollout, an optimizer step, a checkpoint write or an evaluation, wherever it happens to be), and
resumed with `agentrl train --resume` until it finishes. A run matches when its final weights equal
the baseline's (max abs difference 0), its metrics.jsonl is equal except for timing fields, every
update's store file is present exactly once, and summary.json is equal except for wall time.

    python benchmarks/kill_resume.py            # 20 kills (the long form)
    python benchmarks/kill_resume.py --quick    # 3 kills of a shorter run (a smoke test)

Env calls run serially: with a thread pool the rows' join times (set by the tools' latency) change
the batch's padding and so the last bit of the log-probs; two uninterrupted runs differ then too.
Last line: one JSON object with the figures, `ratio` = runs matching / runs tried; also written to
benchmarks/results/kill_resume.json.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "kill_resume.json"


def train_args(out: Path, a: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "agentrl", "train", "--out", str(out), "--updates", str(a.updates),
            "--rollout.groups", str(a.groups), "--rollout.group-size", str(a.group_size),
            "--eval.episodes", str(a.eval_episodes), "--eval.every", str(a.eval_every),
            "--checkpoint.every", str(a.every), "--rollout.env-workers", "serial", "--seed", str(a.seed)]


def timeless(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/") and "tokens_per_s" not in k}
            for r in rows]


def compare(ref: Path, run: Path, updates: int) -> dict[str, object]:
    from safetensors.torch import load_file

    wa, wb = load_file(ref / "checkpoint" / "model.safetensors"), load_file(run / "checkpoint" / "model.safetensors")
    diff = max(float((wa[k] - wb[k]).abs().max()) for k in wa) if wa.keys() == wb.keys() else float("inf")
    store = sorted(p.name for p in (run / "store").iterdir())
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (ref, run))
    for s in (sa, sb):
        s.pop("wall_s")
        s.pop("checkpoint")
    checks = {"weights_max_abs_diff": diff,
              "metrics_equal": timeless(ref / "metrics.jsonl") == timeless(run / "metrics.jsonl"),
              "store_once_each": store == [f"update_{u:05d}_0.parquet" for u in range(1, updates + 1)],
              "summary_equal": sa == sb}
    checks["match"] = diff == 0.0 and all(v for k, v in checks.items() if k != "weights_max_abs_diff")
    return checks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 kills of a 4-update run")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--updates", type=int, default=12)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--eval-episodes", type=int, default=32)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--every", type=int, default=3, help="checkpoint.every")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.quick:
        a.kills, a.updates, a.groups, a.group_size, a.eval_episodes, a.eval_every, a.every = 3, 4, 2, 2, 4, 2, 2
    work = Path(tempfile.mkdtemp(prefix="kill_resume_"))
    rng = random.Random(a.seed)
    try:
        # the warm start first (built once, then cached): the kill moments are drawn within a run that loads it
        warm = train_args(work / "warm", a)
        warm[warm.index("--updates") + 1] = "0"
        subprocess.run(warm, capture_output=True, check=True)
        ref = work / "ref"
        t0 = time.perf_counter()
        done = subprocess.run(train_args(ref, a), capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"the baseline run failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        said = " ".join(done.stdout.split())
        m = re.search(r"checkpoints: (\d+) written, ([0-9.]+)s each", said)
        ckpt_n, ckpt_s = (int(m.group(1)), float(m.group(2))) if m else (0, float("nan"))
        runs = []
        for i in range(a.kills):
            out = work / f"run{i}"
            at = rng.uniform(0.0, wall)
            proc = subprocess.Popen(train_args(out, a), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(at)
            killed = proc.poll() is None
            proc.kill()
            proc.wait()
            rows = len((out / "metrics.jsonl").read_text().splitlines()) if (out / "metrics.jsonl").exists() else 0
            resumes = 0
            if not (out / "config.yaml").exists():  # killed before the run folder was written: start it again
                subprocess.run(train_args(out, a), capture_output=True, check=True)
            else:
                while True:
                    resumes += 1
                    r = subprocess.run([sys.executable, "-m", "agentrl", "train", "--resume", str(out)],
                                       capture_output=True, text=True)
                    if r.returncode == 0:
                        break
                    if resumes >= 3:
                        raise SystemExit(f"run {i}: resume failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
            checks = compare(ref, out, a.updates)
            runs.append({"kill_at_s": round(at, 2), "killed_running": killed, "rows_at_kill": rows, **checks})
            print(f"run {i}: SIGKILL at {at:.1f}s ({rows} metrics rows written), resumed: "
                  f"{'match' if checks['match'] else 'DIFFERS ' + json.dumps(checks)}", flush=True)
        matching = sum(r["match"] for r in runs)
        result = {"benchmark": "kill_resume", "quick": a.quick, "updates": a.updates,
                  "batch": f"{a.groups}x{a.group_size}", "checkpoint_every": a.every, "baseline_wall_s": round(wall, 2),
                  "checkpoints": ckpt_n, "checkpoint_s": ckpt_s,
                  "checkpoint_share": round(ckpt_n * ckpt_s / wall, 4) if ckpt_n else None,
                  "runs_tried": len(runs), "runs_matching": matching, "ratio": matching / max(len(runs), 1),
                  "runs": runs}
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
        print(f"{matching}/{len(runs)} resumed runs match the uninterrupted one; checkpoint {ckpt_s:.3f}s each, "
              f"{ckpt_n} in a {wall:.0f}s run")
        print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
