"""The credit-assigner protocol and the pieces assigners share.

An assigner turns a `TurnBatch` into per-token advantages. It may own a network (a critic, a
process reward model) that it trains in `fit` from the same batch; `assign` then returns the
advantages, a per-episode weight (0 drops an episode from the loss: dynamic sampling, masked
truncations) and diagnostics for the `credit/` metrics. The trainer looks assigners up in
`agentrl.algorithms.ASSIGNERS` and never branches on which one it holds.

>>> import torch
>>> A, stats = group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]))
>>> [round(a, 4) for a in A.tolist()], stats["zero_adv_groups"], stats["all_pass_groups"]
([0.7071, -0.7071, 0.0, 0.0], 1, 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch
from pydantic import BaseModel

from agentrl.store import TurnBatch


@dataclass
class Credit:
    """What an assigner returns."""

    advantages: torch.Tensor  # (B, T); 0 off action tokens
    row_weight: torch.Tensor  # (B,) 1 to train on the episode, 0 to leave it out
    metrics: dict[str, float] = field(default_factory=dict)  # logged under credit/


class CreditAssigner(Protocol):
    name: ClassVar[str]
    description: ClassVar[str]
    Config: ClassVar[type[BaseModel]]

    def fit(self, batch: TurnBatch) -> dict[str, float]: ...

    def assign(self, batch: TurnBatch) -> Credit: ...


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, std_norm: bool = True, baseline: str = "mean", eps: float = 1e-6
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Group-relative outcome advantages (ALGORITHMS.md §3, grpo).

    mean baseline: A = (R - mean) / (std + eps), std unbiased as torch.std; without std_norm
    A = R - mean; "rloo": A = G / (G - 1) * (R - mean), the leave-one-out baseline. A group of one
    has no baseline: A = R. Groups whose rewards are all equal are counted (all-pass: every episode
    passed, R >= 1; all-fail: none did) and get A = 0.
    """
    A = torch.zeros_like(rewards, dtype=torch.float32)  # (B,)
    zero = torch.zeros_like(rewards, dtype=torch.bool)  # (B,) episode sits in a zero-advantage group
    n_groups = n_zero = n_pass = n_fail = 0
    stds = []
    for g in torch.unique(group_ids):
        idx = (group_ids == g).nonzero(as_tuple=True)[0]
        r = rewards[idx].float()
        n_groups += 1
        if len(idx) == 1:
            A[idx] = r
            continue
        stds.append(r.std().item())
        if torch.all(r == r[0]):
            n_zero += 1
            zero[idx] = True
            n_pass += int(r[0] >= 1.0)
            n_fail += int(r[0] <= 0.0)
            continue
        centred = r - r.mean()
        if baseline == "rloo":
            A[idx] = centred * len(idx) / (len(idx) - 1)
        elif std_norm:
            A[idx] = centred / (r.std() + eps)
        else:
            A[idx] = centred
    stats = {
        "groups": n_groups,
        "zero_adv_groups": n_zero,
        "all_pass_groups": n_pass,
        "all_fail_groups": n_fail,
        "zero_adv_frac": n_zero / max(n_groups, 1),
        "reward_std_in_group": sum(stds) / len(stds) if stds else 0.0,
        "zero_mask": zero,
    }
    return A, stats


def tokens_from_episodes(adv: torch.Tensor, batch: TurnBatch) -> torch.Tensor:
    """(B,) episode advantages -> (B, T): every action token of episode b gets adv[b]."""
    return adv[:, None] * batch.action_mask


def tokens_from_turns(adv: torch.Tensor, batch: TurnBatch) -> torch.Tensor:
    """(B, K) turn advantages -> (B, T): every action token of turn k gets adv[b, k]."""
    idx = batch.turn_index.clamp(min=0)  # (B, T)
    return adv.gather(1, idx) * batch.action_mask
