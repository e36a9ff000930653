"""The `distill` credit rule worked by hand on a two-turn episode, and `--algo distill` end to end on the micro
policy with a micro teacher on its tokenizer."""

from __future__ import annotations

import json

import pytest
import torch

from agentrl.algorithms.configs import DistillConfig
from agentrl.algorithms.distill import Distill
from agentrl.core import Episode, Turn
from agentrl.credit import Fit
from agentrl.store import make_batch


def two_turns(reward: float, group: int = 0) -> Episode:
    """prompt [1, 2]; a1 = [5, 6] (student log-probs -0.5, -1.0), o1 = [7]; a2 = [8] (-2.0).
    Laid out as [1, 2, 5, 6, 7, 8]: action tokens at positions 2, 3 and 5."""
    return Episode([1, 2], [Turn(2, [5, 6], [-0.5, -1.0], [7]), Turn(5, [8], [-2.0], [0])], reward=reward,
                   group_id=group)


# the teacher's log-probs at positions 2, 3, 5 (the numbers at 0, 1, 4 sit on context tokens and must be ignored)
TEACHER = [[9.0, 9.0, -0.25, -3.0, 9.0, -1.0]]


def credit(cfg: DistillConfig, episodes: list[Episode], teacher: list[list[float]]):
    batch = make_batch(episodes, pad_id=0)
    return Distill(cfg).assign(batch.with_(teacher_logp=torch.tensor(teacher)), Fit())


def test_each_action_tokens_advantage_is_the_teachers_logp_minus_the_students():
    c = credit(DistillConfig(), [two_turns(1.0)], TEACHER)
    # -0.25 - (-0.5) = 0.25; -3.0 - (-1.0) = -2.0; -1.0 - (-2.0) = 1.0; 0 on the prompt and the observation
    assert c.advantages.tolist() == [[0.0, 0.0, 0.25, -2.0, 0.0, 1.0]]
    assert c.row_weight.tolist() == [1.0]
    # reverse KL per action token: the mean of student - teacher = (-0.25 + 2.0 - 1.0) / 3
    assert c.metrics["teacher_kl"] == pytest.approx(0.25)
    assert c.metrics["adv_abs_mean"] == pytest.approx((0.25 + 2.0 + 1.0) / 3)


def test_the_clip_bounds_each_tokens_log_ratio():
    c = credit(DistillConfig(distill_clip=1.5), [two_turns(1.0)], TEACHER)
    assert c.advantages.tolist() == [[0.0, 0.0, 0.25, -1.5, 0.0, 1.0]]
    assert c.metrics["distill_clip_frac"] == pytest.approx(1 / 3)
    assert c.metrics["teacher_kl"] == pytest.approx(0.25)  # the KL is measured before the clip


def test_reward_weight_adds_the_verifiers_group_advantage_to_every_action_token():
    # one group of two: rewards 1 and 0, mean 0.5, unbiased std 0.70711 -> group advantages +0.70711, -0.70711;
    # times the weight 0.5: +0.353553 on the passing episode's action tokens, -0.353553 on the failing one's
    teacher = TEACHER + [[9.0, 9.0, -0.5, -1.0, 9.0, -2.0]]  # the second episode: the teacher agrees exactly
    c = credit(DistillConfig(reward_weight=0.5), [two_turns(1.0), two_turns(0.0)], teacher)
    want = [[0.0, 0.0, 0.25 + 0.353553, -2.0 + 0.353553, 0.0, 1.0 + 0.353553],
            [0.0, 0.0, -0.353553, -0.353553, 0.0, -0.353553]]
    assert torch.allclose(c.advantages, torch.tensor(want), atol=1e-5)
    assert c.metrics["groups"] == 1.0
    assert c.metrics["teacher_kl"] == pytest.approx(0.25 / 2)  # over six action tokens, three of them 0


def test_a_batch_without_teacher_logps_is_refused():
    with pytest.raises(ValueError, match="--teacher"):
        Distill().assign(make_batch([two_turns(1.0)], pad_id=0), Fit())


def test_algo_distill_trains_end_to_end_and_logs_the_teacher_kl(vault_policy_dir, teacher_dir, tmp_path):
    from test_e2e import small_config

    from agentrl.trainer import Trainer

    cfg = small_config(tmp_path, vault_policy_dir, algo="distill", teacher=str(teacher_dir),
                       credit={"distill_clip": 5.0, "reward_weight": 0.1})
    trainer = Trainer(cfg)
    teacher_before = {k: v.clone() for k, v in trainer.learner.teacher.state_dict().items()}
    before = {k: v.clone() for k, v in trainer.policy.model.state_dict().items()}
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if r["step"] >= 1 and not r.get("final")]
    assert len(updates) == 2
    assert all(r["credit/teacher_kl"] > 0 and r["time/teacher_s"] > 0 for r in updates)  # two random models differ
    assert all(torch.isfinite(torch.tensor(r["train/loss"])) for r in updates)
    after = trainer.policy.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    teacher_after = trainer.learner.teacher.state_dict()
    assert all(torch.equal(teacher_before[k], v) for k, v in teacher_after.items())  # frozen
