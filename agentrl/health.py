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
- Each alarm is an `AlarmSpec` (name, status label, metrics key, check) in the `ALARMS` registry;
  adding one is one `register(...)` beside its check.

Why the defaults: see each `HealthConfig` field. Interventions are the small pure policies at the
bottom (`plan`): given the history, the alarm states and the current knobs, they say what to change.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Row = dict[str, Any]
Point = tuple[float, float]  # (step, value)

ENTROPY_COLLAPSE = "ENTROPY COLLAPSE"
KL_DRIFT = "KL DRIFT"
STALLED = "STALLED"
VERIFIER_OVERFIT = "VERIFIER OVERFIT"
TRUNCATION = "TRUNCATION BLOW-UP"
NONFINITE = "NON-FINITE"
ENGINE_MISMATCH = "ENGINE MISMATCH"
ENTROPY_TREND = "entropy trending down"  # a notice, not an alarm: it never stops a run

ENTROPY, KL, PASS, HELDOUT = "train/entropy", "train/kl", "rollout/pass_rate", "eval/pass_rate"
ZERO_ADV, TRUNC = "credit/zero_adv_frac", "rollout/truncated_frac"
FINITE_KEYS = ("train/loss", "train/grad_norm", "train/kl", "train/entropy")
MISMATCH_KL, MISMATCH_ESS = "mismatch/kl_k3", "mismatch/ess"  # agentrl.mismatch.stats, every update


# -- configuration -------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EntropyBonus(_Strict):
    enabled: bool = Field(True, description="On ENTROPY COLLAPSE (with --health.on-alarm intervene), switch on an "
                          "entropy bonus if none is set.")
    coef: float = Field(0.01, gt=0, description="c_H to set: 0.01 is PPO's Atari value and a common first try for LLM "
                        "policies.")


class AdaptiveEntropy(_Strict):
    enabled: bool = Field(False, description="A controller, not an alarm response: acts every update when on (off: it "
                          "changes the loss you asked for).")
    target_frac: float = Field(0.5, gt=0, description="Target entropy as a fraction of the early-run entropy: half "
                               "leaves room to sharpen but keeps exploring.")
    target: float | None = Field(None, gt=0, description="Absolute target entropy (nats per token); overrides "
                                 "target_frac.")
    step: float = Field(0.005, gt=0, description="Change of c_H per update (+/- 0.005 steps, docs/algorithms.md).")
    tolerance: float = Field(0.1, ge=0, description="No change while entropy is within this fraction of the target, so "
                             "the coefficient does not chatter.")
    max_coef: float = Field(0.05, gt=0, description="Upper bound of c_H; larger bonuses swamp the policy gradient of a "
                            "sparse reward.")


class RaiseTemperature(_Strict):
    enabled: bool = Field(True, description="Below the entropy floor (with --health.on-alarm intervene), sample "
                          "rollouts hotter; back down once entropy recovers.")
    step: float = Field(0.1, gt=0, description="Temperature change per acting update; small, since the ratio's "
                        "behaviour log-probs follow it.")
    max_temperature: float = Field(1.5, gt=0, description="Cap: above ~1.5 tiny policies emit malformed tool calls "
                                   "more than they explore.")
    recover_frac: float = Field(1.5, ge=1, description="Step back toward the configured temperature once entropy is "
                                "above floor x this (hysteresis).")


class AdaptiveKL(_Strict):
    enabled: bool = Field(False, description="A controller: acts every update when on (verl's adaptive KL controller, "
                          "Ziegler et al. 2019).")
    target: float = Field(0.05, gt=0, description="Target k3 KL per token; half the 0.1 warning level, so the "
                          "controller acts before the alarm.")
    init_coef: float = Field(0.001, gt=0, description="beta to start from when the loss has none (kl_coef 0): the "
                             "controller multiplies, so it needs a start.")
    max_change: float = Field(0.2, gt=0, le=1, description="beta changes by at most this factor per update (verl clips "
                              "the proportional error at 0.2).")
    max_coef: float = Field(1.0, gt=0, description="Upper bound of beta.")


class DynamicSampling(_Strict):
    enabled: bool = Field(True, description="On STALLED by zero-advantage groups (with --health.on-alarm intervene), "
                          "switch the assigner's dynamic sampling to 'resample' (DAPO).")


class VerifierRotation(_Strict):
    enabled: bool = Field(True, description="On VERIFIER OVERFIT (with --health.on-alarm intervene), score each "
                          "episode against more hidden tests drawn from the pool.")
    step: int = Field(2, ge=1, description="Extra hidden tests per episode each time it acts.")
    max_tests: int = Field(12, ge=1, description="Cap on hidden tests per episode; the env also caps at its pool size.")


class Interventions(_Strict):
    entropy_bonus: EntropyBonus = Field(default_factory=EntropyBonus, description="Raise the entropy bonus.")
    adaptive_entropy: AdaptiveEntropy = Field(default_factory=AdaptiveEntropy,
                                              description="Steer the entropy bonus to a target.")
    temperature: RaiseTemperature = Field(default_factory=RaiseTemperature, description="Sample hotter.")
    adaptive_kl: AdaptiveKL = Field(default_factory=AdaptiveKL, description="Steer the KL coefficient to a target.")
    dynamic_sampling: DynamicSampling = Field(default_factory=DynamicSampling,
                                              description="Resample zero-advantage groups.")
    verifier_rotation: VerifierRotation = Field(default_factory=VerifierRotation,
                                                description="Rotate the verifier's hidden tests.")
    cooldown: int = Field(5, ge=0, description="Updates an alarm-triggered intervention waits before acting again, so "
                          "its effect can show first.")


class HealthConfig(_Strict):
    """Alarm thresholds and interventions (docs/algorithms.md, Training health). Windows are in updates (steps).

    >>> HealthConfig().kl_warn, HealthConfig(on_alarm="stop").on_alarm
    (0.1, 'stop')
    """

    on_alarm: Literal["warn", "stop", "intervene"] = Field(
        "warn", description="warn: show and log; stop: end the run at the first alarm; intervene: also apply the "
        "enabled interventions. warn never changes a run you configured.")
    smooth_steps: float = Field(2.0, gt=0, description="Half-life (updates) of the moving average; 2 damps 64-episode "
                                "batch noise yet follows a collapse within a few updates.")
    trend_steps: int = Field(8, ge=1, description="Span over which rising / falling is judged; 8 updates of the "
                             "default run move the pass rate ~0.06, well past smoothed noise.")
    stall_steps: int = Field(24, ge=1, description="Shortest span of the no-progress test: three trend spans, so that "
                             "a slow but real climb (0.006 per update under 64-episode noise) is not called flat.")
    stall_max_steps: int = Field(96, ge=1, description="Longest span: the test widens from stall_steps up to this "
                                 "until the pass rate's noise is small enough to call it flat (64-episode noise needs "
                                 "~60-100 updates).")
    stall_z: float = Field(2.0, ge=0, description="No progress means the fitted gain plus this many standard errors is "
                           "still flat: a noisy run is not called flat on a bad draw.")
    baseline_steps: int = Field(5, ge=1, description="The first updates that set the early-run level of entropy and "
                                "truncation.")
    entropy_floor_frac: float = Field(0.3, gt=0, lt=1, description="ENTROPY COLLAPSE needs entropy below this fraction "
                                      "of its early level (30%, docs/algorithms.md).")
    entropy_trend_frac: float = Field(0.2, gt=0, description="'entropy trending down' when the smoothed entropy fell "
                                      "by this fraction of its early level within the trend span.")
    entropy_flat_frac: float = Field(0.05, ge=0, description="Entropy counts as flat (the policy is not moving) if its "
                                     "fitted change over the stall span is within this fraction of its level.")
    monotone_frac: float = Field(0.75, gt=0, le=1, description="'Fell monotonically' allows this share of rising "
                                 "row-to-row steps to be missing, since smoothed noise still wiggles.")
    rise_min: float = Field(0.08, ge=0, description="Pass rate counts as still rising only if it gained this much over "
                            "the trend span (~ one standard error of a 64-episode difference).")
    flat_tol: float = Field(0.02, ge=0, description="Pass rate counts as flat if it gained at most this much per "
                            "stall_steps (scaled with a wider span).")
    ceiling: float = Field(1.0, gt=0, le=1, description="The best pass rate the verifier allows; lower it when some "
                           "tasks cannot be solved.")
    top_margin: float = Field(0.15, ge=0, le=1, description="A plateau within this of the ceiling is success, never "
                              "STALLED (a run at 0.9 has little left to learn).")
    far_margin: float = Field(0.3, ge=0, le=1, description="A plateau more than this below the ceiling is STALLED on "
                              "its own; between the two margins it needs zero-advantage groups or flat/collapsed "
                              "entropy too.")
    zero_adv_max: float = Field(0.75, gt=0, le=1, description="Groups carry no signal when the smoothed share of "
                                "zero-advantage groups reaches this.")
    kl_warn: float = Field(0.1, ge=0, description="KL per token above which rising KL with a pass rate that does not "
                           "rise is drift (verl's adaptive controller targets 0.1).")
    kl_max: float = Field(0.5, gt=0, description="KL per token that is drift on its own (one practitioner's "
                          "early-warning figure for 7B models).")
    kl_rise_min: float = Field(0.01, ge=0, description="KL counts as rising if it grew this much over the trend span.")
    overfit_steps: int = Field(100, ge=1, description="VERIFIER OVERFIT fits the trend of every held-out evaluation in "
                               "this many updates (at least the last two): with evaluation every 10 updates, 11 "
                               "evaluations see a steady slide that any two neighbours hide in noise.")
    overfit_drop: float = Field(0.05, ge=0, description="...and needs the fitted held-out pass rate to fall by at "
                                "least this over them...")
    overfit_z: float = Field(3.0, ge=0, description="...and by this many standard errors of the fitted fall (binomial "
                             "when episode counts are logged, else from the residuals): on a flat held-out rate under "
                             "128-episode noise, 1 run in 100 with 13 evaluations saw a false alarm (5 at 2.5).")
    overfit_rise: float = Field(0.05, ge=0, description="...while the smoothed train pass rate rose by at least this "
                                "over the same steps.")
    trunc_rise: float = Field(0.25, gt=0, le=1, description="Truncation blow-up when the truncated share rose this far "
                              "above its early level (episodes grow past the turn or context budget)...")
    trunc_max: float | None = Field(None, gt=0, le=1, description="...or reached this share at all. Off by default: "
                                    "where failing means running out of turns (Vault), half the warm start's episodes "
                                    "are truncated by design.")
    mismatch_kl_max: float = Field(0.01, gt=0, description="ENGINE MISMATCH when the k3 KL between the engine's and "
                                   "the trainer's log-probs under the same weights reaches this per token: were the "
                                   "log-ratio normal, KL 0.01 is a standard deviation of 0.14, and about 20% of tokens "
                                   "would leave PPO's clip band [0.8, 1.2] from the engine alone, before any update "
                                   "(an fp32 engine against the fp32 trainer measures ~3e-14 on the default run).")
    mismatch_ess_min: float = Field(0.5, gt=0, le=1, description="...or when the effective sample size of the "
                                    "episodes' weights prod_t pi_old / mu falls to this share of the batch: below "
                                    "half, fewer than half the episodes carry the batch's weight, and a sequence-level "
                                    "correction would train on those few.")
    interventions: Interventions = Field(default_factory=Interventions, description="What --health.on-alarm "
                                         "intervene may do, each on its own switch.")


# -- alarm states ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Alarm:
    name: str
    reason: str  # in words: why it fired, with the numbers


@dataclass(frozen=True)
class AlarmSpec:
    """One alarm: its name (what logs, reports and the docs call it), how the status column spells it,
    its 0/1 key in metrics.jsonl, and its check: a reason in words when it fires, else None.

    Adding an alarm is one `register(AlarmSpec(...))` beside its check; the trainer's log, the
    console, `alarm_spans` and the report read `ALARMS`.
    """

    name: str
    label: str
    key: str
    check: Callable[[Reading], str | None]


ALARMS: dict[str, AlarmSpec] = {}  # the registry, in status order


def register(spec: AlarmSpec) -> AlarmSpec:
    if spec.name in ALARMS:
        raise ValueError(f"alarm {spec.name!r} is registered already")
    ALARMS[spec.name] = spec
    return spec


def _order(name: str) -> int:
    return list(ALARMS).index(name) if name in ALARMS else len(ALARMS)


@dataclass
class Health:
    """The state of a run at its latest row: alarms (each with a reason) and notices."""

    step: float
    alarms: list[Alarm] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    entropy_floor: float | None = None

    @property
    def names(self) -> set[str]:
        return {a.name for a in self.alarms}

    @property
    def level(self) -> Literal["healthy", "notice", "alarm"]:
        return "alarm" if self.alarms else "notice" if self.notices else "healthy"

    @property
    def status(self) -> str:
        """The dashboard's status column: 'healthy', a notice, or the alarms joined by ' + '."""
        if self.alarms:
            return " + ".join(ALARMS[a.name].label if a.name in ALARMS else a.name
                              for a in sorted(self.alarms, key=lambda a: _order(a.name)))
        return " + ".join(self.notices) or "healthy"

    def metrics(self) -> dict[str, Any]:
        """What the trainer writes into metrics.jsonl: one 0/1 per alarm, the status and the reasons."""
        out: dict[str, Any] = {spec.key: float(name in self.names) for name, spec in ALARMS.items()}
        out["health/status"] = self.status
        out["health/level"] = self.level
        if self.alarms or self.notices:
            out["health/reasons"] = [f"{a.name}: {a.reason}" for a in self.alarms] + self.notices
        return out


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
    if not points:
        return None
    first = points[0][0]
    vals = [v for s, v in points if s <= first + steps and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def _falling(points: Sequence[Point], lag: float, monotone_frac: float) -> bool:
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


class Reading:
    """What the checks read from one history: the series, smoothed or raw, computed once, and the
    other alarms' verdicts (a check may depend on another: collapse defers to a stall)."""

    def __init__(self, rows: Sequence[Row], cfg: HealthConfig):
        self.rows, self.cfg = rows, cfg
        self.step = float(rows[-1]["step"])
        self._verdicts: dict[str, str | None] = {}
        self._series: dict[tuple[str, bool], list[Point]] = {}

    def fires(self, name: str) -> str | None:
        """The reason alarm `name` fires at this row, or None (each check runs once)."""
        if name not in self._verdicts:
            self._verdicts[name] = ALARMS[name].check(self)
        return self._verdicts[name]

    def raw(self, key: str) -> list[Point]:
        """The finite values of `key` (computed once per key)."""
        if (key, False) not in self._series:
            self._series[key, False] = [p for p in series(self.rows, key) if math.isfinite(p[1])]
        return self._series[key, False]

    def smoothed(self, key: str) -> list[Point]:
        if (key, True) not in self._series:
            self._series[key, True] = smooth(series(self.rows, key), self.cfg.smooth_steps)
        return self._series[key, True]

    @functools.cached_property
    def ent(self) -> list[Point]:
        return self.smoothed(ENTROPY)

    @functools.cached_property
    def pas(self) -> list[Point]:
        return self.smoothed(PASS)

    @functools.cached_property
    def base_ent(self) -> float | None:
        return early_level(self.raw(ENTROPY), self.cfg.baseline_steps)

    @functools.cached_property
    def floor(self) -> float | None:
        return self.cfg.entropy_floor_frac * self.base_ent if self.base_ent else None

    @functools.cached_property
    def below_floor(self) -> bool:
        raw = self.raw(ENTROPY)
        return self.floor is not None and bool(raw) and raw[-1][1] < self.floor

    @functools.cached_property
    def pass_gain(self) -> tuple[float, float] | None:
        return change(self.pas, self.cfg.trend_steps, settle=2 * self.cfg.smooth_steps)


# -- the alarms: each a check over a Reading, registered below in status order ----------------------


def check_entropy_collapse(r: Reading) -> str | None:
    """Smoothed entropy fell monotonically over the trend span, sits below the floor, and the pass
    rate has stopped rising. Once the run is STALLED as well, the stall (which names the spent
    entropy as its cause) is the state to act on, and the collapse hands over."""
    cfg, raw = r.cfg, r.raw(ENTROPY)
    if not (r.ent and r.base_ent) or not _falling(r.ent, cfg.trend_steps, cfg.monotone_frac) or not r.below_floor:
        return None
    not_rising = r.pass_gain is not None and r.pass_gain[0] < cfg.rise_min
    if not (not_rising or not r.pas) or r.fires(STALLED):
        return None
    drop = change(r.ent, cfg.trend_steps)
    gain = f"pass rate gained only {r.pass_gain[0]:+.2f}" if r.pass_gain else "no pass rate logged"
    return (f"entropy {raw[-1][1]:.3f} fell over the last {drop[1]:.0f} steps and sits below the floor {r.floor:.3f} "
            f"({cfg.entropy_floor_frac:.0%} of the early {r.base_ent:.3f}) while {gain}")


def no_progress(r: Reading) -> tuple[Trend, float] | None:
    """(the pass rate's trend, the span asked for) if the pass rate is flat, else None.

    Flat means: a line fitted to the raw pass rate over the span gains at most `flat_tol` per
    `stall_steps`, even `stall_z` standard errors up. The span starts at `stall_steps` and widens
    (x1.5, x2, x3, x4, up to `stall_max_steps`) until the history runs out, so a noisy run needs
    more updates before it can be called flat: the window scales with the noise.
    """
    cfg, pts = r.cfg, r.raw(PASS)
    start = None
    for mult in (1, 1.5, 2, 3, 4):
        want = min(cfg.stall_steps * mult, max(cfg.stall_max_steps, cfg.stall_steps))
        span = since(pts, want)
        if span is None or span[0] == start:  # no more history, or a sparse log whose span did not grow
            return None
        start, t = span[0], trend(span)
        if t is not None and (t.slope + cfg.stall_z * t.se) * t.span <= cfg.flat_tol * want / cfg.stall_steps:
            return t, want
        if want >= cfg.stall_max_steps:
            return None
    return None


def check_stalled(r: Reading) -> str | None:
    """No progress and no signal: the pass rate is flat (`no_progress`), below the top band, and
    either far below the ceiling or starved of signal (most groups zero-advantage, entropy flat or
    under the floor). A plateau near the ceiling is success, not a stall."""
    cfg = r.cfg
    flat = no_progress(r)
    if flat is None:
        return None
    t, want = flat
    if t.mean + cfg.stall_z * t.mean_se >= cfg.ceiling - cfg.top_margin:  # near the top, within noise: success
        return None
    why = []
    zero = r.smoothed(ZERO_ADV)
    if zero and zero[-1][1] >= cfg.zero_adv_max:
        why.append(f"{zero[-1][1]:.0%} of groups carry zero advantage (>= {cfg.zero_adv_max:.0%})")
    raw_ent = r.raw(ENTROPY)
    if r.below_floor:
        why.append(f"entropy {raw_ent[-1][1]:.3f} is below the floor {r.floor:.3f}: groups stop exploring")
    else:
        span = since(raw_ent, t.span)
        et = trend(span) if span else None
        mean = sum(v for _, v in span) / len(span) if span else 0.0
        if et is not None and mean > 0 and abs(et.gain) <= cfg.entropy_flat_frac * mean:
            why.append(f"entropy is flat ({et.gain / mean:+.1%} over {et.span:.0f} steps): the policy has stopped "
                       "moving")
    if t.mean + cfg.stall_z * t.mean_se <= cfg.ceiling - cfg.far_margin:
        why.append(f"the plateau is far below the ceiling {cfg.ceiling:.2f}")
    if not why:
        return None
    return (f"pass rate {t.mean:.2f} gained {t.gain:+.2f} over {t.span:.0f} steps "
            f"(flat: <= {cfg.flat_tol * want / cfg.stall_steps:+.2f}); " + "; ".join(why))


def check_kl_drift(r: Reading) -> str | None:
    """KL per token above kl_max, or above kl_warn and rising while the pass rate (held-out when
    evaluated in the span, else train) does not rise."""
    cfg, kl = r.cfg, r.smoothed(KL)
    if not kl or not math.isfinite(kl[-1][1]):
        return None
    now = kl[-1][1]
    if now >= cfg.kl_max:
        return f"KL {now:.3f} per token is above the ceiling {cfg.kl_max}"
    kl_rise = change(kl, cfg.trend_steps)
    held = series(r.rows, HELDOUT)
    ref, which = ((change(held, cfg.trend_steps), "held-out")
                  if len(held) >= 2 and held[-1][0] >= kl[-1][0] - cfg.trend_steps else (r.pass_gain, "train"))
    if which == "held-out" and ref is None:
        ref, which = r.pass_gain, "train"
    if (now >= cfg.kl_warn and kl_rise is not None and kl_rise[0] >= cfg.kl_rise_min
            and ref is not None and ref[0] <= cfg.flat_tol):
        return (f"KL {now:.3f} per token (>= {cfg.kl_warn}) rose {kl_rise[0]:+.3f} over {kl_rise[1]:.0f} steps "
                f"while {which} pass rate moved {ref[0]:+.2f}")
    return None


def check_verifier_overfit(r: Reading) -> str | None:
    """At an evaluation: the held-out pass rate's fitted trend over the evaluations of the last
    `overfit_steps` updates (at least the last two) fell beyond noise while the smoothed train pass
    rate rose over the same steps."""
    cfg = r.cfg
    held = r.raw(HELDOUT)
    if len(held) < 2 or held[-1][0] != r.step:
        return None
    window = [p for p in held if p[0] >= r.step - cfg.overfit_steps]
    window = window if len(window) >= 2 else held[-2:]
    counts = [_count(r.rows, s, "eval/episodes") for s, _ in window]
    p = min(max(sum(v for _, v in window) / len(window), 0.05), 0.95)
    variances = [p * (1 - p) / n for n in counts] if all(counts) else None
    t = trend(window, variances)
    if t is None:
        return None
    need = cfg.overfit_drop
    if variances is not None or len(window) >= 3:
        need = max(need, cfg.overfit_z * t.se * t.span)
    s0 = window[0][0]
    tr0 = [v for s, v in r.pas if s <= s0]
    tr_rise = r.pas[-1][1] - tr0[-1] if tr0 and r.pas else None
    if -t.gain >= need and tr_rise is not None and tr_rise >= cfg.overfit_rise:
        return (f"held-out pass rate fell {window[0][1]:.2f} -> {window[-1][1]:.2f} over {len(window)} evaluations "
                f"(fitted {t.gain:+.2f}, needed a fall of {need:.2f}) between steps {s0:.0f} and {r.step:.0f} while "
                f"train pass rate rose {tr_rise:+.2f}")
    return None


def check_truncation(r: Reading) -> str | None:
    """Many episodes hit the turn / context budget, or far more than early on."""
    cfg, tr = r.cfg, r.smoothed(TRUNC)
    if not tr:
        return None
    base = early_level(series(r.rows, TRUNC), cfg.baseline_steps) or 0.0
    over_max = cfg.trunc_max is not None and tr[-1][1] >= cfg.trunc_max
    if over_max or tr[-1][1] >= base + cfg.trunc_rise:
        limit = f"+{cfg.trunc_rise:.0%}" + (f" or {cfg.trunc_max:.0%}" if cfg.trunc_max is not None else "")
        return f"{tr[-1][1]:.0%} of episodes are truncated (early run: {base:.0%}; limit {limit})"
    return None


def check_nonfinite(r: Reading) -> str | None:
    """The latest update's loss, gradient norm, KL or entropy is NaN or infinite."""
    last = r.rows[-1]
    bad = [k for k in FINITE_KEYS if isinstance(last.get(k), (int, float)) and not math.isfinite(last[k])]
    return ", ".join(f"{k} = {last[k]}" for k in bad) + " at this update" if bad else None


def check_engine_mismatch(r: Reading) -> str | None:
    """The latest update's engine/trainer gap (mismatch/*, agentrl.mismatch.stats): k3 KL per token above
    `mismatch_kl_max`, or the episodes' effective sample size below `mismatch_ess_min`. Read as logged, not
    smoothed: it is measured on the whole batch each update, and a weight sync that failed shows at once."""
    cfg, last = r.cfg, r.rows[-1]
    kl, ess = last.get(MISMATCH_KL), last.get(MISMATCH_ESS)
    why = []
    if isinstance(kl, (int, float)) and kl >= cfg.mismatch_kl_max:
        why.append(f"KL(engine || trainer) {kl:.3g} per token (k3) >= {cfg.mismatch_kl_max}")
    if isinstance(ess, (int, float)) and ess <= cfg.mismatch_ess_min:
        why.append(f"the episodes' effective sample size is {ess:.0%} of the batch (<= {cfg.mismatch_ess_min:.0%})")
    if not why:
        return None
    return ("; ".join(why) + ": the engine samples from a distribution the trainer does not compute (precision, "
            "kernels, a weight sync); loss.mismatch corrects it (docs/algorithms.md, 'Engine mismatch')")


# How each alarm reads in the status column: the docs' example spells "stalled + KL drifting"
register(AlarmSpec(ENTROPY_COLLAPSE, "ENTROPY COLLAPSE", "health/entropy_collapse", check_entropy_collapse))
register(AlarmSpec(STALLED, "stalled", "health/stalled", check_stalled))
register(AlarmSpec(KL_DRIFT, "KL drifting", "health/kl_drift", check_kl_drift))
register(AlarmSpec(VERIFIER_OVERFIT, "VERIFIER OVERFIT", "health/verifier_overfit", check_verifier_overfit))
register(AlarmSpec(TRUNCATION, "truncation blow-up", "health/truncation", check_truncation))
register(AlarmSpec(ENGINE_MISMATCH, "ENGINE MISMATCH", "health/engine_mismatch", check_engine_mismatch))
register(AlarmSpec(NONFINITE, "NON-FINITE loss/grad", "health/nonfinite", check_nonfinite))


def entropy_trending_down(r: Reading) -> bool:
    """A notice: entropy fell by `entropy_trend_frac` of its early level within the trend span, but
    is not below the floor yet (where ENTROPY COLLAPSE takes over)."""
    cfg = r.cfg
    if not (r.ent and r.base_ent) or r.below_floor or not _falling(r.ent, cfg.trend_steps, cfg.monotone_frac):
        return False
    drop = change(r.ent, cfg.trend_steps)
    return drop is not None and -drop[0] >= cfg.entropy_trend_frac * r.base_ent


NOTICES: dict[str, Callable[[Reading], bool]] = {ENTROPY_TREND: entropy_trending_down}


def check(history: Sequence[Row], cfg: HealthConfig | None = None) -> Health:
    """The alarm states at the last row of `history` (pure: the same history, the same answer)."""
    cfg = cfg or HealthConfig()
    rows = [r for r in history if not r.get("final")]
    if not rows:
        return Health(step=0.0)
    r = Reading(rows, cfg)
    health = Health(step=r.step, entropy_floor=r.floor)
    health.alarms = [Alarm(name, why) for name in ALARMS if (why := r.fires(name)) is not None]
    health.notices = [name for name, notice in NOTICES.items() if notice(r)]
    return health


def _count(rows: Sequence[Row], step: float, key: str) -> float | None:
    for r in rows:
        if float(r["step"]) == step and isinstance(r.get(key), (int, float)):
            return float(r[key])
    return None


def replay(history: Sequence[Row], cfg: HealthConfig | None = None) -> list[Health]:
    """The state at every update row of a (possibly old) run, as the live run would have seen it."""
    rows = [r for r in history if not r.get("final")]
    return [check(rows[: i + 1], cfg) for i in range(len(rows)) if float(rows[i]["step"]) > 0 or i == len(rows) - 1]


def alarm_spans(history: Sequence[Row], cfg: HealthConfig | None = None) -> dict[str, list[tuple[float, float]]]:
    """Per alarm, the [first step, last step] spans in which it was on (for the report's shading).

    Logged states (`health/*`) are used when the run has them, so the report shows what the run
    saw; otherwise the history is replayed.
    """
    rows = [r for r in history if not r.get("final") and float(r.get("step", 0)) > 0]
    logged = any(spec.key in r for r in rows for spec in ALARMS.values())
    states = [{n for n, spec in ALARMS.items() if r.get(spec.key)}
              for r in rows] if logged else [h.names for h in replay(rows, cfg)]
    spans: dict[str, list[tuple[float, float]]] = {}
    for name in ALARMS:
        cur: list[float] | None = None
        for r, on in zip(rows, states):
            s = float(r["step"])
            if name in on:
                cur = [cur[0], s] if cur else [s, s]
            elif cur:
                spans.setdefault(name, []).append((cur[0], cur[1]))
                cur = None
        if cur:
            spans.setdefault(name, []).append((cur[0], cur[1]))
    return spans


# -- interventions ---------------------------------------------------------------------------------


@dataclass
class Knobs:
    """What interventions may turn. `verifier_tests` is None when the environment has no rotation."""

    entropy_coef: float
    kl_coef: float
    temperature: float
    base_temperature: float
    dynamic_sampling: str | None  # None: the assigner has no such option
    verifier_tests: int | None


@dataclass(frozen=True)
class Action:
    intervention: str
    knob: str
    old: Any
    new: Any
    reason: str

    def __str__(self) -> str:
        return f"{self.intervention}: {self.knob} {self.old} -> {self.new} ({self.reason})"


def entropy_bonus(h: Health, k: Knobs, c: EntropyBonus) -> Action | None:
    """On ENTROPY COLLAPSE, switch on an entropy bonus if the loss has none."""
    if ENTROPY_COLLAPSE in h.names and k.entropy_coef < c.coef:
        return Action("entropy_bonus", "entropy_coef", k.entropy_coef, c.coef, "ENTROPY COLLAPSE")
    return None


def adaptive_entropy(history: Sequence[Row], k: Knobs, c: AdaptiveEntropy, baseline_steps: int) -> Action | None:
    """Move c_H by one step toward keeping entropy at its target; no change inside the tolerance band.

    >>> rows = [{"step": 1, "train/entropy": 1.0}, {"step": 9, "train/entropy": 0.3}]
    >>> k = Knobs(0.0, 0.0, 1.0, 1.0, None, None)
    >>> adaptive_entropy(rows, k, AdaptiveEntropy(enabled=True), 1).new
    0.005
    """
    pts = series(history, ENTROPY)
    if not pts or not math.isfinite(pts[-1][1]):
        return None
    target = c.target or c.target_frac * (early_level(pts, baseline_steps) or pts[0][1])
    now = pts[-1][1]
    if now < target * (1 - c.tolerance) and k.entropy_coef < c.max_coef:
        new = min(round(k.entropy_coef + c.step, 6), c.max_coef)
        return Action("adaptive_entropy", "entropy_coef", k.entropy_coef, new,
                      f"entropy {now:.3f} < target {target:.3f}")
    if now > target * (1 + c.tolerance) and k.entropy_coef > 0:
        new = max(round(k.entropy_coef - c.step, 6), 0.0)
        return Action("adaptive_entropy", "entropy_coef", k.entropy_coef, new,
                      f"entropy {now:.3f} > target {target:.3f}")
    return None


def raise_temperature(history: Sequence[Row], h: Health, k: Knobs, c: RaiseTemperature) -> Action | None:
    """Below the entropy floor, sample one step hotter; once entropy is back above floor x recover,
    step back toward the configured temperature."""
    pts = series(history, ENTROPY)
    if h.entropy_floor is None or not pts:
        return None
    now = pts[-1][1]
    if now < h.entropy_floor and k.temperature < c.max_temperature:
        new = round(min(k.temperature + c.step, c.max_temperature), 4)
        return Action("temperature", "temperature", k.temperature, new,
                      f"entropy {now:.3f} < floor {h.entropy_floor:.3f}")
    if now > h.entropy_floor * c.recover_frac and k.temperature > k.base_temperature:
        new = round(max(k.temperature - c.step, k.base_temperature), 4)
        return Action("temperature", "temperature", k.temperature, new,
                      f"entropy {now:.3f} recovered above {h.entropy_floor * c.recover_frac:.3f}")
    return None


def adaptive_kl(history: Sequence[Row], k: Knobs, c: AdaptiveKL) -> Action | None:
    """beta <- beta * (1 + clip(KL / target - 1, -max_change, +max_change)); at the target, no change.

    >>> k = Knobs(0.0, 0.01, 1.0, 1.0, None, None)
    >>> adaptive_kl([{"step": 1, "train/kl": 0.1}], k, AdaptiveKL(enabled=True, target=0.05)).new
    0.012
    """
    pts = series(history, KL)
    if not pts or not math.isfinite(pts[-1][1]):
        return None
    err = max(-c.max_change, min(c.max_change, pts[-1][1] / c.target - 1.0))
    if abs(err) < 1e-9:
        return None
    beta = k.kl_coef
    if beta == 0:
        if err < 0:
            return None  # below target with no KL term: nothing to relax
        beta = c.init_coef
    new = round(min(beta * (1 + err), c.max_coef), 8)
    if new == k.kl_coef:
        return None
    return Action("adaptive_kl", "kl_coef", k.kl_coef, new, f"KL {pts[-1][1]:.4f} vs target {c.target}")


def dynamic_sampling(h: Health, k: Knobs, c: DynamicSampling) -> Action | None:
    """On STALLED by zero-advantage groups, drop such groups and roll out more (DAPO's resampling)."""
    stalled = next((a for a in h.alarms if a.name == STALLED), None)
    if stalled and "zero advantage" in stalled.reason and k.dynamic_sampling not in (None, "resample"):
        return Action("dynamic_sampling", "dynamic_sampling", k.dynamic_sampling, "resample",
                      "STALLED: most groups carry zero advantage")
    return None


def verifier_rotation(h: Health, k: Knobs, c: VerifierRotation) -> Action | None:
    """On VERIFIER OVERFIT, score every episode against more hidden tests from the pool."""
    if VERIFIER_OVERFIT in h.names and k.verifier_tests is not None and k.verifier_tests < c.max_tests:
        return Action("verifier_rotation", "verifier_tests", k.verifier_tests,
                      min(k.verifier_tests + c.step, c.max_tests), "VERIFIER OVERFIT")
    return None


def plan(history: Sequence[Row], health: Health, knobs: Knobs, cfg: HealthConfig,
         last_acted: dict[str, float] | None = None) -> list[Action]:
    """Every action the enabled interventions take at this update (pure; the trainer applies them).

    The controllers (adaptive entropy, adaptive KL) act whenever they are enabled; the alarm
    responses act only with `on_alarm="intervene"`, and each waits `cooldown` updates after acting.
    """
    iv = cfg.interventions
    last_acted = last_acted or {}
    actions: list[Action | None] = []
    if iv.adaptive_entropy.enabled:
        actions.append(adaptive_entropy(history, knobs, iv.adaptive_entropy, cfg.baseline_steps))
    if iv.adaptive_kl.enabled:
        actions.append(adaptive_kl(history, knobs, iv.adaptive_kl))
    if cfg.on_alarm == "intervene":
        def ready(name: str) -> bool:
            return health.step - last_acted.get(name, -math.inf) >= iv.cooldown

        if iv.entropy_bonus.enabled and not iv.adaptive_entropy.enabled and ready("entropy_bonus"):
            actions.append(entropy_bonus(health, knobs, iv.entropy_bonus))
        if iv.temperature.enabled and ready("temperature"):
            actions.append(raise_temperature(history, health, knobs, iv.temperature))
        if iv.dynamic_sampling.enabled:
            actions.append(dynamic_sampling(health, knobs, iv.dynamic_sampling))
        if iv.verifier_rotation.enabled and ready("verifier_rotation"):
            actions.append(verifier_rotation(health, knobs, iv.verifier_rotation))
    return [a for a in actions if a is not None]


__all__ = ["ALARMS", "NOTICES", "Action", "Alarm", "AlarmSpec", "Health", "HealthConfig", "Knobs", "Reading",
           "alarm_spans", "check", "plan", "register", "replay", "series", "smooth", "trend"]
