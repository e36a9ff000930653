"""A tail-heavy workload through a bounded engine batch: rows refilled as episodes end vs batches
run to completion one after another.

Vault with a mixture of horizons: each task draws 1-16 locks (slack 1, so a budget of 3-33 turns),
4 episodes per task. The policy is the tiny one, untrained and greedy with no stop tokens: every
action is `--new-tokens` long, no lock opens, every episode runs its whole budget, so the work is
fixed by the draw and both sides do exactly the same (checked: equal episodes, equal tokens).

- **refill**: one `rollout(..., max_batch_rows=64)`: when an episode ends, the next in the queue
  takes its row (prefilled into the kept cache), so the batch stays full until the queue is empty.
- **baseline**: the same episodes in consecutive batches of 64, each `rollout` run to completion:
  once a batch's short episodes end, its rows sit empty until its longest one is done.

    python benchmarks/continuous_batching.py            # 256 episodes through 64 rows
    python benchmarks/continuous_batching.py --quick    # 64 episodes through 16 rows

Both arms use the same engine, which plans each turn over windows of the cache (rows of similar
length together, `TorchSession._plan`); a third arm, **refill, one window**, is the refill run with
that planning off (`EngineTuning.length_buckets` False: every forward over the whole batch and the longest
row's width), as the engine was before. Each arm's process CPU seconds are recorded beside its wall
time (`cpu_ratio`): on a machine shared with other jobs they move much less than wall time.

What to expect on CPU (measured with the tiny policy, one thread): a turn over b rows of cache width
L costs about 16 ms + b * (0.8 ms + 0.005 ms * L), so compute grows with the rows and their width
and a fuller batch buys only the fixed part. Refill saves turn-steps (84 against 126 here: the
1.5x a device whose forward costs the same for any number of rows would see), but its batch holds
rows of every age where each baseline batch holds rows of one age; the windows win back most of
that width (0.65x -> 0.87x on a loaded machine), not the turn-steps' worth. With 16 rows (--quick)
the fixed part weighs more and refill comes out ahead.

The three arms run in turn, `--repeats` rounds (3; medians reported, each round's seconds in `rounds_s`).
Last line: one JSON object; `ratio` is refill episodes/s over baseline episodes/s (the issue asks
>= 1.5x). Also written to benchmarks/results/continuous_batching.json, with `loadavg` (the 1, 5
and 15 minute load averages when the run ended): figures taken on a loaded machine are not final.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np
import torch
from benchlib import parser, report

from agentrl.config import TinyModelConfig
from agentrl.engines import SamplingConfig, TorchEngine
from agentrl.policy import Policy, build_tiny_policy
from agentrl.registry import make
from agentrl.rollout import rollout
from agentrl.stages.sft import expert_texts


def episodes_for(locks: list[int], group_size: int):
    envs = [make("agentrl/Vault-v0", locks=L, slack=1) for L in locks for _ in range(group_size)]
    seeds = [g for g in range(len(locks)) for _ in range(group_size)]
    return envs, seeds, [g for g in range(len(locks)) for _ in range(group_size)]


def engine_for(policy: Policy, new_tokens: int, windows: bool = True) -> TorchEngine:
    chat = policy.chat
    engine = TorchEngine(policy.model, SamplingConfig(temperature=0.0, max_new_tokens=new_tokens), stop_ids=[],
                         eos_id=chat.eos_id, pad_id=chat.pad_id, seed=0)
    engine.tune(length_buckets=windows)
    return engine


class Clock:
    """Wall and process CPU seconds of a block."""

    def __enter__(self):
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.t0, time.process_time() - self.c0


def main() -> None:
    ap = parser(__doc__, quick="64 episodes through 16 rows, one round")
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--out", default="/tmp/agentrl-bench-continuous")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of the three arms in turn; medians are reported")
    args = ap.parse_args()
    if args.quick:
        args.episodes, args.rows, args.repeats = 64, 16, 1
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: at least one round is needed to time the arms")
    load_before = round(os.getloadavg()[0], 2)

    build_tiny_policy(expert_texts(make("agentrl/Vault-v0", locks=2), range(100), noise=0.3), args.out,
                      TinyModelConfig(max_position_embeddings=4096), seed=0)
    policy = Policy.load(args.out)
    policy.model.eval()
    chat = policy.chat
    rng = np.random.default_rng(0)
    locks = rng.integers(1, 17, size=args.episodes // args.group_size).tolist()
    warm_envs, warm_seeds, _ = episodes_for([1, 2], args.group_size)
    rollout(warm_envs, warm_seeds, engine_for(policy, args.new_tokens), chat)  # warm-up

    def refill_run(windows: bool):
        envs, seeds, gids = episodes_for(locks, args.group_size)
        with Clock() as clock:
            episodes, _ = rollout(envs, seeds, engine_for(policy, args.new_tokens, windows), chat, group_ids=gids,
                                  max_batch_rows=args.rows)
        return episodes, clock

    def baseline_run():
        envs, seeds, gids = episodes_for(locks, args.group_size)
        engine = engine_for(policy, args.new_tokens)
        episodes = []
        with Clock() as clock:
            for i in range(0, len(envs), args.rows):
                part, _ = rollout(envs[i : i + args.rows], seeds[i : i + args.rows], engine, chat,
                                  group_ids=gids[i : i + args.rows])
                episodes += part
        return episodes, clock

    clocks: dict[str, list[Clock]] = {"refill": [], "baseline": [], "one_window": []}
    for _ in range(args.repeats):  # the arms in turn, so that each round's load falls on all three alike
        refill, t = refill_run(True)
        clocks["refill"].append(t)
        baseline, t = baseline_run()
        clocks["baseline"].append(t)
        one_window, t = refill_run(False)
        clocks["one_window"].append(t)
    wall = {k: statistics.median(c.wall for c in v) for k, v in clocks.items()}
    cpu = {k: statistics.median(c.cpu for c in v) for k, v in clocks.items()}
    gids = episodes_for(locks, args.group_size)[2]

    assert [e.token_ids() for e in refill] == [e.token_ids() for e in baseline], "refill changed an episode"
    assert [e.token_ids() for e in one_window] == [e.token_ids() for e in refill], "windows changed an episode"
    assert [e.group_id for e in refill] == gids
    tokens = sum(len(e.token_ids()) for e in refill)
    n = len(refill)
    ratio = wall["baseline"] / wall["refill"]
    result = {"episodes": n, "rows": args.rows, "group_size": args.group_size,
              "locks": locks, "turns_total": sum(e.num_turns for e in refill), "tokens": tokens, "quick": args.quick,
              "repeats": args.repeats, "threads": torch.get_num_threads(), "loadavg_1min_before": load_before,
              "loadavg": [round(x, 2) for x in os.getloadavg()],
              "refill_s": round(wall["refill"], 3), "baseline_s": round(wall["baseline"], 3),
              "refill_one_window_s": round(wall["one_window"], 3),
              "rounds_s": {k: [round(c.wall, 3) for c in v] for k, v in clocks.items()},
              "refill_cpu_s": round(cpu["refill"], 3), "baseline_cpu_s": round(cpu["baseline"], 3),
              "refill_one_window_cpu_s": round(cpu["one_window"], 3),
              "refill_episodes_per_s": round(n / wall["refill"], 2),
              "baseline_episodes_per_s": round(n / wall["baseline"], 2),
              "cpu_ratio": round(cpu["baseline"] / cpu["refill"], 3),
              "one_window_ratio": round(wall["baseline"] / wall["one_window"], 3), "ratio": round(ratio, 3)}
    print(f"{n} episodes through {args.rows} rows, medians of {args.repeats}: refill {wall['refill']:.2f} s "
          f"({cpu['refill']:.2f} CPU s), batches to completion {wall['baseline']:.2f} s ({cpu['baseline']:.2f} CPU s): "
          f"{ratio:.2f}x; refill over one window {wall['one_window']:.2f} s ({cpu['one_window']:.2f} CPU s)")
    report("continuous_batching", result, quick=args.quick)


if __name__ == "__main__":
    main()
