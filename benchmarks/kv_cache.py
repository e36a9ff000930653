"""KV cache kept across turns vs re-encoding the history every turn: same model, same episodes.

Both engines replay the same recorded Vault episodes by teacher forcing (every action token costs
one forward, exactly as when sampling), so they do identical work except for how the context is
handled. The baseline rebuilds each row's cache from its whole history at the start of every
turn, as a loop that calls `generate()` per turn does. Reports rollout tokens/s and the ratio.

    python benchmarks/kv_cache.py --locks 8 --episodes 64

Last line: one JSON object with the figures, `ratio` among them (cached speed / re-encode speed).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from agentrl.core import make
from agentrl.engines import SamplingConfig, ScriptedEngine, TorchEngine
from agentrl.engines.torch_engine import TorchSession
from agentrl.policy import Policy, TinyModelConfig, build_tiny_policy
from agentrl.rollout import rollout
from agentrl.stages.sft import expert_texts


class ReencodeSession(TorchSession):
    """The baseline: at every turn, drop the cache and feed each row's whole history again."""

    def __init__(self, engine, prompts):
        super().__init__(engine, prompts)
        self.history = [list(p) for p in prompts]

    def generate(self, forced=None):
        for i, chunk in enumerate(self.pending):
            if self.cache_len:  # not the first turn: the whole history, re-encoded
                self.history[i] += chunk
                self.pending[i] = list(self.history[i])
        self.cache = DynamicCache()
        self.mask = self.mask[:, :0]
        self.pos = torch.zeros_like(self.pos)
        gens = super().generate(forced)
        for i, g in enumerate(gens):
            if self.history[i] is not None and self.cache_len and len(self.history[i]) and g.ids:
                self.history[i] += g.ids[:-1]  # the last token travels in pending, as in the parent
        return gens

    def keep(self, positions: Sequence[int]) -> None:
        self.history = [self.history[p] for p in positions]
        super().keep(positions)


class ReencodeEngine(TorchEngine):
    def open(self, prompts):
        return ReencodeSession(self, [list(p) for p in prompts])


class Forced:
    """Wraps an engine so that each row replays a recorded action sequence."""

    def __init__(self, engine, actions: list[list[list[int]]]):
        self.engine, self.actions = engine, actions

    def open(self, prompts):
        inner = self.engine.open(prompts)
        turn = {"k": 0}
        actions = self.actions

        class S:
            @property
            def rows(self):
                return inner.rows

            def generate(self):
                g = inner.generate(forced=[actions[r][turn["k"]] for r in inner.rows])
                turn["k"] += 1
                return g

            def extend(self, chunks):
                inner.extend(chunks)

            def keep(self, positions):
                inner.keep(positions)

        return S()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--locks", type=int, default=8)
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="/tmp/agentrl-bench-kv")
    args = ap.parse_args()
    torch.manual_seed(0)

    env_kw = {"locks": args.locks, "slack": 0}
    env = make("agentrl/Vault-v0", **env_kw)
    build_tiny_policy(expert_texts(env, range(100), noise=0.3), args.out, TinyModelConfig(max_position_embeddings=2048))
    policy = Policy.load(args.out)
    chat = policy.chat
    envs = [make("agentrl/Vault-v0", **env_kw) for _ in range(args.episodes)]
    seeds = list(range(args.episodes))
    # record the expert's episodes once; both engines replay exactly these actions
    scripted = ScriptedEngine(lambda row: chat.action_ids(envs[row].expert_action()), chat.eos_id)
    recorded, _ = rollout(envs, seeds, scripted, chat)
    actions = [[t.action_ids for t in ep.turns] for ep in recorded]
    n_tokens = sum(ep.num_action_tokens for ep in recorded)
    sampling = SamplingConfig(max_new_tokens=max(len(a) for ep in actions for a in ep))

    def run(engine_cls):
        eng = Forced(engine_cls(policy.model, sampling, chat.stop_ids, chat.eos_id, chat.pad_id, seed=0), actions)
        t0 = time.perf_counter()
        eps, _ = rollout(envs, seeds, eng, chat)
        dt = time.perf_counter() - t0
        assert [e.token_ids() for e in eps] == [e.token_ids() for e in recorded], "replay diverged"
        return dt, eps

    run(TorchEngine)  # warm-up (the first call of a fresh model is several times slower)
    run(ReencodeEngine)
    cached = min(run(TorchEngine)[0] for _ in range(args.repeats))
    reenc_t, reenc_eps = min((run(ReencodeEngine) for _ in range(args.repeats)), key=lambda x: x[0])
    _, cached_eps = run(TorchEngine)
    lp_diff = max(abs(a - b) for x, y in zip(cached_eps, reenc_eps) for s, t in zip(x.turns, y.turns) for a,
                  b in zip(s.logprobs, t.logprobs))
    turns = sum(e.num_turns for e in recorded) / len(recorded)
    result = {
        "benchmark": "kv_cache_across_turns",
        "locks": args.locks,
        "episodes": args.episodes,
        "turns_per_episode": turns,
        "tokens_per_episode": sum(len(e.token_ids()) for e in recorded) / len(recorded),
        "action_tokens": n_tokens,
        "cached_s": round(cached, 3),
        "reencode_s": round(reenc_t, 3),
        "cached_tokens_per_s": round(n_tokens / cached, 1),
        "reencode_tokens_per_s": round(n_tokens / reenc_t, 1),
        "max_logprob_diff": lp_diff,
        "ratio": round(reenc_t / cached, 3),
    }
    print(f"{args.episodes} Vault episodes at {args.locks} locks ({turns:.0f} turns each): KV cache kept across turns "
          f"{result['cached_tokens_per_s']:.0f} action tokens/s, re-encoding each turn "
          f"{result['reencode_tokens_per_s']:.0f} tokens/s -> {result['ratio']:.2f}x (log-probs agree to "
          f"{lp_diff:.1e})")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
