"""Oracle tests for the shared loss: clip bounds, dual clip, k3, aggregation modes, GSPO ratios."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.config import LossConfig
from agentrl.loss import aggregate, k3_kl, policy_loss


def lp(*ratios):
    return torch.log(torch.tensor([list(ratios)]))


def test_clip_bounds_positive_and_negative_advantage():
    cfg = LossConfig(eps_low=0.2, eps_high=0.28)
    old, mask = torch.zeros(1, 4), torch.ones(1, 4)
    # A > 0: gain capped at 1 + eps_high; below 1 nothing is clipped
    loss, s = policy_loss(lp(2.0, 1.1, 0.5, 1.0), old, torch.ones(1, 4), mask, cfg)
    assert loss.item() == pytest.approx(-(1.28 + 1.1 + 0.5 + 1.0) / 4)
    assert s["clip_high_frac"] == 0.25 and s["clip_low_frac"] == 0.0
    # A < 0: -min(rho A, clip(rho) A) = max(rho, clip(rho)) * |A|
    loss, s = policy_loss(lp(2.0, 1.1, 0.5, 1.0), old, -torch.ones(1, 4), mask, cfg)
    assert loss.item() == pytest.approx((2.0 + 1.1 + 0.8 + 1.0) / 4)
    assert s["clip_low_frac"] == 0.25


def test_dual_clip_caps_negative_advantage_loss():
    cfg = LossConfig(dual_clip=3.0)
    loss, _ = policy_loss(lp(10.0, 2.0), torch.zeros(1, 2), torch.full((1, 2), -2.0), torch.ones(1, 2), cfg)
    # token 1: rho 10 -> 20, capped at 3 * 2 = 6 ; token 2: rho 2 -> 4
    assert loss.item() == pytest.approx((6.0 + 4.0) / 2)


def test_k3_by_hand_and_nonnegative():
    logp, ref = torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-1.5, -1.0, -0.5])
    d = ref - logp
    assert k3_kl(logp, ref).tolist() == pytest.approx((torch.exp(d) - d - 1).tolist())
    assert k3_kl(torch.tensor([0.0]), torch.tensor([-1000.0])).item() >= 0  # clamped, finite
    assert math.isfinite(k3_kl(torch.tensor([-1000.0]), torch.tensor([0.0])).item())


def test_kl_term_enters_with_beta():
    logp, old, ref = torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[-1.0, -1.0]])
    k3 = math.exp(-1) + 1 - 1
    base, _ = policy_loss(logp, old, torch.ones(1, 2), torch.ones(1, 2), LossConfig(), ref_logp=ref)
    with_kl, s = policy_loss(logp, old, torch.ones(1, 2), torch.ones(1, 2), LossConfig(kl_coef=0.5), ref_logp=ref)
    assert s["kl"] == pytest.approx(k3)
    assert with_kl.item() - base.item() == pytest.approx(0.5 * k3)


def test_entropy_bonus_lowers_the_loss():
    ent = torch.full((1, 2), 2.0)
    a, _ = policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), LossConfig(),
                       entropy=ent)
    b, _ = policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2),
                       LossConfig(entropy_coef=0.1), entropy=ent)
    assert a.item() - b.item() == pytest.approx(0.2)


def test_aggregation_modes_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    assert aggregate(x, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(x, mask, "seq-mean-token-mean").item() == pytest.approx((2.0 + 4.0) / 2)
    assert aggregate(x, mask, "seq-mean-token-sum-norm", max_len=8).item() == pytest.approx((6 / 8 + 4 / 8) / 2)


def test_observation_tokens_never_contribute():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    loss, _ = policy_loss(logp, logp.detach(), torch.ones(1, 3), mask, LossConfig(), entropy=torch.ones(1, 3))
    loss.backward()
    assert logp.grad[0, 1].item() == 0.0 and logp.grad[0, 0].item() != 0.0


def test_sequence_ratio_is_geometric_mean_per_episode():
    logp = torch.log(torch.tensor([[2.0, 0.5, 1.0]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # exp(mean(log 2, log 0.5)) = 1 -> unclipped, loss = -A
    loss, s = policy_loss(logp, torch.zeros(1, 3), torch.ones(1, 3), mask, LossConfig(ratio="sequence"))
    assert loss.item() == pytest.approx(-1.0) and s["ratio_mean"] == pytest.approx(1.0)
    turns = torch.tensor([[0, 1, -1]])
    loss, _ = policy_loss(logp, torch.zeros(1, 3), torch.ones(1, 3), mask, LossConfig(ratio="turn"), turn_index=turns)
    assert loss.item() == pytest.approx(-(1.2 + 0.5) / 2)
