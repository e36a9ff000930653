"""KV cache kept across turns vs re-encoding the history every turn: same model, same episodes.

Both engines replay the same recorded Vault episodes by teacher forcing (every action token costs
one forward, exactly as when sampling), so they do identical work except for how the context is
handled. The baseline rebuilds each row's cache from its whole history at the start of every
turn, as a loop that calls `generate()` per turn does. Reports rollout tokens/s and the ratio.

    python benchmarks/kv_cache.py --locks 8 --episodes 64
    python benchmarks/kv_cache.py --quick    # 16 episodes, one timed run of each, one thread

Last line: one JSON object with the figures, `ratio` among them (cached speed / re-encode speed).
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Sequence

import torch
from benchlib import parser, report

from agentrl.config import TinyModelConfig
from agentrl.engines import SamplingConfig, ScriptedEngine, TorchEngine
from agentrl.engines.torch import TorchSession
from agentrl.policy import Policy, build_tiny_policy
from agentrl.registry import make
from agentrl.rollout import rollout
from agentrl.stages.sft import expert_texts


class Replay(TorchEngine):
    """The torch engine, its sessions replaying recorded actions: row r's k-th action is actions[r][k],
    fed by teacher forcing (`generate(forced=...)`: the same forwards and log-probs as sampling it)."""

    def __init__(self, *args, actions: list[list[list[int]]], **kwargs):
        super().__init__(*args, **kwargs)
        self.actions = actions
        self.turn: collections.Counter[int] = collections.Counter()

    def forced(self, rows: Sequence[int]) -> list[list[int]]:
        out = [self.actions[r][self.turn[r]] for r in rows]
        self.turn.update(rows)
        return out

    def open(self, prompts):
        self.turn.clear()
        return CachedSession(self, [list(p) for p in prompts])


class CachedSession(TorchSession):
    """Each row's KV cache kept across turns (the engine as it is), actions forced."""

    def collect(self):
        rows, self.started = self.started, []
        return list(zip(rows, self.generate(forced=self.engine.forced(rows), rows=rows)))


class Reencode(Replay):
    def open(self, prompts):
        self.turn.clear()
        return ReencodeSession(self, prompts)


class ReencodeSession:
    """The baseline: nothing kept between turns. Each turn opens a fresh torch session on the started
    rows' whole histories (prompt, actions, observations) and decodes their actions in it."""

    turn_level = True

    def __init__(self, engine: Reencode, prompts: Sequence[Sequence[int]]):
        self.engine, self.started = engine, []
        self.history = {r: list(p) for r, p in enumerate(prompts)}

    @property
    def rows(self) -> list[int]:
        return list(self.history)

    def add(self, rows, prompts):
        self.history.update((r, list(p)) for r, p in zip(rows, prompts))

    def start(self, rows):
        self.started += list(rows)

    def collect(self):
        rows, self.started = self.started, []
        fresh = TorchSession(self.engine, [list(self.history[r]) for r in rows])
        gens = fresh.generate(forced=self.engine.forced(rows))
        for r, g in zip(rows, gens):
            self.history[r] += g.ids
        return list(zip(rows, gens))

    def extend(self, chunks, rows=None):
        for r, chunk in zip(self.rows if rows is None else rows, chunks, strict=True):
            self.history[r] += list(chunk)

    def drop(self, rows):
        for r in rows:
            del self.history[r]

    def keep(self, positions):
        rows = self.rows
        self.history = {rows[p]: self.history[rows[p]] for p in positions}


def main() -> None:
    ap = parser(__doc__, quick="16 episodes, 1 repeat, 1 thread: a check, not figures")
    ap.add_argument("--locks", type=int, default=8)
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="/tmp/agentrl-bench-kv")
    args = ap.parse_args()
    if args.quick:
        args.episodes, args.repeats = 16, 1
        torch.set_num_threads(1)  # on a shared machine, threads fighting for cores cost far more than they give
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
        eng = engine_cls(policy.model, sampling, chat.stop_ids, chat.eos_id, chat.pad_id, seed=0, actions=actions)
        t0 = time.perf_counter()
        # lockstep: every row's env answers before each generation, so both arms batch the same rows together
        eps, _ = rollout(envs, seeds, eng, chat, schedule="lockstep")
        dt = time.perf_counter() - t0
        if [e.token_ids() for e in eps] != [e.token_ids() for e in recorded]:
            raise SystemExit(f"kv_cache: the {engine_cls.__name__} replay differs from the recorded episodes")
        return dt, eps

    run(Replay)  # warm-up (the first call of a fresh model is several times slower)
    run(Reencode)
    cached, cached_eps = min((run(Replay) for _ in range(args.repeats)), key=lambda x: x[0])
    reenc_t, reenc_eps = min((run(Reencode) for _ in range(args.repeats)), key=lambda x: x[0])
    lp_diff = max(abs(a - b) for x, y in zip(cached_eps, reenc_eps) for s, t in zip(x.turns, y.turns)
                  for a, b in zip(s.logprobs, t.logprobs))
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
        "quick": args.quick,
        "threads": torch.get_num_threads(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    print(f"{args.episodes} Vault episodes at {args.locks} locks ({turns:.0f} turns each): KV cache kept across turns "
          f"{result['cached_tokens_per_s']:.0f} action tokens/s, re-encoding each turn "
          f"{result['reencode_tokens_per_s']:.0f} tokens/s -> {result['ratio']:.2f}x (log-probs agree to "
          f"{lp_diff:.1e})")
    report("kv_cache", result, quick=args.quick)  # a quick run beside the committed figure, never over it


if __name__ == "__main__":
    main()
