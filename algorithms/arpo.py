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

from typing import Any

import torch

from agentrl.algorithms.configs import ARPOConfig
from agentrl.algorithms.grpo import GRPO
from agentrl.credit import (
    Credit,
    Fit,
    TurnCritic,
    discounted_returns,
    explained_variance,
    tokens_from_turns,
    turn_features,
    turn_rewards,
    value_change_concentration,
    value_changes,
)
from agentrl.store import TurnBatch


class ARPO(GRPO):
    def __init__(self, config: ARPOConfig | None = None, policy: Any = None, critic: Any = None,
                 hidden_size: int | None = None, **_: object):
        self.cfg = config or ARPOConfig()
        self.model = policy.model if policy is not None else None
        size = hidden_size or (policy.model.config.hidden_size if policy is not None else None)
        self.critic = critic if critic is not None else TurnCritic(size, self.cfg.critic)
        self.gate_passes = 0

    def state_dict(self) -> dict[str, Any]:
        """The critic (weights and optimizer) and the gate passes that ramp lambda up."""
        return {"critic": self.critic.state_dict(), "gate_passes": self.gate_passes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.critic.load_state_dict(state["critic"])
        self.gate_passes = int(state["gate_passes"])

    @property
    def lam(self) -> float:
        return self.cfg.lam_max * min(1.0, self.gate_passes / self.cfg.ramp_updates)

    def fit(self, batch: TurnBatch) -> Fit:
        feats = turn_features(batch, self.model)
        mask = batch.turn_mask
        r = turn_rewards(batch, self.cfg.use_step_rewards)
        G = discounted_returns(r, mask)  # Monte Carlo targets, gamma = 1
        V = self.critic.values(feats, mask)  # (B, K) before fitting: these episodes are held out
        ev = explained_variance(V[mask], G[mask])
        if ev >= self.cfg.ev_gate:
            self.gate_passes += 1
        d = value_changes(r, V, mask)  # (B, K) d_k = r_k + V(s_{k+1}) - V(s_k), under the pre-fit critic
        metrics = self.critic.fit(feats, mask, G)
        return Fit({**metrics, "critic_ev": ev, "arpo_lambda": self.lam}, per_turn={"d": d})

    def assign(self, batch: TurnBatch, fit: Fit) -> Credit:
        A, weight, metrics = self.episode_advantages(batch)
        mask = batch.turn_mask.float()
        K = batch.num_turns.clamp(min=1).float()[:, None]  # (B, 1)
        d, lam = fit.per_turn["d"], fit.metrics["arpo_lambda"]
        if self.cfg.signed:
            valid = d[batch.turn_mask]
            z = (d - valid.mean()) / (valid.std() + 1e-6) if valid.numel() > 1 else torch.zeros_like(d)
            turn_adv = (A[:, None] + self.cfg.omega * z * (lam > 0)) * mask
        else:
            absd = d.abs() * mask
            total = absd.sum(1, keepdim=True)
            w = torch.where(total > 1e-8, absd / total.clamp(min=1e-8), mask / K)
            w_mix = (1 - lam) / K + lam * w
            turn_adv = K * w_mix * A[:, None] * mask  # (B, K)
        metrics.update({"arpo_lambda": lam, "critic_ev": fit.metrics["critic_ev"],
                        "value_change_concentration": float(value_change_concentration(d, batch.turn_mask).mean())})
        return Credit(tokens_from_turns(turn_adv, batch), weight, metrics)
