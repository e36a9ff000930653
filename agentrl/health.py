"""Training health: alarms as a pure function over the metric history, and the interventions.

Everything here reads rows as `metrics.jsonl` holds them (one dict per update, with `step`), so an
old run can be replayed exactly as the live run saw it:

>>> rows = [{"step": s, "rollout/pass_rate": p, "train/entropy": h, "train/kl": k}
...         for s, p, h, k in [(200, .42, 1.83, .04), (800, .61, 1.51, .11), (1600, .73, 1.02, .19),
...                            (2400, .79, .48, .28), (3200, .79, .11, .44)]]
>>> [check(rows[: i + 1]).status for i in range(len(rows))]
['healthy', 'healthy', 'entropy trending down', 'ENTROPY COLLAPSE', 'stalled + KL drifting']
>>> print(check(rows[:4]).alarms[0].reason)
entropy 0.480 fell over the last 800 steps and sits below the floor 0.549 (30% of the early 1.830) while pass rate gained only +0.06

How the rules read a history (ALGORITHMS.md §4):

- A series is one metric over the rows that hold it (the final-evaluation row is left out).
- Smoothing is an exponential moving average whose weight follows the step gap (half-life
  `smooth_steps` updates): per-update logs are smoothed, a dashboard sampled every few hundred
  steps is read as it stands.
- "Over the last N steps" compares the smoothed value now with the smoothed value at the latest row
  at least N steps back; until such a row exists the rule does not judge.
- The early level of a metric is its mean over the first `baseline_steps` updates.

Why the defaults: see each `HealthConfig` field. Interventions are the small pure policies at the
bottom (`plan`): given the history, the alarm states and the current knobs, they say what to change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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
ALARMS = (ENTROPY_COLLAPSE, STALLED, KL_DRIFT, VERIFIER_OVERFIT, TRUNCATION, NONFINITE)  # status order
# How each alarm reads in the status column (ALGORITHMS.md §4's example spells "stalled + KL drifting")
LABELS = {ENTROPY_COLLAPSE: "ENTROPY COLLAPSE", KL_DRIFT: "KL drifting", STALLED: "stalled",
          VERIFIER_OVERFIT: "VERIFIER OVERFIT", TRUNCATION: "truncation blow-up", NONFINITE: "NON-FINITE loss/grad"}
# metrics.jsonl keys of the alarm states: health/entropy_collapse, health/kl_drift, ...
KEYS = {ENTROPY_COLLAPSE: "health/entropy_collapse", KL_DRIFT: "health/kl_drift", STALLED: "health/stalled",
        VERIFIER_OVERFIT: "health/verifier_overfit", TRUNCATION: "health/truncation", NONFINITE: "health/nonfinite"}
ENTROPY_TREND = "entropy trending down"  # a notice, not an alarm: it never stops a run

ENTROPY, KL, PASS, HELDOUT = "train/entropy", "train/kl", "rollout/pass_rate", "eval/pass_rate"
ZERO_ADV, TRUNC = "credit/zero_adv_frac", "rollout/truncated_frac"
FINITE_KEYS = ("train/loss", "train/grad_norm", "train/kl", "train/entropy")


# -- configuration -------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EntropyBonus(_Strict):
    enabled: bool = Field(True, description="On ENTROPY COLLAPSE (with --on-alarm intervene), switch on an entropy bonus if none is set.")
    coef: float = Field(0.01, gt=0, description="c_H to set: 0.01 is PPO's Atari value and a common first try for LLM policies.")


class AdaptiveEntropy(_Strict):
    enabled: bool = Field(False, description="A controller, not an alarm response: acts every update when on (off: it changes the loss you asked for).")
    target_frac: float = Field(0.5, gt=0, description="Target entropy as a fraction of the early-run entropy: half leaves room to sharpen but keeps exploring.")
    target: float | None = Field(None, gt=0, description="Absolute target entropy (nats per token); overrides target_frac.")
    step: float = Field(0.005, gt=0, description="Change of c_H per update (ALGORITHMS.md §4: +/- 0.005 steps).")
    tolerance: float = Field(0.1, ge=0, description="No change while entropy is within this fraction of the target, so the coefficient does not chatter.")
    max_coef: float = Field(0.05, gt=0, description="Upper bound of c_H; larger bonuses swamp the policy gradient of a sparse reward.")


class RaiseTemperature(_Strict):
    enabled: bool = Field(True, description="Below the entropy floor (with --on-alarm intervene), sample rollouts hotter; back down once entropy recovers.")
    step: float = Field(0.1, gt=0, description="Temperature change per acting update; small, since the ratio's behaviour log-probs follow it.")
    max_temperature: float = Field(1.5, gt=0, description="Cap: above ~1.5 tiny policies emit malformed tool calls more than they explore.")
    recover_frac: float = Field(1.5, ge=1, description="Step back toward the configured temperature once entropy is above floor x this (hysteresis).")


class AdaptiveKL(_Strict):
    enabled: bool = Field(False, description="A controller: acts every update when on (verl's adaptive KL controller, Ziegler et al. 2019).")
    target: float = Field(0.05, gt=0, description="Target k3 KL per token; half the 0.1 warning level, so the controller acts before the alarm.")
    init_coef: float = Field(0.001, gt=0, description="beta to start from when the loss has none (kl_coef 0): the controller multiplies, so it needs a start.")
    max_change: float = Field(0.2, gt=0, le=1, description="beta changes by at most this factor per update (verl clips the proportional error at 0.2).")
    max_coef: float = Field(1.0, gt=0, description="Upper bound of beta.")


class DynamicSampling(_Strict):
    enabled: bool = Field(True, description="On STALLED by zero-advantage groups (with --on-alarm intervene), switch the assigner's dynamic sampling to 'resample' (DAPO).")


class VerifierRotation(_Strict):
    enabled: bool = Field(True, description="On VERIFIER OVERFIT (with --on-alarm intervene), score each episode against more hidden tests drawn from the pool.")
    step: int = Field(2, ge=1, description="Extra hidden tests per episode each time it acts.")
    max_tests: int = Field(12, ge=1, description="Cap on hidden tests per episode; the env also caps at its pool size.")


class Interventions(_Strict):
    entropy_bonus: EntropyBonus = Field(default_factory=EntropyBonus)
    adaptive_entropy: AdaptiveEntropy = Field(default_factory=AdaptiveEntropy)
    temperature: RaiseTemperature = Field(default_factory=RaiseTemperature)
    adaptive_kl: AdaptiveKL = Field(default_factory=AdaptiveKL)
    dynamic_sampling: DynamicSampling = Field(default_factory=DynamicSampling)
    verifier_rotation: VerifierRotation = Field(default_factory=VerifierRotation)
    cooldown: int = Field(5, ge=0, description="Updates an alarm-triggered intervention waits before acting again, so its effect can show first.")


class HealthConfig(_Strict):
    """Alarm thresholds and interventions (ALGORITHMS.md §4). Windows are in updates (steps).

    >>> HealthConfig().kl_warn, HealthConfig(on_alarm="stop").on_alarm
    (0.1, 'stop')
    """

    on_alarm: Literal["warn", "stop", "intervene"] = Field(
        "warn", description="warn: show and log; stop: end the run at the first alarm; intervene: also apply the enabled interventions. warn never changes a run you configured.")
    smooth_steps: float = Field(2.0, gt=0, description="Half-life (updates) of the moving average; 2 damps 64-episode batch noise yet follows a collapse within a few updates.")
    trend_steps: int = Field(8, ge=1, description="Span over which rising / falling is judged; 8 updates of the default run move the pass rate ~0.06, well past smoothed noise.")
    stall_steps: int = Field(24, ge=1, description="Span of the flat-pass-rate rule: three trend spans, so that a slow but real climb (0.006 per update under 64-episode noise) is not called flat.")
    baseline_steps: int = Field(5, ge=1, description="The first updates that set the early-run level of entropy and truncation.")
    entropy_floor_frac: float = Field(0.3, gt=0, lt=1, description="ENTROPY COLLAPSE needs entropy below this fraction of its early level (ALGORITHMS.md §4: 30%).")
    entropy_trend_frac: float = Field(0.2, gt=0, description="'entropy trending down' when the smoothed entropy fell by this fraction of its early level within the trend span.")
    monotone_frac: float = Field(0.75, gt=0, le=1, description="'Fell monotonically' allows this share of rising row-to-row steps to be missing, since smoothed noise still wiggles.")
    rise_min: float = Field(0.08, ge=0, description="Pass rate counts as still rising only if it gained this much over the trend span (~ one standard error of a 64-episode difference).")
    flat_tol: float = Field(0.02, ge=0, description="Pass rate counts as flat (not rising) if it gained at most this much over the span.")
    zero_adv_max: float = Field(0.75, gt=0, le=1, description="STALLED when the smoothed share of zero-advantage groups reaches this: 'most groups carry no signal'.")
    kl_warn: float = Field(0.1, ge=0, description="KL per token above which rising KL with a pass rate that does not rise is drift (verl's adaptive controller targets 0.1).")
    kl_max: float = Field(0.5, gt=0, description="KL per token that is drift on its own (one practitioner's early-warning figure for 7B models).")
    kl_rise_min: float = Field(0.01, ge=0, description="KL counts as rising if it grew this much over the trend span.")
    overfit_drop: float = Field(0.05, ge=0, description="VERIFIER OVERFIT needs held-out pass rate to fall by at least this between two evaluations...")
    overfit_z: float = Field(2.5, ge=0, description="...and by this many standard errors of the difference when episode counts are logged (128 held-out episodes: ~0.15), so a run with a dozen evaluations rarely sees a false alarm.")
    overfit_rise: float = Field(0.05, ge=0, description="...while the smoothed train pass rate rose by at least this over the same steps.")
    trunc_rise: float = Field(0.25, gt=0, le=1, description="Truncation blow-up when the truncated share rose this far above its early level (episodes grow past the turn or context budget)...")
    trunc_max: float | None = Field(None, gt=0, le=1, description="...or reached this share at all. Off by default: where failing means running out of turns (Vault), half the warm start's episodes are truncated by design.")
    interventions: Interventions = Field(default_factory=Interventions)


# -- alarm states ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Alarm:
    name: str
    reason: str  # in words: why it fired, with the numbers


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
            return " + ".join(LABELS[a.name] for a in sorted(self.alarms, key=lambda a: ALARMS.index(a.name)))
        return " + ".join(self.notices) or "healthy"

    def metrics(self) -> dict[str, Any]:
        """What the trainer writes into metrics.jsonl: one 0/1 per alarm, the status and the reasons."""
        out: dict[str, Any] = {key: float(name in self.names) for name, key in KEYS.items()}
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


def check(history: Sequence[Row], cfg: HealthConfig | None = None) -> Health:
    """The alarm states at the last row of `history` (pure: the same history, the same answer)."""
    cfg = cfg or HealthConfig()
    rows = [r for r in history if not r.get("final")]
    health = Health(step=float(rows[-1]["step"]) if rows else 0.0)
    if not rows:
        return health

    # NON-FINITE: the latest update's loss, gradient norm, KL or entropy is NaN or infinite
    last = rows[-1]
    bad = [k for k in FINITE_KEYS if isinstance(last.get(k), (int, float)) and not math.isfinite(last[k])]
    if bad:
        health.alarms.append(Alarm(NONFINITE, ", ".join(f"{k} = {last[k]}" for k in bad) + " at this update"))

    ent = smooth(series(rows, ENTROPY), cfg.smooth_steps)
    pas = smooth(series(rows, PASS), cfg.smooth_steps)
    kl = smooth(series(rows, KL), cfg.smooth_steps)
    raw_ent = [p for p in series(rows, ENTROPY) if math.isfinite(p[1])]
    base_ent = early_level(raw_ent, cfg.baseline_steps)
    pass_gain = change(pas, cfg.trend_steps, settle=2 * cfg.smooth_steps)
    floor = cfg.entropy_floor_frac * base_ent if base_ent else None
    health.entropy_floor = floor
    below_floor = floor is not None and bool(raw_ent) and raw_ent[-1][1] < floor

    # STALLED: most groups carry zero advantage, or the pass rate is flat over `stall_steps`
    stalled_why = []
    zero = smooth(series(rows, ZERO_ADV), cfg.smooth_steps)
    if zero and zero[-1][1] >= cfg.zero_adv_max:
        stalled_why.append(f"{zero[-1][1]:.0%} of groups carry zero advantage (>= {cfg.zero_adv_max:.0%})")
    flat = change(pas, cfg.stall_steps, settle=2 * cfg.smooth_steps)
    if flat is not None and flat[0] <= cfg.flat_tol:
        stalled_why.append(f"pass rate {pas[-1][1]:.2f} gained {flat[0]:+.2f} over {flat[1]:.0f} steps (flat: <= {cfg.flat_tol:+.2f})")
    if stalled_why:
        if below_floor:
            stalled_why.append(f"entropy {raw_ent[-1][1]:.3f} is below the floor {floor:.3f}: groups stop exploring")
        health.alarms.append(Alarm(STALLED, "; ".join(stalled_why)))

    # ENTROPY COLLAPSE: smoothed entropy fell monotonically over the trend span, sits below the
    # floor, and the pass rate has stopped rising. Once the run is STALLED as well, the stall (which
    # names the spent entropy as its cause) is the state to act on, and the collapse hands over.
    if ent and base_ent:
        falling = _falling(ent, cfg.trend_steps, cfg.monotone_frac)
        drop = change(ent, cfg.trend_steps)
        not_rising = pass_gain is not None and pass_gain[0] < cfg.rise_min
        if falling and below_floor and (not_rising or not pas) and STALLED not in health.names:
            gain = f"pass rate gained only {pass_gain[0]:+.2f}" if pass_gain else "no pass rate logged"
            health.alarms.append(Alarm(ENTROPY_COLLAPSE, f"entropy {raw_ent[-1][1]:.3f} fell over the last {drop[1]:.0f} steps and sits below "
                                                         f"the floor {floor:.3f} ({cfg.entropy_floor_frac:.0%} of the early {base_ent:.3f}) while {gain}"))
        elif falling and drop is not None and -drop[0] >= cfg.entropy_trend_frac * base_ent and not below_floor:
            health.notices.append(ENTROPY_TREND)

    # KL DRIFT: KL per token above kl_max, or above kl_warn and rising while the pass rate (held-out
    # when evaluated in the span, else train) does not rise
    if kl and math.isfinite(kl[-1][1]):
        now = kl[-1][1]
        if now >= cfg.kl_max:
            health.alarms.append(Alarm(KL_DRIFT, f"KL {now:.3f} per token is above the ceiling {cfg.kl_max}"))
        else:
            kl_rise = change(kl, cfg.trend_steps)
            held = series(rows, HELDOUT)
            ref, which = (change(held, cfg.trend_steps), "held-out") if len(held) >= 2 and held[-1][0] >= kl[-1][0] - cfg.trend_steps else (pass_gain, "train")
            if which == "held-out" and ref is None:
                ref, which = pass_gain, "train"
            if now >= cfg.kl_warn and kl_rise is not None and kl_rise[0] >= cfg.kl_rise_min and ref is not None and ref[0] <= cfg.flat_tol:
                health.alarms.append(Alarm(KL_DRIFT, f"KL {now:.3f} per token (>= {cfg.kl_warn}) rose {kl_rise[0]:+.3f} over {kl_rise[1]:.0f} steps "
                                                     f"while {which} pass rate moved {ref[0]:+.2f}"))

    # VERIFIER OVERFIT: held-out pass rate fell between its last two evaluations (beyond noise)
    # while the train pass rate rose over the same steps
    held = series(rows, HELDOUT)
    if len(held) >= 2 and held[-1][0] == health.step:
        (s0, h0), (s1, h1) = held[-2], held[-1]
        n0, n1 = _count(rows, s0, "eval/episodes"), _count(rows, s1, "eval/episodes")
        need = cfg.overfit_drop
        if n0 and n1:
            p = min(max((h0 + h1) / 2, 0.05), 0.95)
            need = max(need, cfg.overfit_z * math.sqrt(p * (1 - p) * (1 / n0 + 1 / n1)))
        tr0 = [v for s, v in pas if s <= s0]
        tr_rise = pas[-1][1] - tr0[-1] if tr0 and pas else None
        if h0 - h1 >= need and tr_rise is not None and tr_rise >= cfg.overfit_rise:
            health.alarms.append(Alarm(VERIFIER_OVERFIT, f"held-out pass rate fell {h0:.2f} -> {h1:.2f} (needed a drop of {need:.2f}) between steps "
                                                         f"{s0:.0f} and {s1:.0f} while train pass rate rose {tr_rise:+.2f}"))

    # TRUNCATION BLOW-UP: many episodes hit the turn / context budget, or far more than early on
    tr = smooth(series(rows, TRUNC), cfg.smooth_steps)
    if tr:
        base = early_level(series(rows, TRUNC), cfg.baseline_steps) or 0.0
        over_max = cfg.trunc_max is not None and tr[-1][1] >= cfg.trunc_max
        if over_max or tr[-1][1] >= base + cfg.trunc_rise:
            limit = f"+{cfg.trunc_rise:.0%}" + (f" or {cfg.trunc_max:.0%}" if cfg.trunc_max is not None else "")
            health.alarms.append(Alarm(TRUNCATION, f"{tr[-1][1]:.0%} of episodes are truncated (early run: {base:.0%}; limit {limit})"))
    health.alarms.sort(key=lambda a: ALARMS.index(a.name))
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
    logged = any(KEYS[STALLED] in r for r in rows)
    states = [{n for n, k in KEYS.items() if r.get(k)} for r in rows] if logged else [h.names for h in replay(rows, cfg)]
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
        return Action("adaptive_entropy", "entropy_coef", k.entropy_coef, new, f"entropy {now:.3f} < target {target:.3f}")
    if now > target * (1 + c.tolerance) and k.entropy_coef > 0:
        new = max(round(k.entropy_coef - c.step, 6), 0.0)
        return Action("adaptive_entropy", "entropy_coef", k.entropy_coef, new, f"entropy {now:.3f} > target {target:.3f}")
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
        return Action("temperature", "temperature", k.temperature, new, f"entropy {now:.3f} < floor {h.entropy_floor:.3f}")
    if now > h.entropy_floor * c.recover_frac and k.temperature > k.base_temperature:
        new = round(max(k.temperature - c.step, k.base_temperature), 4)
        return Action("temperature", "temperature", k.temperature, new, f"entropy {now:.3f} recovered above {h.entropy_floor * c.recover_frac:.3f}")
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
        return Action("dynamic_sampling", "dynamic_sampling", k.dynamic_sampling, "resample", "STALLED: most groups carry zero advantage")
    return None


def verifier_rotation(h: Health, k: Knobs, c: VerifierRotation) -> Action | None:
    """On VERIFIER OVERFIT, score every episode against more hidden tests from the pool."""
    if VERIFIER_OVERFIT in h.names and k.verifier_tests is not None and k.verifier_tests < c.max_tests:
        return Action("verifier_rotation", "verifier_tests", k.verifier_tests, min(k.verifier_tests + c.step, c.max_tests), "VERIFIER OVERFIT")
    return None


def plan(history: Sequence[Row], health: Health, knobs: Knobs, cfg: HealthConfig, last_acted: dict[str, float] | None = None) -> list[Action]:
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


__all__ = ["ALARMS", "Action", "Alarm", "Health", "HealthConfig", "Knobs", "alarm_spans", "check", "plan", "replay", "series", "smooth"]
