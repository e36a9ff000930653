"""The time-series helpers the alarms and interventions read a metric history with.

A history is the rows of `metrics.jsonl` (one dict per update, with `step`); a series is one metric
over the rows that hold it, as (step, value) points. Smoothing follows the step gap, so a dashboard
sampled every few hundred steps reads as it stands and a per-update log is smoothed
(docs/algorithms.md, Training health).

>>> pts = series([{"step": 1, "train/kl": 0.25}, {"step": 2}, {"step": 3, "train/kl": 0.75}], "train/kl")
>>> pts, change(pts, 2)
([(1.0, 0.25), (3.0, 0.75)], (0.5, 2.0))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Row = dict[str, Any]
Point = tuple[float, float]  # (step, value)


def series(history: Sequence[Row], key: str) -> list[Point]:
    """(step, value) of every row that holds `key`, leaving out the final-evaluation row."""
    out = []
    for r in history:
        v = r.get(key)
        if r.get("final") or v is None or isinstance(v, (str, bool, list, dict)):
            continue
        out.append((float(r["step"]), float(v)))
    return out


def smooth(points: Sequence[Point], half_life: float) -> list[Point]:
    """Step-aware EMA: the weight of a new value is 1 - 0.5 ** (step gap / half_life).

    >>> smooth([(0, 0.0), (1, 1.0), (1000, 5.0)], half_life=1.0)
    [(0, 0.0), (1, 0.5), (1000, 5.0)]
    """
    out: list[Point] = []
    s = 0.0
    for step, v in points:
        if not math.isfinite(v):
            continue  # the NON-FINITE alarm reports it; it must not poison every later average
        gap = max(step - out[-1][0], 0.0) if out else math.inf
        # a plain running mean until the EMA has seen enough points, so the first (noisiest) value
        # is not taken as the smoothed level
        weight = max(1.0 - 0.5 ** (gap / half_life), 1.0 / (len(out) + 1))
        s += weight * (v - s)
        out.append((step, s))
    return out


def at_lag(points: Sequence[Point], lag: float, settle: float = 0.0) -> Point | None:
    """The latest point at least `lag` steps before the last one, or None if the history is shorter.

    Points within `settle` steps of the first are never a reference: a moving average that has
    seen one or two batches is still as noisy as they were.
    """
    if not points:
        return None
    now, first = points[-1][0], points[0][0]
    earlier = [p for p in points[:-1] if p[0] <= now - lag and p[0] >= first + settle]
    return earlier[-1] if earlier else None


def change(points: Sequence[Point], lag: float, settle: float = 0.0) -> tuple[float, float] | None:
    """(value now - value `lag` steps back, steps actually spanned), or None."""
    then = at_lag(points, lag, settle)
    if then is None:
        return None
    return points[-1][1] - then[1], points[-1][0] - then[0]


def early_level(points: Sequence[Point], steps: int) -> float | None:
    """A metric's early-run level: the mean of its finite values within `steps` of the first point."""
    if not points:
        return None
    first = points[0][0]
    vals = [v for s, v in points if s <= first + steps and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def falling(points: Sequence[Point], lag: float, monotone_frac: float) -> bool:
    """Whether the points fell over the last `lag` steps: lower at the end than at the start, with at least
    `monotone_frac` of the row-to-row steps falling."""
    then = at_lag(points, lag)
    if then is None:
        return False
    span = [p for p in points if p[0] >= then[0]]
    steps = [b[1] - a[1] for a, b in zip(span, span[1:])]
    return bool(steps) and span[-1][1] < span[0][1] and sum(d < 0 for d in steps) >= monotone_frac * len(steps)


@dataclass(frozen=True)
class Trend:
    """A least-squares line through (step, value) points: what a noisy series did over a span."""

    slope: float  # per step
    se: float  # standard error of the slope; 0 for two points, read as they stand
    level: float  # the fitted value at the last point
    span: float  # steps from the first point to the last
    mean: float  # of the values: a flat line's level, steadier than its end point
    mean_se: float  # its standard error (from the residuals; 0 below 3 points)

    @property
    def gain(self) -> float:
        return self.slope * self.span


def trend(points: Sequence[Point], variances: Sequence[float] | None = None) -> Trend | None:
    """Fit a line; the slope's error comes from known per-point variances (binomial counts) when
    given, else from the residuals (3 points or more).

    >>> t = trend([(0, 1.0), (1, 2.0), (2, 3.0)])
    >>> t.slope, t.se, t.level, t.gain, t.mean
    (1.0, 0.0, 3.0, 2.0, 2.0)
    """
    n = len(points)
    if n < 2:
        return None
    ts, vs = [p[0] for p in points], [p[1] for p in points]
    tbar, vbar = sum(ts) / n, sum(vs) / n
    sxx = sum((t - tbar) ** 2 for t in ts)
    if sxx == 0:
        return None
    slope = sum((t - tbar) * (v - vbar) for t, v in zip(ts, vs)) / sxx
    resid_var = sum((v - vbar - slope * (t - tbar)) ** 2 for t, v in zip(ts, vs)) / (n - 2) if n >= 3 else 0.0
    if variances is not None:
        se = math.sqrt(sum(((t - tbar) / sxx) ** 2 * var for t, var in zip(ts, variances)))
    else:
        se = math.sqrt(resid_var / sxx)
    return Trend(slope, se, vbar + slope * (ts[-1] - tbar), ts[-1] - ts[0], vbar, math.sqrt(resid_var / n))


def since(points: Sequence[Point], lag: float) -> list[Point] | None:
    """The points from the latest one at least `lag` steps before the last, to the last; None if the
    history is shorter. (Sparse logs get a span of two points, read as they stand.)"""
    ref = at_lag(points, lag)
    return None if ref is None else [p for p in points if p[0] >= ref[0]]



__all__ = ["Point", "Row", "Trend", "at_lag", "change", "early_level", "falling", "series", "since", "smooth", "trend"]
