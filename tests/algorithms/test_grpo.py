"""Oracle tests for the grpo assigner: hand-computed advantages over known reward schedules."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algorithms.grpo import GRPO, GRPOConfig, overlong_penalty
from agentrl.core import Episode, Turn
from agentrl.credit import Fit, group_advantages
from agentrl.store import make_batch


def ep(reward: float, group: int, turns=(2, 2), truncated: bool = False) -> Episode:
    """An episode with the given action lengths per turn (observations of one token)."""
    e = Episode(prompt_ids=[9], reward=reward, group_id=group, truncated=truncated, terminated=not truncated)
    ctx = 1
    for n in turns:
        e.turns.append(Turn(ctx, [5] * n, [-1.0] * n, [7]))
        ctx += n + 1
    return e


def test_std_normalised_by_hand():
    # group 0: rewards 1, 0, 0 -> mean 1/3, unbiased std sqrt(1/3)
    A, stats = group_advantages(torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0, 0, 0]))
    std = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)
    assert A.tolist() == pytest.approx([(2 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6)])
    assert stats["zero_adv_groups"] == 0


def test_no_std_and_rloo_by_hand():
    r, g = torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4, dtype=torch.long)
    A, _ = group_advantages(r, g, std_norm=False)
    assert A.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5])
    A, _ = group_advantages(r, g, baseline="rloo")
    # leave-one-out: 1 - mean(0, 0, 1) = 2/3 ; G/(G-1) * (R - mean) = 4/3 * 0.5 = 2/3
    assert A.tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])


def test_group_of_one_gets_its_reward_and_equal_groups_get_zero():
    r = torch.tensor([0.7, 1.0, 1.0, 0.0, 0.0, 0.5, 0.5])
    g = torch.tensor([0, 1, 1, 2, 2, 3, 3])
    A, stats = group_advantages(r, g)
    assert A.tolist() == pytest.approx([0.7, 0, 0, 0, 0, 0, 0])
    got = (stats["groups"], stats["zero_adv_groups"], stats["all_pass_groups"], stats["all_fail_groups"])
    assert got == (4, 3, 1, 1)
    assert stats["zero_adv_frac"] == pytest.approx(0.75)


def test_every_action_token_gets_the_episode_advantage_and_observations_zero():
    batch = make_batch([ep(1.0, 0), ep(0.0, 0)], pad_id=0)
    credit = GRPO(GRPOConfig(std_norm=False)).assign(batch, Fit())
    # layout: prompt, a(2), o, a(2), [last obs not in sequence]
    assert batch.action_mask[0].tolist() == [0, 1, 1, 0, 1, 1]
    assert credit.advantages[0].tolist() == [0, 0.5, 0.5, 0, 0.5, 0.5]
    assert credit.advantages[1].tolist() == [0, -0.5, -0.5, 0, -0.5, -0.5]
    assert credit.row_weight.tolist() == [1, 1]


def test_dynamic_sampling_skip_drops_equal_groups():
    batch = make_batch([ep(1.0, 0), ep(0.0, 0), ep(1.0, 1), ep(1.0, 1)], pad_id=0)
    assert GRPO(GRPOConfig()).assign(batch, Fit()).row_weight.tolist() == [1, 1, 1, 1]
    credit = GRPO(GRPOConfig(dynamic_sampling="skip")).assign(batch, Fit())
    assert credit.row_weight.tolist() == [1, 1, 0, 0]
    assert credit.metrics["all_pass_groups"] == 1


def test_overlong_soft_penalty_and_mask():
    assert overlong_penalty(torch.tensor([10, 12, 14, 16, 20]), l_max=16, l_cache=4).tolist() == [0, 0, -0.5, -1, -1]
    batch = make_batch([ep(1.0, 0, turns=(6,)), ep(1.0, 0, turns=(2,))], pad_id=0)
    credit = GRPO(GRPOConfig(overlong="soft", overlong_max=6, overlong_cache=4, std_norm=False)).assign(batch, Fit())
    # lengths 6 and 2: penalties -1 and 0 -> rewards 0 and 1 -> A = -0.5, 0.5
    assert credit.advantages[:, 1].tolist() == [-0.5, 0.5]
    batch = make_batch([ep(0.0, 0, truncated=True), ep(1.0, 0)], pad_id=0)
    assert GRPO(GRPOConfig(overlong="mask")).assign(batch, Fit()).row_weight.tolist() == [0, 1]
