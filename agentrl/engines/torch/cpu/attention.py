"""The engine's attention on CPU: SDPA under the engine's additive mask with grouped key and value heads read in
place, a decode step's attention as two matmuls, and a packed or levelled chunk computed in its parts.

Registered with transformers as `_GQA_SDPA`; `_attention` runs a model's forwards under it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from agentrl.engines.torch.packing import _CHUNK, _packed_chunk


def _plain_sdpa(config: Any) -> bool:
    """Does every attention layer run SDPA under a plain causal mask (no sliding window)?"""
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    types = getattr(config, "layer_types", None)
    if types is not None:
        return all(t == "full_attention" for t in types)
    return not getattr(config, "sliding_window", None)


def _decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                      scale: float) -> torch.Tensor:
    """Attention of a few queries per head over a long cache (query (b, H, q, D), key and value (b, H, L, D), mask
    additive (b, 1, 1, L) or None): two batched matmuls around a softmax. At a handful of queries SDPA's CPU kernel
    runs a small GEMM per block of keys and is bound by that, not by reading the cache; these three passes are
    bound by the read (docs/benchmarks.md, "Many turns"). Used in fp32 only. The rounding differs from SDPA's in
    the last bit."""
    scores = torch.matmul(query * scale, key.transpose(-1, -2))  # (b, H, q, L)
    if mask is not None:
        scores += mask
    return torch.matmul(scores.softmax(-1), value)  # (b, H, q, D)


def _gqa_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention under the engine's additive mask (or none), with the grouped key and value
    heads read in place instead of copied (query (b, H, C, D), key and value (b, H_kv, L, D)).

    A decode step (one query per row) folds each group's query heads into the query axis instead: they share
    one key head and, at one position, one mask row, so SDPA reads each key and value head once for the whole
    group (enable_gqa reads it once per query head, and a decode step's attention is the cache read from memory).
    Query head h reads key head h // group, as transformers' repeat_kv lays them out.

    A chunk fed packed or in levels (`_Chunk`) gets its queries back in the cache's rectangle, its attention
    computed level by level, and its output packed again (1, N, H, D)."""
    run, packed = _CHUNK.get(), _packed_chunk()
    if packed is not None:  # its queries back in the cache's rectangle
        query = packed.unpack(query)
    b, heads, chunk, dim = query.shape
    kv_heads = key.shape[1]
    if chunk == 1 and heads != kv_heads and (attention_mask is None or attention_mask.shape[1:3] == (1, 1)):
        group = heads // kv_heads
        folded = query.reshape(b, kv_heads, group, dim)  # (b, H_kv, group, D): the group's heads as its queries
        if query.dtype == torch.float32:
            out = _decode_attention(folded, key, value, attention_mask, dim**-0.5 if scaling is None else scaling)
        else:  # bf16 / fp16: SDPA's kernel accumulates the softmax in fp32
            out = F.scaled_dot_product_attention(folded, key, value, attn_mask=attention_mask, scale=scaling)
        return out.reshape(b, 1, heads, dim), None  # (b, C = 1, H, D), as transformers' own
    if run is None or run.levels is None:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,
                                             enable_gqa=kv_heads != heads)  # (b, H, C, D)
    else:  # columns no level covers are padding: zeros, finite wherever they go
        out = query.new_zeros(b, heads, chunk, dim)
        for level in run.levels:
            keys = level.mask.shape[-1]  # the last key the level's queries may see
            q, k, v = query[:, :, level.lo : level.hi], key[:, :, :keys], value[:, :, :keys]
            if level.rows is not None:  # gathered: this level's rows only
                q, k, v = (x.index_select(0, level.rows) for x in (q, k, v))
            part = F.scaled_dot_product_attention(q, k, v, attn_mask=level.mask, scale=scaling,
                                                  enable_gqa=kv_heads != heads)  # (r, H, hi - lo, D)
            if level.rows is None:
                out[:, :, level.lo : level.hi] = part
            else:
                out[level.rows, :, level.lo : level.hi] = part
    if packed is not None:
        return packed.pack(out.transpose(1, 2)), None  # (1, N, H, D)
    return out.transpose(1, 2).contiguous(), None  # (b, C, H, D), as transformers' own


_GQA_SDPA = "agentrl_gqa_sdpa"
# architectures whose attention is plain SDPA over the projected heads (no softcap, sinks or position bias)
_GQA_MODELS = {"llama", "qwen2", "qwen3"}
AttentionInterface.register(_GQA_SDPA, _gqa_sdpa)


@contextmanager
def _attention(model: torch.nn.Module, name: str | None):
    """Run the model's forwards under attention implementation `name` (None: its own). The engine's forwards are
    the only ones on its model while it runs them (a rollout ahead of training generates from a copy)."""
    if name is None:
        yield
        return
    config = model.config
    own = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = own

