"""The engine/trainer gap on `agentrl train`'s default run: an fp32 engine (the baseline, gap 0) against a bf16
one (rollout.dtype bf16, the trainer in fp32), with no correction and with each of loss.mismatch's.

One warm start (the tiny policy's SFT on Vault-v0, cached, built once) and, from it, `seeds` RL seeds per arm
(grpo, 8 x 8 episodes per update); the held-out pass rate of the warm start is evaluated once per engine
precision and shared by the arms. Reported per arm: the mismatch metrics averaged over the updates
(mismatch/kl_k3, chi2, ess, logp_diff_max, token_out_frac, and what a correction kept), and the final
held-out pass rate with the seeds' spread.

    nice -n 10 python benchmarks/engine_mismatch.py           # 7 arms x 3 seeds, 10 updates
    nice -n 10 python benchmarks/engine_mismatch.py --quick   # 7 arms x 1 seed, 3 updates, 32 held-out episodes
    # one process per seed, then joined:
    python benchmarks/engine_mismatch.py --seeds 1 --threads 1 --out /tmp/s1.json &   # ... and so on
    python benchmarks/engine_mismatch.py --merge /tmp/s0.json /tmp/s1.json /tmp/s2.json

A bf16 engine on a CPU without native bf16 matrix units is several times slower than fp32 (the tiny
policy's run here: ~5x); it exists to show the gap, not for speed.

Last line: one JSON object; `ratio` = the bf16 engine's mean k3 KL / the fp32 engine's (how many times the gap
grows; null when fp32 measures exactly 0). Also benchmarks/results/engine_mismatch.json (a quick run:
engine_mismatch_quick.json).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from benchlib import parser, report, save
from rich.console import Console
from train_runs import spread

from agentrl.config import TrainConfig
from agentrl.evaluation import evaluate
from agentrl.monitor import Monitor
from agentrl.policy import Policy
from agentrl.trainer import Trainer

# arm -> (rollout.dtype, loss.mismatch)
ARMS = {"fp32": ("auto", "none"), "bf16": ("bf16", "none"), "bf16+token-tis": ("bf16", "token-tis"),
        "bf16+seq-tis": ("bf16", "seq-tis"), "bf16+token-mask": ("bf16", "token-mask"),
        "bf16+seq-mask": ("bf16", "seq-mask"), "bf16+icepop": ("bf16", "icepop")}
KEYS = ("kl_k3", "kl_rev_k3", "chi2", "ess", "logp_diff_mean", "logp_diff_max", "token_out_frac", "kept_frac")


def run(out: Path, start: Path, seed: int, dtype: str, mismatch: str, updates: int, episodes: int, warm) -> dict:
    cfg = TrainConfig(out=str(out), seed=seed, updates=updates, eval={"episodes": episodes, "every": 0},
                      rollout={"dtype": dtype}, loss={"mismatch": mismatch}, checkpoint={"every": 0})
    t0 = time.perf_counter()
    out.mkdir(parents=True)
    quiet = Monitor(out, updates, console=Console(file=io.StringIO()))  # metrics.jsonl, no console
    summary = Trainer(cfg, monitor=quiet, start=start).train(warm=warm)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) > 0 and not r.get("final")]
    means = {k: statistics.mean(r[f"mismatch/{k}"] for r in steps if f"mismatch/{k}" in r)
             for k in KEYS if any(f"mismatch/{k}" in r for r in steps)}
    return {"seed": seed, "updates": len(steps), "wall_s": round(time.perf_counter() - t0, 1),
            "alarms": summary["alarms"], "warm_start_pass_rate": summary["warm_start_pass_rate"],
            "final_pass_rate": summary["final_pass_rate"], **{f"mismatch_{k}": v for k, v in means.items()}}


def main() -> None:
    p = parser(__doc__, quick="one seed, 3 updates, 32 held-out episodes")
    p.add_argument("--seeds", type=int, nargs="+", default=None)
    p.add_argument("--updates", type=int, default=None)
    p.add_argument("--eval-episodes", type=int, default=None)
    p.add_argument("--warm-seed", type=int, default=1, help="the SFT seed of the one warm start all arms share")
    p.add_argument("--start", type=Path, default=None, help="a warm-start folder to use instead of building one")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--out", type=Path, default=None, help="the JSON (default engine_mismatch[_quick].json in "
                   "results/)")
    p.add_argument("--threads", type=int, default=2, help="torch threads; several single-threaded processes, one "
                   "per seed, do more work on 2 cores than one (the tiny model's forwards are too small for two)")
    p.add_argument("--merge", type=Path, nargs="+", default=None, help="JSONs of earlier runs (e.g. one per seed) "
                   "to join into one, with no run of its own")
    a = p.parse_args()
    if a.merge:
        merge(a)
        return
    torch.set_num_threads(a.threads)
    seeds = a.seeds or ([0] if a.quick else [0, 1, 2])
    updates = a.updates or (3 if a.quick else 10)
    episodes = a.eval_episodes or (32 if a.quick else 64)
    from agentrl.stages.warm_start import warm_start

    base = TrainConfig()
    start = a.start or Path(warm_start(base.env.id, base.env.kwargs, base.tiny, base.sft, a.warm_seed))
    runs: dict[str, list[dict]] = {arm: [] for arm in a.arms}
    warm = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in sorted({ARMS[arm][0] for arm in a.arms}):  # the warm start, once per engine precision
            cfg = TrainConfig(eval={"episodes": episodes}, rollout={"dtype": dtype})
            policy = Policy.load(start, device=torch.device("cpu"), tool_format=cfg.tool_format)
            warm[dtype] = evaluate(cfg, policy, None, policy.model.config.max_position_embeddings)
            print(f"warm start ({dtype} engine): held-out {warm[dtype].pass_rate:.3f}", flush=True)
        for seed in seeds:
            for arm in a.arms:
                dtype, mismatch = ARMS[arm]
                r = run(Path(tmp) / f"{arm}-s{seed}", start, seed, dtype, mismatch, updates, episodes, warm[dtype])
                runs[arm].append(r)
                save("engine_mismatch", figures(summarize(runs), runs, a, seeds, updates, episodes, partial=True),
                     a.quick, a.out)  # after every run: a killed sweep keeps what it ran
                print(f"seed {seed}  {arm:<16} kl_k3 {r.get('mismatch_kl_k3', float('nan')):.2e}  ess "
                      f"{r.get('mismatch_ess', float('nan')):.4f}  held-out {r['warm_start_pass_rate']:.3f} -> "
                      f"{r['final_pass_rate']:.3f}  ({r['wall_s']:.0f}s)", flush=True)
    summary = summarize(runs)
    for arm, row in summary.items():
        print(f"{arm:<16} final {row['final_pass_rate']} (mean {row['final_mean']:.3f})  kl_k3 "
              f"{row.get('mismatch_kl_k3', float('nan')):.2e}")
    report("engine_mismatch", figures(summary, runs, a, seeds, updates, episodes, partial=False), a.quick, a.out)


def merge(a: argparse.Namespace) -> None:
    parts = [json.loads(f.read_text()) for f in a.merge]
    settings = {(d["updates"], d["eval_episodes"], d["warm_start_seed"]) for d in parts}
    if len(settings) > 1:
        raise SystemExit(f"--merge: the runs differ in (updates, eval episodes, warm-start seed): {sorted(settings)}")
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for d in parts:
        for arm, rs in d["runs"].items():
            runs[arm] += rs
    seeds = sorted({r["seed"] for rs in runs.values() for r in rs})
    a.quick, a.warm_seed = any(d["quick"] for d in parts), parts[0]["warm_start_seed"]
    joined = figures(summarize(runs), runs, a, seeds, parts[0]["updates"], parts[0]["eval_episodes"],
                     partial=any(d["partial"] for d in parts))
    joined["merged_from"] = [{"file": f.name, "command": d["command"], "machine": d["machine"]}
                             for f, d in zip(a.merge, parts, strict=True)]
    report("engine_mismatch", joined, a.quick, a.out)


def summarize(runs: dict[str, list[dict]]) -> dict:
    summary = {}
    for arm, rs in runs.items():
        if not rs:
            continue
        finals = [r["final_pass_rate"] for r in rs]
        summary[arm] = {"final_pass_rate": finals, "final_mean": round(statistics.mean(finals), 4),
                        "final_spread": spread(finals),
                        **{k: statistics.mean(r[k] for r in rs) for k in rs[0] if k.startswith("mismatch_")}}
    return summary


def figures(summary: dict, runs: dict, a, seeds: list[int], updates: int, episodes: int, partial: bool) -> dict:
    """The JSON's figures (`partial` true until the last run); benchlib adds the machine and the command."""
    fp32 = summary.get("fp32", {}).get("mismatch_kl_k3", 0.0)
    bf16 = summary.get("bf16", {}).get("mismatch_kl_k3", 0.0)
    ratio = round(bf16 / fp32, 1) if fp32 > 0 else None  # None: fp32 measured exactly 0 on every update
    return {"benchmark": "engine_mismatch", "quick": a.quick, "partial": partial, "updates": updates,
            "seeds": seeds, "warm_start_seed": a.warm_seed, "eval_episodes": episodes, "arms": summary,
            "runs": {arm: rs for arm, rs in runs.items() if rs}, "ratio": ratio}


if __name__ == "__main__":
    main()
