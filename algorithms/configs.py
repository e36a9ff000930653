"""The options of every built-in credit assigner, one pydantic model each, tagged by `algo`.

They live here, apart from the assigners' code, so that configuration and the command line load
without torch (a bad flag answers in a fraction of a second). `TrainConfig.credit` holds one of
them, chosen by `algo`; a run's `config.yaml` records every option with its resolved default.

>>> TurnPPOConfig().gamma, TurnPPOConfig().algo
(0.99, 'turn-ppo')
>>> GRPOConfig(gamma=0.9)
Traceback (most recent call last):
...
pydantic_core._pydantic_core.ValidationError: 1 validation error for GRPOConfig
gamma
  Extra inputs are not permitted [type=extra_forbidden, input_value=0.9, input_type=float]
...
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from tyro.conf import Suppress


class CreditConfig(BaseModel):
    """Base of every assigner's options; `algo` names the assigner they belong to (the tag of the union)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # the tag: always equal to the run's `algo`, so the command line sets it with --algo, never on its own
    algo: Annotated[str, Suppress] = Field(description="The assigner these options belong to.")


class CriticConfig(BaseModel):
    """A small turn-level head on the policy's detached hidden state (a value critic or a PRM)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    width: int = Field(64, ge=1, description="Hidden width of the two-layer MLP head; the policy's hidden state is its "
                       "input.")
    lr: float = Field(2e-3, gt=0, description="About 10x the policy's: the head must track a policy that moves every "
                      "update.")
    epochs: int = Field(4, ge=1, description="Passes over a batch's turns per fit.")
    minibatch: int = Field(256, ge=1, description="Turns per optimizer step of the head.")
    value_clip: float | None = Field(0.2, gt=0, description="PPO's clipped value loss around the pre-fit values; None: "
                                     "plain MSE.")


class GRPOConfig(CreditConfig):
    """Options of the group-relative advantage (also the base of arpo, steppo and gigpo)."""

    algo: Annotated[Literal["grpo"], Suppress] = "grpo"
    std_norm: bool = Field(True, description="Divide by the group's std (GRPO). Dr. GRPO turns it off: it up-weights "
                           "near-solved and near-failed groups.")
    baseline: Literal["mean", "rloo"] = Field("mean", description="'rloo' uses the leave-one-out mean, an unbiased "
                                              "baseline (Ahmadian et al. 2024).")
    dynamic_sampling: Literal["off", "skip", "resample"] = Field(
        "off", description="Groups whose rewards are all equal carry no signal: keep them at A=0 ('off'), drop them "
        "('skip'), or drop them and roll out extra groups ('resample', DAPO).")
    max_resample_batches: int = Field(2, ge=0, description="With 'resample': at most this many extra rollout batches "
                                      "per update, so an all-fail task cannot loop forever.")
    overlong: Literal["off", "mask", "soft"] = Field(
        "off", description="Truncated episodes: 'mask' leaves them out of the loss; 'soft' adds DAPO's length penalty "
        "(0 below max - cache, to -1 at max action tokens).")
    overlong_max: int = Field(512, ge=1, description="L_max of the soft overlong penalty, in action tokens per "
                              "episode.")
    overlong_cache: int = Field(128, ge=0, description="L_cache: the penalty ramps over the last this-many tokens "
                                "before L_max.")


class ARPOConfig(GRPOConfig):
    algo: Annotated[Literal["arpo"], Suppress] = "arpo"  # type: ignore[assignment]
    lam_max: float = Field(0.5, ge=0.0, le=1.0, description="How far turn weights may move from uniform once the "
                           "critic is trusted; 0.5 keeps half the outcome signal uniform, a hedge against a critic "
                           "that is right on average but noisy per turn.")
    ev_gate: float = Field(0.2, description="Held-out explained variance the critic must reach before it may reweight "
                           "(an untrained critic's weights are noise; ungated runs collapsed, docs/algorithms.md).")
    ramp_updates: int = Field(5, ge=1, description="Updates over which lam ramps from 0 to lam_max once the gate is "
                              "passed.")
    signed: bool = Field(False, description="Ablation: add omega * standardised(d_k) to A_i instead of reweighting.")
    omega: float = Field(1.0, description="Scale of the signed ablation's turn term.")
    use_step_rewards: bool = Field(False, description="Fold the env's info['step_reward'] into r_k; off: credit from "
                                   "the verifier's outcome alone.")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="The turn critic's head.")


class StepPOConfig(GRPOConfig):
    algo: Annotated[Literal["steppo"], Suppress] = "steppo"  # type: ignore[assignment]
    prm: Literal["env", "learned", "implicit"] = Field("env", description="Which process reward model scores the "
                                                       "turns: the env's info['step_reward'], a head learned on Monte "
                                                       "Carlo outcomes, or PRIME's implicit log(pi/pi_ref).")
    lam_p: float = Field(1.0, ge=0.0, description="Weight of the step term against the outcome advantage.")
    implicit_beta: float = Field(0.05, gt=0.0, description="beta of the implicit PRM (PRIME's 0.05).")
    head: CriticConfig = Field(default_factory=lambda: CriticConfig(value_clip=None), description="The learned PRM's "
                               "head (BCE on logits, so no value clip).")


class TurnPPOConfig(CreditConfig):
    algo: Annotated[Literal["turn-ppo"], Suppress] = "turn-ppo"
    gamma: float = Field(0.99, ge=0.0, le=1.0, description="Discount over turns; near 1 since the reward is terminal.")
    lam: float = Field(0.9, ge=0.0, le=1.0, description="GAE's bias-variance knob over turns (0.9: mostly Monte Carlo, "
                       "some bootstrapping).")
    use_step_rewards: bool = Field(False, description="r_k = the env's info['step_reward']; off: outcome-only.")
    whiten: bool = Field(True, description="Standardise A over the batch's turns (not tokens: long turns must not "
                         "dominate).")
    warmup_updates: int = Field(5, ge=0, description="At most this many critic-only updates before the policy moves: "
                                "an untrained critic's advantages can wreck a warm-started policy within a few "
                                "updates.")
    warmup_ev: float = Field(0.2, description="Warm-up ends early once the critic's held-out explained variance "
                             "reaches this.")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="The turn critic's head.")


class GiGPOConfig(GRPOConfig):
    algo: Annotated[Literal["gigpo"], Suppress] = "gigpo"  # type: ignore[assignment]
    gamma: float = Field(0.95, ge=0.0, le=1.0, description="Discount of the step return: shorter paths from the same "
                         "state score higher (GiGPO's 0.95).")
    omega: float = Field(1.0, description="Weight of the step advantage against the episode advantage (GiGPO's 1).")
    use_step_rewards: bool = Field(False, description="Include the env's info['step_reward'] in the step return.")


class DistillConfig(CreditConfig):
    algo: Annotated[Literal["distill"], Suppress] = "distill"
    distill_clip: float | None = Field(None, gt=0, description="Clip each token's teacher-student log-ratio to +/- "
                                       "this; None: unclipped, as on-policy distillation usually runs. A clip keeps "
                                       "a token the teacher finds near-impossible (a log-ratio of many nats) from "
                                       "outweighing the rest of its batch.")
    reward_weight: float = Field(0.0, ge=0.0, description="Add this times the verifier's group-relative advantage "
                                 "(grpo's, std-normalised) to every action token; 0: the teacher alone is the "
                                 "signal, which is dense and needs no passing episode in a group.")
