"""`turn-ppo`: a turn-level critic and GAE over turns; every token of turn k carries A_k.

    r_k  = step reward (or 0), R added at the last turn
    d_k  = r_k + gamma V(s_{k+1}) - V(s_k)     V(s_{K+1}) bootstrapped only when truncated, else 0
    A_k  = sum_l (gamma lam)^l d_{k+l}          gamma 0.99, lam 0.9
    critic target: A_k + V(s_k) (clipped value loss); A whitened over the batch's turns

The critic warms up first: critic-only updates (the policy is left alone) until its held-out
explained variance passes `warmup_ev` or `warmup_updates` have passed, because an untrained
critic's advantages can wreck a warm-started policy within a few updates (docs/design.md, Measured facts).

Relatives: Turn-PPO (arXiv 2512.17008), StepPO (2604.18401), RAGEN's bi-level GAE; this is the
turn-level half of those (one value per turn, shared by the turn's tokens).
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.algorithms.configs import TurnPPOConfig
from agentrl.credit import (
    Credit,
    Fit,
    TurnCritic,
    explained_variance,
    final_features,
    gae,
    group_advantages,
    tokens_from_turns,
    turn_features,
    turn_rewards,
)
from agentrl.store import TurnBatch


class TurnPPO:
    def __init__(self, config: TurnPPOConfig | None = None, policy: Any = None, critic: Any = None,
                 hidden_size: int | None = None, **_: object):
        self.cfg = config or TurnPPOConfig()
        self.model = policy.model if policy is not None else None
        self.pad_id = policy.chat.pad_id if policy is not None else 0
        size = hidden_size or (policy.model.config.hidden_size if policy is not None else None)
        self.critic = critic if critic is not None else TurnCritic(size, self.cfg.critic)
        self.updates = 0
        self.warm = self.cfg.warmup_updates == 0

    def state_dict(self) -> dict[str, Any]:
        """The critic (weights and optimizer) and the warm-up's counter and verdict."""
        return {"critic": self.critic.state_dict(), "updates": self.updates, "warm": self.warm}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.critic.load_state_dict(state["critic"])
        self.updates, self.warm = int(state["updates"]), bool(state["warm"])

    def advantages(self, batch: TurnBatch,
                   feats: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(A, V, bootstrap) under the current critic; A is not whitened."""
        feats = turn_features(batch, self.model) if feats is None else feats
        mask = batch.turn_mask
        V = self.critic.values(feats, mask)
        boot = self.critic.bootstrap(final_features(batch, self.model, self.pad_id), batch)
        r = turn_rewards(batch, self.cfg.use_step_rewards)
        return gae(r, V, mask, boot, self.cfg.gamma, self.cfg.lam), V, boot

    def fit(self, batch: TurnBatch) -> Fit:
        feats = turn_features(batch, self.model)
        mask = batch.turn_mask
        A, V, _ = self.advantages(batch, feats)
        returns = A + V
        ev = explained_variance(V[mask], returns[mask])  # before fitting: held-out for the critic
        self.updates += 1
        if not self.warm and (ev >= self.cfg.warmup_ev or self.updates > self.cfg.warmup_updates):
            self.warm = True  # the policy moves from this update on
        metrics = self.critic.fit(feats, mask, returns, old=V)
        metrics.update({"critic_ev": ev, "critic_warmup": float(not self.warm)})
        # A under the pre-fit critic: the critic has not seen these episodes' returns when it judges them
        return Fit(metrics, per_turn={"A": A}, trains_policy=self.warm)

    def assign(self, batch: TurnBatch, fit: Fit) -> Credit:
        A, warm = fit.per_turn["A"], fit.trains_policy
        mask = batch.turn_mask
        if self.cfg.whiten and mask.sum() > 1:
            vals = A[mask]
            A = (A - vals.mean()) / (vals.std() + 1e-8) * mask
        weight = torch.ones(batch.size) if warm else torch.zeros(batch.size)  # critic-only during warm-up
        _, groups = group_advantages(batch.rewards, batch.group_ids)  # for the zero-signal counters only
        metrics = {k: float(v) for k, v in groups.items() if k != "zero_mask"}
        metrics["adv_abs_mean"] = float(A[mask].abs().mean()) if mask.any() else 0.0
        return Credit(tokens_from_turns(A, batch), weight, metrics)
