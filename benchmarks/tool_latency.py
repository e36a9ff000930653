"""Slow tools against the rollout loop: default settings vs a zero-latency tool, and vs the serial loop.

Vault with one lock and a turn budget of 4 or 16 (`slack`), every `step` sleeping `latency` seconds
before it answers (what a remote API or a sandbox round-trip costs; `time.sleep` releases the GIL,
as waiting on a socket or a subprocess does). The policy is the real tiny one (built in-process,
untrained), sampling with no stop tokens, so every action is `--new-tokens` long, no lock opens and
every episode runs its whole budget: every case does the same work, and since each row samples from
its own stream the episodes' tokens are the same in every case (checked).

Per case (latency x turns): **default** (`env_workers thread:64`: steps overlap each other and the
next generation, rows go on as their observation arrives, and when every row is ready at once and
the tool is slower than a generation's fixed cost, half of them generate while the other half's
tools run) against the same rollout with a zero-latency tool (the issue asks <= 1.5x), the same
default with that staggering off (`unstaggered`), and the **serial** loop (`env_workers serial`:
every step one after another, as before) against the default (>= 20x at 20 ms x 16 turns).

    python benchmarks/tool_latency.py            # 64 episodes; the serial baseline at 200 ms takes minutes
    python benchmarks/tool_latency.py --quick    # 16 episodes, serial only at 20 ms

Last line: one JSON object; `ratio` is serial / default at 20 ms x 16 turns. Also written to
benchmarks/results/tool_latency.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from agentrl.core import make
from agentrl.engines import SamplingConfig, TorchEngine
from agentrl.envs.vault import VaultEnv
from agentrl.policy import Policy, TinyModelConfig, build_tiny_policy
from agentrl.rollout import _Driver, rollout
from agentrl.stages.sft import expert_texts


class SlowVault(VaultEnv):
    def __init__(self, latency: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.latency = latency

    def step(self, action: str):
        if self.latency:
            time.sleep(self.latency)
        return super().step(action)


def run(policy: Policy, latency: float, turns: int, episodes: int, new_tokens: int,
        workers: str, stagger: bool = True) -> tuple[float, list[list[int]]]:
    chat = policy.chat
    envs = [SlowVault(latency, locks=1, slack=turns - 2) for _ in range(episodes)]
    engine = TorchEngine(policy.model, SamplingConfig(max_new_tokens=new_tokens), stop_ids=[], eos_id=chat.eos_id,
                         pad_id=chat.pad_id, seed=0)
    t0 = time.perf_counter()
    if stagger:
        eps, _ = rollout(envs, list(range(episodes)), engine, chat, workers=workers)
    else:  # the same loop with the staggering off: every ready row goes into each generation
        cohort = _Driver._cohort
        _Driver._cohort = lambda self: self.ready
        try:
            eps, _ = rollout(envs, list(range(episodes)), engine, chat, workers=workers)
        finally:
            _Driver._cohort = cohort
    seconds = time.perf_counter() - t0
    assert all(e.num_turns == turns for e in eps), "an episode ended before its turn budget"
    return seconds, [e.token_ids() for e in eps]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--turns", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--latency", type=float, nargs="+", default=[0.02, 0.2])
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="16 episodes; the serial baseline at 20 ms only")
    ap.add_argument("--out", default="/tmp/agentrl-bench-tool-latency")
    args = ap.parse_args()
    if args.quick:
        args.episodes = 16

    build_tiny_policy(expert_texts(make("agentrl/Vault-v0", locks=2), range(100), noise=0.3), args.out,
                      TinyModelConfig(), seed=0)
    policy = Policy.load(args.out)
    policy.model.eval()
    run(policy, 0.0, 4, args.episodes, args.new_tokens, "thread:64")  # warm-up

    cases = []
    for turns in args.turns:
        zero, ref_tokens = run(policy, 0.0, turns, args.episodes, args.new_tokens, "thread:64")
        for latency in args.latency:
            default, tokens = run(policy, latency, turns, args.episodes, args.new_tokens, "thread:64")
            assert tokens == ref_tokens, "a tool's latency changed the episodes"
            flat, tokens = run(policy, latency, turns, args.episodes, args.new_tokens, "thread:64", stagger=False)
            assert tokens == ref_tokens, "staggering changed the episodes"
            case = {"latency_s": latency, "turns": turns, "zero_latency_s": round(zero, 3),
                    "default_s": round(default, 3), "default_vs_zero": round(default / zero, 3),
                    "unstaggered_s": round(flat, 3), "unstaggered_vs_zero": round(flat / zero, 3)}
            if not args.quick or latency <= 0.02:
                serial, tokens = run(policy, latency, turns, args.episodes, args.new_tokens, "serial")
                assert tokens == ref_tokens
                case.update(serial_s=round(serial, 3), serial_vs_default=round(serial / default, 2))
            cases.append(case)
            print(f"{latency * 1000:.0f} ms x {turns} turns: default {default:.2f} s = {default / zero:.2f}x "
                  f"zero-latency ({zero:.2f} s; without staggering {flat / zero:.2f}x)"
                  + (f"; serial {case['serial_s']:.2f} s = {case['serial_vs_default']:.1f}x default"
                     if "serial_s" in case else ""))
    key = next((c for c in cases if c["latency_s"] == 0.02 and c["turns"] == 16 and "serial_vs_default" in c), None)
    result = {"benchmark": "tool_latency", "episodes": args.episodes, "new_tokens": args.new_tokens,
              "quick": args.quick, "threads": torch.get_num_threads(), "cases": cases,
              "max_default_vs_zero": max(c["default_vs_zero"] for c in cases),
              "ratio": key["serial_vs_default"] if key else None}
    Path(__file__).parent.joinpath("results").mkdir(exist_ok=True)
    Path(__file__).parent.joinpath("results", "tool_latency.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
