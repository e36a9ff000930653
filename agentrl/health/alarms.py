"""The alarms: each a check over a `Reading` of the metric history, registered in `ALARMS`.

`check(history)` is pure: the same history gives the same answer, so `agentrl report` replays an old
run exactly as the live run saw it. How each rule reads a history: docs/algorithms.md, Training
health, and the module docstring of `agentrl.health`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.health.config import HealthConfig
from agentrl.health.series import Point, Row, Trend, change, early_level, falling, series, since, smooth, trend

ENTROPY_COLLAPSE = "ENTROPY COLLAPSE"
KL_DRIFT = "KL DRIFT"
STALLED = "STALLED"
VERIFIER_OVERFIT = "VERIFIER OVERFIT"
TRUNCATION = "TRUNCATION BLOW-UP"
NONFINITE = "NON-FINITE"
ENGINE_MISMATCH = "ENGINE MISMATCH"
SUMMARY_COLLAPSE = "SUMMARY COLLAPSE"
COMPACTION_DRIFT = "COMPACTION DRIFT"
ENTROPY_TREND = "entropy trending down"  # a notice, not an alarm: it never stops a run

ENTROPY, KL, PASS, HELDOUT = "train/entropy", "train/kl", "rollout/pass_rate", "eval/pass_rate"
ZERO_ADV, TRUNC = "credit/zero_adv_frac", "rollout/truncated_frac"
FINITE_KEYS = ("train/loss", "train/grad_norm", "train/kl", "train/entropy")
MISMATCH_KL, MISMATCH_ESS = "mismatch/kl_k3", "mismatch/ess"  # agentrl.mismatch.stats, every update
# the rollout's, under a compacting rollout.context policy (agentrl.context)
SUMMARY_TOKENS, FACTS_KEPT = "context/summary_tokens", "context/facts_kept"
COMPACTIONS = "context/compactions_per_episode"


# -- alarm states ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Alarm:
    name: str
    reason: str  # in words: why it fired, with the numbers


@dataclass(frozen=True)
class AlarmSpec:
    """One alarm: its name (what logs, reports and the docs call it), how the status column spells it,
    its 0/1 key in metrics.jsonl, its check (a reason in words when it fires, else None), the colour
    `agentrl report` shades its spans with, and whether it stops a run whatever `on_alarm` says.

    Adding an alarm is one `register(AlarmSpec(...))` beside its check; the trainer's log and its stop
    (`stops`), the console, `alarm_spans` and the report read `ALARMS`.
    """

    name: str
    label: str
    key: str
    check: Callable[[Reading], str | None]
    colour: str = "#bbbbbb"  # a matplotlib colour
    fatal: bool = False  # True: the run cannot go on sensibly (a non-finite loss), so it stops even under warn


ALARMS: dict[str, AlarmSpec] = {}  # the registry, in status order


def register(spec: AlarmSpec) -> AlarmSpec:
    """Add `spec` to `ALARMS`, after the alarms registered before it (registration order is status order)."""
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
    rate has stopped rising below the top band. Once the run is STALLED as well, the stall (which names
    the spent entropy as its cause) is the state to act on, and the collapse hands over.

    A policy that sharpens while it passes within `top_margin` of the ceiling is converging, not
    collapsing, as a plateau there is success for STALLED: on the README's main job, answering this
    alarm (an entropy bonus and a temperature floor) did not lift the plateau it fired on
    (docs/benchmarks.md, "Collapse or convergence: the main job")."""
    cfg, raw = r.cfg, r.raw(ENTROPY)
    if not (r.ent and r.base_ent) or not falling(r.ent, cfg.trend_steps, cfg.monotone_frac) or not r.below_floor:
        return None
    if r.pas and r.pas[-1][1] >= cfg.ceiling - cfg.top_margin:
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


def _settled(r: Reading, key: str) -> tuple[float, float] | None:
    """(the smoothed value now, the early level) of `key`, once the history reaches past its early window."""
    raw = r.raw(key)
    if not raw or raw[-1][0] < raw[0][0] + r.cfg.baseline_steps:
        return None
    base = early_level(raw, r.cfg.baseline_steps)
    return (r.smoothed(key)[-1][1], base) if base is not None else None


def check_summary_collapse(r: Reading) -> str | None:
    """The policy's summaries (rollout.context summarize) are shrinking toward nothing: smoothed summary tokens
    below `summary_floor_frac` of their early level; or losing the facts the task needs: the env's smoothed
    facts-kept share `facts_drop` or more below its early level. Masked summaries were reported to collapse
    (docs/context.md); a trained summary that collapses is the policy learning to forget."""
    cfg, why = r.cfg, []
    tokens = _settled(r, SUMMARY_TOKENS)
    if tokens is not None and tokens[1] > 0 and tokens[0] < cfg.summary_floor_frac * tokens[1]:
        why.append(f"summaries of {tokens[0]:.0f} tokens are below {cfg.summary_floor_frac:.0%} of the early "
                   f"{tokens[1]:.0f}")
    facts = _settled(r, FACTS_KEPT)
    if facts is not None and facts[0] <= facts[1] - cfg.facts_drop:
        why.append(f"summaries keep {facts[0]:.0%} of the facts the task needs (early run: {facts[1]:.0%}; "
                   f"limit: a fall of {cfg.facts_drop:.0%})")
    return "; ".join(why) or None


def check_compaction_drift(r: Reading) -> str | None:
    """Compactions per episode moved far from their early rate (x (1 + `compaction_drift`) or / it): episodes
    outgrowing the budget much more often (longer turns, summaries that crowd the context they free) or much
    less (shorter episodes, a policy that ends early to avoid the cut)."""
    cfg, rate = r.cfg, _settled(r, COMPACTIONS)
    if rate is None or rate[1] <= 0:
        return None
    now, base = rate
    ratio = now / base
    if ratio >= 1 + cfg.compaction_drift or ratio <= 1 / (1 + cfg.compaction_drift):
        return (f"{now:.2f} compactions per episode against {base:.2f} early in the run (x{ratio:.2f}; limit "
                f"x{1 + cfg.compaction_drift:g} either way)")
    return None


# How each alarm reads in the status column: the docs' example spells "stalled + KL drifting"
register(AlarmSpec(ENTROPY_COLLAPSE, "ENTROPY COLLAPSE", "health/entropy_collapse", check_entropy_collapse, "#d62728"))
register(AlarmSpec(STALLED, "stalled", "health/stalled", check_stalled, "#7f7f7f"))
register(AlarmSpec(KL_DRIFT, "KL drifting", "health/kl_drift", check_kl_drift, "#9467bd"))
register(AlarmSpec(VERIFIER_OVERFIT, "VERIFIER OVERFIT", "health/verifier_overfit", check_verifier_overfit,
                   "#ff7f0e"))
register(AlarmSpec(TRUNCATION, "truncation blow-up", "health/truncation", check_truncation, "#8c564b"))
register(AlarmSpec(ENGINE_MISMATCH, "ENGINE MISMATCH", "health/engine_mismatch", check_engine_mismatch, "#17becf"))
register(AlarmSpec(SUMMARY_COLLAPSE, "SUMMARY COLLAPSE", "health/summary_collapse", check_summary_collapse,
                   "#e377c2"))
register(AlarmSpec(COMPACTION_DRIFT, "compaction drift", "health/compaction_drift", check_compaction_drift,
                   "#bcbd22"))
# a step whose loss or gradient is not finite is skipped: the run cannot learn on, so it stops under every on_alarm
register(AlarmSpec(NONFINITE, "NON-FINITE loss/grad", "health/nonfinite", check_nonfinite, "#000000", fatal=True))


def entropy_trending_down(r: Reading) -> bool:
    """A notice: entropy fell by `entropy_trend_frac` of its early level within the trend span, but
    is not below the floor yet (where ENTROPY COLLAPSE takes over)."""
    cfg = r.cfg
    if not (r.ent and r.base_ent) or r.below_floor or not falling(r.ent, cfg.trend_steps, cfg.monotone_frac):
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

def stops(health: Health, cfg: HealthConfig) -> list[Alarm]:
    """The alarms at which the run must stop, in status order: every alarm with `on_alarm="stop"`, else the
    fatal ones (`AlarmSpec.fatal`: NON-FINITE).

    >>> h = Health(step=3, alarms=[Alarm(STALLED, "flat"), Alarm(NONFINITE, "train/loss = nan at this update")])
    >>> [a.name for a in stops(h, HealthConfig())], [a.name for a in stops(h, HealthConfig(on_alarm="stop"))]
    (['NON-FINITE'], ['STALLED', 'NON-FINITE'])
    """
    return [a for a in health.alarms if cfg.on_alarm == "stop" or (a.name in ALARMS and ALARMS[a.name].fatal)]


__all__ = [
    "ALARMS", "COMPACTION_DRIFT", "ENGINE_MISMATCH", "ENTROPY_COLLAPSE", "ENTROPY_TREND", "KL_DRIFT", "NONFINITE",
    "NOTICES", "STALLED", "SUMMARY_COLLAPSE", "TRUNCATION", "VERIFIER_OVERFIT", "Alarm", "AlarmSpec", "Health",
    "Reading", "alarm_spans", "check", "check_compaction_drift", "check_engine_mismatch", "check_entropy_collapse",
    "check_kl_drift", "check_nonfinite", "check_stalled", "check_summary_collapse", "check_truncation",
    "check_verifier_overfit", "entropy_trending_down", "no_progress", "register", "replay", "stops",
]
