"""How a chunk of observations reaches the cache without paying for its padding.

Rows differ in length, so a turn's observations are left-padded into a rectangle (rows x chunk). The engine builds
the chunk's additive mask itself (`_additive_mask`); a chunk with padding runs packed (only its real tokens go
through the layers, `_Chunk`), its attention in levels so that no row attends over a longer row's columns
(`_chunk_levels`, `_chunk_run`), and its tokens may go into their rows' holes before the cache widens
(`_fill_plan`, `_fill_mask`). The chunk being fed is announced to the cache layers and the attention through
`_CHUNK`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F


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
    j-th token is its j-th real column. A row's holes from earlier turns' padding are room, not waste: attention
    takes keys in any order, each carrying its rotary position (figures: docs/benchmarks.md, "Many turns")."""
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


def _chunk_run(chunk_mask: torch.Tensor, spans: list[int], packs: bool, mask: torch.Tensor, gather_cost: float,
               call_cost: float, fill: _Fill | None = None) -> tuple[_Chunk, int]:
    """How a chunk with padding runs (`_Chunk`), and the query-key pairs its attention computes. Packed when `packs`
    (the group's cache layers take a packed chunk, every row ends in a real token, the newest, sampled from, and the
    model computes the last logits only); in levels when they cost less than one attention over the rectangle
    (`_chunk_levels`, costs in query-key pairs). Written by `fill`, the chunk's keys may sit anywhere in the cache,
    so every level attends over all of it."""
    rows, chunk = chunk_mask.shape
    width = mask.shape[-1]
    index = chunk_mask.flatten().nonzero().squeeze(1) if packs else None  # (N,)
    levels: list[_Level] | None = []
    computed = 0
    for before, upto in _chunk_levels(spans, width, gather_cost, call_cost):
        lo, hi, keys = chunk - upto, chunk - before, width - (before if fill is None else 0)
        if before == 0:
            take, level_mask = None, mask[:, :, lo:hi, :keys]
            computed += rows * (hi - lo) * keys
        else:
            take = torch.tensor([r for r, n in enumerate(spans) if n > before], dtype=torch.long, device=mask.device)
            level_mask = mask[take, :, lo:hi, :keys]
            computed += len(take) * (hi - lo) * keys
        levels.append(_Level(take, lo, hi, level_mask.contiguous()))
    if len(levels) == 1 and levels[0].lo == 0:  # one level over the whole rectangle: the plain attention
        levels = None
    if fill is not None and index is None:
        raise RuntimeError("a chunk written into holes must run packed")  # the caller checked what packing needs
    return _Chunk(rows, chunk, index, levels, fill), computed
