"""`grpo`: group-relative outcome advantage, critic-free, and its DAPO / Dr. GRPO variants.

Each group holds G episodes of one task from one initial state; an episode's advantage is its
terminal reward against the group's (docs/algorithms.md, grpo), and every action token of the episode
carries it. Related: GRPO (DeepSeekMath, arXiv 2402.03300), RLOO (2402.14740), Dr. GRPO
(2503.20783), DAPO (2503.14476). The loss-side options (clip-higher, aggregation, KL) live in
`agentrl.loss` so that every assigner shares them.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.algorithms.configs import GRPOConfig
from agentrl.credit import Credit, Fit, group_advantages, tokens_from_episodes
from agentrl.store import TurnBatch


def overlong_penalty(lengths: torch.Tensor, l_max: int, l_cache: int) -> torch.Tensor:
    """DAPO's soft overlong punishment: 0 up to l_max - l_cache, linear to -1 at l_max, -1 beyond."""
    over = (lengths.float() - (l_max - l_cache)).clamp(min=0)
    return -(over / max(l_cache, 1)).clamp(max=1.0)


class GRPO:
    def __init__(self, config: GRPOConfig | None = None, **_: object):
        self.cfg = config or GRPOConfig()

    def fit(self, batch: TurnBatch) -> Fit:
        return Fit()  # nothing to learn: the group is the baseline

    def state_dict(self) -> dict[str, Any]:
        """What the next update depends on besides the batch (a checkpoint's part): nothing, for grpo."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} has no state to load; got {sorted(state)}")

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

    def assign(self, batch: TurnBatch, fit: Fit) -> Credit:
        adv, weight, metrics = self.episode_advantages(batch)
        return Credit(tokens_from_episodes(adv, batch), weight, metrics)
