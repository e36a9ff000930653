"""Prompts prefilled once per distinct prompt, not once per row (a GRPO group's rows share theirs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache

from agentrl.engines.torch.cache import _append, _RollingCache


def _common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    """The length of the longest prefix every sequence starts with."""
    n = min(len(q) for q in seqs)
    for i in range(n):
        if any(q[i] != seqs[0][i] for q in seqs[1:]):
            return i
    return n


def _share_prefill(session: Any, joining: list[int], slots: list[int]) -> None:
    """Prefill the prompts of a `TorchSession`'s rows joining the batch once per distinct prompt, not once per row.

    A GRPO group's G rows start from one prompt: each distinct prompt (all but its last token) runs
    through the model in a cache of its own, and its keys and values are copied into every slot that
    starts with it (keys carry their rotary position, which is the row's own count, so where they sit in
    the cache changes nothing). A prefix common to all the distinct prompts (a system prompt and its
    tools), `EngineTuning.min_shared_prefix` tokens or more, runs once for all of them. The last prompt token stays
    pending: the turn's first forward feeds it and samples from its logits, as without sharing. The
    samples are the unshared engine's up to the last bit of a matmul run at another batch size
    (tests/engines/test_engine_prefix.py counts the flips)."""
    eng = session.engine
    heads = {s: tuple(session.pending[s][:-1]) for s in joining}
    session.prefill_tokens += sum(len(session.pending[s]) for s in joining)
    unique = list(dict.fromkeys(h for h in heads.values() if h))
    prefix = _common_prefix(unique) if len(unique) > 1 else 0
    prefix = prefix if prefix >= eng.tuning.min_shared_prefix else 0
    run = prefix + sum(len(h) - prefix for h in unique)  # head tokens the shared prefill runs
    saved = sum(len(h) for h in heads.values()) - run
    if not eng.share_prefill or saved < eng.tuning.min_shared_prefix or not isinstance(session.cache, _RollingCache):
        return
    dev, model = eng.device, eng.model
    own = DynamicCache()
    if prefix:  # the common prefix once, then as many copies as there are distinct prompts
        ids = torch.tensor([unique[0][:prefix]], dtype=torch.long, device=dev)
        model(input_ids=ids, position_ids=torch.arange(prefix, device=dev)[None], use_cache=True,
              **{eng.cache_kwarg: own}, **eng.last_logits)
        own.batch_repeat_interleave(len(unique))
    width = max(len(h) for h in unique) - prefix
    mask = torch.ones(len(unique), prefix + width, dtype=torch.long, device=dev)  # (U, P + W)
    if width:  # the distinct rest, left-padded
        ids = torch.full((len(unique), width), eng.pad_id, dtype=torch.long, device=dev)  # (U, W)
        for u, h in enumerate(unique):
            tail = h[prefix:]
            ids[u, width - len(tail):] = torch.tensor(tail, dtype=torch.long, device=dev)
            mask[u, prefix : prefix + width - len(tail)] = 0
        pos = (prefix + mask[:, prefix:].cumsum(1) - 1).clamp(min=0)  # (U, W)
        model(input_ids=ids, attention_mask=None if bool(mask.all()) else mask, position_ids=pos, use_cache=True,
              **{eng.cache_kwarg: own}, **eng.last_logits)
    session.tokens_fed += prefix + len(unique) * width
    # every slot gets the new positions: the joining rows their prompt's, the rest masked holes
    B, length, span = len(session.slot_rows), session.cache_len, prefix + width
    which = {h: u for u, h in enumerate(unique)}
    takers = [s for s in joining if heads[s]]
    dst = torch.tensor(takers, dtype=torch.long, device=dev)
    src = torch.tensor([which[heads[s]] for s in takers], dtype=torch.long, device=dev)
    rest = max([1] + [len(session.pending[s]) for s in slots if s not in heads])
    session.room = session.cache.room = length + span + rest + eng.sampling.max_new_tokens
    for i, layer in enumerate(own.layers):
        keys = layer.keys.new_zeros(B, *layer.keys.shape[1:])  # (B, H, P + W, D)
        values = layer.values.new_zeros(B, *layer.values.shape[1:])
        keys[dst], values[dst] = layer.keys[src], layer.values[src]
        session.cache.update(keys, values, i)
    new = mask.new_zeros(B, span)  # (B, P + W)
    new[dst] = mask[src]
    session.mask, session.mask_buf = _append(session.mask, session.mask_buf, new, session.room, dim=1)
    session.holes = session.holes or not bool(new.all())
    for s in takers:
        session.pos[s] = len(heads[s])
        session.pending[s] = session.pending[s][-1:]
    session.prefill_tokens -= saved
    session.prefill_saved += saved

