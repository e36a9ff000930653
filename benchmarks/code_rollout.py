"""Code-v0 rollouts with the real sandbox: concurrent environment steps against the serial loop.

Every `run_tests` and `submit` of Code-v0 starts a sandboxed judge and candidate (~0.1 s of mostly
waiting on subprocesses), so a rollout of Code-v0 is tool-bound. The policy is the scripted expert
(noisy, so that episodes mix test runs, wrong submissions and right ones): the model is not what is
measured here, the environment steps are. Both arms roll out the same seeds; their episodes
(tokens, rewards, turns) must be equal, which is checked.

    python benchmarks/code_rollout.py            # 48 episodes, 3 repeats
    python benchmarks/code_rollout.py --quick    # 16 episodes, 1 repeat

Last line: one JSON object; `ratio` is concurrent / serial episodes per second (the issue asks
>= 1.7 on 2 cores). Also written to benchmarks/results/code_rollout.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # per-file bars for a few-MB model are noise here

from agentrl.core import make  # noqa: E402
from agentrl.engines import ScriptedEngine  # noqa: E402
from agentrl.policy import ChatFormat, Policy, TinyModelConfig, build_tiny_policy  # noqa: E402
from agentrl.rollout import rollout  # noqa: E402
from agentrl.stages.sft import expert_texts  # noqa: E402


def run(chat: ChatFormat, seeds: list[int], workers: str, noise: float) -> tuple[float, list[tuple]]:
    envs = [make("agentrl/Code-v0") for _ in seeds]
    # the expert's slips draw from each env's own seeded generator, so both arms play the same actions
    engine = ScriptedEngine(lambda row: chat.action_ids(envs[row].expert_action(noise)), chat.eos_id)
    t0 = time.perf_counter()
    episodes, _ = rollout(envs, seeds, engine, chat, workers=workers)
    seconds = time.perf_counter() - t0
    errored = [e for e in episodes if e.error]
    assert not errored, errored[0].error
    return seconds, [(e.token_ids(), e.reward, e.num_turns) for e in episodes]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--noise", type=float, default=0.5, help="the expert's slip rate (mixes test runs and retries)")
    ap.add_argument("--workers", default="thread:64", help="the concurrent arm's rollout.env_workers")
    ap.add_argument("--quick", action="store_true", help="16 episodes, 1 repeat")
    ap.add_argument("--out", default="/tmp/agentrl-bench-code-rollout")
    args = ap.parse_args()
    if args.quick:
        args.episodes, args.repeats = 16, 1

    build_tiny_policy(expert_texts(make("agentrl/Code-v0"), range(40), noise=0.3), args.out,
                      TinyModelConfig(vocab_size=2048), seed=0)
    chat = Policy.load(args.out).chat
    seeds = list(range(args.episodes))
    run(chat, seeds[:4], args.workers, args.noise)  # warm-up: imports, the first sandbox start

    serial_s, concurrent_s = [], []
    for _ in range(args.repeats):
        s, ref = run(chat, seeds, "serial", args.noise)
        c, got = run(chat, seeds, args.workers, args.noise)
        assert got == ref, "concurrent steps changed the episodes"
        serial_s.append(s)
        concurrent_s.append(c)
    s, c = statistics.median(serial_s), statistics.median(concurrent_s)
    turns = sum(t for _, _, t in ref)
    ratio = s / c
    print(f"{args.episodes} Code-v0 episodes ({turns} turns, pass rate {sum(r for _, r, _ in ref) / len(ref):.2f}): "
          f"serial {s:.2f} s = {args.episodes / s:.1f} episodes/s, {args.workers} {c:.2f} s = {args.episodes / c:.1f} "
          f"episodes/s -> {ratio:.2f}x")
    result = {"benchmark": "code_rollout", "episodes": args.episodes, "turns": turns, "repeats": args.repeats,
              "noise": args.noise, "workers": args.workers, "cpus": os.cpu_count(), "quick": args.quick,
              "serial_s": round(s, 3), "concurrent_s": round(c, 3),
              "serial_episodes_per_s": round(args.episodes / s, 2),
              "concurrent_episodes_per_s": round(args.episodes / c, 2), "ratio": round(ratio, 2)}
    Path(__file__).parent.joinpath("results").mkdir(exist_ok=True)
    Path(__file__).parent.joinpath("results", "code_rollout.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
