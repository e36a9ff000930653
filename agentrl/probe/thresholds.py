"""The probe's thresholds, and the calibrated ones this package ships.

`default_thresholds()` is what every caller uses (`agentrl probe`, `agentrl train --algo auto`,
`probe_store`): the fallback figures of `ProbeThresholds` with the horizon ones replaced by the
calibration in `thresholds.json` beside this module. That file is package data, so a wheel install
recommends exactly what a checkout does; it is written by `python -m agentrl.probe calibrate`
from the committed horizon sweep and records which sweep, which commit and how it was derived.

Which assigners are turn-level is read from the registry (`agentrl.algorithms.ASSIGNERS`, each
class's `turn_level`), so a newly registered one is a candidate without touching the probe.

>>> t = ProbeThresholds(horizon_cutoff=12)
>>> t.horizon_cutoff, t.source
(12.0, 'literature')
>>> "turn-ppo" in turn_level_assigners() and "grpo" not in turn_level_assigners()
True
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# Turn-level credit is measured against this critic-free, episode-level baseline, and it is the
# safe pick whenever the statistics cannot justify more (too few episodes, no signal, short horizon).
BASELINE = "grpo"

PACKAGED = "thresholds.json"  # package data of agentrl.probe

# The fields a sweep calibrates (the rest keep the defaults written below), and the fields that
# say where they came from. `agentrl.probe.calibration` writes exactly these to `PACKAGED`.
CALIBRATED = ("horizon_cutoff", "min_budget_episodes", "turn_level_candidates", "long_horizon_algo", "evidence")
PROVENANCE = ("source", "sweep_started", "sweep_command", "sweep_sha256", "sweep_commit", "derivation")


def turn_level_assigners() -> list[str]:
    """Names of the registered assigners that assign credit per turn (their registry entry's `turn_level`)."""
    from agentrl.algorithms import turn_level_assigners as registered

    return registered()


def _registered(names: list[str], field: str) -> list[str]:
    from agentrl.algorithms import ASSIGNERS

    unknown = [n for n in names if n not in ASSIGNERS]
    if unknown:
        raise ValueError(
            f"{field}: {unknown} not registered in agentrl.algorithms.ASSIGNERS; known: {sorted(ASSIGNERS)}"
        )
    return names


class Evidence(BaseModel):
    """What the calibration sweeps measured for one assigner against grpo past the horizon cut-off: how a pick
    of it is backed. `lead` is its mean final pass rate minus grpo's, averaged over those horizons; `spread`
    the seeds' spread there, averaged the same way (`agentrl.probe.calibration.horizon_spread`); `stderr` the spread of
    that mean lead: the larger of the seeds' spread and the leads' own standard deviation across horizons
    (they differ from family to family, not only by seed), over the square root of the horizons.

    >>> e = Evidence(lead=0.03, spread=0.06, stderr=0.02, horizons=9, wins=3)
    >>> e.reliable, Evidence(lead=0.03, spread=0.06, horizons=9, wins=3).reliable  # without stderr: vs spread
    (True, False)
    """

    model_config = ConfigDict(extra="forbid")

    lead: float
    spread: float
    stderr: float | None = Field(None, ge=0, description="the spread of the mean lead over the horizons; None in "
                                 "records written before it was kept (then `reliable` compares with `spread`)")
    horizons: int = Field(ge=0, description="calibration horizons past the cut-off that ran it")
    wins: int = Field(ge=0, description="of those, where its lead over grpo exceeded that horizon's spread")

    @property
    def reliable(self) -> bool:
        """Ahead of grpo by more than the spread of the measured lead: at one horizon the seeds' spread, over
        several the spread of their mean, so a lead seen consistently on many horizons counts even when each
        horizon alone cannot separate it (the same test as one horizon's when `horizons` is 1)."""
        bar = self.spread if self.stderr is None else self.stderr
        return self.horizons > 0 and self.lead > bar

    def describe(self, algo: str) -> str:
        sure = "" if self.stderr is None else f" ± {self.stderr:.3f}"
        return (f"in the calibration sweeps {algo} led {BASELINE} by {self.lead:+.3f}{sure} (seeds' spread "
                f"{self.spread:.3f}) over {self.horizons} horizon(s) past the cut-off, beyond the spread at "
                f"{self.wins}")


class ProbeThresholds(BaseModel):
    """Every threshold of the recommendation, and how the value probe is measured.

    The defaults here are the fallback figures of the brief and the literature; `default_thresholds()`
    replaces the horizon ones with the calibration this package ships.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    min_episodes: int = Field(
        32,
        ge=1,
        description="Fewer probed episodes than this: the statistics are too noisy to act on, so the safe choice "
        "(grpo).",
    )
    max_zero_adv_frac: float = Field(
        0.8,
        ge=0,
        le=1,
        description="More groups than this with all-equal rewards: no assigner has signal to spread; fix sampling or "
        "the curriculum first (DAPO's dynamic sampling exists for this).",
    )
    horizon_cutoff: float | None = Field(
        30.0,
        description="Median turns per episode below which grpo is recommended. Fallback: the brief's ~30 turns. From "
        "a sweep: halfway between the last horizon where no turn-level assigner beat grpo and the first where "
        "one did. None: the sweep found no such horizon, so turn-level is never recommended.",
    )
    min_budget_episodes: int = Field(
        10_000,
        ge=0,
        description="Planned training episodes below which grpo is recommended (a critic needs data). Fallback: the "
        "brief's 'tens of thousands of rollouts'. From a sweep: the per-run budget with which turn-level credit "
        "won there.",
    )
    turn_level_candidates: list[str] = Field(
        default_factory=turn_level_assigners,
        description="Turn-level assigners the rules may pick. Fallback: every registered turn-level assigner. From a "
        "sweep: those within the seeds' spread of the best at the horizons past the crossover.",
    )
    long_horizon_algo: str = Field(
        "turn-ppo",
        description="Picked at a long horizon when no more specific rule fires. §5: turn-ppo; from a sweep: the best "
        "turn-level assigner past the crossover.",
    )
    evidence: dict[str, Evidence] = Field(
        default_factory=dict,
        description="Per assigner, its measured lead over grpo past the cut-off in the calibration sweeps. A "
        "turn-level pick whose lead is not beyond its spread becomes the best-backed free assigner, or grpo "
        "('no reliable difference'); empty (the "
        "literature fallback, or a calibration from before it was recorded): picks are kept and marked unmeasured.",
    )
    free_signal: dict[str, str] = Field(
        default_factory=lambda: {"steppo": "step_reward_density", "gigpo": "state_recurrence"},
        description="Assigners that cost no more than grpo when the environment hands them their signal, and the "
        "probed statistic that says it does (above 0): steppo reads the environment's step scores (no PRM to "
        "train), gigpo groups recurring states (no critic). Only these can replace a pick the sweeps do not back "
        "(`agentrl.probe.rules.recommend`); an assigner with a critic to train never does.",
    )
    picks: dict[str, str] = Field(
        default_factory=lambda: {
            "step-scores-only": "steppo",
            "dense-step-scores": "steppo",
            "critic-not-learnable": "gigpo",
            "concentrated-value-changes": "arpo",
        },
        description="The assigner each condition-specific rule recommends: the one whose credit reads that "
        "condition's signal (step scores: steppo; a critic that cannot learn but recurring states: gigpo's step "
        "groups; concentrated value changes: arpo's reweighting). Data, not code: a new assigner is routed to a "
        "condition here.",
    )
    min_step_signal_frac: float = Field(
        0.5,
        ge=0,
        le=1,
        description="With silent outcomes, the fraction of groups whose step scores differ from which steppo is "
        "picked (the sweep: at 37 turns, all-fail groups, only steppo learned).",
    )
    min_step_density: float = Field(
        0.25,
        ge=0,
        le=1,
        description="Fraction of turns with a non-zero step score above which steppo's process rewards have something "
        "to say (heuristic; the sweep does not vary density).",
    )
    min_value_r2: float = Field(
        0.2,
        description="Cross-validated R² of the turn-value probe below which a turn critic is judged not learnable; "
        "arpo's own explained-variance gate (0.2).",
    )
    min_state_recurrence: float = Field(
        0.2,
        ge=0,
        le=1,
        description="Fraction of turns that share a (group, state) with another turn above which gigpo's step groups "
        "carry signal (heuristic).",
    )
    concentration_ratio: float = Field(
        2.0,
        gt=0,
        description="arpo when the mean largest share of |value change| is at least this multiple of the uniform "
        "share 1/K (heuristic: twice as concentrated as uniform).",
    )
    cv_folds: int = Field(
        5,
        ge=2,
        description="Folds of the value probe's cross-validation, split by group so that no task is both fit and "
        "scored.",
    )
    ridge_alpha: float | None = Field(
        None,
        ge=0,
        description="Ridge penalty on standardised features. None: chosen inside each training fold from ridge_alphas "
        "by an inner group k-fold (nested, so the reported R² is not flattered by the choice); a 96-wide hidden "
        "state on a few hundred turns needs a strong penalty, cheap features almost none.",
    )
    ridge_alphas: list[float] = Field(
        default_factory=lambda: [0.1, 1.0, 10.0, 100.0, 1000.0],
        description="The penalties tried when ridge_alpha is None.",
    )
    use_step_rewards: bool = Field(
        False,
        description="Put step rewards into the Monte Carlo returns; off, as arpo and turn-ppo default: credit from "
        "the verifier's outcome alone.",
    )
    seed: int = Field(0, description="Seeds the fold split.")
    source: str = Field(
        "literature",
        description="Where the horizon thresholds came from: 'literature', the packaged calibration, or a sweep file.",
    )
    sweep_started: str | None = Field(None, description="The sweep's start date, when the thresholds came from one.")
    sweep_command: str | None = Field(None, description="The command that ran the sweep.")
    sweep_sha256: str | None = Field(
        None, description="SHA-256 of the sweep's results file, so a calibration names the exact results it read."
    )
    sweep_commit: str | None = Field(
        None, description="The commit that last changed the sweep's results file, when calibrated in a git checkout."
    )
    derivation: str = Field(
        "the brief's cut-offs (~30 turns, tens of thousands of rollouts); no horizon sweep results were read",
        description="How the horizon thresholds were derived, in words.",
    )

    @field_validator("turn_level_candidates")
    @classmethod
    def _candidates_registered(cls, v: list[str]) -> list[str]:
        return _registered(v, "turn_level_candidates")

    @field_validator("long_horizon_algo")
    @classmethod
    def _long_registered(cls, v: str) -> str:
        return _registered([v], "long_horizon_algo")[0]

    @field_validator("free_signal")
    @classmethod
    def _free_signal_registered(cls, v: dict[str, str]) -> dict[str, str]:
        _registered(list(v), "free_signal")  # the statistics are checked against ProbeStats where they are read
        return v

    @field_validator("picks")
    @classmethod
    def _picks_registered(cls, v: dict[str, str]) -> dict[str, str]:
        _registered(list(v.values()), "picks")
        return v


def packaged_thresholds() -> ProbeThresholds:
    """The calibration shipped in `agentrl/probe/thresholds.json`, over the fallback defaults.

    A missing or broken file is a packaging bug, not a reason to recommend from other thresholds
    (the wheel once fell back silently and recommended grpo where the checkout said steppo): it raises.
    """
    ref = resources.files("agentrl.probe") / PACKAGED
    where = f"agentrl/probe/{PACKAGED}"
    try:
        data = json.loads(ref.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{where} is missing from this install: the package data was not shipped "
            "(pyproject.toml [tool.setuptools.package-data])"
        ) from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e})") from e
    t = thresholds_from_record(data, where)
    return t.model_copy(update={"source": f"packaged {where}, calibrated on {t.source}"})


def thresholds_from_record(data: Any, where: str) -> ProbeThresholds:
    """A `ProbeThresholds` from a calibration record ({"generated_by": ..., "thresholds": {...}})."""
    if not isinstance(data, dict) or not isinstance(data.get("thresholds"), dict):
        raise ValueError(
            f"{where}: expected an object with a 'thresholds' object (written by python -m agentrl.probe calibrate)"
        )
    allowed = set(CALIBRATED) | set(PROVENANCE)
    extra = sorted(set(data["thresholds"]) - allowed)
    if extra:
        raise ValueError(f"{where}: fields {extra} are not calibrated by a sweep; calibrated: {list(CALIBRATED)}")
    try:
        return ProbeThresholds(**data["thresholds"])
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc']))}: {err['msg']} (got {err['input']!r})" for err in e.errors()
        )
        raise ValueError(f"{where}: {problems}") from e


def default_thresholds() -> ProbeThresholds:
    """The thresholds the probe uses unless told otherwise: the packaged calibration (thresholds fitted to
    another sweep: `agentrl.probe.calibration.thresholds_from_file`)."""
    return packaged_thresholds()


# The probe as frozen for a prediction written down before its sweep (benchmarks/probe_preregister.py): a
# change to the rules or to the thresholds is a new version, so that a prediction names the probe that made it
# and a later probe cannot be judged by an earlier one's record. tests/test_probe.py holds these digests to the
# files: changing thresholds.json or a default threshold fails there until the version and digests move too.
PROBE_VERSION = "1"
FROZEN_SHA256 = {
    "thresholds.json": "e2b34784f0e5f4c251187ec788ea0a37d7c63bdeed207aba017bf328dd2e7311",
    "resolved": "32ce02b81595381532ba10e8506ba08d6532c6c5f6d28f9fd78330f5752cbac0",
}


def probe_fingerprint() -> dict[str, str]:
    """What identifies the probe that makes a recommendation: `PROBE_VERSION`, and sha256 digests of the packaged
    thresholds file, of the thresholds it resolves to (the file over the code's defaults) and of the rules' source.

    >>> f = probe_fingerprint()
    >>> f["probe_version"] == PROBE_VERSION, f["thresholds_sha256"] == FROZEN_SHA256["thresholds.json"]
    (True, True)
    """
    here = resources.files("agentrl.probe")  # rules.py is read, not imported: it imports this module
    raw = (here / PACKAGED).read_bytes()
    resolved = json.dumps(packaged_thresholds().model_dump(mode="json"), sort_keys=True).encode()
    return {
        "probe_version": PROBE_VERSION,
        "thresholds_sha256": hashlib.sha256(raw).hexdigest(),
        "resolved_thresholds_sha256": hashlib.sha256(resolved).hexdigest(),
        "rules_sha256": hashlib.sha256((here / "rules.py").read_bytes()).hexdigest(),
    }
