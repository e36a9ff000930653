"""The session's KV cache: buffers with room reserved ahead, written in place rather than concatenated.

`DynamicCache` concatenates every layer's keys and values at every token (`torch.cat`), copying the whole cache
each time: a turn of N tokens copied its context N times. The session instead reserves room, once per turn, for
the turn's chunk and its longest action, and writes each token into it (`_append`, `_RollingLayer`, and the same
for the attention mask); the samples and log-probs are bit for bit those of `DynamicCache`. A run of slots decodes
over a window of the session's buffers (`_WindowLayer`, `_Group`): views, no copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agentrl.engines.torch.packing import _Fill, _packed_chunk, _unpacked


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


def _gather_positions(x: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """out[b, h, w] = x[rows[b], h, positions[b, w]] for a cache layer's keys or values x (B, H, L, D): the
    compaction's gather (`TorchSession._compact`). It copies whole head vectors, as rows of a (positions, D) view of
    x's storage, by one `index_select`, where `gather` would read an int64 index per element; it costs about what
    cloning the cache costs (docs/benchmarks.md, "Many turns")."""
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
    wait for its rare full collections: a process running many rollouts would grow by a cache a round and fault
    in fresh memory every round (`test_a_finished_session_is_freed_without_the_cyclic_gc`)."""

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

