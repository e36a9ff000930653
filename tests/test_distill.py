"""Distillation from a teacher: the `distill` credit rule worked by hand on a two-turn episode, the tokenizer
check that keeps token-level distillation to a teacher with the student's tokenizer, the rejection stage on a
micro policy, and `--algo distill` end to end (the teacher scored on each action's own context, segments
included)."""

from __future__ import annotations

import json

import pytest
import torch
from test_segments import trimming_config, trimming_model  # noqa: F401 (a fixture)

from agentrl.algorithms.configs import DistillConfig
from agentrl.algorithms.distill import Distill
from agentrl.cli import main
from agentrl.config import RejectionConfig, TrainConfig
from agentrl.core import Episode, Turn
from agentrl.credit import Fit
from agentrl.policy import Policy, build_tiny_policy
from agentrl.registry import make
from agentrl.stages.data import load_conversations, to_episode
from agentrl.stages.distill import best_of_k, run_rejection, write_conversations
from agentrl.stages.sft import collect_demos, expert_texts
from agentrl.store import make_batch
from agentrl.teacher import TeacherMismatch, check_same_tokenizer, tokenizer_difference
from conftest import MICRO

# -- the credit rule, by hand ---------------------------------------------------------------------------


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


# -- the tokenizer check --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def other_vocab_dir(tmp_path_factory):
    """A micro policy whose tokenizer is trained on other text (a larger Vault's, other tasks, more slips): the same
    kind of tokenizer, a vocabulary of its own."""
    folder = tmp_path_factory.mktemp("other")
    build_tiny_policy(expert_texts(make("agentrl/Vault-v0", locks=5), range(500, 560), noise=0.9), folder, MICRO,
                      seed=0)
    return folder


@pytest.fixture(scope="module")
def teacher_dir(vault_policy_dir, tmp_path_factory):
    """A second micro policy on the student's tokenizer (the same corpus), with weights of its own (seed 1)."""
    folder = tmp_path_factory.mktemp("teacher")
    build_tiny_policy(expert_texts(make("agentrl/Vault-v0", locks=2), range(60), noise=0.3), folder, MICRO, seed=1)
    return folder


def test_the_tokenizer_check_compares_vocabularies_and_special_tokens(vault_policy_dir, teacher_dir,
                                                                      other_vocab_dir):
    from transformers import AutoTokenizer

    student = AutoTokenizer.from_pretrained(vault_policy_dir)
    assert tokenizer_difference(student, AutoTokenizer.from_pretrained(teacher_dir)) is None
    other = AutoTokenizer.from_pretrained(other_vocab_dir)
    assert "the vocabularies differ" in tokenizer_difference(student, other)
    # the same vocabulary, another end-of-sequence token: a sampled action would stop elsewhere
    renamed = AutoTokenizer.from_pretrained(vault_policy_dir)
    renamed.eos_token = renamed.convert_ids_to_tokens(5)
    assert "eos_token differs" in tokenizer_difference(student, renamed)
    with pytest.raises(TeacherMismatch, match=r"teacher T cannot score the tokens of student S: .*--mode rejection"):
        check_same_tokenizer(student, other, "S", "T")


def test_a_teacher_with_another_vocabulary_is_refused_for_token_level_distillation(vault_policy_dir,
                                                                                   other_vocab_dir, tmp_path):
    from agentrl.trainer import Trainer

    cfg = TrainConfig(model=str(vault_policy_dir), teacher=str(other_vocab_dir), algo="distill",
                      out=str(tmp_path / "run"), env={"id": "agentrl/Vault-v0", "kwargs": {"locks": 2}})
    with pytest.raises(TeacherMismatch, match=f"teacher {other_vocab_dir} cannot score the tokens of student "
                       f"{vault_policy_dir}"):
        Trainer(cfg)


def test_the_command_line_refuses_distill_without_a_teacher(tmp_path, capsys):
    assert main(["train", "--algo", "distill", "--out", str(tmp_path / "run")]) == 2
    assert "give --teacher MODEL" in capsys.readouterr().err
    assert main(["distill", "--mode", "rejection", "--out", str(tmp_path / "d")]) == 2
    assert "give --teacher MODEL" in capsys.readouterr().err
    assert main(["pipeline", "--distill", "on-policy", "--out", str(tmp_path / "p")]) == 2
    assert "give --teacher MODEL" in capsys.readouterr().err
    assert main(["distill", "--mode", "on-policy", "--algo", "grpo", "--teacher", "t/"]) == 2
    assert "--mode on-policy trains with --algo distill, not grpo" in capsys.readouterr().err


# -- rejection sampling ---------------------------------------------------------------------------------


def test_best_of_k_keeps_the_best_passing_episode_of_each_task():
    def ep(group, reward, n):
        return Episode([0], [Turn(1, [5] * n, [0.0] * n, [])], reward=reward, group_id=group)

    kept, counts = best_of_k([ep(0, 0.0, 1), ep(0, 1.0, 5), ep(0, 1.0, 3), ep(1, 0.0, 2), ep(1, 0.5, 2),
                              ep(2, 2.0, 9), ep(2, 1.0, 1)])
    assert [(e.group_id, e.reward, e.num_action_tokens) for e in kept] == [(0, 1.0, 3), (2, 2.0, 9)]
    assert counts == {"tasks": 3, "samples": 7, "passed": 4, "kept": 2, "dropped": 5, "tasks_without_pass": 1}


def test_a_kept_episode_written_as_text_reads_back_as_the_same_tokens(vault_policy, tmp_path):
    """The teacher's episode travels as text; with the student's tokenizer it is the same ids again."""
    demos = collect_demos(lambda: make("agentrl/Vault-v0", locks=2), vault_policy.chat, [3, 4], noise=0.0)
    fmt = vault_policy.chat.tool_format.name
    write_conversations(demos, tmp_path / "d.jsonl", "agentrl/Vault-v0", {"locks": 2}, fmt, fmt)
    env = make("agentrl/Vault-v0", locks=2)
    convs = load_conversations(tmp_path / "d.jsonl", env.system_prompt, env.tool_schemas())
    back = [to_episode(c, vault_policy.chat) for _, c in convs]
    assert [b.token_ids() for b in back] == [d.token_ids() for d in demos]
    assert [b.action_mask() for b in back] == [d.action_mask() for d in demos]


def test_rejection_keeps_the_teachers_passing_episodes_and_fine_tunes_the_student(vault_policy_dir, teacher_dir,
                                                                                  tmp_path):
    # Babble passes an action of even length: a random micro teacher passes about half its samples
    cfg = TrainConfig(env={"id": "test_e2e:Babble"}, model=str(vault_policy_dir), teacher=str(teacher_dir), seed=3,
                      rollout={"sampling": {"max_new_tokens": 6}}, eval={"episodes": 4},
                      sft={"epochs": 1, "lr": 1e-2, "batch_size": 4})
    before = Policy.load(vault_policy_dir).model.state_dict()
    record = run_rejection(cfg, RejectionConfig(tasks=5, k=3), tmp_path / "out")
    counts = record["counts"]
    assert counts["samples"] == 15 and counts["tasks"] == 5
    assert counts["kept"] + counts["dropped"] == 15 and counts["kept"] + counts["tasks_without_pass"] == 5
    assert counts["kept"] >= 1 and counts["passed"] >= counts["kept"]
    lines = [json.loads(s) for s in (tmp_path / "out" / "data.jsonl").read_text().splitlines()]
    assert len(lines) == counts["kept"] and all(line["reward"] >= 1.0 for line in lines)
    assert json.loads((tmp_path / "out" / "rejection.json").read_text())["counts"] == counts
    after = Policy.load(tmp_path / "out").model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


# -- on-policy: --algo distill end to end ---------------------------------------------------------------


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


def test_the_teacher_scores_each_action_on_the_context_it_was_sampled_from(trimming_model, tmp_path):  # noqa: F811
    """A teacher with the student's weights, on a template that rewrites the history (segments): its log-probs of
    every action token are the engine's, which sampled each action on its segment's context."""
    from agentrl.trainer import Trainer

    trainer = Trainer(trimming_config(trimming_model, tmp_path / "run", algo="distill", teacher=str(trimming_model)))
    episodes, metrics = trainer.collector.collect(1)
    assert metrics["rollout/segmented_frac"] > 0.5
    batch, _ = trainer._score_step(1, episodes, metrics)
    mask = batch.action_mask > 0
    assert torch.allclose(batch.teacher_logp[mask], batch.behaviour_logp[mask], atol=1e-4)
    assert torch.equal(batch.teacher_logp, batch.ref_logp)  # the same micro-batches as the reference
    assert metrics["time/teacher_s"] > 0


def test_the_pipeline_distils_after_sft_and_can_stop_there(tmp_path):
    from test_stages import PIPELINE_CFG

    from agentrl.stages.distill import DistillStage
    from agentrl.stages.pipeline import run_pipeline
    from agentrl.stages.warm_start import warm_start

    cfg = PIPELINE_CFG
    # a teacher on the student's tokenizer: the pipeline's own warm start (cached, so stage one finds it again)
    teacher = warm_start(cfg.env.id, cfg.env.kwargs, cfg.tiny, cfg.sft, cfg.seed, say=lambda s: None)
    out = tmp_path / "p"
    result = run_pipeline(cfg.model_copy(update={"teacher": str(teacher)}), None, out, say=lambda s: None,
                          distill=DistillStage("on-policy", updates=1, stop_after=True))
    assert [s["stage"] for s in result["stages"]] == ["sft", "distill (on-policy)"]  # no RL after it
    row = result["stages"][1]
    assert row["updates"] == 1 and row["teacher_kl_last"] is not None and row["teacher_seconds"] >= 0
    assert (out / "distill" / "checkpoint" / "config.json").is_file() and not (out / "rl").exists()
    assert json.loads((out / "pipeline.json").read_text())["distill"]["mode"] == "on-policy"
    with pytest.raises(ValueError, match="distillation stage's options differ"):
        run_pipeline(cfg, None, out, say=lambda s: None, resume=True,
                     distill=DistillStage("on-policy", updates=2, stop_after=True))
