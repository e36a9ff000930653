"""The tokenizer check that keeps token-level distillation to a teacher with the student's tokenizer, and the
refusals that name both models (or the missing teacher) before any training."""

from __future__ import annotations

import pytest

from agentrl.cli import main
from agentrl.config import TrainConfig
from agentrl.policy import build_tiny_policy
from agentrl.registry import make
from agentrl.stages.sft import expert_texts
from agentrl.teacher import TeacherMismatch, check_same_tokenizer, tokenizer_difference
from conftest import MICRO


@pytest.fixture(scope="module")
def other_vocab_dir(tmp_path_factory):
    """A micro policy whose tokenizer is trained on other text (a larger Vault's, other tasks, more slips): the same
    kind of tokenizer, a vocabulary of its own."""
    folder = tmp_path_factory.mktemp("other")
    build_tiny_policy(expert_texts(make("agentrl/Vault-v0", locks=5), range(500, 560), noise=0.9), folder, MICRO,
                      seed=0)
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
