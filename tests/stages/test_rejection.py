"""Distillation as a stage: rejection sampling from a teacher (best-of-k, the kept episodes as text that reads back
as the same tokens, SFT on them) and the pipeline's distillation stage."""

from __future__ import annotations

import json

import pytest
import torch

from agentrl.config import RejectionConfig, TrainConfig
from agentrl.core import Episode, Turn
from agentrl.policy import Policy
from agentrl.registry import make
from agentrl.stages.data import load_conversations, to_episode
from agentrl.stages.distill import best_of_k, run_rejection, write_conversations
from agentrl.stages.sft import collect_demos


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


def test_a_teacher_that_passes_nothing_is_an_error_not_a_traceback(vault_policy_dir, teacher_dir, tmp_path,
                                                                   monkeypatch, capsys):
    """SmolLM2 untouched on Arithmetic passes none of its samples: the command says so and what to try, exit 2."""
    import agentrl.stages.distill as distill
    from agentrl import cli

    counts = {"tasks": 4, "samples": 8, "passed": 0, "kept": 0, "dropped": 8, "tasks_without_pass": 4}
    monkeypatch.setattr(distill, "rejection_sample", lambda *a, **k: ([], counts))
    code = cli.main(["distill", "--mode", "rejection", "--teacher", str(teacher_dir), "--model", str(vault_policy_dir),
                     "--env.id", "agentrl/Vault-v0", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "passed none of its 8 samples" in err and "--rejection.k" in err and "Traceback" not in err
