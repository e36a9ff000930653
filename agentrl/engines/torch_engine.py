"""The default backend: batched generation with transformers models in plain torch.

All rows of a session share one KV cache (`transformers.DynamicCache`) laid out as a rectangle.
Rows differ in length, so every chunk fed to the model (the prompts, then each turn's
observations) is left-padded to the longest row, and padding stays in the cache as masked holes;
positions come from the attention mask, so a row sees the same positions it would see unpadded
(and in training). One forward per generated token serves the whole batch; a row that has stopped
feeds a masked pad token until the turn ends. Finished episodes leave the batch with `keep()`,
which slices the cache.

Appending a token must not copy what is already there: `DynamicCache` concatenates every layer's
keys and values at every token (`torch.cat`), copying the whole cache each time: a turn of N
tokens copied its context N times. The session instead reserves room, once per turn, for the
turn's chunk and its longest action, and writes each token into it (`_RollingCache`, and the
same for the attention mask); the samples and log-probs are bit for bit those of `DynamicCache`.

Over many turns the turn's observation chunk is the costly forward (on CPU, rows x chunk width x cache
width of attention, against rows x cache width for a decode step). The engine builds its additive mask once
per forward and lets SDPA read grouped key/value heads in place. A chunk with padding runs packed: the layers
see only its real tokens, and its attention runs in levels, so that no row attends over a longer row's columns
(`_Chunk`). Where the engine's attention is not used, the longest observations' heads are fed in forwards of
their own instead (`_feed_heads`). The holes are squeezed out of the cache when that pays (`_compact`).
`positions_attended` / `positions_padding` count what the forwards attended over and how much of it was holes;
`attention_pairs` counts the query-key pairs computed and how many were real.
"""

from __future__ import annotations

import copy
import ctypes
import inspect
import os
import platform
from collections.abc import Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer

from agentrl.engines.base import Generation, SamplingConfig


def sample_tokens(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None = None,
                  uniforms: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return it and its log-prob under the temperature-scaled policy.

    The log-prob is taken before top-k/top-p truncation (as vLLM reports it), so that it matches
    what the learner recomputes from the same logits. With `uniforms` (B,) in [0, 1), row b takes
    the token where its cumulative distribution passes uniforms[b] (inverse-CDF sampling), so a
    row's sample depends on its own number only, not on the rows batched with it.
    """
    logits = logits.float()  # (B, V)
    if cfg.temperature == 0:
        tok = logits.argmax(-1)
        return tok, F.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)
    logits = logits / cfg.temperature
    logp = F.log_softmax(logits, -1)  # (B, V)
    masked = logits
    if cfg.top_k > 0 and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[:, -1:]
        masked = masked.masked_fill(masked < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(masked, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) > cfg.top_p  # keep the smallest set reaching top_p
        masked = masked.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = masked.softmax(-1)  # (B, V)
    if uniforms is None:
        tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)
    else:
        cdf = probs.cumsum(-1)  # (B, V)
        # right=True: the first token whose cdf exceeds u, never a zero-probability one
        target = (uniforms.to(cdf.dtype) * cdf[:, -1])[:, None]  # (B, 1)
        tok = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")  # the user's own settings win
_malloc_tuned = False


def keep_freed_memory() -> bool:
    """Let glibc's malloc hand freed blocks of up to 32 MB back to the next allocation instead of to the kernel.

    The engine's largest tensors are allocated afresh every few turns (a grown cache buffer, a compacted cache:
    tens of MB per layer at 32 Vault turns). By default glibc gives such blocks memory mapped for them alone, and
    returns it when freed; every new one is then faulted in page by page. With the mmap threshold at glibc's maximum
    (32 MB) and a trim threshold of 512 MB, a warm 32-turn round of benchmarks/multi_turn.py faults ~300 times
    against 6,000-66,000 (3 pairs of processes in turn, 4 warm rounds each), for ~200 MB more resident memory; the
    rounds' time moved by less than this machine's drift. Process-wide, once,
    only under glibc and only where the user has not set these knobs (MALLOC_MMAP_THRESHOLD_,
    MALLOC_TRIM_THRESHOLD_) or opted out (AGENTRL_SYSTEM_MALLOC=1). Returns whether it is in effect.
    docs/benchmarks.md, "Many turns"."""
    global _malloc_tuned
    if _malloc_tuned:
        return True
    if (platform.system() != "Linux" or platform.libc_ver()[0] != "glibc"
            or os.environ.get("AGENTRL_SYSTEM_MALLOC") == "1" or any(os.environ.get(name) for name in _MALLOC_ENV)):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _malloc_tuned = bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 512 << 20))
    return _malloc_tuned


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN, _MIX1, _MIX2 = _signed(0x9E3779B97F4A7C15), _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    return (x >> k) & ((1 << (64 - k)) - 1)  # logical shift of int64 (torch's >> keeps the sign)


def _splitmix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 on int64 tensors (products wrap modulo 2^64): a counter-based random number."""
    z = x + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def row_uniforms(stream: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """Uniforms in [0, 1), one per row, from each row's stream and draw counter (int64, (B,))."""
    return _shr(_splitmix(_splitmix(stream) + counter), 11).double() / float(1 << 53)


def _leading(view: torch.Tensor, buf: torch.Tensor | None, dim: int) -> bool:
    """Is `view` the leading part of `buf` along `dim` (same start, strides and other sizes)?"""
    return buf is not None and view.data_ptr() == buf.data_ptr() and view.stride() == buf.stride() and all(
        a == b for d, (a, b) in enumerate(zip(view.shape, buf.shape)) if d != dim % view.dim())


def _append(view: torch.Tensor, buf: torch.Tensor | None, new: torch.Tensor, room: int,
            dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.cat([view, new], dim)` written into `buf`, of which `view` is the leading part; returns
    the new view and the buffer. The buffer is reallocated (to `room` positions, or just enough when
    `room` is smaller) only when it is full, so appending a token copies one token, not the tensor.
    A `view` that is not the leading part of `buf` (the caller replaced it) becomes the buffer."""
    length, n = view.shape[dim], new.shape[dim]
    if not _leading(view, buf, dim):
        buf = view
    if length + n > buf.shape[dim]:
        shape = list(new.shape)
        shape[dim] = max(length + n, room)
        grown = new.new_empty(shape)
        grown.narrow(dim, 0, length).copy_(view)
        buf = grown
    buf.narrow(dim, length, n).copy_(new)
    return buf.narrow(dim, 0, length + n), buf


@dataclass
class _Level:
    """Part of a chunk's attention: the queries of columns lo:hi for `rows` (None: every row), over the keys up to
    the last one those queries may see, under `mask` (the forward's mask cut to them; made once per forward)."""

    rows: torch.Tensor | None  # (r,) row indices
    lo: int
    hi: int
    mask: torch.Tensor  # (r, 1, hi - lo, keys)


@dataclass
class _Fill:
    """Where a packed chunk's tokens go in the cache (`_fill_plan`): token n of the packed sequence into row rows[n],
    position columns[n], after the cache has grown by `grow` positions (zeros, masked, for the rows that need fewer)."""

    rows: torch.Tensor  # (N,)
    columns: torch.Tensor  # (N,)
    grow: int


def _fill_plan(old: torch.Tensor, chunk_mask: torch.Tensor, index: torch.Tensor) -> _Fill:
    """The positions a packed chunk takes: each row's holes in `old` (its kept mask (b, W) before the chunk), in
    order, then new positions past W; the cache grows by what the row with the fewest holes for its tokens lacks,
    not by the chunk's width. The chunk (b, C) is left-padded and `index` its real columns, row-major, so a row's
    j-th token is its j-th real column. At 32 Vault turns (observations of ~30 or ~62 tokens) this took the padded
    share of the positions attended from 20% to 13%, and a round 1.04x faster (docs/benchmarks.md, "Many turns")."""
    chunk, width = chunk_mask.shape[1], old.shape[1]
    holes = old == 0  # (b, W)
    free, fed = holes.sum(1), chunk_mask.sum(1)  # (b,)
    into_holes = torch.minimum(free, fed)  # (b,) tokens each row puts into its holes
    rows = index // chunk  # (N,)
    j = index % chunk - (chunk - fed)[rows]  # (N,) the token's place among its row's
    hole_columns = holes.nonzero()[:, 1]  # (holes,) row by row, in order
    first = free.cumsum(0) - free  # (b,) where each row's holes start in hole_columns
    in_hole = j < into_holes[rows]
    if len(hole_columns):
        pick = hole_columns[(first[rows] + j).clamp(max=len(hole_columns) - 1)]
    else:
        pick = torch.zeros_like(j)
    columns = torch.where(in_hole, pick, width + j - into_holes[rows])
    return _Fill(rows, columns, int((fed - into_holes).max()))


def _fill_mask(old: torch.Tensor, fill: _Fill, chunk_mask: torch.Tensor, index: torch.Tensor,
               dtype: torch.dtype) -> torch.Tensor:
    """The additive mask (b, 1, C, W + grow) of a chunk written by `fill`: every query sees its row's real positions
    in `old` (b, W), and the chunk's own tokens at or before it, wherever they were written."""
    chunk = chunk_mask.shape[1]
    grown = F.pad(old, (0, fill.grow))  # (b, W + grow): the new positions masked until the chunk's tokens
    full = _additive_mask(grown, 1, dtype).repeat(1, 1, chunk, 1)  # (b, 1, C, W + grow)
    # the causal part: the token at chunk column c is seen by the queries at columns c and after, (N, C) values
    # written down each token's cache column (no larger than the mask itself, whatever the chunk's length)
    causal = torch.full((chunk, chunk), float("-inf"), dtype=dtype, device=old.device).triu_(1)  # (query, column)
    full[fill.rows, 0, :, fill.columns] = causal[:, index % chunk].T  # (N, C)
    return full


@dataclass
class _Chunk:
    """An observation chunk of (rows x chunk) columns, fed under the engine's attention without paying for its
    padding (a third of the columns at 32 Vault turns, whose observations are ~30 or ~62 tokens):

    - `index` (packed): only the real tokens go through the model, as one sequence (1, N), so that the layers'
      projections, MLPs and norms skip the pads. Each layer's keys and values are scattered back to the rectangle
      the cache keeps (zeros at the pads, masked as ever), or with `fill` into their rows' holes, and the queries
      to the rectangle for attention, whose output is packed again. `index`: the real positions of the
      rectangle, row-major.
    - `levels`: attention in parts (see `_chunk_levels`) rather than every row over the widest row's columns."""

    rows: int
    chunk: int
    index: torch.Tensor | None  # (N,)
    levels: list[_Level] | None
    fill: _Fill | None = None  # packed tokens written into their rows' holes rather than a new rectangle

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(1, H, N, D) packed heads -> (rows, H, chunk, D), zeros at the pads."""
        heads, dim = x.shape[1], x.shape[-1]
        out = x.new_zeros(self.rows * self.chunk, heads, dim)
        out[self.index] = x[0].transpose(0, 1)  # (N, H, D)
        return out.view(self.rows, self.chunk, heads, dim).transpose(1, 2)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(rows, chunk, H, D) -> (1, N, H, D): the real positions only."""
        return x.reshape(self.rows * self.chunk, *x.shape[2:]).index_select(0, self.index)[None]


# the chunk being fed, if it runs packed or in levels: set by TorchSession._forward around the model call, read by the
# cache layers and the attention below (the model passes neither through to both on every transformers version)
_CHUNK: ContextVar[_Chunk | None] = ContextVar("agentrl_chunk", default=None)


def _packed_chunk() -> _Chunk | None:
    """The chunk being fed, if it runs packed."""
    run = _CHUNK.get()
    return run if run is not None and run.index is not None else None


def _unpacked(key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    run = _packed_chunk()
    if run is None:
        return key_states, value_states
    return run.unpack(key_states), run.unpack(value_states)


def _chunk_levels(spans: Sequence[int], width: int, gather_cost: float, call_cost: float) -> list[tuple[int, int]]:
    """How a chunk's attention runs in levels, cheapest first: [(t_prev, t)], each level the columns of the last t
    (but not the last t_prev) for the rows whose span (real columns, counted from the chunk's end) exceeds t_prev.

    The first level takes every row (t_prev 0); a later one gathers its rows' keys and values first. Costs are in
    query-key pairs: a level of r rows and c columns costs r x c x width, plus, when it gathers, `gather_cost` x r x
    width and `call_cost`. [(0, widest span)] is the plain forward's attention."""
    cuts = sorted(set(spans))
    n = len(cuts)
    over = [sum(1 for x in spans if x > t) for t in cuts]  # rows still to cover past each cut
    best = [len(spans) * t * width for t in cuts]  # one level over every row, up to cut j
    prev: list[int | None] = [None] * n
    for j in range(n):
        for i in range(j):
            cost = best[i] + over[i] * ((cuts[j] - cuts[i] + gather_cost) * width) + call_cost
            if cost < best[j]:
                best[j], prev[j] = cost, i
    levels, j = [], n - 1
    while prev[j] is not None:
        levels.append((cuts[prev[j]], cuts[j]))
        j = prev[j]
    return [(0, cuts[j])] + levels[::-1]


def _gather_positions(x: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """out[b, h, w] = x[rows[b], h, positions[b, w]] for a cache layer's keys or values x (B, H, L, D): the
    compaction's gather (`TorchSession._compact`). It copies whole head vectors, as rows of a (positions, D) view of
    x's storage, by one `index_select`: `gather` reads an int64 index per element, and for the tiny policy's 32 x 2 x
    2,000 x 32 cache it took 4.0 against 0.66 ms (the whole cache cloned: 0.6 ms)."""
    b, heads, _, dim = x.shape
    s0, s1, s2, s3 = x.stride()
    if s3 != 1 or s2 != dim or s1 % dim or s0 % dim:  # not laid out as rows of head vectors
        x = x.contiguous()
        s0, s1, s2, s3 = x.stride()
    span = ((x.shape[0] - 1) * s0 + (heads - 1) * s1 + (x.shape[2] - 1) * s2) // dim + 1  # head vectors x reaches
    vectors = x.as_strided((span, dim), (dim, 1))  # (span, D), from x's first element
    index = (rows[:, None, None] * (s0 // dim) + torch.arange(heads, device=x.device)[None, :, None] * (s1 // dim)
             + positions[:, None, :])  # (B', H, W)
    return vectors.index_select(0, index.flatten()).view(*index.shape, dim)


class _RollingLayer(DynamicLayer):
    """A `DynamicLayer` that writes new keys and values into room reserved by its cache (see `_append`)
    instead of concatenating; `keys`/`values` are views of the buffers' leading positions, so every
    other `DynamicLayer` method (selecting rows, cropping) works on them unchanged."""

    def __init__(self, room: _Room):
        super().__init__()
        self.room = room  # the cache's, shared: not the cache itself (see `_RollingCache`)
        self.key_buf: torch.Tensor | None = None  # (B, H, capacity, D)
        self.value_buf: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args,
               **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        run = _packed_chunk()
        if run is not None and run.fill is not None and self.get_seq_length() > 0:
            return self._fill(run.fill, key_states, value_states)
        key_states, value_states = _unpacked(key_states, value_states)
        # the first write sets the layer up as the parent does (its API varies by version)
        if self.get_seq_length() == 0:
            return super().update(key_states, value_states, *args, **kwargs)
        self.keys, self.key_buf = _append(self.keys, self.key_buf, key_states, self.room.length, dim=-2)
        self.values, self.value_buf = _append(self.values, self.value_buf, value_states, self.room.length, dim=-2)
        return self.keys, self.values

    def _fill(self, fill: _Fill, key_states: torch.Tensor,
              value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a packed chunk's keys and values (1, H, N, D) where `fill` puts them; new positions start as zeros
        (finite where a row leaves them masked)."""
        if fill.grow:
            b, heads, _, dim = self.keys.shape
            zeros = self.keys.new_zeros(b, heads, fill.grow, dim)
            self.keys, self.key_buf = _append(self.keys, self.key_buf, zeros, self.room.length, dim=-2)
            self.values, self.value_buf = _append(self.values, self.value_buf, zeros, self.room.length, dim=-2)
        self.keys[fill.rows, :, fill.columns] = key_states[0].transpose(0, 1)  # (N, H, D)
        self.values[fill.rows, :, fill.columns] = value_states[0].transpose(0, 1)
        return self.keys, self.values


class _Room:
    """The length a `_RollingCache`'s layers grow to when they are full, held apart from the cache."""

    __slots__ = ("length",)

    def __init__(self) -> None:
        self.length = 0


class _RollingCache(DynamicCache):
    """A `DynamicCache` of `_RollingLayer`s; `room` is the length each layer grows to when it is full.

    Nothing the cache holds refers back to it: a layer, or a layer factory, holding the cache would make a cycle
    that only Python's cyclic collector frees, and a finished rollout's buffers (hundreds of MB at 32 turns) would
    wait for its rare full collections. At 32 Vault turns a process grew by ~200 MB a round that way, to 3.7 GB
    after 25 rounds, faulting in fresh memory every round (`test_a_finished_session_is_freed_without_the_cyclic_gc`)."""

    def __init__(self) -> None:
        super().__init__()
        self._room = _Room()
        # layers are made on first use; a transformers without this hook keeps plain DynamicLayers (which cannot
        # take a packed chunk)
        self.packs = getattr(self, "layer_class_to_replicate", None) is DynamicLayer
        if self.packs:
            self.layer_class_to_replicate = partial(_RollingLayer, self._room)

    @property
    def room(self) -> int:
        return self._room.length

    @room.setter
    def room(self, length: int) -> None:
        self._room.length = length


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
    runs a small GEMM per block of keys and is bound by that, not by reading the cache: these three passes took
    0.68 against 0.95 ms per layer for the tiny policy's 32 x 1,200 cache in fp32, and made a 32-turn rollout
    round 1.07x faster (docs/benchmarks.md, "Many turns"). The rounding differs from SDPA's in the last bit."""
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
    group (enable_gqa reads it once per query head: a decode step's attention is the cache read from memory, and
    folding cut it from 1.42 to 0.88 ms per layer for the tiny policy's 32 x 1100 cache, 1.79 to 1.30 ms for
    SmolLM2's 8 x 1500). Query head h reads key head h // group, as transformers' repeat_kv lays them out.

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


def _decoder(model: torch.nn.Module) -> torch.nn.Module | None:
    """The causal LM whose decoder layers the engine may call in turn (`_run_layers`): a llama-family model laid out
    as transformers lays it out (embedding, rotary tables, layers, final norm, LM head); None: call the model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft: its layers carry the adapters
    inner = getattr(base, "model", None)
    if getattr(base.config, "model_type", None) not in _GQA_MODELS or inner is None or not hasattr(base, "lm_head"):
        return None
    if not all(hasattr(inner, name) for name in ("embed_tokens", "rotary_emb", "layers", "norm")):
        return None
    return base


# the decoder layers `_layer` runs: pre-norm attention and a SwiGLU MLP, RMSNorm, rotary positions (qwen3: each head's
# query and key normed first)
_LAYERS = {"LlamaDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer"}
_NORMS = {"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"}


def _hub_kernels(model: torch.nn.Module) -> bool:
    """Has the `kernels` library swapped a hub kernel in for any of the model's layers or functions?

    transformers kernelizes every model it loads while `kernels` is installed (its dependency), so `use_kernels` is
    True for any model from disk; on a device without a mapped kernel, or offline, kernelize keeps each module's own
    forward. `kernels`' own inspector lists only what a kernel did replace. Reading the flag instead had kept every
    loaded model off `_layer`: 4% of a 32-turn rollout round (docs/benchmarks.md, "Many turns")."""
    try:
        import kernels
    except ImportError:  # nothing can have been swapped in
        return False
    inspector = getattr(kernels, "get_kernelized_layers", None)
    if inspector is None:  # a kernels too old to say: trust the flag, as before
        return bool(getattr(model, "use_kernels", False))
    found = inspector(model)
    return bool(found.layers or found.funcs)


def _inline_layers(base: torch.nn.Module) -> bool:
    """Can `_layer` run each of the decoder's layers in its place: every layer, norm and activation the kind it
    computes, and no hub kernels swapped in for the model's own forwards?"""
    if getattr(base.config, "hidden_act", None) != "silu" or _hub_kernels(base):
        return False
    for layer in base.model.layers:
        attn = layer.self_attn
        norms = [layer.input_layernorm, layer.post_attention_layernorm] + [
            getattr(attn, n) for n in ("q_norm", "k_norm") if hasattr(attn, n)]
        if (type(layer).__name__ not in _LAYERS or any(type(n).__name__ not in _NORMS for n in norms)
                or hasattr(attn, "q_norm") != (type(layer).__name__ == "Qwen3DecoderLayer")):
            return False
    return True


def _norm(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The llama family's RMSNorm, op for op: normalized in fp32, scaled in the input's dtype. In fp32 throughout,
    torch's own `rms_norm` computes the same numbers in one call where the module runs six ops (checked bit for bit
    by `test_layers_called_in_turn_match_the_model_bit_for_bit`); a bf16 model rounds between the two scalings, which
    `rms_norm` would not."""
    if x.dtype == torch.float32 and module.weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), module.weight, module.variance_epsilon)
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + module.variance_epsilon)
    return module.weight * h.to(x.dtype)


def _linear(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A projection: a plain `nn.Linear` by its weights, anything else (a peft LoRA layer) by calling it."""
    return F.linear(x, module.weight, module.bias) if type(module) is torch.nn.Linear else module(x)


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """The rotary sine with its first half negated, for `_rotate` (once per forward, for every layer)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), -1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions as transformers applies them, x * cos + rotate_half(x) * sin, with rotate_half's negation
    moved onto the sine (`_signed_sin`): (-a) * b and a * (-b) are the same float, and a roll of the halves is one op
    where rotate_half is four."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin


def _layer(layer: torch.nn.Module, hidden: torch.Tensor, mask: torch.Tensor | None, cos: torch.Tensor,
           signed_sin: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
    """One llama-family decoder layer (`_LAYERS`) under the engine's attention: the ops its modules run, in their
    order, called here rather than through its ten module calls, rotary and kernel-hub wrappers. A decode step is
    ~300 small ops where the tiny policy's matmuls take under a millisecond, and the wrappers cost ~0.5 ms of a
    ~3.5 ms step (32 rows, a short cache). `test_layers_called_in_turn_match_the_model_bit_for_bit` holds the
    samples, log-probs and hidden states equal to the model's own forward."""
    attn, mlp = layer.self_attn, layer.mlp
    shape = (*hidden.shape[:-1], -1, attn.head_dim)  # (b, s, heads, D)
    x = _norm(layer.input_layernorm, hidden)
    q, k = _linear(attn.q_proj, x).view(shape), _linear(attn.k_proj, x).view(shape)
    if hasattr(attn, "q_norm"):  # qwen3
        q, k = _norm(attn.q_norm, q), _norm(attn.k_norm, k)
    v = _linear(attn.v_proj, x).view(shape).transpose(1, 2)
    q, k = _rotate(q.transpose(1, 2), cos, signed_sin), _rotate(k.transpose(1, 2), cos, signed_sin)  # (b, heads, s, D)
    k, v = cache.update(k, v, attn.layer_idx)
    out, _ = _gqa_sdpa(attn, q, k, v, mask, scaling=attn.scaling)  # (b, s, heads, D)
    hidden = hidden + _linear(attn.o_proj, out.reshape(*hidden.shape[:-1], -1))
    x = _norm(layer.post_attention_layernorm, hidden)
    return hidden + _linear(mlp.down_proj, F.silu(_linear(mlp.gate_proj, x)) * _linear(mlp.up_proj, x))


def _run_layers(base: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor | None, position_ids: torch.Tensor,
                cache: DynamicCache, cache_kwarg: str, last: torch.Tensor | None,
                inline: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits (b, V) and final hidden states (b, H) that `base(...)` computes at each row's last position (or at
    the packed positions `last` of a (1, N) sequence), calling its modules in turn: the embedding, the rotary tables,
    each decoder layer (`inline`: its ops, `_layer`), the final norm, the LM head. The same ops on the same numbers,
    without the model-level wrappers (output capture, config defaults, deprecated-argument checks), which cost
    ~0.5 ms of a 4-layer decode step's ~6.5 ms on CPU (tests/test_engine_padding.py checks the logits and the cache
    bit for bit)."""
    inner = base.model
    hidden = inner.embed_tokens(ids)
    rotary = inner.rotary_emb(hidden, position_ids)
    if inline:
        cos, signed_sin = rotary[0][:, None], _signed_sin(rotary[1][:, None])  # (b, 1, s, D): broadcast over the heads
    for layer in inner.layers[: inner.config.num_hidden_layers]:
        if inline:
            hidden = _layer(layer, hidden, mask, cos, signed_sin, cache)
        else:
            hidden = layer(hidden, attention_mask=mask, position_ids=position_ids, use_cache=True,
                           position_embeddings=rotary, **{cache_kwarg: cache})
    hidden = inner.norm(hidden[:, -1] if last is None else hidden[0, last])  # (b, H)
    return base.lm_head(hidden), hidden


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


def _additive_mask(mask: torch.Tensor, chunk: int, dtype: torch.dtype) -> torch.Tensor:
    """The (b, 1, C, L) additive mask of a forward feeding `chunk` tokens whose kept mask (b, L), the chunk
    included, is `mask`: 0 where query i may see key j (j real and not after the query), -inf elsewhere.
    The chunk is the cache's last C positions, so query i sits at position L - C + i."""
    b, length = mask.shape
    pad = torch.zeros(b, length, dtype=dtype, device=mask.device).masked_fill_(mask == 0, float("-inf"))  # (b, L)
    if chunk == 1:
        return pad[:, None, None, :]  # (b, 1, 1, L)
    future = torch.full((chunk, chunk), float("-inf"), dtype=dtype, device=mask.device).triu_(1)  # (C, C)
    full = pad[:, None, None, :].repeat(1, 1, chunk, 1)  # (b, 1, C, L)
    full[..., length - chunk :] += future
    return full


class TorchEngine:
    """Generate with a transformers causal LM, keeping each row's KV cache across turns."""

    def __init__(self, model: torch.nn.Module, sampling: SamplingConfig, stop_ids: Sequence[int], eos_id: int,
                 pad_id: int, seed: int | None = None, capture_hidden: bool = False, dtype: str = "auto"):
        """`dtype` bf16: sample from a bf16 copy of `model` (refresh it with `sync_weights` after every update)
        while the trainer keeps its own precision: the gap vLLM in bf16 has against an fp32 learner, on any
        device. auto / fp32: generate from `model` itself, the trainer's weights as they are."""
        # the engine holds its own weights (the trainer syncs them after every update, as vLLM's)
        self.owns_weights = dtype == "bf16"
        self.model = copy.deepcopy(model).to(torch.bfloat16).eval() if self.owns_weights else model
        # Turn critics read the hidden state at the last context token of each turn; it falls out
        # of the forward that produces the turn's first logits, so capturing it costs no pass.
        self.capture_hidden = capture_hidden
        self.sampling = sampling
        self.stop_ids = torch.tensor(sorted(set(stop_ids)), dtype=torch.long)
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        if self.device.type == "cpu":  # the cache lives in host memory: reuse freed blocks, do not fault them in anew
            keep_freed_memory()
        # With holes in the cache, the engine builds the 4D mask itself, additive (0 / -inf) in the model's dtype:
        # transformers would expand the 2D mask to a boolean 4D one every forward, and SDPA converts a boolean mask
        # to an additive one in every layer, a pass over (rows, chunk, cache) each time: 16% of an observation
        # chunk's forward at 32 turns. The same numbers reach the same kernel. Only on CPU (where it was measured)
        # and where every layer is plain causal SDPA (a sliding-window layer needs the model's own mask); None:
        # pass the 2D mask as before.
        self.mask_dtype = (next(self.model.parameters()).dtype
                           if self.device.type == "cpu" and _plain_sdpa(self.model.config) else None)
        # A forward under a mask (every turn's observations, and every decode step once the cache has holes) reaches
        # SDPA with each key and value head copied once per query head sharing it (transformers' repeat_kv: a copy of
        # the whole cache per layer, 20% of an observation chunk's forward at 32 turns, and at one query 1.7 ms of a
        # decode step's attention against 0.4 ms in place for SmolLM2's 8 x 500 cache); on CPU, SDPA reads the shared
        # heads in place (enable_gqa), bit for bit the same.
        # Accelerators keep transformers' path, whose kernels do not all take a mask with grouped heads.
        self.gqa_attention = (_GQA_SDPA if self.mask_dtype is not None
                              and getattr(self.model.config, "model_type", None) in _GQA_MODELS else None)
        # transformers 5 renamed `past_key_values` to `cache`
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model passes kwargs on
        params = inspect.signature(base.forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        # only the last position's logits are sampled from: skip the LM head on the rest of a chunk
        self.last_logits = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        # An observation chunk with padding, under the engine's attention, does not pay for its pads (`_Chunk`): it
        # runs packed, so that the layers' matmuls skip them, and its attention runs in levels (`_chunk_levels`) when
        # some rows' longer observations would make every row attend over their width. At 32 Vault turns a third
        # of the chunk's columns are pads (observations are ~30 or ~62 tokens). This supersedes feeding the longest
        # chunks' heads alone (`_feed_heads`), which costs a forward per row. Level costs in query-key pairs,
        # measured on CPU with the tiny policy (32 rows, 62-column chunks, 2,000 cached positions): gathering a
        # row's keys and values by `index_select` costs ~3.5 pairs per position (25 against 7 ns a pair; advanced
        # indexing took 72 ns), an SDPA call ~6,000 pairs (40 us).
        self.skip_chunk_padding = self.gqa_attention is not None
        # Under the engine's attention the forward calls the decoder's layers in turn (`_run_layers`), not the model.
        self.decoder = _decoder(self.model) if self.gqa_attention is not None else None
        # ... and, for the llama family's own layers, runs each layer's ops itself (`_layer`)
        self.inline_layers = self.decoder is not None and _inline_layers(self.decoder)
        self.level_gather_cost = 3.5
        self.level_call_cost = 6000.0
        # A packed chunk writes each row's tokens into that row's holes before it widens the cache (`_fill_plan`):
        # attention takes keys in any order (each carries its rotary position), so a row's holes from earlier
        # turns' padding are room, not waste. At 32 Vault turns this keeps the cache as wide as its longest row.
        self.fill_holes = True
        # Each row samples from a stream of its own: a counter-based generator keyed by the session
        # and the caller's row index, so a row's tokens do not depend on which rows share its batch
        # (rows join and leave at times set by their tools' latency).
        self.generator = None
        if seed is not None:
            self.generator = torch.Generator().manual_seed(seed)
        self.sessions = 0
        # Planning a turn (TorchSession._plan): cut the batch into runs of rows of similar length where
        # the attention saved outweighs another forward. Costs are in row-positions of one turn's
        # attention: a turn costs about split_cost + rows * (row_cost + cache width). Measured on CPU with
        # the tiny policy: 1.85 ms a forward, 44 us a row a step, 2.9 us a row-position a turn, so a cut
        # costs ~7,000-11,000 row-positions; at 32 Vault turns 12,000 runs 512 forwards a round instead
        # of 624, ~4% faster over 10 alternating rounds, same tokens. On an accelerator a forward costs
        # nearly the same for any number of rows, so the batch is never cut there (it still skips leading
        # holes and freed slots at its edges).
        self.length_buckets = True
        self.split_cost = 12_000.0 if self.device.type == "cpu" else 1e12
        self.row_cost = 156.0
        # one gather of a row-position, against a turn's attention over it (0.25 while the next chunk copied the
        # compacted cache once more; it now gathers into the room of the turns ahead)
        self.compact_cost = 0.1
        # A forward's fixed cost in query-key pairs of attention (TorchSession._feed_heads): ~2 ms against ~5e-5 ms a
        # pair, measured on CPU with the tiny policy; an accelerator pays for a forward, not for its rows: never split.
        self.head_cost = 40_000.0 if self.device.type == "cpu" else 1e12
        # Rows that start with the same prompt (a GRPO group's G samples) are prefilled once and their keys and
        # values copied to each row (TorchSession._share_prefill); rollout.share_prefill turns it off.
        self.share_prefill = True
        self.min_shared_prefix = 16  # a prefix common to different prompts is run once when at least this long

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy the learner's current weights into the engine's own bf16 copy (dtype bf16 only)."""
        if not self.owns_weights:
            raise ValueError("this engine generates from the trainer's own weights: nothing to sync")
        with torch.no_grad():
            self.model.load_state_dict(model.state_dict())  # copy_ casts each tensor to the copy's bf16

    def state_dict(self) -> dict[str, Any]:
        """Where the sampler stands (its session-key generator and the number of sessions opened): a
        resumed run's next session then draws the key, and so the tokens, the uninterrupted run would."""
        return {"generator": None if self.generator is None else self.generator.get_state(), "sessions": self.sessions}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["generator"] is None) != (self.generator is None):
            raise ValueError("engine state: saved from an engine "
                             + ("without" if state["generator"] is None else "with")
                             + " a seed, loaded into one " + ("without" if self.generator is None else "with") + " one")
        if self.generator is not None:
            self.generator.set_state(state["generator"])
        self.sessions = int(state["sessions"])

    def open(self, prompts: Sequence[Sequence[int]]) -> TorchSession:
        # the session's key: the engine's seed and the number of sessions before it (or torch's own RNG without a seed)
        key = int(torch.randint(0, 2**62, (1,), generator=self.generator))
        self.sessions += 1
        return TorchSession(self, [list(p) for p in prompts], key)


class _WindowLayer(DynamicLayer):
    """Rows lo:hi and positions start: of a session's cache buffers, as one layer of a cache of its
    own: what the model appends is written straight into the session's buffers (no copy in or out)."""

    def __init__(self, key_buf: torch.Tensor, value_buf: torch.Tensor, length: int):
        super().__init__()
        self.key_buf, self.value_buf = key_buf, value_buf  # (b, H, room, D) views of the session's buffers
        self.keys, self.values = key_buf.narrow(-2, 0, length), value_buf.narrow(-2, 0, length)
        self.device = key_buf.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args,
               **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        key_states, value_states = _unpacked(key_states, value_states)
        n, m = self.keys.shape[-2], key_states.shape[-2]
        if n + m > self.key_buf.shape[-2]:  # the session reserves a turn's room first: a bug, not an input
            raise RuntimeError(f"cache window full: {n} + {m} positions in room for {self.key_buf.shape[-2]}")
        self.key_buf.narrow(-2, n, m).copy_(key_states)
        self.value_buf.narrow(-2, n, m).copy_(value_states)
        self.keys, self.values = self.key_buf.narrow(-2, 0, n + m), self.value_buf.narrow(-2, 0, n + m)
        return self.keys, self.values


@dataclass
class _Group:
    """The slots lo:hi that one turn's forwards run on, over cache positions start: onwards."""

    lo: int
    hi: int
    start: int
    cache: Any
    mask: torch.Tensor  # (b, L - start) 1 = real token
    mask_buf: torch.Tensor | None
    holes: bool
    window: bool  # a view of the session's buffers (else the session's own cache and mask)
    # the decode steps' additive mask (b, 1, 1, L - start), kept across the turn's steps (`_decode_mask`)
    additive: torch.Tensor | None = None
    additive_buf: torch.Tensor | None = None


def _common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    """The length of the longest prefix every sequence starts with."""
    n = min(len(q) for q in seqs)
    for i in range(n):
        if any(q[i] != seqs[0][i] for q in seqs[1:]):
            return i
    return n


def _fit(view: torch.Tensor, buf: torch.Tensor | None, need: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`view` as the leading part of a buffer with room for `need` positions along `dim`, zero past the
    view (so that positions no forward writes hold finite numbers); reallocates only when short."""
    length = view.shape[dim]
    if not _leading(view, buf, dim) or buf.shape[dim] < need:
        shape = list(view.shape)
        shape[dim] = need + length // 4  # a quarter more: the next turns grow into it
        buf = view.new_zeros(shape)
        buf.narrow(dim, 0, length).copy_(view)
    else:
        buf.narrow(dim, length, need - length).zero_()
    return buf.narrow(dim, 0, length), buf


class TorchSession:
    """A batch of rows in slots of one rectangular cache.

    Rows need not move together: `generate(rows)` decodes only the rows named (the others stay as
    they are), so a row whose observation has arrived need not wait for the rest; `drop(rows)` frees
    a finished row's slot without touching the cache, and `add(rows, prompts)` puts new rows into
    free slots (continuous batching): the new row's old slot contents are masked out and its prompt
    is prefilled by its first `generate`. Positions come from each row's own count of real tokens,
    never from the cache index, so moving keys changes nothing.

    Rows of very different lengths (a refilled batch holds fresh episodes beside old ones) would make
    every forward attend over the longest row's width. So each turn is planned (`_plan`): the slots
    are cut into contiguous runs, each decoded over a window of the cache that starts at its own
    earliest real position (`_WindowLayer`: views, no copies), where the saved attention outweighs
    the cost of another forward; the cut is chosen exactly (a partition over the slot order) from a
    cost model of a turn, `split_cost` + rows * (`row_cost` + width). When sorting the rows by length
    and squeezing out the holes (`_compact`: one gather of the cache) would save more than it costs,
    the slots are first reordered that way, longest first, freed slots last.

    Holes also fill up as the rows go: a turn's observations, left-padded to the longest, leave holes in the
    shorter rows, and the next packed chunk writes each row's tokens into its own holes first (`_fill_plan`), so
    that the cache widens only by what the row needing most room lacks. Attention does not care where a key sits:
    the keys carry their positions, the mask says which a query sees.
    """

    turn_level = True  # generate() decodes whole actions: rows join and leave between calls

    def __init__(self, engine: TorchEngine, prompts: list[list[int]], key: int = 0):
        self.engine = engine
        dev = engine.device
        self.key = key
        self.slot_rows: list[int | None] = list(range(len(prompts)))  # the caller's row in each slot (None: free)
        self.order: list[int] = list(range(len(prompts)))  # the caller's rows in the order `rows` lists them
        self.drawn = torch.zeros(len(prompts), dtype=torch.long, device=dev)  # (B,) tokens each row has sampled
        # not fed yet: a reused slot's old positions are masked out at its first feed
        self.fresh = [True] * len(prompts)
        self.cache: DynamicCache = _RollingCache()
        self.mask = torch.zeros(len(prompts), 0, dtype=torch.long, device=dev)  # (B, L) 1 = real token
        self.mask_buf: torch.Tensor | None = None  # (B, capacity): `mask` is its leading part
        self.room = 0  # cache length to reserve room for at the next growth
        self.holes = False  # is any cached position masked (padding, a stopped row's pad)?
        self.pos = torch.zeros(len(prompts), dtype=torch.long, device=dev)  # (B,) real tokens so far
        self.pending: list[list[int]] = prompts  # tokens each row has not yet fed to the model
        self.tokens_fed = 0  # padded positions run through the model (for throughput accounting)
        self.tokens_packed_out = 0  # ... of them padding that skipped the layers' matmuls (a packed chunk, _Chunk)
        self.chunks_in_levels = 0  # chunks whose attention ran in more than one level (_chunk_levels)
        self.chunks_filled = 0  # chunks written into their rows' holes (_fill_plan)
        self.forwards = 0  # model forwards run (prefills of shared prompts not counted)
        # cache positions the forwards attended over (rows x width, summed over forwards), and of them masked holes
        self.positions_attended = 0
        self.positions_padding = 0
        # query-key pairs the attention computed (rows x chunk x cache width) and of them the real ones (a real query
        # and a real key it may see), for chunks (more than one query) and decode steps apart: the share of the
        # attention's time that padding costs, which bounds what removing it can gain (benchmarks/multi_turn.py)
        self.attention_pairs: dict[str, list[int]] = {"chunk": [0, 0], "decode": [0, 0]}
        self.groups_run = 0  # turns' forwards run on a window of the cache (a run of slots), for tests and benchmarks
        self.compactions = 0
        self.heads_fed = 0  # long chunks whose leading tokens ran in a forward of their own (_feed_heads)
        self.prefill_tokens = 0  # prompt tokens the model ran for rows joining the batch (real, not padding)
        self.prefill_saved = 0  # ... and those it did not run because another row's prompt shared them
        self.turn_hidden: torch.Tensor | None = None
        self.started: list[int] = []
        self._group: _Group | None = None

    @property
    def rows(self) -> list[int]:
        """The caller's index of every row in the batch (positions for `keep`): in the order they were
        added, whatever slots they occupy."""
        return list(self.order)

    @property
    def cache_len(self) -> int:
        return self.mask.shape[1]

    def _slots(self, rows: Sequence[int] | None) -> list[int]:
        where = {r: s for s, r in enumerate(self.slot_rows) if r is not None}
        if rows is None:
            return [where[r] for r in self.order]
        missing = [r for r in rows if r not in where]
        if missing:
            raise KeyError(f"rows {missing} are not in this session")
        return [where[r] for r in rows]

    def _forward(self, ids: torch.Tensor, chunk_mask: torch.Tensor, hidden: bool = False,
                 fill: bool = False) -> torch.Tensor:
        """The logits (b, V) at each row's last fed token. `fill`: every row of the group feeds real tokens, so a
        packed chunk may write them into its rows' holes (`_fill_plan`)."""
        g, eng, chunk = self._group, self.engine, ids.shape[1]
        if chunk > 1:  # each row's span: its columns from the first real one to the chunk's end (one host sync)
            *spans, real, ends_real = torch.cat([chunk - chunk_mask.argmax(1),  # argmax: the first maximum
                                                 chunk_mask.sum()[None], chunk_mask[:, -1].sum()[None]]).tolist()
            full = real == ids.numel()
        else:
            full = True if g.holes else bool(chunk_mask.all())
        plan, fill_mask = None, None
        if (fill and chunk > 1 and not full and g.holes and not g.window and ends_real == len(spans) and eng.fill_holes
                and eng.skip_chunk_padding and eng.mask_dtype is not None and eng.last_logits
                and isinstance(g.cache, _RollingCache) and g.cache.packs):
            index = chunk_mask.flatten().nonzero().squeeze(1)  # (N,)
            plan = _fill_plan(g.mask, chunk_mask, index)
            fill_mask = _fill_mask(g.mask, plan, chunk_mask, index, eng.mask_dtype)  # from the mask before the chunk
            grown = g.mask.new_zeros(g.mask.shape[0], plan.grow)
            g.mask, g.mask_buf = _append(g.mask, g.mask_buf, grown, self.room, dim=1)  # (b, W + grow)
            g.mask[plan.rows, plan.columns] = 1
            self.chunks_filled += 1
        elif g.window:  # written in place: the room was reserved (an empty window has no data pointer to check)
            n, c = g.mask.shape[1], chunk_mask.shape[1]
            if n + c > g.mask_buf.shape[1]:
                raise RuntimeError("cache window full: the turn's room was not reserved")  # a bug, not an input
            g.mask_buf.narrow(1, n, c).copy_(chunk_mask)
            g.mask = g.mask_buf.narrow(1, 0, n + c)  # (b, L - start + C)
        else:
            g.mask, g.mask_buf = _append(g.mask, g.mask_buf, chunk_mask, self.room, dim=1)  # (B, L + C)
        pos = self.pos[g.lo : g.hi]  # a view: updated in place
        pos_ids = (pos[:, None] + chunk_mask.cumsum(1) - 1).clamp(min=0)  # (b, C)
        width = g.mask.shape[1]
        # An all-ones mask is one that transformers checks (a reduction, a host sync) and then
        # drops: until the first hole, pass none; the model runs the same kernels on the same numbers.
        g.holes = g.holes or not full
        past = width > chunk  # a chunk after cached positions: transformers materializes a mask even without holes
        mask, attention = None, None
        if eng.mask_dtype is None:
            mask = g.mask if g.holes else None
        elif fill_mask is not None:
            mask, attention = fill_mask, eng.gqa_attention
        elif g.holes or (chunk > 1 and past):
            mask = _additive_mask(g.mask, chunk, eng.mask_dtype) if chunk > 1 else self._decode_mask(chunk_mask)
            attention = eng.gqa_attention  # a decode step too: repeat_kv at one query is most of SDPA's cost
        elif chunk == 1:
            attention = eng.gqa_attention  # no mask: the group's heads still fold into one read of the cache
        fed = chunk_mask.sum(1)  # (b,) real tokens each row feeds
        run, keep, model_ids, model_pos = None, eng.last_logits, ids, pos_ids
        computed = ids.shape[0] * chunk * width  # query-key pairs the attention computes
        if chunk > 1 and not full and attention is not None and eng.skip_chunk_padding:
            run, computed = self._chunk_run(chunk_mask, spans, ends_real == len(spans), mask, plan)
            if run.index is not None:
                keep = {"logits_to_keep": fed.cumsum(0) - 1}  # (b,) each row's last token, packed
                model_ids, model_pos = ids.flatten()[run.index][None], pos_ids.flatten()[run.index][None]  # (1, N)
        packed = run is not None and run.index is not None
        token = _CHUNK.set(run)
        try:
            with _attention(eng.model, attention):
                if attention is not None and eng.decoder is not None:
                    logits, last_hidden = _run_layers(eng.decoder, model_ids, mask, model_pos, g.cache,
                                                      eng.cache_kwarg, keep["logits_to_keep"] if packed else None,
                                                      eng.inline_layers)
                else:
                    out = eng.model(
                        input_ids=model_ids, attention_mask=mask, position_ids=model_pos, use_cache=True,
                        output_hidden_states=hidden, **{eng.cache_kwarg: g.cache}, **keep,
                    )
                    logits = out.logits[0] if packed else out.logits[:, -1]  # (b, V): each row's last token
                    last_hidden = (out.hidden_states[-1][0, keep["logits_to_keep"]] if packed
                                   else out.hidden_states[-1][:, -1]) if hidden else None
        finally:
            _CHUNK.reset(token)
        pos += fed
        self.tokens_fed += ids.numel()
        self.forwards += 1
        real = g.mask.sum(1)  # (b,) real positions, the chunk's included
        before = (real - fed)[:, None]  # (b, 1) ... before the chunk
        # one host sync for both counts: real positions, and query-key pairs a real query may see
        kept, seen = torch.stack([real.sum(), (chunk_mask * (before + chunk_mask.cumsum(1))).sum()]).tolist()
        self.positions_attended += ids.shape[0] * width
        self.positions_padding += ids.shape[0] * width - kept
        pairs = self.attention_pairs["chunk" if chunk > 1 else "decode"]
        pairs[0] += computed
        pairs[1] += seen
        if packed:
            self.tokens_packed_out += ids.numel() - len(run.index)
        if hidden:  # the state at the last context token, which a turn critic reads
            self.turn_hidden = last_hidden.float()  # (b, H)
        return logits  # (b, V)

    def _decode_mask(self, column: torch.Tensor) -> torch.Tensor:
        """The additive mask (b, 1, 1, L) of a decode step whose fed column (b, 1) the group's mask now ends with:
        the previous step's, with that column appended into room reserved for the turn's steps. Building it afresh
        from the (b, L) mask at every step took ~0.14 ms of a ~12 ms step at 32 Vault turns."""
        g, dtype = self._group, self.engine.mask_dtype
        b, width = g.mask.shape
        if g.additive is None or g.additive.shape[-1] != width - 1 or g.additive.dtype != dtype:
            # the turn's first step: as `_additive_mask` makes it, in a buffer with room for the turn's other steps
            buf = g.mask.new_empty(b, 1, 1, width + self.engine.sampling.max_new_tokens, dtype=dtype)
            g.additive, g.additive_buf = buf.narrow(-1, 0, width).copy_(_additive_mask(g.mask, 1, dtype)), buf
            return g.additive
        new = torch.zeros(b, 1, 1, 1, dtype=dtype, device=column.device)
        new.masked_fill_(column[:, None, None] == 0, float("-inf"))  # (b, 1, 1, 1)
        g.additive, g.additive_buf = _append(g.additive, g.additive_buf, new, 0, dim=-1)
        return g.additive

    def _chunk_run(self, chunk_mask: torch.Tensor, spans: list[int], ends_real: bool,
                   mask: torch.Tensor, fill: _Fill | None = None) -> tuple[_Chunk, int]:
        """How a chunk with padding runs (`_Chunk`), and the query-key pairs its attention computes. Packed when the
        group's cache layers take it and every row ends in a real token (the newest, sampled from); in levels
        when they cost less than one attention over the rectangle (`_chunk_levels`). Written by `fill`, the chunk's
        keys may sit anywhere in the cache, so every level attends over all of it."""
        eng, g = self.engine, self._group
        rows, chunk = chunk_mask.shape
        width = mask.shape[-1]
        ours = g.cache.packs if isinstance(g.cache, _RollingCache) else all(
            isinstance(layer, _WindowLayer) for layer in g.cache.layers)
        index = None
        if ours and ends_real and eng.last_logits:
            index = chunk_mask.flatten().nonzero().squeeze(1)  # (N,)
        cuts = _chunk_levels(spans, width, eng.level_gather_cost, eng.level_call_cost)
        levels, computed = [], 0
        for before, upto in cuts:
            lo, hi, keys = chunk - upto, chunk - before, width - (before if fill is None else 0)
            if before == 0:
                take, level_mask = None, mask[:, :, lo:hi, :keys]
                computed += rows * (hi - lo) * keys
            else:
                take = torch.tensor([r for r, n in enumerate(spans) if n > before], dtype=torch.long,
                                    device=mask.device)
                level_mask = mask[take, :, lo:hi, :keys]
                computed += len(take) * (hi - lo) * keys
            levels.append(_Level(take, lo, hi, level_mask.contiguous()))
        if len(levels) == 1 and levels[0].lo == 0:  # one level over the whole rectangle: the plain attention
            levels = None
        elif len(levels) > 1:
            self.chunks_in_levels += 1
        if fill is not None and index is None:
            raise RuntimeError("a chunk written into holes must run packed")  # _forward checked what packing needs
        return _Chunk(rows, chunk, index, levels, fill), computed

    def _layers(self) -> list[Any]:
        return [layer for layer in getattr(self.cache, "layers", []) if layer.get_seq_length() > 0]

    def _compact(self, order: Sequence[int] | None = None) -> None:
        """Drop the masked holes: each row's real positions, in order, right-aligned in a cache as
        long as the longest row's (one gather of every layer). With `order`, slot i afterwards holds
        what slot order[i] held. A free slot keeps nothing."""
        B = len(self.slot_rows)
        perm = list(range(B)) if order is None else list(order)
        idx_rows = torch.tensor(perm, dtype=torch.long, device=self.engine.device)
        live = torch.tensor([self.slot_rows[s] is not None for s in perm], device=self.engine.device)
        real = self.mask.bool()[idx_rows] & live[:, None]  # (B, L)
        width = int(real.sum(1).max()) if real.numel() else 0
        # a stable sort puts each row's holes first and its real positions after, in their order
        idx = torch.argsort(real.int(), dim=1, stable=True)[:, real.shape[1] - width :]  # (B, W)
        self.mask, self.mask_buf = real.gather(1, idx).long(), None
        # the gather also fills the room of the turns ahead (copies of a row's first key, finite and never attended
        # to before a forward overwrites them), so that the next chunk does not copy the compacted cache again
        room = self._room_ahead(width) if width else 0
        idx_room = torch.cat([idx, idx[:, :1].expand(-1, room)], 1) if room else idx  # (B, W + room)
        for layer in self._layers():
            keys, values = (_gather_positions(t, idx_rows, idx_room) for t in (layer.keys, layer.values))
            layer.keys, layer.values = keys.narrow(2, 0, width), values.narrow(2, 0, width)
            if isinstance(layer, _RollingLayer):
                layer.key_buf, layer.value_buf = keys, values
        if order is not None:
            self.pos, self.drawn = self.pos[idx_rows], self.drawn[idx_rows]
            self.slot_rows = [self.slot_rows[s] for s in perm]
            self.pending = [self.pending[s] for s in perm]
            self.fresh = [self.fresh[s] for s in perm]
        self.turn_hidden = None
        self.compactions += 1

    def _room_ahead(self, length: int) -> int:
        """Positions to reserve past a cache of `length`: the next chunk, the longest action, and a quarter more."""
        widest = max((len(p) for p in self.pending), default=0)
        return widest + self.engine.sampling.max_new_tokens + (length + widest) // 4

    def _partition(self, starts: list[int | None], length: int) -> tuple[float, list[tuple[int, int, int]]]:
        """The cheapest cut of the slots into runs, each decoded over cache positions from its
        earliest start: (cost, [(lo, hi, start)]). `starts[s]` is where slot s's real positions
        begin, None for a slot not decoded (a run may hold it, at its cost, or leave it out)."""
        eng = self.engine
        B = len(starts)
        step = max(1, -(-B // 128))  # cut between blocks of slots: the search is quadratic in their number
        edges = list(range(0, B, step)) + [B]
        lows = []
        for a, b in zip(edges, edges[1:]):
            known = [s for s in starts[a:b] if s is not None]
            lows.append(min(known) if known else None)
        n = len(lows)
        best, cut, first = [0.0] + [float("inf")] * n, [0] * (n + 1), [None] * (n + 1)
        for j in range(1, n + 1):
            low = None
            for i in range(j - 1, -1, -1):
                if lows[i] is not None:
                    low = lows[i] if low is None else min(low, lows[i])
                rows = edges[j] - edges[i]
                c = best[i] + (0.0 if low is None else eng.split_cost + rows * (eng.row_cost + length - low))
                if c < best[j]:
                    best[j], cut[j], first[j] = c, i, low
        runs, j = [], n
        while j > 0:
            if first[j] is not None:
                runs.append((edges[cut[j]], edges[j], first[j]))
            j = cut[j]
        return best[n], runs[::-1]

    def _plan(self, slots: list[int]) -> list[tuple[int, int, int]]:
        """The runs of slots this turn's forwards go over, as (lo, hi, start): see the class doc."""
        B, length = len(self.slot_rows), self.cache_len
        layers = getattr(self.cache, "layers", [])
        windows = (self.engine.length_buckets and length > 0 and isinstance(self.cache, _RollingCache) and layers
                   and all(isinstance(layer, _RollingLayer) and layer.get_seq_length() == length for layer in layers))
        if not windows:
            if self.holes and length > 64 and 2 * int(self.mask.sum(1).max()) < length:
                self._compact()
            return [(0, B, 0)]
        real = self.mask.bool()
        counts = real.sum(1).tolist()
        firsts = torch.where(real.any(1), real.int().argmax(1), length).tolist()
        active = set(slots)
        now, runs = self._partition([firsts[s] if s in active else None for s in range(B)], length)
        # the same turn after sorting the live rows by length and squeezing out every hole
        live = [s for s in range(B) if self.slot_rows[s] is not None]
        live.sort(key=lambda s: -counts[s])  # stable: ties keep their slot order
        order = live + [s for s in range(B) if self.slot_rows[s] is None]
        width = max((counts[s] for s in live), default=0)
        sorted_starts = [width - counts[s] if s in active else None for s in order]
        after, sorted_runs = self._partition(sorted_starts, width)
        if width > 0 and now - after > self.engine.compact_cost * B * length:
            self._compact(order)
            runs = sorted_runs
        return runs

    def _prepare(self, slots: list[int]) -> list[int]:
        """Check every slot has something to feed and clear the reused ones; returns the slots joining the batch."""
        joining = []
        for s in slots:
            if not self.pending[s]:
                raise ValueError(f"row {self.slot_rows[s]} has nothing to feed: extend() it with its observation "
                                 "before generate()")
            if self.fresh[s]:  # a reused slot: the previous row's positions are holes to the new one
                if self.cache_len:
                    self.mask[s] = 0
                    self.holes = True
                self.pos[s] = 0
                self.fresh[s] = False
                joining.append(s)
        return joining

    def _share_prefill(self, joining: list[int], slots: list[int]) -> None:
        """Prefill the prompts of the rows joining the batch once per distinct prompt, not once per row.

        A GRPO group's G rows start from one prompt: each distinct prompt (all but its last token) runs
        through the model in a cache of its own, and its keys and values are copied into every slot that
        starts with it (keys carry their rotary position, which is the row's own count, so where they sit in
        the cache changes nothing). A prefix common to all the distinct prompts (a system prompt and its
        tools), `min_shared_prefix` tokens or more, runs once for all of them. The last prompt token stays
        pending: the turn's first forward feeds it and samples from its logits, as without sharing. The
        samples are the unshared engine's up to the last bit of a matmul run at another batch size
        (tests/test_engine_prefix.py counts the flips)."""
        eng = self.engine
        heads = {s: tuple(self.pending[s][:-1]) for s in joining}
        self.prefill_tokens += sum(len(self.pending[s]) for s in joining)
        unique = list(dict.fromkeys(h for h in heads.values() if h))
        prefix = _common_prefix(unique) if len(unique) > 1 else 0
        prefix = prefix if prefix >= eng.min_shared_prefix else 0
        run = prefix + sum(len(h) - prefix for h in unique)  # head tokens the shared prefill runs
        saved = sum(len(h) for h in heads.values()) - run
        if not eng.share_prefill or saved < eng.min_shared_prefix or not isinstance(self.cache, _RollingCache):
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
        self.tokens_fed += prefix + len(unique) * width
        # every slot gets the new positions: the joining rows their prompt's, the rest masked holes
        B, length, span = len(self.slot_rows), self.cache_len, prefix + width
        which = {h: u for u, h in enumerate(unique)}
        takers = [s for s in joining if heads[s]]
        dst = torch.tensor(takers, dtype=torch.long, device=dev)
        src = torch.tensor([which[heads[s]] for s in takers], dtype=torch.long, device=dev)
        rest = max([1] + [len(self.pending[s]) for s in slots if s not in heads])
        self.room = self.cache.room = length + span + rest + eng.sampling.max_new_tokens
        for i, layer in enumerate(own.layers):
            keys = layer.keys.new_zeros(B, *layer.keys.shape[1:])  # (B, H, P + W, D)
            values = layer.values.new_zeros(B, *layer.values.shape[1:])
            keys[dst], values[dst] = layer.keys[src], layer.values[src]
            self.cache.update(keys, values, i)
        new = mask.new_zeros(B, span)  # (B, P + W)
        new[dst] = mask[src]
        self.mask, self.mask_buf = _append(self.mask, self.mask_buf, new, self.room, dim=1)
        self.holes = self.holes or not bool(new.all())
        for s in takers:
            self.pos[s] = len(heads[s])
            self.pending[s] = self.pending[s][-1:]
        self.prefill_tokens -= saved
        self.prefill_saved += saved

    def _open(self, lo: int, hi: int, start: int, window: bool) -> _Group:
        if not window:
            return _Group(0, len(self.slot_rows), 0, self.cache, self.mask, self.mask_buf, self.holes, False)
        length = self.cache_len
        win = DynamicCache()
        win.layers = [_WindowLayer(layer.key_buf[lo:hi, :, start:], layer.value_buf[lo:hi, :, start:], length - start)
                      for layer in self.cache.layers]
        mask_buf = self.mask_buf[lo:hi, start:]
        return _Group(lo, hi, start, win, mask_buf[:, : length - start], mask_buf, True, True)

    @torch.inference_mode()
    def generate(self, forced: Sequence[Sequence[int]] | None = None,
                 rows: Sequence[int] | None = None) -> list[Generation]:
        """One action for each of `rows` (default: every row), in that order; the other rows stay as
        they are. `forced` (one token list per row) replaces sampling by those tokens (teacher
        forcing: same forwards, same log-probs; for replaying episodes and benchmarks)."""
        cfg = self.engine.sampling
        wanted = list(self.order if rows is None else rows)
        slots = self._slots(wanted)
        if not slots:
            return []
        if forced is not None:
            forced = list(forced)
            if len(forced) != len(wanted):
                raise ValueError(f"generate() got {len(forced)} forced actions for {len(wanted)} rows")
        joining = self._prepare(slots)
        self._share_prefill(joining, slots)
        runs = self._plan(slots)
        slots = self._slots(wanted)  # the plan may have moved rows to other slots
        B, length = len(self.slot_rows), self.cache_len
        if len(runs) == 1 and runs[0][:2] == (0, B) and 4 * runs[0][2] < length:
            # one run over every slot that would skip under a quarter of the cache: the window's per-step
            # bookkeeping costs more than the skipped columns save (kv_cache.py's equal-length rows: 18% slower)
            runs = [(0, B, 0)]
        window = runs != [(0, B, 0)]
        if window:  # room for every run's chunk and longest action, before any run writes into it
            widest = max(len(self.pending[s]) for s in slots)
            need = length + widest + cfg.max_new_tokens
            for layer in self.cache.layers:
                layer.keys, layer.key_buf = _fit(layer.keys, layer.key_buf, need, dim=-2)
                layer.values, layer.value_buf = _fit(layer.values, layer.value_buf, need, dim=-2)
            self.mask, self.mask_buf = _fit(self.mask, self.mask_buf, need, dim=1)
        by_slot = dict(zip(slots, forced)) if forced is not None else None
        out: dict[int, Generation] = {}
        span = 0
        for lo, hi, start in runs:
            self._group = g = self._open(lo, hi, start, window)
            self._turn(g, set(slots), by_slot, out)
            span = max(span, g.mask.shape[1] - (length - g.start))
            if not window:
                self.mask, self.mask_buf, self.holes = g.mask, g.mask_buf, g.holes
        self._group = None
        if window:
            self.mask = self.mask_buf.narrow(1, 0, length + span)
            for layer in self.cache.layers:
                layer.keys = layer.key_buf.narrow(-2, 0, length + span)
                layer.values = layer.value_buf.narrow(-2, 0, length + span)
            self.holes = True
            self.groups_run += len(runs)
        return [out[s] for s in slots]

    def _feed_heads(self, g: _Group, slots: list[int], width: int) -> int:
        """Feed the leading tokens of the turn's longest chunks first, each row alone, when that is cheaper than
        padding every row's chunk to the longest; returns the width the batch's chunk keeps (`width`: none fed).

        A chunk forward costs about rows x chunk width x cache width (every query attends over the whole cache),
        so one long observation (an error message, a tool's long output) makes every row pay for its length. Its
        head runs instead in a forward of its own, over its row's window of the cache, right-aligned against the
        batch's chunk, which then keeps `tail` columns: the cache gains the same `width` positions either way, the
        head rows' first ones holes like any padding. Chosen under `head_cost`, a forward's fixed cost in
        query-key pairs: the k longest chunks alone, for the k that costs least (k = 0: as before)."""
        eng = self.engine
        length = self.cache_len
        layers = getattr(self.cache, "layers", [])
        if (g.window or eng.skip_chunk_padding or not length or not layers or not isinstance(self.cache, _RollingCache)
                or not all(isinstance(layer, _RollingLayer) and layer.get_seq_length() == length for layer in layers)):
            return width
        sizes = sorted((len(self.pending[s]) for s in slots), reverse=True)
        rows = g.hi - g.lo
        tail, best = width, float(rows * width * length)
        for cut in sorted(set(sizes[1:]), reverse=True):
            cost = rows * cut * length + sum(eng.head_cost + (n - cut) * length for n in sizes if n > cut)
            if cost < best:
                tail, best = cut, cost
        if tail == width:
            return width
        gap = width - tail
        need = length + width + eng.sampling.max_new_tokens  # the turn's room, zero past the cache
        for layer in layers:
            layer.keys, layer.key_buf = _fit(layer.keys, layer.key_buf, need, dim=-2)
            layer.values, layer.value_buf = _fit(layer.values, layer.value_buf, need, dim=-2)
        self.mask, self.mask_buf = _fit(self.mask, self.mask_buf, need, dim=1)
        for s in slots:
            head = self.pending[s][:-tail]
            if not head:
                continue
            start = length + gap - len(head)  # the head ends where the batch's chunk begins
            win = DynamicCache()
            win.layers = [_WindowLayer(layer.key_buf[s : s + 1], layer.value_buf[s : s + 1], start) for layer in layers]
            mask_buf = self.mask_buf[s : s + 1]
            self._group = _Group(s, s + 1, 0, win, mask_buf[:, :start], mask_buf, True, True)
            ids = torch.tensor([head], dtype=torch.long, device=eng.device)  # (1, h)
            self._forward(ids, torch.ones_like(ids))
            self.pending[s] = self.pending[s][-tail:]
            self.heads_fed += 1
        self._group = g
        for layer in layers:
            layer.keys = layer.key_buf.narrow(-2, 0, length + gap)
            layer.values = layer.value_buf.narrow(-2, 0, length + gap)
        g.mask = self.mask = self.mask_buf.narrow(1, 0, length + gap)
        g.mask_buf, g.holes = self.mask_buf, True
        return tail

    def _turn(self, g: _Group, wanted: set[int], forced: dict[int, Sequence[int]] | None,
              out: dict[int, Generation]) -> None:
        """Decode one action for each wanted slot in g.lo:g.hi; the group's other slots feed masked pads."""
        eng, cfg = self.engine, self.engine.sampling
        b, dev, length = g.hi - g.lo, eng.device, self.cache_len
        slots = [s for s in range(g.lo, g.hi) if s in wanted]
        local = [s - g.lo for s in slots]
        active = torch.zeros(b, dtype=torch.bool, device=dev)
        active[local] = True
        width = max(len(self.pending[s]) for s in slots)
        tail = self._feed_heads(g, slots, width)  # the chunk's last `tail` columns; the rest fed already
        ids = torch.full((b, tail), eng.pad_id, dtype=torch.long, device=dev)  # (b, C)
        m = torch.zeros_like(ids)
        for s in slots:  # left-pad: the last column is every row's newest token
            chunk = self.pending[s]
            ids[s - g.lo, tail - len(chunk) :] = torch.tensor(chunk, dtype=torch.long)
            m[s - g.lo, tail - len(chunk) :] = 1
            self.pending[s] = []
        # A row not decoded may see no real position in its window (a free or fresh slot, or one whose
        # positions begin before the window): it would attend to nothing (NaN, which its masked positions
        # would then hold). Its pad sees itself during the turn; that position is masked again after it.
        idle = ~active
        m[idle, -1] = 1
        before = self.pos[g.lo : g.hi].clone()
        # room for this chunk and the longest action: no growth while decoding this turn; a quarter more, so that
        # the next turns grow into it instead of copying the whole cache at every turn's chunk
        need = length + width + cfg.max_new_tokens
        self.room = need + need // 4
        if isinstance(self.cache, _RollingCache):
            self.cache.room = self.room
        logits = self._forward(ids, m, hidden=eng.capture_hidden, fill=len(slots) == b)
        hidden = self.turn_hidden.tolist() if eng.capture_hidden and self.turn_hidden is not None else [None] * b
        if forced is not None:
            forced_t = torch.full((b, cfg.max_new_tokens), eng.pad_id, dtype=torch.long, device=dev)
            for s in slots:
                f = forced[s]
                forced_t[s - g.lo, : len(f)] = torch.tensor(f[: cfg.max_new_tokens], dtype=torch.long)
        tokens = torch.full((b, cfg.max_new_tokens), eng.pad_id, dtype=torch.long, device=dev)  # (b, N)
        logps = torch.zeros(b, cfg.max_new_tokens, device=dev)  # (b, N)
        done = idle.clone()  # rows not asked for feed masked pads throughout
        count = torch.zeros(b, dtype=torch.long, device=dev)
        stop_ids = eng.stop_ids.to(dev)
        stream = torch.tensor([self.key + (-1 if r is None else r) * 1_000_003 for r in self.slot_rows[g.lo : g.hi]],
                              dtype=torch.long, device=dev)  # (b,)
        drawn = self.drawn[g.lo : g.hi]  # a view: updated in place
        # a row draws at every step until it stops, so its t-th draw of the turn is number drawn + t: the turn's
        # uniforms in one go (b, N) rather than a splitmix of ~30 small ops per step
        uniforms = None
        if forced is None and cfg.temperature > 0:
            steps = torch.arange(cfg.max_new_tokens, device=dev)
            uniforms = row_uniforms(stream[:, None], drawn[:, None] + steps)  # (b, N)
        n = 0
        for t in range(cfg.max_new_tokens):
            if forced is None:
                tok, lp = sample_tokens(logits, cfg, uniforms=None if uniforms is None else uniforms[:, t])
            else:
                tok = forced_t[:, t]
                lp = torch.log_softmax(logits.float() / (cfg.temperature or 1.0), -1).gather(
                    -1, tok[:, None]).squeeze(-1)
            live = ~done  # rows that produce a real token at this step
            tokens[:, t] = torch.where(live, tok, eng.pad_id)
            logps[:, t] = torch.where(live, lp, 0.0)
            count += live.long()
            done = done | (live & torch.isin(tok, stop_ids))
            n = t + 1
            if bool(done.all()) or n == cfg.max_new_tokens:
                break
            logits = self._forward(tokens[:, t : t + 1], live.long()[:, None])
        drawn += count  # one draw per token produced
        # the idle rows' pads: masked again, and not counted as positions
        self.pos[g.lo : g.hi] = torch.where(active, self.pos[g.lo : g.hi], before)
        if bool(idle.any()):
            g.mask[idle, length - g.start + width - 1] = 0
            g.holes = True
        # the last token each row produced at the final step is not in the cache yet: it goes
        # first in the row's next chunk, saving a forward pass now.
        tokens, logps = tokens[:, :n].tolist(), logps[:, :n].tolist()
        lengths, last_live = count.tolist(), live.tolist()
        stops = set(eng.stop_ids.tolist())
        for s, i in zip(slots, local):
            ids_i = tokens[i][: lengths[i]]
            if last_live[i]:
                self.pending[s] = [ids_i[-1]]
            finish = "length"
            if ids_i and ids_i[-1] in stops:
                finish = "eos" if ids_i[-1] == eng.eos_id else "stop"
            out[s] = Generation(ids_i, logps[i][: lengths[i]], finish, hidden[i])


    def start(self, rows: Sequence[int]) -> None:
        """Ask for the next action of `rows`; `collect()` decodes them (in one batch)."""
        self.started += list(rows)

    def collect(self) -> list[tuple[int, Generation]]:
        """The actions of every started row, decoded together."""
        rows, self.started = self.started, []
        return list(zip(rows, self.generate(rows=rows)))

    def extend(self, chunks: Sequence[Sequence[int]], rows: Sequence[int] | None = None) -> None:
        slots = self._slots(rows)
        if len(chunks) != len(slots):
            raise ValueError(f"extend() got {len(chunks)} chunks for {len(slots)} rows")
        for s, chunk in zip(slots, chunks):
            self.pending[s] = self.pending[s] + list(chunk)

    @torch.inference_mode()  # the session's tensors are made in inference mode (generate)
    def add(self, rows: Sequence[int], prompts: Sequence[Sequence[int]]) -> None:
        """New rows join the batch: into free slots (their cache stays, masked out), else new ones."""
        if len(rows) != len(prompts):
            raise ValueError(f"add() got {len(prompts)} prompts for {len(rows)} rows")
        taken = set(self.rows) & set(rows)
        if taken:
            raise ValueError(f"rows {sorted(taken)} are already in this session")
        free = [s for s, r in enumerate(self.slot_rows) if r is None]
        new = len(rows) - len(free)
        if new > 0:
            self._grow(new)
            free += list(range(len(self.slot_rows) - new, len(self.slot_rows)))
        for s, row, prompt in zip(free, rows, prompts):
            if not prompt:
                raise ValueError(f"row {row}: an empty prompt")
            self.slot_rows[s], self.pending[s], self.fresh[s] = row, list(prompt), True
            self.drawn[s] = 0
        self.order += list(rows)

    def _grow(self, n: int) -> None:
        self.mask, self.mask_buf = torch.cat([self.mask, self.mask.new_zeros(n, self.cache_len)]), None
        self.pos = torch.cat([self.pos, self.pos.new_zeros(n)])
        self.drawn = torch.cat([self.drawn, self.drawn.new_zeros(n)])
        for layer in self._layers():
            layer.keys = torch.cat([layer.keys, layer.keys.new_zeros(n, *layer.keys.shape[1:])])
            layer.values = torch.cat([layer.values, layer.values.new_zeros(n, *layer.values.shape[1:])])
            if isinstance(layer, _RollingLayer):
                layer.key_buf = layer.value_buf = None
        self.slot_rows += [None] * n
        self.pending += [[] for _ in range(n)]
        self.fresh += [True] * n
        self.holes = self.holes or self.cache_len > 0
        self.turn_hidden = None

    def drop(self, rows: Sequence[int]) -> None:
        """These rows leave the batch; their slots are free for `add` (the cache is not touched)."""
        for s in self._slots(rows):
            self.slot_rows[s], self.pending[s] = None, []
        gone = set(rows)
        self.order = [r for r in self.order if r not in gone]

    @torch.inference_mode()  # the session's tensors are made in inference mode (generate)
    def keep(self, positions: Sequence[int]) -> None:
        """Keep only these positions of `rows` (drop finished episodes); slices the KV cache."""
        chosen = [self.order[p] for p in positions]
        if len(chosen) == len(self.slot_rows):  # every slot stays: nothing to slice
            self.order = chosen
            return
        slots = self._slots(chosen)
        idx = torch.tensor(slots, dtype=torch.long, device=self.engine.device)
        if len(slots) and self.cache.get_seq_length() > 0:
            self.cache.batch_select_indices(idx)
        self.mask, self.mask_buf = self.mask[idx], None
        self.pos = self.pos[idx]
        self.drawn = self.drawn[idx]
        self.slot_rows = [self.slot_rows[s] for s in slots]
        self.pending = [self.pending[s] for s in slots]
        self.fresh = [self.fresh[s] for s in slots]
        self.order = chosen
        self.turn_hidden = None


def for_policy(policy: Any, sampling: SamplingConfig, seed: int, capture_hidden: bool = False,
               dtype: str = "auto") -> TorchEngine:
    """The registry's builder (agentrl.engines.ENGINES["torch"]): generate from the policy's own model (or,
    `dtype` bf16, from a bf16 copy of it)."""
    chat = policy.chat
    return TorchEngine(policy.model, sampling, chat.stop_ids, chat.eos_id, chat.pad_id, seed=seed,
                       capture_hidden=capture_hidden, dtype=dtype)
