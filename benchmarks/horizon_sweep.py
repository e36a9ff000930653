"""The horizon sweep: every credit assigner on one task family at several horizons, same warm start,
same episode budget, several seeds. Where does turn-level credit pay off?

    python benchmarks/horizon_sweep.py                       # Vault: 4 horizons x 5 assigners x 3 seeds
    python benchmarks/horizon_sweep.py --locks 1 3 --seeds 0 --updates 5   # a quick look
    python benchmarks/horizon_sweep.py --family hanoi --disks 2 3 4 --jobs 1   # TextArena's Tower of Hanoi

Families (`FAMILIES`): `vault` (agentrl's own Vault-v0, the knob `--locks`), `hanoi` (TextArena's
Tower of Hanoi through agentrl.adapters.textarena_games, the knob `--disks`: 2**disks - 1 moves, every
episode from TextArena's start), `hanoi-varied` (the same game from a random legal position each episode,
so held-out episodes are new puzzles), `textworld` (a generated TextWorld quest, the knob `--quest-length`),
`frozenlake` (TextArena's FrozenLake, the knob `--size`: 2 * (size - 1) moves) and `rg-chain` (reasoning-gym's
chain_sum one operation a turn, the knob `--difficulty`: terms, one turn each; outcome-only, no step scores).
The horizon knob's values are given with `--horizons` or its family's name. `--preset ci` is a run small enough for CI
(one short horizon, two assigners, one seed, two updates).

With `--jobs 2` (the default) the horizons are split between two worker processes of one torch
thread each, balanced by their expected cost; the tiny model's forwards are too small to keep two
threads busy, so two single-threaded workers do nearly twice the work of one process on 2 cores.
The workers write `part<i>/sweep.json`; the parent merges them.

Per horizon, the expert's slip rate and the turn slack are calibrated by simulation so
that the noisy expert passes about half its episodes (docs/design.md, Measured facts: with a fixed slack a long
horizon gives an all-fail warm start and measures nothing). With `--band LO HI` (the default for families
other than Vault, 0.1 0.9) a warm start whose held-out pass rate falls outside the band is rebuilt with the
expert's target pass rate moved by 0.2 towards the band (more slips when it passes too often), at most
`--band-tries` times; every try is recorded. One tiny policy is warm-started by
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import announce, parser, save

from agentrl.algorithms import teacherless_assigners, turn_level_assigners

# Every registered assigner that trains from the verifier alone (distill needs a teacher), and which of them
# assign credit per turn: a newly registered one is swept, and so calibrated into the probe's thresholds
# (python -m agentrl.probe calibrate), without editing this file.
ALGOS = teacherless_assigners()
TURN_LEVEL = set(turn_level_assigners())


@dataclass(frozen=True)
class Family:
    """A task family with one knob that sets the horizon: how to build it at a knob value `n`, its turn
    budget, and how its warm start is sized (the same number of SFT steps at every horizon)."""

    name: str
    env_id: str
    knob: str  # the env's keyword for the horizon, and its key in sweep.json's horizons
    horizons: tuple[int, ...]  # the default sweep
    optimal_turns: Callable[[int], int]  # an optimal (expert, no slip) episode's turns
    slack: Callable[[int], int]
    band: tuple[float, float] | None  # the warm start's held-out pass rate must fall inside (None: not checked)
    noises: tuple[float, ...] = tuple(round(float(x), 2) for x in np.arange(0.05, 0.61, 0.05))
    kwargs: tuple[tuple[str, object], ...] = ()  # fixed env keywords
    sft_epochs: int = 4  # passes over the demonstrations: a family whose actions copy numbers wants more

    def env_kwargs(self, n: int, slack: int) -> dict:
        return {self.knob: n, "slack": slack, **dict(self.kwargs)}

    def max_turns(self, n: int, slack: int) -> int:
        return self.optimal_turns(n) + slack

    def cost(self, n: int) -> float:
        """Relative cost of one run (longer episodes and longer contexts): turns squared."""
        return float(self.max_turns(n, self.slack(n)) ** 2)


FAMILIES = {
    # Vault: 2 turns per lock (read the clue, open); slack grows with the horizon
    "vault": Family("vault", "agentrl/Vault-v0", "locks", (1, 3, 8, 16), lambda n: 2 * n,
                    lambda n: max(1, n // 3), band=None),
    # Tower of Hanoi: 2**disks - 1 moves; a slip costs at least the move that undoes it. 5 disks (31 moves,
    # ~2,000 tokens of history) passes the tiny policy's 2,048 positions, so the default stops at 4.
    "hanoi": Family("hanoi", "agentrl/TA-TowerOfHanoi-v0", "disks", (2, 3, 4), lambda n: 2**n - 1,
                    lambda n: max(2, (2**n - 1) // 3), band=(0.1, 0.9)),
    # the same game from a random legal position each episode (start="random"): held-out episodes are new
    # puzzles; no position is more than 2**disks - 1 moves from the goal, so the budget is the same
    "hanoi-varied": Family("hanoi-varied", "agentrl/TA-TowerOfHanoi-v0", "disks", (2, 3, 4), lambda n: 2**n - 1,
                           lambda n: max(2, (2**n - 1) // 3), band=(0.1, 0.9), kwargs=(("start", "random"),)),
    # TextWorld: a generated quest of quest_length commands (its walkthrough); a slip ("look") costs a turn.
    # 8 games per quest length, so evaluation and training share puzzles only as often as TextWorld repeats
    "textworld": Family("textworld", "agentrl/TextWorld-v0", "quest_length", (1, 3, 5), lambda n: n,
                        lambda n: max(2, n // 2), band=(0.1, 0.9), kwargs=(("games", 8),)),
    # FrozenLake: a size x size board drawn per episode, 2 * (size - 1) moves corner to corner
    "frozenlake": Family("frozenlake", "agentrl/TA-FrozenLake-v0", "size", (3, 5, 7), lambda n: 2 * (n - 1),
                         lambda n: max(2, 2 * (n - 1) // 3), band=(0.1, 0.9)),
    # reasoning-gym's chain_sum one operation a turn (RG-Chain-v0): difficulty terms, difficulty - 1 calculator
    # calls and an answer. The fifth family: the only one without step scores, so steppo has none to read
    # 12 epochs: at 4 the tiny policy wrote calls of the right shape with the wrong numbers, warm starts under 0.1
    # (docs/benchmarks.md, "The adapters": reasoning-gym's copy needed three times the steps there too)
    "rg-chain": Family("rg-chain", "agentrl/RG-Chain-v0", "difficulty", (3, 6, 10), lambda n: n,
                       lambda n: max(1, n // 3), band=(0.1, 0.9), sft_epochs=12),
}


def train_config(env_id: str, env_kw: dict, demos: int, batch: int, noise: float, args: dict) -> Any:
    """One horizon's TrainConfig (its warm start's SFT and the runs' budget) from the sweep's arguments
    (`vars(args)`, or a sweep.json's "args"): benchmarks/probe_vs_sweep.py rebuilds warm starts with it."""
    from agentrl.config import TinyModelConfig, TrainConfig

    return TrainConfig(env={"id": env_id, "kwargs": env_kw}, tiny=TinyModelConfig(max_position_embeddings=2048),
                       sft={"episodes": demos, "epochs": args.get("sft_epochs") or 4, "noise": noise,
                            "batch_size": batch},
                       rollout={"groups": args.get("groups", 4), "group_size": args.get("group_size", 8)},
                       eval={"episodes": args.get("eval_episodes", 128), "every": 0}, updates=args.get("updates", 20))


def calibrate(family: Family, n: int, target: float = 0.5, episodes: int = 400) -> tuple[int, float, float]:
    """(slack, noise, expert pass rate) at knob value `n`: slack from the family, noise fitted to `target`."""
    from agentrl.registry import make

    slack = family.slack(n)
    best = None
    env = make(family.env_id, **family.env_kwargs(n, slack))
    for noise in family.noises:
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
            best = (slack, noise, rate)
    return best


def warm_horizon(family: Family, n: int, args: dict) -> tuple[dict, Any, Path, Any]:
    """One horizon's warm start, as the sweep builds it: the expert's slip rate calibrated, the SFT sized, the
    warm start rebuilt while its held-out pass rate falls outside `args["band"]`. Returns the horizon's record
    (no runs yet), its TrainConfig, the warm start's folder and its evaluation. benchmarks/probe_preregister.py
    calls it too, so a probe written down before a sweep probes the warm start that sweep will train from."""
    from agentrl.config import TinyModelConfig
    from agentrl.evaluation import evaluate
    from agentrl.policy import Policy
    from agentrl.stages.warm_start import warm_start

    tiny = TinyModelConfig(max_position_embeddings=2048)
    band = args.get("band")
    t0 = time.perf_counter()
    target, tries = 0.5, []
    while True:
        slack, noise, expert = calibrate(family, n, target)
        env_kw = family.env_kwargs(n, slack)
        max_turns = family.max_turns(n, slack)
        # the same number of SFT steps (~375) at every horizon: fewer, longer demonstrations in smaller
        # batches (too few steps left the 8-lock policy unable to add). Vault's sizing is by locks; other
        # families' by turns (a Vault episode has ~2 turns per lock)
        per = n if family.name == "vault" else max(1, round(max_turns / 2))
        demos = min(3000, max(300, args.get("lock_examples", 9000) // per))
        batch = min(32, max(4, round(96 / per)))
        base = train_config(family.env_id, env_kw, demos, batch, noise, args)
        folder = warm_start(base.env.id, env_kw, tiny, base.sft, seed=0)
        warm = evaluate(base, Policy.load(folder), None, tiny.max_position_embeddings)
        tries.append({"target_expert_pass_rate": round(target, 2), "noise": noise, "expert_pass_rate": expert,
                      "warm_start_pass_rate": warm.pass_rate})
        print(f"[{family.knob} {n}] slack {slack}, noise {noise} (expert {expert:.2f}), warm start "
              f"{warm.pass_rate:.3f}", flush=True)
        if band is None or band[0] <= warm.pass_rate <= band[1] or len(tries) >= args.get("band_tries", 3):
            break
        # too good: more slips in the demonstrations; too poor: fewer
        target = target - 0.2 if warm.pass_rate > band[1] else target + 0.2
        target = min(0.95, max(0.05, target))
    h = {family.knob: n, "knob": family.knob, "size": n, "env_kwargs": env_kw, "slack": slack,
         "max_turns": max_turns, "noise": noise,
         "expert_pass_rate": expert, "demos": demos, "sft_batch": batch, "warm_start_pass_rate": warm.pass_rate,
         "in_band": None if band is None else bool(band[0] <= warm.pass_rate <= band[1]),
         "warm_start_tries": tries, "warm_start_s": time.perf_counter() - t0, "runs": {}}
    return h, base, Path(folder), warm


def smooth(xs: list[float], k: int = 3) -> list[float]:
    return [float(np.mean(xs[max(0, i - k + 1) : i + 1])) for i in range(len(xs))]


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--family", choices=sorted(FAMILIES), default="vault", help="the task family (default vault)")
    ap.add_argument("--horizons", "--locks", "--disks", "--quest-length", "--size", "--difficulty", dest="horizons",
                    type=int, nargs="+", default=None, help="the horizon knob's values (vault: locks, turns ~ 2 * "
                    "locks + slack; hanoi, hanoi-varied: disks, 2**disks - 1 moves + slack; textworld: quest length; "
                    "frozenlake: board size, 2 * (size - 1) moves; rg-chain: terms, one turn each + slack); default: "
                    "the family's")
    ap.add_argument("--algos", nargs="+", default=ALGOS)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--eval-episodes", type=int, default=128)
    ap.add_argument("--lock-examples", type=int, default=9000, help="SFT demonstrations x knob value per horizon "
                    "(Vault: constant sum examples)")
    ap.add_argument("--band", type=float, nargs=2, default=None, metavar=("LO", "HI"), help="rebuild a warm start "
                    "whose held-out pass rate falls outside [LO, HI] (default: the family's; Vault none)")
    ap.add_argument("--sft-epochs", type=int, default=None, help="SFT epochs of each warm start (default: the "
                    "family's, 4 but for rg-chain)")
    ap.add_argument("--band-tries", type=int, default=3, help="warm starts built per horizon at most, with --band")
    ap.add_argument("--out", default="runs/horizon-sweep")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (one torch thread each); 1: run here")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default); workers get 1")
    ap.add_argument("--from-json", metavar="SWEEP_JSON", help="only redraw the table, plot and summary of a finished "
                    "sweep into --out")
    ap.add_argument("--preset", choices=["ci"], default=None, help="ci: the family's shortest horizon, grpo and "
                    "steppo, seed 0, 2 updates of 2 groups, 16 held-out episodes (a smoke run of the whole path)")
    args = ap.parse_args()
    family = FAMILIES[args.family]
    if args.preset == "ci":
        args.horizons = args.horizons or [family.horizons[0]]
        args.algos, args.seeds, args.updates, args.groups, args.eval_episodes = ["grpo", "steppo"], [0], 2, 2, 16
        args.lock_examples, args.band_tries, args.jobs = 600, 1, 1
    if args.horizons is None:
        args.horizons = list(family.horizons)
    if args.band is None and family.band is not None:
        args.band = list(family.band)
    if args.sft_epochs is None:
        args.sft_epochs = family.sft_epochs
    if args.band is not None and not 0 <= args.band[0] < args.band[1] <= 1:
        ap.error(f"--band: need 0 <= LO < HI <= 1, got {args.band}")
    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
        Path(args.out).mkdir(parents=True, exist_ok=True)
        # a redrawing writes the table and the plot, never a sweep: its figures are the finished sweep's
        return announce("horizon_sweep", finish(results, [a for a in ALGOS if any(
            r["algo"] == a for h in results["horizons"].values() for r in h["runs"].values())], Path(args.out)))
    if args.jobs > 1 and len(args.horizons) > 1:
        return run_parallel(args)

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    from rich.console import Console

    import agentrl.adapters.textarena_games  # noqa: F401  (registers the TA- ids)
    from agentrl.config import TrainConfig
    from agentrl.monitor import Monitor
    from agentrl.trainer import Trainer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    results: dict = {"started": time.strftime("%Y-%m-%d %H:%M"), "family": family.name, "env_id": family.env_id,
                     "knob": family.knob, "args": {k: v for k, v in vars(args).items() if v is not None},
                     "horizons": {}}
    for n in args.horizons:
        h, base, folder, warm = warm_horizon(family, n, vars(args))
        threshold = warm.pass_rate + 0.5 * (1 - warm.pass_rate)
        h["threshold"] = threshold
        for algo in args.algos:
            for seed in args.seeds:
                cfg = base.model_copy(update={"algo": algo, "model": str(folder), "seed": seed,
                                              "out": str(out / f"{family.knob}{n}" / f"{algo}-seed{seed}")})
                # re-validate without the base's credit options (they are grpo's): the algo's own defaults
                cfg = TrainConfig(**cfg.model_dump(exclude={"credit"}))
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
                results["horizons"][str(n)] = h
                (out / "sweep.json").write_text(json.dumps(results, indent=1))  # after every run: a partial sweep
        results["horizons"][str(n)] = h
        (out / "sweep.json").write_text(json.dumps(results, indent=1))
    results["wall_s"] = time.perf_counter() - t_start
    results["loadavg"] = os.getloadavg()
    save("horizon_sweep", results, path=out / "sweep.json")  # the sweep first: a failing plot leaves it whole
    announce("horizon_sweep", finish(results, args.algos, out))


def run_parallel(args: argparse.Namespace) -> None:
    """Split the horizons between `args.jobs` single-threaded workers (cost ~ turns^2: longer
    episodes and longer contexts), wait for them, merge their results."""
    t_start = time.perf_counter()
    out = Path(args.out)
    family = FAMILIES[args.family]
    bins: list[list[int]] = [[] for _ in range(args.jobs)]
    for n in sorted(args.horizons, key=family.cost, reverse=True):
        min(bins, key=lambda b: sum(map(family.cost, b))).append(n)
    bins = [sorted(b) for b in bins if b]
    procs = []
    band = ["--band", *map(str, args.band)] if args.band is not None else []
    for i, b in enumerate(bins):
        cmd = [sys.executable, __file__, "--family", args.family, "--jobs", "1", "--threads", "1", "--horizons",
               *map(str, b), "--algos", *args.algos,
               "--seeds", *map(str, args.seeds), "--updates", str(args.updates), "--groups", str(args.groups),
               "--group-size", str(args.group_size), "--eval-episodes", str(args.eval_episodes),
               "--lock-examples", str(args.lock_examples), *band, "--band-tries", str(args.band_tries),
               "--sft-epochs", str(args.sft_epochs),
               "--out", str(out / f"part{i}")]
        print(f"worker {i}: {family.knob} {b}", flush=True)
        procs.append(subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"horizon sweep: a worker failed (exit codes {codes}); partial results in "
                         f"{out}/part*/sweep.json")
    parts = [json.loads((out / f"part{i}" / "sweep.json").read_text()) for i in range(len(bins))]
    horizons = {h: v for p in parts for h, v in p["horizons"].items()}
    results = {"started": min(p["started"] for p in parts), "family": family.name, "env_id": family.env_id,
               "knob": family.knob, "args": {k: v for k, v in vars(args).items() if v is not None}, "workers": bins,
               "horizons": {str(k): horizons[str(k)] for k in sorted(map(int, horizons))},
               "wall_s": time.perf_counter() - t_start, "loadavg": os.getloadavg()}
    save("horizon_sweep", results, path=out / "sweep.json")  # the sweep first: a failing plot leaves it whole
    announce("horizon_sweep", finish(results, args.algos, out))


def knob_of(results: dict) -> str:
    """The horizon knob's name in a sweep.json (sweeps from before families were Vault's: locks)."""
    return results.get("knob", "locks")


def finish(results: dict, algos: list[str], out: Path) -> dict[str, Any]:
    """Write the table and the plot beside the sweep and print the table; returns the figures of the last line."""
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
    return {"family": results.get("family", "vault"),
            "wall_s": round(results.get("wall_s", float("nan"))),
            "horizons": len(results["horizons"]),
            f"longest_{knob_of(results)}": max(args_locks),
            "grpo_final": None if grpo is None else round(grpo, 3),
            "best_turn_level": best,
            "best_turn_level_final": round(turn_level.get(best, float("nan")), 3),
            "difference": None if grpo is None else round(turn_level.get(best, float("nan")) - grpo, 3),
            "ratio": ratio}


def write_table(results: dict, algos: list[str], out: Path) -> str:
    knob = knob_of(results)
    lines = [f"| {knob} | max turns | warm start | " + " | ".join(algos) + " | best |", "|---" * (len(algos) + 4) + "|"]
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
        lines.append(f"| {h[knob]} | {h['max_turns']} | {h['warm_start_pass_rate']:.2f} | " + " | ".join(cells)
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
    knob = knob_of(results)
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
        ax.set_title(f"{knob} {h[knob]} ({h['max_turns']} turns)")
        ax.set_xlabel("update")
        ax.set_ylim(0, 1)
    axes[0][0].set_ylabel("training pass rate (smoothed)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)


if __name__ == "__main__":
    main()
