"""Training health: alarms as a pure function over the metric history, and the interventions.

Everything here reads rows as `metrics.jsonl` holds them (one dict per update, with `step`), so an
old run can be replayed exactly as the live run saw it:

>>> rows = [{"step": s, "rollout/pass_rate": p, "train/entropy": h, "train/kl": k}
...         for s, p, h, k in [(200, .42, 1.83, .04), (800, .61, 1.51, .11), (1600, .73, 1.02, .19),
...                            (2400, .79, .48, .28), (3200, .79, .11, .44)]]
>>> [check(rows[: i + 1]).status for i in range(len(rows))]
['healthy', 'healthy', 'entropy trending down', 'ENTROPY COLLAPSE', 'stalled + KL drifting']
>>> print(check(rows[:4]).alarms[0].reason)  # doctest: +NORMALIZE_WHITESPACE
entropy 0.480 fell over the last 800 steps and sits below the floor 0.549 (30% of the early 1.830) while pass rate
gained only +0.06

How the rules read a history (docs/algorithms.md, Training health):

- A series is one metric over the rows that hold it (the final-evaluation row is left out).
- Smoothing is an exponential moving average whose weight follows the step gap (half-life
  `smooth_steps` updates): per-update logs are smoothed, a dashboard sampled every few hundred
  steps is read as it stands.
- "Over the last N steps" compares the smoothed value now with the smoothed value at the latest row
  at least N steps back; until such a row exists the rule does not judge.
- The early level of a metric is its mean over the first `baseline_steps` updates.
- Where noise decides (STALLED's "no progress", VERIFIER OVERFIT's fall), a least-squares line is
  fitted to the raw values (`trend`) and judged with its standard error, so a noisier run needs a
  longer span before it is called flat or falling.
- Each alarm is an `AlarmSpec` (name, status label, metrics key, check, report colour, whether it
  stops a run) in the `ALARMS` registry; adding one is one `register(...)` beside its check.

Why the defaults: see each `HealthConfig` field. Interventions are small pure policies (`plan`):
given the history, the alarm states and the knobs as they stand, they say which knob to turn; each is
an `InterventionSpec` in the `INTERVENTIONS` registry (docs/extending.md has both recipes).

The rooms: `config` (the settings), `series` (the time-series helpers), `alarms` (the checks, `check`,
`replay`, `alarm_spans`, `stops`), `interventions` (`Knobs`, the interventions, `plan`), `warm_start`
(the advice before RL on a warm start). `agentrl.health` holds what a user reads a history with and
what plugs in an alarm or an intervention (docs/extending.md); the built-in checks, interventions and
series helpers are imported from their own modules.
"""

from __future__ import annotations

from agentrl.health.alarms import (
    ALARMS,
    ENGINE_MISMATCH,
    ENTROPY_COLLAPSE,
    ENTROPY_TREND,
    KL_DRIFT,
    NONFINITE,
    NOTICES,
    STALLED,
    TRUNCATION,
    VERIFIER_OVERFIT,
    Alarm,
    AlarmSpec,
    Health,
    Reading,
    alarm_spans,
    check,
    register,
    replay,
    stops,
)
from agentrl.health.config import HealthConfig
from agentrl.health.interventions import (
    INTERVENTIONS,
    Action,
    InterventionSpec,
    Knobs,
    Situation,
    plan,
    register_intervention,
)
from agentrl.health.series import Point, Row

__all__ = [
    "ALARMS", "ENGINE_MISMATCH", "ENTROPY_COLLAPSE", "ENTROPY_TREND", "INTERVENTIONS", "KL_DRIFT", "NONFINITE",
    "NOTICES", "STALLED", "TRUNCATION", "VERIFIER_OVERFIT", "Action", "Alarm", "AlarmSpec", "Health", "HealthConfig",
    "InterventionSpec", "Knobs", "Point", "Reading", "Row", "Situation", "alarm_spans", "check", "plan", "register",
    "register_intervention", "replay", "stops",
]
