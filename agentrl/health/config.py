"""The health settings: alarm thresholds (`HealthConfig`) and each intervention's switch and settings
(`Interventions`). Each field's description says why its default is what it is; `--health.*` on the
command line sets them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


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
    summary_floor_frac: float = Field(0.3, gt=0, lt=1, description="SUMMARY COLLAPSE when the policy's summaries "
                                      "(rollout.context summarize) shrink below this fraction of their early length: "
                                      "the entropy floor's 30%, since a summary a third as long has dropped most of "
                                      "what it carried...")
    facts_drop: float = Field(0.2, gt=0, le=1, description="...or when the share of the task's facts they keep "
                              "(context/facts_kept, where the env can say) fell this far below its early level: a "
                              "fifth of the facts lost is a fifth of the late questions answered blind.")
    compaction_drift: float = Field(1.0, gt=0, description="COMPACTION DRIFT when compactions per episode rose to "
                                    "(1 + this) times their early rate or fell to 1 / (1 + this) of it: doubled or "
                                    "halved, beyond the noise of a batch's episode lengths.")
    interventions: Interventions = Field(default_factory=Interventions, description="What --health.on-alarm "
                                         "intervene may do, each on its own switch.")



__all__ = ["AdaptiveEntropy", "AdaptiveKL", "DynamicSampling", "EntropyBonus", "HealthConfig", "Interventions",
           "RaiseTemperature", "VerifierRotation"]
