"""`steppo`: a process reward model scores every turn; turn advantage = outcome advantage plus the
reward-to-go of the group-normalised step scores.

    r~_ik = (p_ik - mean_group) / (std_group + eps)     all step scores of a group together
    A_ik  = A_i (grpo) + lam_p * sum_{k' >= k} r~_ik'

Three PRMs behind one interface, `score(batch) -> (B, K)`:
- `env`: the environment's own rule-based step check, info["step_reward"];
- `learned`: a small head on the policy's hidden state before each turn, trained Math-Shepherd
  style on Monte Carlo success estimates from the store (the outcome of the episode each turn
  led to);
- `implicit`: beta * sum over the turn's tokens of log(pi / pi_ref) (PRIME).
`credit/prm_outcome_corr` (episode's summed step score vs its outcome, on episodes the PRM was
not fit on) is logged: a PRM that drifts from the outcome is being hacked.

What it is not: "StepPO" (arXiv 2604.18401) is a turn-level PPO; ours is closer to process
supervision: Math-Shepherd (2312.08935), PRIME (2502.01456), DeepSeekMath's process supervision,
MT-GRPO (2505.11821).
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.algorithms.configs import StepPOConfig
from agentrl.algorithms.grpo import GRPO
from agentrl.credit import Credit, Fit, TurnHead, tokens_from_turns, turn_features
from agentrl.store import TurnBatch


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    if x.numel() < 2 or x.std() < 1e-8 or y.std() < 1e-8:
        return 0.0
    return float(torch.corrcoef(torch.stack([x.float(), y.float()]))[0, 1])


class StepPO(GRPO):
    def __init__(self, config: StepPOConfig | None = None, policy: Any = None, hidden_size: int | None = None,
                 **_: object):
        self.cfg = config or StepPOConfig()
        self.model = policy.model if policy is not None else None
        self.head = None
        if self.cfg.prm == "learned":
            size = hidden_size or (policy.model.config.hidden_size if policy is not None else None)
            self.head = TurnHead(size, self.cfg.head)

    def state_dict(self) -> dict[str, Any]:
        """The learned PRM's head and its optimizer (the env and implicit PRMs hold no state)."""
        return {"head": self.head.train_state()} if self.head is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (self.head is None) != ("head" not in state):
            raise ValueError(f"steppo prm={self.cfg.prm}: the saved state " + ("has" if "head" in state else "lacks")
                             + " a learned PRM head")
        if self.head is not None:
            self.head.load_train_state(state["head"])

    def score(self, batch: TurnBatch) -> torch.Tensor:
        """(B, K) step scores, 0 on empty turn slots."""
        mask = batch.turn_mask
        if self.cfg.prm == "env":
            return batch.step_rewards * mask
        if self.cfg.prm == "implicit":
            if batch.ref_logp is None:
                raise ValueError("steppo prm=implicit needs reference log-probs in the batch (the trainer fills them "
                                 "in)")
            # log(pi/pi_ref) of the behaviour policy's own tokens, summed per turn
            lr = (batch.behaviour_logp - batch.ref_logp) * batch.action_mask  # (B, T)
            idx = batch.turn_index.clamp(min=0)
            per_turn = torch.zeros_like(batch.step_rewards).scatter_add(1, idx, lr)
            return self.cfg.implicit_beta * per_turn * mask
        with torch.no_grad():
            return torch.sigmoid(self.head(turn_features(batch, self.model))) * mask

    def fit(self, batch: TurnBatch) -> Fit:
        scores = self.score(batch)  # before fitting: these episodes are held out for the PRM
        corr = pearson(scores.sum(1), batch.rewards)
        metrics = {"prm_outcome_corr": corr}
        if self.head is not None:
            feats = turn_features(batch, self.model)
            mask = batch.turn_mask
            # Monte Carlo success estimate of each turn: the outcome of the episode it led to
            target = (batch.rewards >= 1.0).float()[:, None].expand_as(mask)
            metrics["prm_loss"] = self.head.fit(feats[mask], target[mask], loss="bce")
        return Fit(metrics)

    def assign(self, batch: TurnBatch, fit: Fit) -> Credit:
        A, weight, metrics = self.episode_advantages(batch)
        mask = batch.turn_mask
        p = self.score(batch)
        norm = torch.zeros_like(p)
        for g in torch.unique(batch.group_ids):
            rows = batch.group_ids == g
            vals = p[rows][mask[rows]]
            if vals.numel() > 1:
                norm[rows] = (p[rows] - vals.mean()) / (vals.std() + 1e-6)
        norm = norm * mask
        to_go = norm.flip(1).cumsum(1).flip(1) * mask  # sum_{k' >= k}
        turn_adv = (A[:, None] + self.cfg.lam_p * to_go) * mask
        metrics["step_score_mean"] = float(p[mask].mean()) if mask.any() else 0.0
        return Credit(tokens_from_turns(turn_adv, batch), weight, metrics)
