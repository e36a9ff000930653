"""Interventions: small pure policies that read the history, the alarm states and the knobs as they
stand, and say which knob to turn (`plan`); the trainer turns it.

Each intervention is one function `(Situation, its settings) -> Action | None`, one
`register_intervention(InterventionSpec(...))` beside it, and one settings field under
`HealthConfig.interventions` of the spec's name. `plan` asks them in registration order:

>>> from agentrl.health.config import HealthConfig
>>> cfg = HealthConfig(interventions={"adaptive_kl": {"enabled": True}})
>>> knobs = Knobs(entropy_coef=0.0, kl_coef=0.01, temperature=1.0, base_temperature=1.0, dynamic_sampling=None,
...               verifier_tests=None)
>>> [str(a) for a in plan([{"step": 1, "train/kl": 0.1}], Health(step=1), knobs, cfg)]
['adaptive_kl: kl_coef 0.01 -> 0.012 (KL 0.1000 vs target 0.05)']

The knobs live in one object the trainer owns (`Knobs`): the run's config is read, never written.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from pydantic import BaseModel

from agentrl.health.alarms import ENTROPY, ENTROPY_COLLAPSE, KL, STALLED, VERIFIER_OVERFIT, Health
from agentrl.health.config import (
    AdaptiveEntropy,
    AdaptiveKL,
    DynamicSampling,
    EntropyBonus,
    HealthConfig,
    Interventions,
    RaiseTemperature,
    VerifierRotation,
)
from agentrl.health.series import Row, early_level, series

Reader = Literal["loss", "sampling", "credit", "env"]


@dataclass(frozen=True)
class Action:
    intervention: str
    knob: str
    old: Any
    new: Any
    reason: str

    def __str__(self) -> str:
        return f"{self.intervention}: {self.knob} {self.old} -> {self.new} ({self.reason})"


def _knob(reader: Reader, name: str, metric: str | None = None) -> Any:
    """A knob's field: who reads it (the loss's or the sampler's config field `name`, the assigner's option
    `name`, the env's attribute `name`) and its key in metrics.jsonl (None: not logged)."""
    return field(metadata={"reader": reader, "name": name, "metric": metric})


@dataclass
class Knobs:
    """What interventions may turn, in one object the trainer owns; the run's config is never written.

    The trainer builds the parts that read a knob from it: the loss gets a copy of `cfg.loss` with the
    knobs' coefficients, the engine a copy of `cfg.rollout.sampling` with the knobs' temperature, the
    assigner its options through `set_options`, each env its attribute. `dynamic_sampling` is None when
    the assigner has no such option, `verifier_tests` when the env does not rotate its hidden tests: a
    knob that is None is never turned. A checkpoint keeps `state()`; `metrics()` is what each update
    logs it ran with.

    >>> k = Knobs(0.0, 0.01, 1.0, 1.0, None, 3)
    >>> k.turn(Action("adaptive_kl", "kl_coef", 0.01, 0.012, "KL 0.1 vs target 0.05"))
    'loss'
    >>> k.reads("loss"), k.metrics()["train/kl_coef"], k.reads("env")
    ({'entropy_coef': 0.0, 'kl_coef': 0.012}, 0.012, {'hidden_per_episode': 3})
    >>> Knobs(0.0, 0.0, 1.0, 1.0, None, 3).load(k.state()) == k
    True
    """

    entropy_coef: float = _knob("loss", "entropy_coef", "train/entropy_coef")
    kl_coef: float = _knob("loss", "kl_coef", "train/kl_coef")
    temperature: float = _knob("sampling", "temperature", "rollout/temperature")
    base_temperature: float  # the configured temperature, where a raised one returns to; never turned
    dynamic_sampling: str | None = _knob("credit", "dynamic_sampling")
    verifier_tests: int | None = _knob("env", "hidden_per_episode", "rollout/verifier_tests")

    def turn(self, action: Action) -> Reader:
        """Set the knob `action` names to its new value; returns who reads that knob."""
        f = next((f for f in fields(self) if f.name == action.knob and "reader" in f.metadata), None)
        if f is None or getattr(self, f.name) is None:
            raise ValueError(f"intervention {action.intervention!r} names a knob this run does not have: "
                             f"{action.knob!r}")
        old = getattr(self, f.name)
        setattr(self, f.name, type(old)(action.new))  # a coefficient stays a float, a test count an int
        return f.metadata["reader"]

    def reads(self, reader: Reader) -> dict[str, Any]:
        """The knobs `reader` reads, by its own names (the ones this run has)."""
        return {f.metadata["name"]: getattr(self, f.name) for f in fields(self)
                if f.metadata.get("reader") == reader and getattr(self, f.name) is not None}

    def metrics(self) -> dict[str, float]:
        """What an update logs it ran with: `train/entropy_coef`, `train/kl_coef`, `rollout/temperature`, and
        `rollout/verifier_tests` where the env rotates its hidden tests."""
        return {f.metadata["metric"]: float(getattr(self, f.name)) for f in fields(self)
                if f.metadata.get("metric") and getattr(self, f.name) is not None}

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (JSON)."""
        return asdict(self)

    def load(self, state: dict[str, Any]) -> Knobs:
        """Take back what `state()` saved. A knob this run does not have (None) stays None; a checkpoint
        written before the knobs were one object holds the same names, less `base_temperature`."""
        for f in fields(self):
            if getattr(self, f.name) is not None and state.get(f.name) is not None:
                setattr(self, f.name, state[f.name])
        return self


@dataclass(frozen=True)
class Situation:
    """What an intervention reads at one update: the metric history (its last row is this update's),
    the alarm states at that row, the knobs as they stand, and the health settings."""

    history: Sequence[Row]
    health: Health
    knobs: Knobs
    cfg: HealthConfig = field(default_factory=HealthConfig)


@dataclass(frozen=True)
class InterventionSpec:
    """One intervention: its name (its settings field under `HealthConfig.interventions`, the `Action`'s
    `intervention`, its key in the cooldowns), its function, and when `plan` asks it.

    `kind` "controller": asked at every update while enabled, whatever `on_alarm` says (it steers a
    knob to a target); "alarm": an answer to an alarm, asked only with `on_alarm="intervene"`.
    `cooldown`: after acting it waits `interventions.cooldown` updates, so that its effect can show.
    `yields_to`: interventions that own the same knob; while one of them is enabled this one is not asked.
    `settings`: for an intervention registered outside agentrl, its settings (a model with `enabled`),
    used where `Interventions` has no field of its name.
    """

    name: str
    act: Callable[[Situation, Any], Action | None]
    kind: Literal["controller", "alarm"]
    cooldown: bool = True
    yields_to: tuple[str, ...] = ()
    settings: BaseModel | None = None


INTERVENTIONS: dict[str, InterventionSpec] = {}  # the registry, in the order `plan` asks


def register_intervention(spec: InterventionSpec) -> InterventionSpec:
    """Add `spec` to `INTERVENTIONS`, asked after the ones registered before it."""
    if spec.name in INTERVENTIONS:
        raise ValueError(f"intervention {spec.name!r} is registered already")
    if spec.name not in Interventions.model_fields and spec.settings is None:
        raise ValueError(f"intervention {spec.name!r}: HealthConfig.interventions has no field {spec.name!r}; give "
                         "the spec its settings=")
    unknown = [n for n in spec.yields_to if n not in INTERVENTIONS]
    if unknown:
        raise ValueError(f"intervention {spec.name!r} yields to {unknown}, which are not registered (before it)")
    INTERVENTIONS[spec.name] = spec
    return spec


def settings_of(spec: InterventionSpec, iv: Interventions) -> Any:
    """The settings `spec`'s function is called with: the config's field of its name, else the spec's own."""
    return getattr(iv, spec.name) if spec.name in Interventions.model_fields else spec.settings


# -- the interventions: each a function of the situation and its settings, registered below in order -----


def adaptive_entropy(s: Situation, c: AdaptiveEntropy) -> Action | None:
    """Move c_H by one step toward keeping entropy at its target; no change inside the tolerance band.

    >>> rows = [{"step": 1, "train/entropy": 1.0}, {"step": 9, "train/entropy": 0.3}]
    >>> k = Knobs(0.0, 0.0, 1.0, 1.0, None, None)
    >>> adaptive_entropy(Situation(rows, Health(step=9), k, HealthConfig(baseline_steps=1)),
    ...                  AdaptiveEntropy(enabled=True)).new
    0.005
    """
    k, pts = s.knobs, series(s.history, ENTROPY)
    if not pts or not math.isfinite(pts[-1][1]):
        return None
    target = c.target or c.target_frac * (early_level(pts, s.cfg.baseline_steps) or pts[0][1])
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


def adaptive_kl(s: Situation, c: AdaptiveKL) -> Action | None:
    """beta <- beta * (1 + clip(KL / target - 1, -max_change, +max_change)); at the target, no change.

    >>> k = Knobs(0.0, 0.01, 1.0, 1.0, None, None)
    >>> adaptive_kl(Situation([{"step": 1, "train/kl": 0.1}], Health(step=1), k),
    ...             AdaptiveKL(enabled=True, target=0.05)).new
    0.012
    """
    k, pts = s.knobs, series(s.history, KL)
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


def entropy_bonus(s: Situation, c: EntropyBonus) -> Action | None:
    """On ENTROPY COLLAPSE, switch on an entropy bonus if the loss has none."""
    k = s.knobs
    if ENTROPY_COLLAPSE in s.health.names and k.entropy_coef < c.coef:
        return Action("entropy_bonus", "entropy_coef", k.entropy_coef, c.coef, "ENTROPY COLLAPSE")
    return None


def raise_temperature(s: Situation, c: RaiseTemperature) -> Action | None:
    """Below the entropy floor, sample one step hotter; once entropy is back above floor x recover,
    step back toward the configured temperature."""
    h, k, pts = s.health, s.knobs, series(s.history, ENTROPY)
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


def dynamic_sampling(s: Situation, c: DynamicSampling) -> Action | None:
    """On STALLED by zero-advantage groups, drop such groups and roll out more (DAPO's resampling)."""
    k = s.knobs
    stalled = next((a for a in s.health.alarms if a.name == STALLED), None)
    if stalled and "zero advantage" in stalled.reason and k.dynamic_sampling not in (None, "resample"):
        return Action("dynamic_sampling", "dynamic_sampling", k.dynamic_sampling, "resample",
                      "STALLED: most groups carry zero advantage")
    return None


def verifier_rotation(s: Situation, c: VerifierRotation) -> Action | None:
    """On VERIFIER OVERFIT, score every episode against more hidden tests from the pool."""
    k = s.knobs
    if VERIFIER_OVERFIT in s.health.names and k.verifier_tests is not None and k.verifier_tests < c.max_tests:
        return Action("verifier_rotation", "verifier_tests", k.verifier_tests,
                      min(k.verifier_tests + c.step, c.max_tests), "VERIFIER OVERFIT")
    return None


# The controllers first, then the alarm answers. The entropy bonus yields to the adaptive entropy controller,
# which owns the same coefficient; dynamic sampling needs no cooldown (once on, it stays on).
register_intervention(InterventionSpec("adaptive_entropy", adaptive_entropy, "controller", cooldown=False))
register_intervention(InterventionSpec("adaptive_kl", adaptive_kl, "controller", cooldown=False))
register_intervention(InterventionSpec("entropy_bonus", entropy_bonus, "alarm", yields_to=("adaptive_entropy",)))
register_intervention(InterventionSpec("temperature", raise_temperature, "alarm"))
register_intervention(InterventionSpec("dynamic_sampling", dynamic_sampling, "alarm", cooldown=False))
register_intervention(InterventionSpec("verifier_rotation", verifier_rotation, "alarm"))


def plan(history: Sequence[Row], health: Health, knobs: Knobs, cfg: HealthConfig,
         last_acted: dict[str, float] | None = None) -> list[Action]:
    """Every action the enabled interventions take at this update, in registry order (pure; the trainer
    turns the knobs). `last_acted` is the step each intervention last acted at (its cooldown's start)."""
    iv, last_acted = cfg.interventions, last_acted or {}
    s = Situation(history, health, knobs, cfg)
    actions = []
    for spec in INTERVENTIONS.values():
        c = settings_of(spec, iv)
        if not c.enabled or any(settings_of(INTERVENTIONS[n], iv).enabled for n in spec.yields_to):
            continue
        if spec.kind == "alarm" and cfg.on_alarm != "intervene":
            continue
        if spec.cooldown and health.step - last_acted.get(spec.name, -math.inf) < iv.cooldown:
            continue
        if (action := spec.act(s, c)) is not None:
            actions.append(action)
    return actions


__all__ = ["INTERVENTIONS", "Action", "InterventionSpec", "Knobs", "Situation", "adaptive_entropy", "adaptive_kl",
           "dynamic_sampling", "entropy_bonus", "plan", "raise_temperature", "register_intervention", "settings_of",
           "verifier_rotation"]
