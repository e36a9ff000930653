"""How far a probed environment lies from the family the packaged thresholds were fitted on.

The calibrated thresholds (`thresholds.json`) come from one horizon sweep on one environment,
Vault at 1, 3, 8 and 16 locks. On another environment the rules still apply, but whether the
sweep's cut-offs transfer depends on whether its statistics look like the sweep's. This module
holds the range each statistic took across the sweep's horizons (as the probe measured them on
the sweep's warm starts, benchmarks/results/probe_vs_sweep.txt and horizon_sweep.json) and says,
statistic by statistic, whether a probed env falls inside it and by how much it misses.

>>> from types import SimpleNamespace
>>> d = family_distance(SimpleNamespace(turns_median=12.0, zero_adv_frac=0.1, value_r2=0.1, pass_rate=0.2))
>>> d.inside, d.rows[0].outside_by
(True, 0.0)
>>> d = family_distance(SimpleNamespace(turns_median=80.0, zero_adv_frac=0.1, value_r2=0.9, pass_rate=0.2))
>>> [(r.statistic, r.outside_by) for r in d.rows if r.outside_by]
[('turns_median', 1.26), ('value_r2', 2.17)]
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

FAMILY_SOURCE = "Vault-v0 at 1, 3, 8, 16 locks (benchmarks/results/horizon_sweep.json, probe_vs_sweep.txt)"

# statistic -> (lowest, highest) over the sweep's four horizons, as measured there
FAMILY: dict[str, tuple[float, float]] = {
    "turns_median": (3.0, 37.0),  # 3, 7, 18, 37
    "zero_adv_frac": (0.0, 1.0),  # 0.12, 0.00, 0.00, 1.00: the sweep spans every value, so it never decides
    "value_r2": (-0.05, 0.25),  # -0.05, 0.01, 0.25, 0.00
    "pass_rate": (0.0, 0.33),  # the warm starts' held-out pass rates: 0.16, 0.33, 0.30, 0.00
}


class FamilyRow(BaseModel):
    statistic: str
    value: float | None
    low: float
    high: float
    outside_by: float = Field(description="distance outside [low, high] in units of the family's span; 0 inside")


class FamilyDistance(BaseModel):
    """Per statistic: the env's value against the family's range; `inside` if every known one is."""

    source: str = FAMILY_SOURCE
    rows: list[FamilyRow]
    inside: bool
    meaning: str


def family_distance(stats: Any) -> FamilyDistance:
    """Compare probe statistics (`ProbeStats` or anything with the same attributes) with `FAMILY`."""
    rows = []
    for name, (low, high) in FAMILY.items():
        value = getattr(stats, name, None)
        span = max(high - low, 1e-9)
        miss = 0.0 if value is None else max(low - value, value - high, 0.0) / span
        rows.append(FamilyRow(statistic=name, value=value, low=low, high=high, outside_by=round(miss, 2)))
    out = [r for r in rows if r.outside_by > 0]
    if not out:
        meaning = ("every statistic lies within the sweep's range: the calibrated cut-offs were fitted on environments "
                   "that look like this one on these measures")
    else:
        far = ", ".join(f"{r.statistic} {r.value:.3g} (range {r.low:g}-{r.high:g}, outside by {r.outside_by:g} spans)"
                        for r in out)
        meaning = (f"outside the sweep's range: {far}. The thresholds were not fitted on environments like this, so "
                   "the pick is the rules' extrapolation: treat it as a first guess and confirm it with `agentrl probe "
                   "--bakeoff`, or calibrate on a sweep of your own env (`agentrl probe --sweep`)")
    return FamilyDistance(rows=rows, inside=not out, meaning=meaning)
