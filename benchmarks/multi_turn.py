"""Multi-turn rollouts: agentrl's engine (KV cache kept across turns) vs `generate()` once per turn.

Vault (`locks=L, slack=0`: a budget of 2L turns) at several horizons; per horizon the same batch
of episodes (same seeds) runs through:

- **engine**: `agentrl.rollout.rollout` with a `TorchEngine`: one batched forward per token, each
  episode's cache kept across turns, only each turn's new observation tokens fed to the model.
- **regenerate** (a baseline): what a framework without turn-aware rollouts does (TRL's transformers path
  among them): every turn, the whole history of every live episode (prompt, all earlier actions and
  observations) is re-encoded, left-padded into one batch, and `model.generate()` samples the next action.
- **carry_cache** (the stronger baseline): what a user who knows transformers writes: `generate()` once per
  turn with each episode's `DynamicCache` carried across turns, fed only the last action token and the new
  observation, left-padded inside that chunk with the attention mask zero on the pads. Greedy, it writes
  the same tokens as regenerate (tests/test_multi_turn_baselines.py).

Prompt and observation ids come from the same `ChatFormat` calls that `rollout` makes, so every side sees the
same token layout. `ratio` is the engine against the stronger baseline (`stronger_baseline`; `ratio_<name>` for
each); `baselines` holds each loop's seconds per episode at the longest horizon.

Why this design is an equal-work comparison: the policy is the same *untrained* ~0.9M-parameter
Llama (same weights on both sides; the tokenizer is `agentrl train`'s), sampling at temperature 1
with no stop tokens, so every action is exactly `--new-tokens` tokens on both sides (the engine
gets an empty stop list; `generate()` gets `min_new_tokens = max_new_tokens`). Its actions are
never a correct tool call, so no lock ever opens and every episode runs its whole budget of 2L
turns on both sides: equal turns, equal action tokens. The actions themselves are each side's own
samples, so the env's error messages can differ in a few episodes (a sampled `<tool_call>` gets a
different message than none): the tokens per episode of both sides are printed so that this
stays visible (they agree to well under 1%). Replaying one fixed action sequence on both sides
(teacher forcing) was not chosen: `generate()` cannot be teacher-forced without a logits
processor of our own, an overhead no real framework pays. A trained policy was not chosen either:
it stops at different turns on each side, so the two would not do the same work.

Each side runs in fresh Python processes (`--repeats` of them, the median reported, the order rotating), never
beside another side. The engine retunes glibc's malloc for its whole process (`keep_freed_memory`), and a side
that ran after it in the same process timed on that allocator, not the one a transformers user has; a process
also carries its heap and its first-call costs from one side into the next. In each process a warm-up of a
few episodes at every horizon meets the shapes once before any timing, and the engine times several rounds
(its rounds last seconds) where a baseline times one. `engine_spread` and `<baseline>_spread` are each side's
(max - min) / median over its processes: how far one process's timing is from another's.
Time per episode is fitted as `a * turns^k` for each side. Re-encoding the history makes the
baseline's tokens processed grow as turns^2 (k near 2). The engine processes each token once, so
its forwards grow linearly, but every token still attends to the whole context before it, and
that context grows with the turns; for a model this small (hidden 128) attention over a few
thousand positions is a large share of a forward, so its k lies between 1 and 2 as well. (The
cache also holds padding holes: each turn's observations are left-padded to the longest one.)

    python benchmarks/multi_turn.py
    python benchmarks/multi_turn.py --locks 2 8 16 20 --episodes 32 --new-tokens 16 --repeats 3
    python benchmarks/multi_turn.py --quick             # 4 and 16 turns, 16 episodes, one repeat
    python benchmarks/multi_turn.py --locks 16 --episodes 8 --model smollm2-135m-instruct --baselines carry_cache
    python benchmarks/multi_turn.py --engine-only       # the engine's side alone (its exponent, no ratio)

Last line: one JSON object with the figures; `ratio` is the engine's episodes/s divided by the
baseline's at the longest horizon. Per horizon the engine's forwards, its milliseconds per forward, and its
padding fraction: of the cache positions its forwards attended over (rows x cache width, summed over
forwards), the share that were masked holes. Also written to benchmarks/results/multi_turn[_quick].json.

The padding what-if (`ratio_if_padding_free`, at the longest horizon; a what-if, not a bound on what the hardware
allows): one more engine round there with every SDPA call timed splits
the engine's time into attention (`attention_share`; observation chunks and decode steps apart) and the rest;
the engine counts the query-key pairs each kind computed and how many were real (a real query, a real key it may
see: `attention_pairs`), and the what-if is the ratio the engine would reach if the padded pairs cost nothing. What is
left is attention over each row's real context (on CPU a decode step's attention reads the whole fp32 cache:
memory bandwidth) and the per-forward cost of the layers.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from benchlib import parser, report

from agentrl.chat.layout import ChatFormat
from agentrl.config import TinyModelConfig
from agentrl.engines import SamplingConfig, TorchEngine
from agentrl.engines.torch.cpu import attention as engine_attention
from agentrl.policy import Policy, build_tiny_policy
from agentrl.registry import make
from agentrl.rollout import rollout
from agentrl.stages.sft import expert_texts

WARMUP_EPISODES = 4  # each process's warm-up batch at every horizon: the shapes seen once, at a fraction of the cost
ENGINE_ROUNDS = 3  # timed engine rounds per horizon in its process (a round lasts seconds; a baseline's, minutes)
PROTOCOL = ("each side in fresh Python processes, one per repeat, the order rotating between repeats; in each, a "
            f"warm-up of {WARMUP_EPISODES} episodes at every horizon, then the timed rounds (the engine's median of "
            f"{ENGINE_ROUNDS}, a baseline's one); per side the median over repeats")
MODEL = TinyModelConfig(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=4096)


def engine_episodes(policy: Policy, locks: int, seeds: list[int], new_tokens: int,
                    counts: dict[str, int] | None = None) -> list[int]:
    """agentrl's rollout; returns each episode's total tokens (prompt, actions, observations). `counts` gets the
    session's forwards and the cache positions they attended over, and how many of those were padding."""
    chat = policy.chat
    envs = [make("agentrl/Vault-v0", locks=locks, slack=0) for _ in seeds]
    engine = TorchEngine(policy.model, SamplingConfig(max_new_tokens=new_tokens), stop_ids=[], eos_id=chat.eos_id,
                         pad_id=chat.pad_id, seed=seeds[0])
    sessions = []
    opened = engine.open
    engine.open = lambda prompts: sessions.append(opened(prompts)) or sessions[-1]
    episodes, _ = rollout(envs, seeds, engine, chat)
    del engine.open  # the wrapper holds the sessions, which hold the engine: no cycle left for the cyclic GC to find
    assert all(e.num_turns == 2 * locks and e.truncated for e in episodes), "an episode ended before its turn budget"
    assert all(len(t.action_ids) == new_tokens for e in episodes for t in e.turns)
    if counts is not None:
        for name in ("forwards", "positions_attended", "positions_padding", "tokens_fed", "tokens_packed_out",
                     "chunks_in_levels"):
            counts[name] = sum(getattr(s, name) for s in sessions)
        for kind in ("chunk", "decode"):
            counts[f"{kind}_pairs"] = sum(s.attention_pairs[kind][0] for s in sessions)
            counts[f"{kind}_pairs_real"] = sum(s.attention_pairs[kind][1] for s in sessions)
    return [len(e.token_ids()) + len(e.turns[-1].obs_ids) for e in episodes]


@contextmanager
def attention_timed(seconds: dict[str, float], heads: int):
    """Time the engine's attention, summed into `seconds` under "chunk" (more than one query) and "decode" (one
    query): every `scaled_dot_product_attention` call (transformers' SDPA and the engine's grouped-heads path both
    call it through `torch.nn.functional`), and the engine's own decode attention (`_decode_attention`, two matmuls
    around a softmax, in fp32). A decode step folds each group's query heads into the query axis, so an SDPA call
    with fewer than the model's `heads` query heads is one too."""
    F = torch.nn.functional
    own, own_decode = F.scaled_dot_product_attention, engine_attention._decode_attention

    def timed(query, *args, **kwargs):
        t0 = time.perf_counter()
        out = own(query, *args, **kwargs)
        kind = "chunk" if query.shape[-2] > 1 and query.shape[1] == heads else "decode"
        seconds[kind] = seconds.get(kind, 0.0) + time.perf_counter() - t0
        return out

    def timed_decode(*args, **kwargs):
        t0 = time.perf_counter()
        out = own_decode(*args, **kwargs)
        seconds["decode"] = seconds.get("decode", 0.0) + time.perf_counter() - t0
        return out

    F.scaled_dot_product_attention, engine_attention._decode_attention = timed, timed_decode
    try:
        yield seconds
    finally:
        F.scaled_dot_product_attention, engine_attention._decode_attention = own, own_decode


@torch.inference_mode()
def baseline_episodes(policy: Policy, locks: int, seeds: list[int], new_tokens: int, greedy: bool = False,
                      actions_out: list[list[list[int]]] | None = None) -> list[int]:
    """`generate()` once per turn over every live episode's re-encoded history (`regenerate`). `actions_out`
    gets each turn's actions (turn, row, tokens): tests/test_multi_turn_baselines.py compares the baselines."""
    chat: ChatFormat = policy.chat
    envs, history = _episodes_start(chat, locks, seeds)
    live, turns = list(range(len(envs))), [0] * len(envs)
    while live:
        width = max(len(history[i]) for i in live)
        ids = torch.full((len(live), width), chat.pad_id, dtype=torch.long)  # (B, W), left-padded
        mask = torch.zeros_like(ids)
        for b, i in enumerate(live):
            ids[b, width - len(history[i]):] = torch.tensor(history[i])
            mask[b, width - len(history[i]):] = 1
        out = policy.model.generate(
            input_ids=ids, attention_mask=mask, **sampling(new_tokens, greedy), pad_token_id=chat.pad_id,
        )
        actions = out[:, width:].tolist()  # (B, new_tokens)
        if actions_out is not None:
            actions_out.append(actions)
        still = []
        for b, i in enumerate(live):
            obs, _, terminated, truncated, _ = envs[i].step(chat.decode(actions[b]))
            history[i] = history[i] + actions[b] + chat.observation_ids(obs, ended_with_eos=False)
            turns[i] += 1
            if not (terminated or truncated):
                still.append(i)
        live = still
    assert all(t == 2 * locks for t in turns), "an episode ended before its turn budget"
    return [len(h) for h in history]


def _episodes_start(chat: ChatFormat, locks: int, seeds: list[int]) -> tuple[list, list[list[int]]]:
    """Both baselines' start: the sampler seeded, one Vault per seed (slack 0: every episode runs its whole
    budget) and each one's prompt ids."""
    torch.manual_seed(seeds[0])
    envs = [make("agentrl/Vault-v0", locks=locks, slack=0) for _ in seeds]
    prompts = []
    for env, seed in zip(envs, seeds):
        obs, _ = env.reset(seed=seed)
        prompts.append(chat.prompt_ids(obs, env.tool_schemas(), env.system_prompt))
    return envs, prompts


def sampling(new_tokens: int, greedy: bool) -> dict:
    """generate()'s sampling settings, the same for both baselines: every action exactly `new_tokens` long."""
    draw = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    return {**draw, "min_new_tokens": new_tokens, "max_new_tokens": new_tokens}


@torch.inference_mode()
def carry_cache_episodes(policy: Policy, locks: int, seeds: list[int], new_tokens: int, greedy: bool = False,
                         actions_out: list[list[list[int]]] | None = None) -> list[int]:
    """`generate()` once per turn carrying each episode's `DynamicCache` across turns (`carry_cache`): what a user
    who knows transformers writes, and the stronger baseline. The first turn prefills the left-padded prompts; each
    later turn feeds only what the cache lacks, the last action token (sampled, never fed) and the new observation,
    left-padded inside that chunk with the attention mask zero on the pads, so that the cache holds holes the mask
    hides and generate() derives each real token's position from the mask. Every episode runs its whole budget
    (slack 0, an untrained policy), so the batch never shrinks and the cache needs no row selection."""
    from transformers import DynamicCache

    chat: ChatFormat = policy.chat
    envs, chunks = _episodes_start(chat, locks, seeds)
    cache = DynamicCache()
    ids = torch.zeros((len(envs), 0), dtype=torch.long)  # (B, T): every token so far, pads included
    mask = torch.zeros_like(ids)
    lengths = [len(c) for c in chunks]
    for turn in range(2 * locks):
        width = max(len(c) for c in chunks)
        new = torch.full((len(envs), width), chat.pad_id, dtype=torch.long)  # (B, C), left-padded inside the chunk
        new_mask = torch.zeros_like(new)
        for b, c in enumerate(chunks):
            new[b, width - len(c):] = torch.tensor(c)
            new_mask[b, width - len(c):] = 1
        ids, mask = torch.cat([ids, new], dim=1), torch.cat([mask, new_mask], dim=1)
        out = policy.model.generate(
            input_ids=ids, attention_mask=mask, cache=cache, return_dict_in_generate=True,
            **sampling(new_tokens, greedy), pad_token_id=chat.pad_id,
        )
        cache = out.cache  # every position but the last sampled token's
        actions = out.sequences[:, ids.shape[1]:]  # (B, new_tokens)
        if actions_out is not None:
            actions_out.append(actions.tolist())
        # the cache covers all but the last action token: keep the rest, feed that token with the next chunk
        ids = torch.cat([ids, actions[:, :-1]], dim=1)
        mask = torch.cat([mask, torch.ones_like(actions[:, :-1])], dim=1)
        chunks = []
        for b, env in enumerate(envs):
            obs, _, terminated, truncated, _ = env.step(chat.decode(actions[b].tolist()))
            assert not terminated and (truncated == (turn == 2 * locks - 1)), "an episode left its turn budget"
            observation = chat.observation_ids(obs, ended_with_eos=False)
            chunks.append([int(actions[b, -1])] + observation)
            lengths[b] += new_tokens + len(observation)
    return lengths  # prompt, actions and observations: the history regenerate re-encodes


# the generate() loops the engine is timed against: re-encoding every history each turn (what a framework
# without turn-aware rollouts does, TRL's transformers path among them) and carrying the cache across turns
BASELINES: dict[str, Callable[..., list[int]]] = {"regenerate": baseline_episodes, "carry_cache": carry_cache_episodes}


def timed(run: Callable[[], list[int]]) -> tuple[float, list[int]]:
    """`run()`'s wall time in seconds, and what it returned."""
    t0 = time.perf_counter()
    out = run()
    return time.perf_counter() - t0, out


def load_policy(model: str, folder: str) -> Policy:
    """The policy every side times: the tiny one built in `folder` (by the parent) or a fetched model."""
    if model == "tiny":
        policy = Policy.load(folder)
    else:
        from agentrl.models import resolve

        policy = Policy.load(resolve(model))
    policy.model.eval()
    return policy


def run_side(args) -> dict:
    """One side in this (fresh) process: a warm-up of `WARMUP_EPISODES` episodes at every horizon, then its timed
    rounds at each (the engine's median of `ENGINE_ROUNDS`, a baseline's one round), and with `--profile` the
    engine's attention profile at the longest horizon. Returns what the parent aggregates."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Loading weights" bar per process would bury the progress lines
    policy = load_policy(args.model, args.out)
    seeds = list(range(args.episodes))
    run = engine_episodes if args.side == "engine" else BASELINES[args.side]
    for locks in args.locks:  # the shapes of every horizon once (allocator, kernels) before any timing
        run(policy, locks, seeds[:WARMUP_EPISODES], args.new_tokens)
    out: dict = {"side": args.side, "malloc_tuned": malloc_tuned(), "horizons": {}}
    for locks in args.locks:
        counts: dict[str, int] = {}
        rounds, tokens = [], []
        for _ in range(ENGINE_ROUNDS if args.side == "engine" else 1):
            t, tokens = timed(functools.partial(run, policy, locks, seeds, args.new_tokens,
                                                **({"counts": counts} if args.side == "engine" else {})))
            rounds.append(t)
        out["horizons"][str(locks)] = {"rounds_s": rounds, "s": statistics.median(rounds),
                                       "tokens": statistics.mean(tokens), "counts": counts}
    if args.profile:
        attention: dict[str, float] = {}
        pairs: dict[str, int] = {}
        t0 = time.perf_counter()
        with attention_timed(attention, policy.model.config.num_attention_heads):
            engine_episodes(policy, args.locks[-1], seeds, args.new_tokens, pairs)
        out["profile"] = {"attention": attention, "pairs": pairs, "seconds": time.perf_counter() - t0}
    out["num_parameters"] = policy.num_parameters
    out["threads"] = torch.get_num_threads()
    return out


def malloc_tuned() -> bool:
    """Whether this process's glibc malloc was retuned by the engine (`keep_freed_memory`): only the engine's
    process should be; a baseline runs on the allocator a transformers user has."""
    from agentrl.engines.torch.cpu import malloc

    return malloc._malloc_tuned


def spawn_side(args, side: str, profile: bool) -> dict:
    """Run one side in a fresh Python process (this script with `--side`) and read back its result."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_file = Path(f.name)
    cmd = [sys.executable, __file__, "--side", side, "--side-result", str(result_file), "--model", args.model,
           "--out", args.out, "--episodes", str(args.episodes), "--new-tokens", str(args.new_tokens),
           "--locks", *map(str, args.locks), *(["--profile"] if profile else [])]
    subprocess.run(cmd, check=True)
    try:
        return json.loads(result_file.read_text())
    finally:
        result_file.unlink(missing_ok=True)


def main() -> None:
    ap = parser(__doc__, quick="a smoke run: 4 and 16 turns, 16 episodes, 1 repeat")
    ap.add_argument("--locks", type=int, nargs="+", default=[2, 8, 16, 20], help="horizons: 2*locks turns each")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=16, help="tokens per action (every action is this long)")
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per side (the median is reported)")
    ap.add_argument("--model", default="tiny",
                    help="tiny (the untrained ~0.9M Llama, built here) or a fetched model, e.g. smollm2-135m-instruct")
    ap.add_argument("--engine-only", action="store_true", help="time the engine alone (no baseline, no ratio)")
    ap.add_argument("--baselines", nargs="+", choices=sorted(BASELINES), default=sorted(BASELINES),
                    help="the generate() loops timed against the engine (default both); `ratio` is against the "
                    "stronger")
    ap.add_argument("--out", default="/tmp/agentrl-bench-multi-turn",
                    help="where the tiny policy is built (the JSON always goes to benchmarks/results/)")
    ap.add_argument("--save", default=None, help="write the JSON here instead of benchmarks/results/")
    ap.add_argument("--side", choices=["engine", *sorted(BASELINES)], help=argparse.SUPPRESS)
    ap.add_argument("--side-result", help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        Path(args.side_result).write_text(json.dumps(run_side(args)))
        return
    if args.quick:
        args.locks, args.episodes, args.repeats = [2, 8], 16, 1
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: at least one fresh process per side is needed")
    if args.episodes < WARMUP_EPISODES:
        ap.error(f"--episodes {args.episodes}: at least {WARMUP_EPISODES} (the warm-up's batch)")
    baselines = [] if args.engine_only else list(args.baselines)
    sides = ["engine", *baselines]
    load_before = round(os.getloadavg()[0], 2)
    if args.model == "tiny":
        build_tiny_policy(expert_texts(make("agentrl/Vault-v0", locks=4, slack=0), range(200), noise=0.3), args.out,
                          MODEL, seed=0)

    per_repeat: dict[str, list[dict]] = {side: [] for side in sides}
    for r in range(args.repeats):
        order = sides[r % len(sides):] + sides[:r % len(sides)]  # who goes first rotates: no side always first
        for side in order:
            result = spawn_side(args, side, profile=side == "engine" and r == args.repeats - 1)
            per_repeat[side].append(result)
            at_last = result["horizons"][str(args.locks[-1])]
            print(f"repeat {r + 1}/{args.repeats}: {side:11s} {at_last['s'] / args.episodes:.4f} s/episode at "
                  f"{2 * args.locks[-1]} turns (fresh process, malloc retuned: {result['malloc_tuned']})", flush=True)

    rows = []
    for locks in args.locks:
        key = str(locks)
        secs = {side: [res["horizons"][key]["s"] for res in per_repeat[side]] for side in sides}
        counts = per_repeat["engine"][-1]["horizons"][key]["counts"]
        eng = statistics.median(secs["engine"])
        row = {
            "locks": locks, "turns": 2 * locks,
            "engine_episodes_per_s": round(args.episodes / eng, 2),
            "engine_s_per_episode": round(eng / args.episodes, 4),
            "engine_tokens_per_episode": round(per_repeat["engine"][-1]["horizons"][key]["tokens"], 1),
            "engine_s": [round(s, 3) for s in secs["engine"]],  # each fresh process's median round
            "engine_rounds_s": [[round(s, 3) for s in res["horizons"][key]["rounds_s"]]
                                for res in per_repeat["engine"]],
            "engine_spread": round((max(secs["engine"]) - min(secs["engine"])) / eng, 3),
            # rows x cache width summed over the engine's forwards: the share of it that was padding (holes)
            "engine_forwards": counts["forwards"],
            "engine_ms_per_forward": round(1000 * eng / counts["forwards"], 2),
            "engine_padding_fraction": round(counts["positions_padding"] / counts["positions_attended"], 3),
            # of the positions fed, the chunks' pads that skipped the layers; chunks whose attention ran in levels
            "engine_tokens_fed": counts["tokens_fed"],
            "engine_tokens_packed_out": counts["tokens_packed_out"],
            "engine_chunks_in_levels": counts["chunks_in_levels"],
        }
        line = (f"{row['turns']:3d} turns: engine {row['engine_episodes_per_s']:7.2f} episodes/s "
                f"({row['engine_s_per_episode']:.3f} s/episode, {row['engine_ms_per_forward']:.1f} ms a forward, "
                f"padding {row['engine_padding_fraction']:.0%})")
        for name in baselines:
            base = statistics.median(secs[name])
            row.update({
                f"{name}_episodes_per_s": round(args.episodes / base, 2),
                f"{name}_s_per_episode": round(base / args.episodes, 4),
                f"{name}_tokens_per_episode": round(per_repeat[name][-1]["horizons"][key]["tokens"], 1),
                f"{name}_s": [round(s, 3) for s in secs[name]],
                f"{name}_spread": round((max(secs[name]) - min(secs[name])) / base, 3),
                f"ratio_{name}": round(base / eng, 2),
            })
            line += (f", {name} {row[f'{name}_episodes_per_s']:7.2f} episodes/s ({row[f'{name}_s_per_episode']:.3f} "
                     f"s/episode, {row[f'{name}_tokens_per_episode']:.0f} tokens) -> {row[f'ratio_{name}']:.2f}x")
        if baselines:
            row["stronger_baseline"] = min(baselines, key=lambda name: row[f"{name}_s_per_episode"])
            row["ratio"] = row[f"ratio_{row['stronger_baseline']}"]
        rows.append(row)
        print(line, flush=True)

    last = rows[-1]
    profile = per_repeat["engine"][-1]["profile"]
    attention, pairs, profiled = profile["attention"], profile["pairs"], profile["seconds"]
    share = sum(attention.values()) / profiled
    # each kind's attention time times its share of padded query-key pairs: what padding cost, free in the what-if
    padded = {k: 1 - pairs[f"{k}_pairs_real"] / max(pairs[f"{k}_pairs"], 1) for k in ("chunk", "decode")}
    freed = sum(attention.get(k, 0.0) * padded[k] for k in padded) / profiled
    last.update({"attention_share": round(share, 3),
                 "attention_s": {k: round(v, 3) for k, v in sorted(attention.items())},
                 "attention_padded_pairs": {k: round(v, 3) for k, v in padded.items()},
                 "attention_profiled_round_s": round(profiled, 3)})
    print(f"{last['turns']:3d} turns: attention {share:.0%} of the engine's time (chunks "
          f"{attention.get('chunk', 0.0):.2f} s with {padded['chunk']:.0%} of their query-key pairs padding, decode "
          f"{attention.get('decode', 0.0):.2f} s with {padded['decode']:.0%}, of {profiled:.2f} s); with the padding "
          f"free the engine would be {1 / (1 - freed):.2f}x faster", flush=True)

    turns = np.log([r["turns"] for r in rows])
    exponent = {side: float(np.polyfit(turns, np.log([r[f"{side}_s_per_episode"] for r in rows]), 1)[0])
                if len(rows) > 1 else None for side in sides}
    result = {
        "env": "agentrl/Vault-v0 (slack 0, untrained policy: every episode runs 2*locks turns)",
        "model": args.model,
        "model_parameters": per_repeat["engine"][-1]["num_parameters"],
        **({"model_config": MODEL.model_dump()} if args.model == "tiny" else {}),
        "episodes": args.episodes,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "protocol": PROTOCOL,
        "malloc_retuned": {side: per_repeat[side][-1]["malloc_tuned"] for side in sides},
        "threads": per_repeat["engine"][-1]["threads"],
        "horizons": rows,
        **{f"{side}_time_exponent": None if k is None else round(k, 3) for side, k in exponent.items()},
        "engine_padding_fraction": rows[-1]["engine_padding_fraction"],
        # seconds per episode at the longest horizon, each generate() loop; `ratio` is against the stronger
        "baselines": {name: rows[-1][f"{name}_s_per_episode"] for name in baselines},
        "stronger_baseline": rows[-1].get("stronger_baseline"),
        "ratio": rows[-1].get("ratio"),
        **{f"ratio_{name}": rows[-1][f"ratio_{name}"] for name in baselines},
        "loadavg_1min_before": load_before,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    if result["ratio"] is not None:
        result["ratio_if_padding_free"] = round(result["ratio"] / (1 - freed), 2)
        result["ratio_if_padding_free_how"] = (
            "the ratio if the padding in the engine's attention cost nothing (a what-if, not a hardware bound): one "
            "more engine round at the longest horizon with every SDPA call timed, chunks and decode steps apart, each "
            "kind's time times its share of padded query-key pairs taken off the engine's time; the rest is attention "
            "over real context and the layers' per-forward cost")
    if exponent["engine"] is not None:
        print("time per episode ~ turns^k: " + ", ".join(f"{side} k = {k:.2f}" for side, k in exponent.items()))
    name = "multi_turn" if args.model == "tiny" else f"multi_turn_{args.model.split('-')[0]}"
    report(name, result, args.quick, path=args.save)  # adds the machine and the command


if __name__ == "__main__":
    main()
