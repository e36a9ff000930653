"""Configs fail loudly, naming the field, before any work is done; the CLI is generated from them."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from agentrl.algorithms import ASSIGNERS
from agentrl.cli import main
from agentrl.config import TrainConfig, load_config, parse_override, read_yaml


def test_defaults_and_presets():
    cfg = TrainConfig()
    assert cfg.algo == "grpo" and cfg.loss.eps_high == 0.2 and cfg.credit.dynamic_sampling == "off"
    dapo = TrainConfig(preset="dapo")
    assert dapo.loss.eps_high == 0.28 and dapo.credit.dynamic_sampling == "resample" and dapo.credit.overlong == "soft"
    # a value the user set wins over the preset's
    assert TrainConfig(preset="dapo", loss={"eps_high": 0.3}).loss.eps_high == 0.3
    assert TrainConfig(preset="dapo", credit={"overlong": "mask"}).credit.overlong == "mask"
    # the loss side applies to every assigner; the credit side only where the assigner has those options
    tp = TrainConfig(algo="turn-ppo", preset="dapo")
    assert tp.loss.eps_high == 0.28 and tp.credit.algo == "turn-ppo" and not hasattr(tp.credit, "dynamic_sampling")


def test_credit_is_typed_by_algo():
    cfg = TrainConfig(algo="turn-ppo", credit={"gamma": 0.9})
    assert type(cfg.credit).__name__ == "TurnPPOConfig" and cfg.credit.gamma == 0.9 and cfg.credit.lam == 0.9
    with pytest.raises(ValidationError, match="these options are for 'grpo' but algo is 'turn-ppo'"):
        TrainConfig(algo="turn-ppo", credit={"algo": "grpo"})
    with pytest.raises(ValidationError, match="invalid options for turn-ppo: std_norm"):
        TrainConfig(algo="turn-ppo", credit={"std_norm": False})  # a grpo option, not turn-ppo's


@pytest.mark.parametrize(
    "override, field",
    [
        ({"rollout": {"group_sise": 4}}, "rollout.group_sise"),
        ({"loss": {"agg": "mean"}}, "loss.agg"),
        ({"optim": {"lr": -1}}, "optim.lr"),
        ({"algo": "ppo"}, "algo"),
        ({"credit": {"std_norm": "maybe"}}, "credit"),
        ({"credit": {"nope": 1}}, "credit"),
        ({"device": "tpu"}, "device"),
        ({"engine": "jax"}, "engine"),
        ({"tiny": {"num_attention_heads": 5}}, "tiny"),
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


def _printed(capsys, argv):
    assert main([*argv, "--print-config"]) == 0
    return capsys.readouterr().out


def test_print_config_shows_the_assigners_options(capsys):
    text = yaml.safe_load(_printed(capsys, ["train", "--algo", "turn-ppo"]))
    assert text["credit"] == {"algo": "turn-ppo", "gamma": 0.99, "lam": 0.9, "use_step_rewards": False, "whiten": True,
                              "warmup_updates": 5, "warmup_ev": 0.2,
                              "critic": {"width": 64, "lr": 0.002, "epochs": 4, "minibatch": 256, "value_clip": 0.2}}


@pytest.mark.parametrize("algo", sorted(ASSIGNERS))
def test_a_runs_config_passed_back_reproduces_it(algo, tmp_path, capsys):
    first = _printed(capsys, ["train", "--algo", algo, "--rollout.groups", "3", "--set", "loss.kl_coef=0.01",
                              "--env-kw", "locks=2", "--seed", "7"])
    (tmp_path / "config.yaml").write_text(first)
    assert _printed(capsys, ["train", "--config", str(tmp_path / "config.yaml")]) == first
    cfg = TrainConfig.model_validate(yaml.safe_load(first))
    assert cfg.to_yaml() == first and cfg.credit.algo == algo and cfg.env.kwargs == {"locks": 2}


def test_flags_override_set_which_overrides_the_file(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("updates: 5\nrollout: {groups: 2, group_size: 3}\n")
    cfg = yaml.safe_load(_printed(capsys, ["train", "--config", str(tmp_path / "c.yaml"), "--set", "rollout.groups=4",
                                           "--set", "updates=6", "--updates", "9"]))
    assert (cfg["updates"], cfg["rollout"]["groups"], cfg["rollout"]["group_size"]) == (9, 4, 3)


def _descriptions(model: type[BaseModel]):
    """Every flag's description; a field marked Suppress (a free mapping: --set or its own KEY=VALUE flag) has none."""
    from tyro.conf import Suppress

    for field in model.model_fields.values():
        ann = field.annotation
        if any(m is Suppress for m in field.metadata):
            continue
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _descriptions(ann)
        elif field.description:
            yield field.description


def _flat(text: str) -> str:
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


@pytest.mark.parametrize("algo", sorted(ASSIGNERS))
def test_every_flags_help_is_its_fields_description(algo, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # one column of boxes: wrapped lines join again in _flat
    with pytest.raises(SystemExit) as e:
        main(["train", "--algo", algo, "--help"])
    assert e.value.code == 0
    help_text = _flat(capsys.readouterr().out)
    cfg = TrainConfig(algo=algo)
    missing = [d for d in [*_descriptions(TrainConfig), *_descriptions(type(cfg.credit))] if _flat(d) not in help_text]
    assert not missing, missing[:3]
    assert "--credit.algo" not in help_text  # the tag is set by --algo alone


def test_cli_rejects_bad_config_before_any_work(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--set", "rollout.group_sise=3", "--out", str(out)]) == 2
    assert "rollout.group_sise" in capsys.readouterr().err
    assert main(["train", "--algo", "nope", "--out", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "unknown algorithm 'nope'; known: arpo, distill, gigpo, grpo, steppo, turn-ppo" in err
    assert main(["train", "--env", "agentrl/Nope-v0", "--out", str(out)]) == 2
    assert "unknown environment" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # tyro answers a bad flag value itself, on stderr, exit 2
        main(["train", "--device", "tpu", "--out", str(out)])
    assert e.value.code == 2 and "unknown device 'tpu'" in _flat(capsys.readouterr().err)
    assert main(["train", "--set", "tiny.num_attention_heads=5", "--out", str(out)]) == 2
    assert "not a multiple of num_attention_heads 5" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo: grpo\nrollout:\n  groups: [1\n")
    assert main(["train", "--config", str(bad), "--out", str(out)]) == 2
    assert f"{bad}:4:1: not valid YAML" in capsys.readouterr().err
    assert not out.exists()  # nothing was started


def test_a_bad_flag_answers_at_once_without_torch():
    code = ("import sys, time; t = time.perf_counter(); from agentrl.cli import main; "
            "rc = main(['train', '--set', 'bad.field=1']); "
            "print(rc, 'torch' in sys.modules, 'transformers' in sys.modules, time.perf_counter() - t)")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    wall = time.perf_counter() - t0
    rc, torch_loaded, hf_loaded, inside = out.stdout.split()
    assert (rc, torch_loaded, hf_loaded) == ("2", "False",
                                             "False") and "bad: Extra inputs are not permitted" in out.stderr
    assert float(inside) < 1.0 and wall < 3.0, (inside, wall)  # the interpreter's own start-up is most of `wall`


def test_cli_lora_flags_reach_the_config(capsys):
    text = _printed(capsys, ["train", "--optim.lora.r", "16", "--optim.lora.target-modules", "q_proj",
                             "--optim.lora.target-modules", "v_proj",
                             "--optim.lora.dropout", "0.05"])
    assert "r: 16" in text and "- q_proj" in text and "dropout: 0.05" in text
    with pytest.raises(SystemExit) as e:
        main(["train", "--optim.lora.r", "-1", "--print-config"])
    assert e.value.code == 2 and "greater than or equal to 0" in _flat(capsys.readouterr().err)


def test_vllm_engine_is_refused_for_assigners_that_read_hidden_states(capsys):
    assert main(["train", "--algo", "turn-ppo", "--set", "engine=vllm", "--print-config"]) == 2
    assert "engine vllm cannot serve algo turn-ppo" in " ".join(capsys.readouterr().err.split())
    assert TrainConfig(algo="grpo", engine="vllm").engine == "vllm"
    assert TrainConfig(algo="steppo", engine="vllm", credit={"prm": "implicit"}).engine == "vllm"
    with pytest.raises(ValidationError, match="cannot serve algo steppo"):
        TrainConfig(algo="steppo", engine="vllm", credit={"prm": "learned"})


def test_an_engine_that_needs_cuda_is_refused_on_cpu_before_it_is_imported(monkeypatch):
    import torch

    from agentrl.engines import get_engine_spec

    with pytest.raises(ValueError, match="needs a CUDA GPU, but device is cpu"):
        TrainConfig(algo="grpo", engine="vllm", device="cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delitem(sys.modules, "agentrl.engines.vllm_engine", raising=False)
    with pytest.raises(RuntimeError, match="engine vllm needs a CUDA GPU and torch sees none"):
        get_engine_spec("vllm").load()
    assert "agentrl.engines.vllm_engine" not in sys.modules
    assert callable(get_engine_spec("torch").load())


def test_unknown_command_suggests_the_nearest(capsys):
    assert main(["trian"]) == 2
    assert "did you mean 'train'" in capsys.readouterr().err


def _alias_bomb() -> list[str]:
    """A billion laughs: ten x's, then eight levels that each alias the level below ten times (10^9 leaves)."""
    levels = ["a: &a [x,x,x,x,x,x,x,x,x,x]"]
    levels += [f"{n}: &{n} [{','.join(['*' + p] * 10)}]" for p, n in zip("abcdefgh", "bcdefghi")]
    return levels


@contextmanager
def _within(seconds: float):
    """Stop the block with TimeoutError past `seconds` (the code before the bound parsed a 50 MB file for minutes)."""
    def stop(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")
    before = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def test_an_alias_bomb_config_file_is_refused_at_once_naming_the_file(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("env:\n  kwargs:\n" + "".join(f"    {line}\n" for line in _alias_bomb()))
    assert bomb.stat().st_size < 600
    t = time.perf_counter()
    with _within(5), pytest.raises(ValueError) as e:
        read_yaml(bomb)
    assert time.perf_counter() - t < 1.0
    assert str(e.value).startswith(f"{bomb}: its anchors and aliases expand to over 100,000 values")


def test_an_alias_bomb_in_a_set_value_is_refused_naming_the_key():
    value = "[" + ", ".join(line.split(": ", 1)[1] for line in _alias_bomb()) + "]"
    assert len(value) < 470
    t = time.perf_counter()
    with _within(5), pytest.raises(ValueError) as e:
        parse_override("env.kwargs.laughs=" + value)
    assert time.perf_counter() - t < 1.0
    assert str(e.value).startswith("--set env.kwargs.laughs: its anchors and aliases expand to over 100,000 values")
    with pytest.raises(ValueError, match="--set env.kwargs.me: an alias refers to a node that contains it"):
        parse_override("env.kwargs.me=&me [*me]")


def test_the_cli_refuses_an_alias_bomb_in_bounded_memory(tmp_path):
    # before the bound, --print-config wrote the 10^9 values out: here that is a MemoryError under a 3 GiB cap
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("env:\n  kwargs:\n" + "".join(f"    {line}\n" for line in _alias_bomb()))
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
            "from agentrl.cli import main; sys.exit(main(sys.argv[1:]))")
    out = subprocess.run([sys.executable, "-c", code, "train", "--config", str(bomb), "--print-config"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr[-500:]
    assert f"--config: {bomb}: its anchors and aliases expand to over 100,000 values" in out.stderr
    assert "Traceback" not in out.stderr and not out.stdout


def test_a_config_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("env:\n  kwargs:\n" + "    key: a value that is ordinary YAML\n" * 1_300_000)  # 50 MB
    size = big.stat().st_size
    assert size > 50_000_000
    t = time.perf_counter()
    with _within(5), pytest.raises(ValueError) as e:
        read_yaml(big)
    assert time.perf_counter() - t < 1.0
    assert str(e.value) == f"config file {big} is {size:,} bytes, over the limit of 1,048,576 (1 MiB) for a config"


def test_a_config_that_reuses_a_block_through_an_alias_still_loads(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("rollout:\n  sampling: {temperature: &t 0.7, top_p: 0.9}\neval:\n  temperature: *t\n"
                    "env:\n  kwargs:\n    explore: &lock {locks: 3, noise: 0.1}\n    exploit: *lock\n")
    cfg = load_config(path)
    assert (cfg.rollout.sampling.temperature, cfg.eval.temperature) == (0.7, 0.7)
    assert cfg.env.kwargs == {"explore": {"locks": 3, "noise": 0.1}, "exploit": {"locks": 3, "noise": 0.1}}
