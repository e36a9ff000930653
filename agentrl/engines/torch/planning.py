"""The cost model of a turn: where to cut the batch into runs of similar rows, and which long chunks' heads to
feed in forwards of their own. Pure functions of the rows' lengths and the engine's tuning (`EngineTuning`)."""

from __future__ import annotations

from collections.abc import Sequence


def _partition(starts: list[int | None], length: int, split_cost: float,
               row_cost: float) -> tuple[float, list[tuple[int, int, int]]]:
    """The cheapest cut of the slots into runs, each decoded over cache positions from its
    earliest start: (cost, [(lo, hi, start)]). `starts[s]` is where slot s's real positions
    begin, None for a slot not decoded (a run may hold it, at its cost, or leave it out). A run of
    r slots over a cache of `length` from `start` costs split_cost + r * (row_cost + length - start).

    >>> _partition([0, 0, 90, 95], 100, split_cost=10.0, row_cost=1.0)  # two long rows, two short ones
    (244.0, [(0, 2, 0), (2, 4, 90)])
    """
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
            c = best[i] + (0.0 if low is None else split_cost + rows * (row_cost + length - low))
            if c < best[j]:
                best[j], cut[j], first[j] = c, i, low
    runs, j = [], n
    while j > 0:
        if first[j] is not None:
            runs.append((edges[cut[j]], edges[j], first[j]))
        j = cut[j]
    return best[n], runs[::-1]


def _heads_tail(sizes: Sequence[int], rows: int, width: int, length: int, head_cost: float) -> int:
    """The columns a turn's batched chunk keeps when the longest chunks' leading tokens run first, each in a forward
    of its own (`width`: none do). `sizes`: the chunks of the rows decoded, of a batch of `rows` (rows not decoded feed
    a pad); `length`: the cache's. A chunk forward costs about rows x chunk width x cache width, and a forward of its
    own `head_cost` more: the k longest chunks alone, for the k that costs least (k = 0: none).

    >>> _heads_tail([40, 4, 3], rows=3, width=40, length=100, head_cost=1_000.0)  # one long chunk: its head runs alone
    4
    """
    sizes = sorted(sizes, reverse=True)
    tail, best = width, float(rows * width * length)
    for cut in sorted(set(sizes[1:]), reverse=True):
        cost = rows * cut * length + sum(head_cost + (n - cut) * length for n in sizes if n > cut)
        if cost < best:
            tail, best = cut, cost
    return tail
