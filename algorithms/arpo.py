"""`arpo`: turn-critic reweighting. A small turn-level value head redistributes each episode's
group advantage over its turns, by how much each turn moved the expected value.

    d_k  = r_k + V(s_{k+1}) - V(s_k)         V(s_{K+1}) = 0, R folded into r_K
    w_k  = |d_k| / sum_k |d_k|               (uniform when the sum is ~0)
    w~_k = (1 - lam) / K + lam * w_k         lam = 0 until the critic's held-out EV >= ev_gate
    A_ik = K * w~_k * A_i                    A_i from grpo: the turn-mean of A_ik stays A_i

Ablation `signed`: A_ik = A_i + omega * standardised(d_k).

What it is not: the name is shared with "ARPO" (arXiv 2507.19849, entropy-based adaptive rollout
branching for agents), which is a different method. The nearest relatives of this one are
ArCHer (2402.19446: a turn-level critic over token-level policy updates) and SPA-RL
(2505.20732: redistributing the outcome reward over steps by their progress contribution).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import BaseModel, Field

from agentrl.algorithms.grpo import GRPO, GRPOConfig
from agentrl.credit import (
    Credit,
    CriticConfig,
    TurnCritic,
    discounted_returns,
    explained_variance,
    tokens_from_turns,
    turn_features,
    turn_rewards,
)
from agentrl.store import TurnBatch


class ARPOConfig(GRPOConfig):
    lam_max: float = Field(0.5, ge=0.0, le=1.0, description="How far turn weights may move from uniform once the critic is trusted; 0.5 keeps half the outcome signal uniform, a hedge against a critic that is right on average but noisy per turn.")
    ev_gate: float = Field(0.2, description="Held-out explained variance the critic must reach before it may reweight (an untrained critic's weights are noise; DESIGN.md measured collapses without a gate).")
    ramp_updates: int = Field(5, ge=1, description="Updates over which lam ramps from 0 to lam_max once the gate is passed.")
    signed: bool = Field(False, description="Ablation: add omega * standardised(d_k) to A_i instead of reweighting.")
    omega: float = Field(1.0, description="Scale of the signed ablation's turn term.")
    use_step_rewards: bool = Field(False, description="Fold the env's info['step_reward'] into r_k; off: credit from the verifier's outcome alone.")
    critic: CriticConfig = Field(default_factory=CriticConfig)


class ARPO(GRPO):
    name: ClassVar[str] = "arpo"
    description: ClassVar[str] = "turn-critic reweighting: a value head spreads the group advantage over turns by |value change| (gated on critic EV)"
    Config: ClassVar[type[BaseModel]] = ARPOConfig
    needs_hidden: ClassVar[bool] = True
    turn_level: ClassVar[bool] = True

    def __init__(self, config: ARPOConfig | None = None, policy: Any = None, critic: Any = None, hidden_size: int | None = None, **_: object):
        self.cfg = config or ARPOConfig()
        self.model = policy.model if policy is not None else None
        size = hidden_size or (policy.model.config.hidden_size if policy is not None else None)
        self.critic = critic if critic is not None else TurnCritic(size, self.cfg.critic)
        self.gate_passes = 0
        self._d: torch.Tensor | None = None
        self._ev = 0.0

    @property
    def lam(self) -> float:
        return self.cfg.lam_max * min(1.0, self.gate_passes / self.cfg.ramp_updates)

    def fit(self, batch: TurnBatch) -> dict[str, float]:
        feats = turn_features(batch, self.model)
        mask = batch.turn_mask
        r = turn_rewards(batch, self.cfg.use_step_rewards)
        G = discounted_returns(r, mask)  # Monte Carlo targets, gamma = 1
        V = self.critic.values(feats, mask)  # (B, K) before fitting: these episodes are held out
        self._ev = explained_variance(V[mask], G[mask])
        if self._ev >= self.cfg.ev_gate:
            self.gate_passes += 1
        V_next = torch.cat([V[:, 1:], torch.zeros(batch.size, 1)], dim=1) * torch.cat([mask[:, 1:], torch.zeros(batch.size, 1, dtype=torch.bool)], 1)
        self._d = (r + V_next - V) * mask  # (B, K)
        metrics = self.critic.fit(feats, mask, G)
        return {**metrics, "critic_ev": self._ev}

    def assign(self, batch: TurnBatch) -> Credit:
        if self._d is None or self._d.shape[0] != batch.size:
            self.fit(batch)
        A, weight, metrics = self.episode_advantages(batch)
        mask = batch.turn_mask.float()
        K = batch.num_turns.clamp(min=1).float()[:, None]  # (B, 1)
        d = self._d
        if self.cfg.signed:
            valid = d[batch.turn_mask]
            z = (d - valid.mean()) / (valid.std() + 1e-6) if valid.numel() > 1 else torch.zeros_like(d)
            turn_adv = (A[:, None] + self.cfg.omega * z * (self.lam > 0)) * mask
        else:
            absd = d.abs() * mask
            total = absd.sum(1, keepdim=True)
            w = torch.where(total > 1e-8, absd / total.clamp(min=1e-8), mask / K)
            w_mix = (1 - self.lam) / K + self.lam * w
            turn_adv = K * w_mix * A[:, None] * mask  # (B, K)
        metrics.update({"arpo_lambda": self.lam, "critic_ev": self._ev,
                        "value_change_concentration": float((d.abs().max(1).values / (d.abs().sum(1) + 1e-8)).mean())})
        self._d = None
        return Credit(tokens_from_turns(turn_adv, batch), weight, metrics)
