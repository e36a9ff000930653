"""`grpo`: group-relative outcome advantage, critic-free, and its DAPO / Dr. GRPO variants.

Each group holds G episodes of one task from one initial state; an episode's advantage is its
terminal reward against the group's (ALGORITHMS.md §3), and every action token of the episode
carries it. Related: GRPO (DeepSeekMath, arXiv 2402.03300), RLOO (2402.14740), Dr. GRPO
(2503.20783), DAPO (2503.14476). The loss-side options (clip-higher, aggregation, KL) live in
`agentrl.loss` so that every assigner shares them.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from agentrl.credit import Credit, group_advantages, tokens_from_episodes
from agentrl.store import TurnBatch


class GRPOConfig(BaseModel):
    """Options of the group-relative advantage."""

    model_config = ConfigDict(extra="forbid")

    std_norm: bool = Field(True, description="Divide by the group's std (GRPO). Dr. GRPO turns it off: it up-weights near-solved and near-failed groups.")
    baseline: Literal["mean", "rloo"] = Field("mean", description="'rloo' uses the leave-one-out mean, an unbiased baseline (Ahmadian et al. 2024).")
    dynamic_sampling: Literal["off", "skip", "resample"] = Field(
        "off", description="Groups whose rewards are all equal carry no signal: keep them at A=0 ('off'), drop them ('skip'), or drop them and roll out extra groups ('resample', DAPO)."
    )
    max_resample_batches: int = Field(2, ge=0, description="With 'resample': at most this many extra rollout batches per update, so an all-fail task cannot loop forever.")
    overlong: Literal["off", "mask", "soft"] = Field(
        "off", description="Truncated episodes: 'mask' leaves them out of the loss; 'soft' adds DAPO's length penalty (0 below max - cache, to -1 at max action tokens)."
    )
    overlong_max: int = Field(512, ge=1, description="L_max of the soft overlong penalty, in action tokens per episode.")
    overlong_cache: int = Field(128, ge=0, description="L_cache: the penalty ramps over the last this-many tokens before L_max.")


def overlong_penalty(lengths: torch.Tensor, l_max: int, l_cache: int) -> torch.Tensor:
    """DAPO's soft overlong punishment: 0 up to l_max - l_cache, linear to -1 at l_max, -1 beyond."""
    over = (lengths.float() - (l_max - l_cache)).clamp(min=0)
    return -(over / max(l_cache, 1)).clamp(max=1.0)


class GRPO:
    name: ClassVar[str] = "grpo"
    description: ClassVar[str] = "group-relative outcome advantage on every token (GRPO/RLOO/Dr. GRPO/DAPO options); no critic"
    Config: ClassVar[type[BaseModel]] = GRPOConfig
    turn_level: ClassVar[bool] = False  # one advantage per episode, on every token

    def __init__(self, config: GRPOConfig | None = None, **_: object):
        self.cfg = config or GRPOConfig()

    def fit(self, batch: TurnBatch) -> dict[str, float]:
        return {}

    def episode_advantages(self, batch: TurnBatch) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """(B,) advantages, (B,) row weights and credit metrics; reused by the turn-level assigners."""
        cfg = self.cfg
        rewards = batch.rewards.clone()
        weight = torch.ones_like(rewards)
        if cfg.overlong == "soft":
            lengths = batch.action_mask.sum(1)
            rewards = rewards + overlong_penalty(lengths, cfg.overlong_max, cfg.overlong_cache)
        elif cfg.overlong == "mask":
            weight = weight * (~batch.truncated).float()
        adv, stats = group_advantages(rewards, batch.group_ids, cfg.std_norm, cfg.baseline)
        if cfg.dynamic_sampling != "off":
            weight = weight * (~stats["zero_mask"]).float()
        metrics = {k: float(v) for k, v in stats.items() if k != "zero_mask"}
        metrics["adv_abs_mean"] = float(adv.abs().mean())
        return adv, weight, metrics

    def assign(self, batch: TurnBatch) -> Credit:
        adv, weight, metrics = self.episode_advantages(batch)
        return Credit(tokens_from_episodes(adv, batch), weight, metrics)
