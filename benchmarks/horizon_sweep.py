"""The horizon sweep: every credit assigner on Vault at several horizons, same warm start, same
episode budget, several seeds. Where does turn-level credit pay off?

    python benchmarks/horizon_sweep.py                       # 4 horizons x 5 assigners x 3 seeds
    python benchmarks/horizon_sweep.py --locks 1 3 --seeds 0 --updates 5   # a quick look

With `--jobs 2` (the default) the horizons are split between two worker processes of one torch
thread each, balanced by their expected cost; the tiny model's forwards are too small to keep two
threads busy, so two single-threaded workers do nearly twice the work of one process on 2 cores.
The workers write `part<i>/sweep.json`; the parent merges them.

Per horizon (`locks`), the expert's slip rate and the turn slack are calibrated by simulation so
that the noisy expert passes about half its episodes (docs/design.md, Measured facts: with a fixed slack a long
horizon gives an all-fail warm start and measures nothing); one tiny policy is warm-started by
SFT on those demonstrations and every (assigner, seed) run starts from it, with the same number
of updates and episodes. Recorded: the held-out pass rate before and after, the training pass
rate per update (success curves), and episodes-to-threshold (first update where the smoothed
training pass rate reaches halfway from the warm start to 1). Writes `sweep.json`, `table.md`
and `curves.png` into the output folder.

Baseline and ratio: grpo is the baseline at every horizon; `ratio` (last line) is the sum over
horizons of the best turn-level assigner's mean final pass rate over the sum of grpo's (what
picking the right turn-level assigner per horizon gains over grpo everywhere); the longest
horizon's figures are reported beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from agentrl.algorithms import ASSIGNERS, turn_level_assigners

# Every registered assigner, and which of them assign credit per turn: a newly registered one is swept,
# and so calibrated into the probe's thresholds (python -m agentrl.probe calibrate), without editing this file.
ALGOS = list(ASSIGNERS)
TURN_LEVEL = set(turn_level_assigners())


def calibrate(locks: int, target: float = 0.5, episodes: int = 400) -> tuple[int, float, float]:
    """(slack, noise, expert pass rate): slack grows with the horizon, noise is fitted to `target`."""
    from agentrl.core import make

    slack = max(1, locks // 3)
    best = None
    for noise in np.arange(0.05, 0.61, 0.05):
        env = make("agentrl/Vault-v0", locks=locks, slack=slack)
        wins = 0
        for s in range(episodes):
            env.reset(seed=50_000_000 + s)
            while True:
                _, r, term, trunc, _ = env.step(env.expert_action(float(noise)))
                if term or trunc:
                    break
            wins += r
        rate = wins / episodes
        if best is None or abs(rate - target) < abs(best[2] - target):
            best = (slack, round(float(noise), 2), rate)
    return best


def smooth(xs: list[float], k: int = 3) -> list[float]:
    return [float(np.mean(xs[max(0, i - k + 1) : i + 1])) for i in range(len(xs))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--locks", type=int, nargs="+", default=[1, 3, 8, 16], help="horizons (turns ~ 2 * locks + slack)")
    ap.add_argument("--algos", nargs="+", default=ALGOS)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--eval-episodes", type=int, default=128)
    ap.add_argument("--lock-examples", type=int, default=9000, help="SFT demonstrations x locks per horizon (constant "
                    "sum examples)")
    ap.add_argument("--out", default="runs/horizon-sweep")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (one torch thread each); 1: run here")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default); workers get 1")
    ap.add_argument("--from-json", metavar="SWEEP_JSON", help="only redraw the table, plot and summary of a finished "
                    "sweep into --out")
    args = ap.parse_args()
    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
        Path(args.out).mkdir(parents=True, exist_ok=True)
        return finish(results, [a for a in ALGOS if any(r["algo"] == a for h in results["horizons"].values()
                                                        for r in h["runs"].values())], Path(args.out))
    if args.jobs > 1 and len(args.locks) > 1:
        return run_parallel(args)

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    from rich.console import Console

    from agentrl.config import TrainConfig
    from agentrl.monitor import Monitor
    from agentrl.policy import Policy, TinyModelConfig
    from agentrl.stages.sft import warm_start
    from agentrl.trainer import Trainer, evaluate

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    results: dict = {"started": time.strftime("%Y-%m-%d %H:%M"), "args": vars(args), "horizons": {}}
    tiny = TinyModelConfig(max_position_embeddings=2048)
    for locks in args.locks:
        slack, noise, expert = calibrate(locks)
        env_kw = {"locks": locks, "slack": slack}
        # the same number of sum examples and of SFT steps (~375) at every horizon: fewer, longer
        # demonstrations in smaller batches (too few steps left the 8-lock policy unable to add)
        demos = min(3000, max(300, args.lock_examples // locks))
        batch = min(32, max(4, round(96 / locks)))
        base = TrainConfig(env={"id": "agentrl/Vault-v0", "kwargs": env_kw}, tiny=tiny,
                           sft={"episodes": demos, "epochs": 4, "noise": noise, "batch_size": batch},
                           rollout={"groups": args.groups, "group_size": args.group_size},
                           eval={"episodes": args.eval_episodes, "every": 0}, updates=args.updates)
        t0 = time.perf_counter()
        folder = warm_start(base.env.id, env_kw, tiny, base.sft, seed=0)
        policy = Policy.load(folder)
        warm = evaluate(base, policy, None, tiny.max_position_embeddings)
        h = {"locks": locks, "slack": slack, "max_turns": 2 * locks + slack, "noise": noise, "expert_pass_rate": expert,
             "demos": demos, "sft_batch": batch, "warm_start_pass_rate": warm.pass_rate,
             "warm_start_s": time.perf_counter() - t0, "runs": {}}
        print(f"[locks {locks}] slack {slack}, noise {noise} (expert {expert:.2f}), warm start {warm.pass_rate:.3f}",
              flush=True)
        threshold = warm.pass_rate + 0.5 * (1 - warm.pass_rate)
        h["threshold"] = threshold
        for algo in args.algos:
            for seed in args.seeds:
                cfg = base.model_copy(update={"algo": algo, "model": str(folder), "seed": seed,
                                              "out": str(out / f"locks{locks}" / f"{algo}-seed{seed}")})
                cfg = TrainConfig(**cfg.model_dump())  # re-validate (credit defaults for the algo)
                t1 = time.perf_counter()
                Path(cfg.out).mkdir(parents=True, exist_ok=True)
                trainer = Trainer(cfg, monitor=Monitor(Path(cfg.out), total=cfg.updates, console=Console(quiet=True)))
                summary = trainer.train(warm=warm)
                rows = [json.loads(x) for x in (Path(cfg.out) / "metrics.jsonl").read_text().splitlines()]
                curve = [r["rollout/pass_rate"] for r in rows if r.get("step", 0) >= 1 and "rollout/pass_rate" in r]
                sm = smooth(curve)
                hit = next((i + 1 for i, v in enumerate(sm) if v >= threshold), None)
                eps_per_update = args.groups * args.group_size
                h["runs"][f"{algo}/{seed}"] = {
                    "algo": algo, "seed": seed, "final_pass_rate": summary["final_pass_rate"], "curve": curve,
                    "episodes_to_threshold": None if hit is None else hit * eps_per_update,
                    "zero_adv_frac": float(np.mean([r.get("credit/zero_adv_frac", 0) for r in rows
                                                    if r.get("step", 0) >= 1 and not r.get("final")])),
                    "critic_ev_last": next((r["credit/critic_ev"] for r in reversed(rows) if "credit/critic_ev" in r),
                                           None),
                    "wall_s": time.perf_counter() - t1,
                }
                print(f"  {algo:9s} seed {seed}: {warm.pass_rate:.3f} -> {summary['final_pass_rate']:.3f} "
                      f"({time.perf_counter() - t1:.0f}s)", flush=True)
        results["horizons"][str(locks)] = h
        (out / "sweep.json").write_text(json.dumps(results, indent=1))
    results["wall_s"] = time.perf_counter() - t_start
    (out / "sweep.json").write_text(json.dumps(results, indent=1))
    finish(results, args.algos, out)


def run_parallel(args: argparse.Namespace) -> None:
    """Split the horizons between `args.jobs` single-threaded workers (cost ~ locks^2: longer
    episodes and longer contexts), wait for them, merge their results."""
    t_start = time.perf_counter()
    out = Path(args.out)
    bins: list[list[int]] = [[] for _ in range(args.jobs)]
    for locks in sorted(args.locks, reverse=True):
        min(bins, key=lambda b: sum(x * x for x in b)).append(locks)
    bins = [sorted(b) for b in bins if b]
    procs = []
    for i, b in enumerate(bins):
        cmd = [sys.executable, __file__, "--jobs", "1", "--threads", "1", "--locks", *map(str, b), "--algos",
               *args.algos,
               "--seeds", *map(str, args.seeds), "--updates", str(args.updates), "--groups", str(args.groups),
               "--group-size", str(args.group_size), "--eval-episodes", str(args.eval_episodes),
               "--lock-examples", str(args.lock_examples), "--out", str(out / f"part{i}")]
        print(f"worker {i}: locks {b}", flush=True)
        procs.append(subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"horizon sweep: a worker failed (exit codes {codes}); partial results in "
                         f"{out}/part*/sweep.json")
    parts = [json.loads((out / f"part{i}" / "sweep.json").read_text()) for i in range(len(bins))]
    horizons = {h: v for p in parts for h, v in p["horizons"].items()}
    results = {"started": min(p["started"] for p in parts), "args": {**vars(args)}, "workers": bins,
               "horizons": {str(k): horizons[str(k)] for k in sorted(map(int, horizons))},
               "wall_s": time.perf_counter() - t_start}
    (out / "sweep.json").write_text(json.dumps(results, indent=1))
    finish(results, args.algos, out)


def finish(results: dict, algos: list[str], out: Path) -> None:
    args_locks = [int(k) for k in results["horizons"]]
    table = write_table(results, algos, out)
    plot(results, algos, out)
    print(table)
    longest = results["horizons"][str(max(args_locks))]
    means = {a: statistics.mean(r["final_pass_rate"] for r in longest["runs"].values() if r["algo"] == a)
             for a in algos}
    turn_level = {a: m for a, m in means.items() if a in TURN_LEVEL}
    best = max(turn_level, key=turn_level.get) if turn_level else "grpo"
    grpo = means.get("grpo")
    # ratio: the best turn-level assigner at each horizon (what a right pick per horizon gives) over
    # grpo at every horizon, summed over horizons (grpo's 0 at one horizon must not make it infinite)
    per_h = [{a: statistics.mean(r["final_pass_rate"] for r in h["runs"].values() if r["algo"] == a) for a in algos}
             for h in results["horizons"].values()]
    best_sum = sum(max(m[a] for a in m if a in TURN_LEVEL) for m in per_h if any(a in TURN_LEVEL for a in m))
    grpo_sum = sum(m["grpo"] for m in per_h if "grpo" in m)
    ratio = round(best_sum / grpo_sum, 3) if grpo_sum else None
    print(json.dumps({"benchmark": "horizon_sweep", "wall_s": round(results["wall_s"]),
                      "horizons": len(results["horizons"]),
                      "longest_locks": max(args_locks), "grpo_final": None if grpo is None else round(grpo, 3),
                      "best_turn_level": best,
                      "best_turn_level_final": round(turn_level.get(best, float("nan")), 3),
                      "difference": None if grpo is None else round(turn_level.get(best, float("nan")) - grpo, 3),
                      "ratio": ratio}))


def write_table(results: dict, algos: list[str], out: Path) -> str:
    lines = ["| locks | max turns | warm start | " + " | ".join(algos) + " | best |", "|---" * (len(algos) + 4) + "|"]
    for h in results["horizons"].values():
        cells, means = [], {}
        for a in algos:
            finals = [r["final_pass_rate"] for r in h["runs"].values() if r["algo"] == a]
            eps = [r["episodes_to_threshold"] for r in h["runs"].values() if r["algo"] == a]
            reached = [e for e in eps if e is not None]
            m, sd = statistics.mean(finals), (statistics.stdev(finals) if len(finals) > 1 else 0.0)
            means[a] = m
            ett = f"{statistics.mean(reached):.0f} ({len(reached)}/{len(eps)})" if reached else f"- (0/{len(eps)})"
            cells.append(f"{m:.2f} ± {sd:.2f}, {ett}")
        best = max(means, key=means.get)
        lines.append(f"| {h['locks']} | {h['max_turns']} | {h['warm_start_pass_rate']:.2f} | " + " | ".join(cells)
                     + f" | {best} |")
    text = ("Final held-out pass rate, mean ± std over seeds; then episodes to reach halfway from the warm start to 1 "
            "(mean over the seeds that reached it, and how many did).\n\n" + "\n".join(lines) + "\n")
    (out / "table.md").write_text(text)
    return text


def plot(results: dict, algos: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hs = list(results["horizons"].values())
    fig, axes = plt.subplots(1, len(hs), figsize=(4 * len(hs), 3.2), squeeze=False)
    for ax, h in zip(axes[0], hs):
        for a in algos:
            curves = [r["curve"] for r in h["runs"].values() if r["algo"] == a]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            mean = np.mean([smooth(c[:n]) for c in curves], axis=0)
            ax.plot(range(1, n + 1), mean, label=a)
        ax.axhline(h["warm_start_pass_rate"], color="grey", ls=":", lw=1)
        ax.set_title(f"locks {h['locks']} ({h['max_turns']} turns)")
        ax.set_xlabel("update")
        ax.set_ylim(0, 1)
    axes[0][0].set_ylabel("training pass rate (smoothed)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)


if __name__ == "__main__":
    main()
