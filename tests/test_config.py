"""Configs fail loudly, naming the field, before any work is done."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentrl.cli import main
from agentrl.config import TrainConfig, load_config, parse_override


def test_defaults_and_presets():
    cfg = TrainConfig()
    assert cfg.algo == "grpo" and cfg.loss.eps_high == 0.2 and cfg.credit_config.dynamic_sampling == "off"
    dapo = TrainConfig(preset="dapo")
    assert dapo.loss.eps_high == 0.28 and dapo.credit_config.dynamic_sampling == "resample" and dapo.credit_config.overlong == "soft"
    # a value the user set wins over the preset's
    assert TrainConfig(preset="dapo", loss={"eps_high": 0.3}).loss.eps_high == 0.3


@pytest.mark.parametrize(
    "override, field",
    [
        ({"rollout": {"group_sise": 4}}, "rollout.group_sise"),
        ({"loss": {"agg": "mean"}}, "loss.agg"),
        ({"optim": {"lr": -1}}, "optim.lr"),
        ({"algo": "ppo"}, "algo"),
        ({"credit": {"std_norm": "maybe"}}, "credit"),
        ({"credit": {"nope": 1}}, "credit"),
    ],
)
def test_invalid_values_name_the_field(override, field):
    with pytest.raises(ValidationError) as e:
        TrainConfig(**override)
    assert field in {".".join(map(str, err["loc"])) for err in e.value.errors()}


def test_yaml_round_trip_and_overrides(tmp_path):
    cfg = TrainConfig(updates=3, rollout={"group_size": 4})
    path = tmp_path / "config.yaml"
    path.write_text(cfg.to_yaml())
    again = load_config(path, [parse_override("rollout.groups=2"), parse_override("env.kwargs={locks: 5}")])
    assert (again.updates, again.rollout.group_size, again.rollout.groups, again.env.kwargs) == (3, 4, 2, {"locks": 5})


def test_cli_rejects_bad_config_before_any_work(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--set", "rollout.group_sise=3", "--out", str(out)]) == 2
    assert "rollout.group_sise" in capsys.readouterr().out
    assert main(["train", "--algo", "nope", "--out", str(out)]) == 2
    assert "unknown algorithm 'nope'; known: arpo, gigpo, grpo, steppo, turn-ppo" in " ".join(capsys.readouterr().out.split())
    assert main(["train", "--env", "agentrl/Nope-v0", "--out", str(out)]) == 2
    assert "unknown environment" in capsys.readouterr().out
    assert not out.exists()  # nothing was started


def test_cli_lora_flags_reach_the_config(capsys):
    assert main(["train", "--lora-r", "16", "--lora-targets", "q_proj", "v_proj", "--lora-dropout", "0.05", "--print-config"]) == 0
    text = capsys.readouterr().out
    assert "r: 16" in text and "- q_proj" in text and "dropout: 0.05" in text
    assert main(["train", "--lora-r", "-1", "--print-config"]) == 2
    assert "optim.lora.r" in capsys.readouterr().out


def test_vllm_engine_is_refused_for_assigners_that_read_hidden_states(capsys):
    assert main(["train", "--algo", "turn-ppo", "--engine", "vllm", "--print-config"]) == 2
    assert "cannot serve --algo turn-ppo" in " ".join(capsys.readouterr().out.split())
    assert TrainConfig(algo="grpo", engine="vllm").engine == "vllm"
