"""`gigpo`: critic-free step credit. Inside a group, turns that start from the same state (equal
`state_key`) form a step group; each turn's discounted return is compared within its step group.

    G_ik   = sum_{k' >= k} gamma^(k'-k) r_ik'        gamma = 0.95, R on the last turn
    A_step = (G_ik - mean_stepgroup) / (std_stepgroup + eps)    0 in a step group of one
    A_ik   = A_i (grpo) + omega * A_step

Follows GiGPO (arXiv 2505.10978). Needs environments that report `state_key`.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.algorithms.configs import GiGPOConfig
from agentrl.algorithms.grpo import GRPO
from agentrl.credit import (
    Credit,
    Fit,
    discounted_returns,
    state_groups,
    state_recurrence,
    tokens_from_turns,
    turn_rewards,
)
from agentrl.store import TurnBatch


class GiGPO(GRPO):
    def __init__(self, config: GiGPOConfig | None = None, **_: Any):
        self.cfg = config or GiGPOConfig()

    def step_advantages(self, batch: TurnBatch) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch.turn_mask
        G = discounted_returns(turn_rewards(batch, self.cfg.use_step_rewards), mask, self.cfg.gamma)
        A_step = torch.zeros_like(G)
        for ep in batch.episodes:
            for k, turn in enumerate(ep.turns):
                if turn.state_key is None:
                    raise ValueError(f"gigpo needs state_key; {ep.env_id or 'the environment'} reports none (turn {k} "
                                     f"of {ep.task_id}): an env defines state_key(), an agent through the gateway "
                                     "gets one from --agent.state-key FILE.py:fn")
        step_groups = state_groups(batch.episodes)
        for members in step_groups.values():
            if len(members) < 2:
                continue
            rows, cols = zip(*members)
            g = G[list(rows), list(cols)]
            A_step[list(rows), list(cols)] = (g - g.mean()) / (g.std() + 1e-6)
        recurrence = state_recurrence(step_groups) or 0.0
        return A_step, {"step_groups": float(len(step_groups)), "state_recurrence": recurrence}

    def assign(self, batch: TurnBatch, fit: Fit) -> Credit:
        A, weight, metrics = self.episode_advantages(batch)
        A_step, step_metrics = self.step_advantages(batch)
        metrics.update(step_metrics)
        turn_adv = (A[:, None] + self.cfg.omega * A_step) * batch.turn_mask
        return Credit(tokens_from_turns(turn_adv, batch), weight, metrics)
