"""Defaults that fit a pretrained model (docs/models.md, "Defaults for a pretrained model"): the documented
real-model commands run as printed, on a stand-in for SmolLM2 and shrunk by extra flags, and choose the
pretrained defaults; what the user sets wins, even at the tiny policy's value; agentrl's tiny policy keeps
the fields' own defaults."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from agentrl import cli, models
from agentrl.cli.flags import given_fields
from agentrl.cli.training import SFTCommand
from agentrl.config import TinyModelConfig, fit_pretrained

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- commands: real model"
# SmolLM2-135M-Instruct's own chat template, as its fetched folder holds it: plain ChatML that ignores tools=
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# what each documented command gets on top, so that it runs in seconds; every other setting is the command's own
SHRINK = {
    "sft": ["--sft.episodes", "4", "--sft.epochs", "1", "--eval-episodes", "2"],
    "train": ["--updates", "2", "--rollout.groups", "1", "--rollout.group-size", "2", "--eval.episodes", "2",
              "--rollout.sampling.max-new-tokens", "16"],
}


def commands_after_marker(text: str) -> list[list[str]]:
    """The indented `agentrl ...` lines of the code block that follows the marker, as argv lists (comments cut)."""
    lines = text[text.index(MARKER):].splitlines()[1:]
    block: list[list[str]] = []
    for line in lines:
        if line.startswith("    agentrl "):
            block.append(shlex.split(line, comments=True))
        elif line.strip() and block:
            break
        elif line.strip():
            raise AssertionError(f"text between the marker and its commands: {line!r}")
    return block


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> Path:
    """A micro Llama with SmolLM2's chat template and a BPE tokenizer trained on Arithmetic's expert text: what
    agentrl sees of SmolLM2 (a pretrained model, told by its template) at a size a test trains in seconds."""
    from transformers import AutoTokenizer

    from agentrl.policy import build_tiny_policy
    from agentrl.registry import make
    from agentrl.stages.sft import expert_texts

    env = make(f"{ROOT / 'examples' / 'custom_env.py'}:Arithmetic")
    folder = tmp_path_factory.mktemp("smollm2-standin")
    size = TinyModelConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=1, max_position_embeddings=2048, vocab_size=400)
    build_tiny_policy(expert_texts(env, range(40), noise=0.3), folder, size, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.chat_template = SMOLLM2_TEMPLATE  # no longer the tiny policy's: a pretrained model's
    tokenizer.save_pretrained(folder)
    return folder


def _said(capsys) -> str:
    out = capsys.readouterr()
    return " ".join((out.out + out.err).split())  # the console wraps long lines


def test_the_documented_commands_run_as_printed_and_choose_the_pretrained_defaults(standin, tmp_path, monkeypatch,
                                                                                    capsys):
    commands = commands_after_marker((ROOT / "docs" / "models.md").read_text())
    assert [c[:2] for c in commands] == [["agentrl", "models"], ["agentrl", "models"], ["agentrl", "show-prompt"],
                                         ["agentrl", "sft"], ["agentrl", "train"]]
    readme = (ROOT / "README.md").read_text()
    readme_block = readme[readme.index("## Your own model"):]
    in_readme = [shlex.split(x, comments=True) for x in readme_block.splitlines()[:8] if x.startswith("    agentrl ")]
    assert [c for c in in_readme if c[1] in ("sft", "train")] == commands[3:], "README and docs/models.md differ"

    # the fetched model is the stand-in, in the cache where `agentrl models fetch` leaves it
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    fetched = models.cache_dir() / "smollm2-135m-instruct"
    shutil.copytree(standin, fetched)
    models._write_manifest(fetched, {"name": "smollm2-135m-instruct", "about": "a test's stand-in"})
    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "examples" / "custom_env.py", tmp_path / "my_env.py")  # the README's env, as it says to save it
    said = {}
    for cmd in commands:
        argv = [*cmd[1:], *SHRINK.get(cmd[1], [])]
        rc = cli.main(argv)
        said[cmd[1]] = _said(capsys)
        assert rc == 0, (argv, said[cmd[1]][-3000:])

    warm = json.loads((tmp_path / "warm" / "warm_start.json").read_text())
    assert warm["demonstrations"] == 4 and warm["sft/steps"] == 1  # 4 demonstrations in one batch of 8
    assert warm["settings"] == {"epochs": 1, "batch_size": 8, "lr": 1e-4, "lora_r": 0}
    assert warm["pretrained_defaults"] == {"filled": {"sft.batch_size": 8, "sft.lr": 1e-4},
                                           "yours": {"sft.episodes": 4, "sft.epochs": 1, "eval_episodes": 2}}
    assert ("sft: smollm2-135m-instruct is a pretrained model, not agentrl's tiny policy" in said["sft"]
            and "--sft.batch-size 8, --sft.lr 0.0001; set by you: --sft.episodes 4" in said["sft"])
    assert "sft step 1/1" in said["sft"] and "held-out pass rate" in said["sft"]

    run = tmp_path / "runs" / "arithmetic"
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert (cfg["optim"]["lora"]["r"], cfg["optim"]["lr"], cfg["optim"]["minibatches"], cfg["eval"]["every"]) == (
        16, 5e-5, 1, 0)
    assert (cfg["updates"], cfg["rollout"]["groups"], cfg["rollout"]["group_size"], cfg["eval"]["episodes"]) == (
        2, 1, 2, 2)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates_done"] == 2
    assert summary["decisions"]["pretrained_defaults"]["filled"] == {"optim.lora.r": 16, "optim.lr": 5e-5,
                                                                     "optim.minibatches": 1, "eval.every": 0}
    assert (run / "config.yaml").read_text().startswith("# a pretrained model's defaults (docs/models.md)")
    assert "train: warm/ is a pretrained model" in said["train"]
    assert "ETA" in said["train"] and "for the 1 update left (an estimate from update 1's time" in said["train"]


def _printed(capsys, argv: list[str]) -> dict:
    assert cli.main(argv) == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_what_the_user_sets_wins_even_at_the_tiny_policys_value(standin, tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("eval:\n  episodes: 128\n")
    cfg = _printed(capsys, ["train", "--model", str(standin), "--config", str(tmp_path / "c.yaml"), "--updates", "40",
                            "--optim.lr", "2e-4", "--set", "rollout.groups=8", "--print-config"])
    # each of these equals the tiny policy's default, and is kept because the user gave it
    assert (cfg["updates"], cfg["optim"]["lr"], cfg["rollout"]["groups"], cfg["eval"]["episodes"]) == (
        40, 2e-4, 8, 128)
    # the rest of the table is filled in
    assert (cfg["rollout"]["group_size"], cfg["optim"]["lora"]["r"], cfg["optim"]["minibatches"],
            cfg["eval"]["every"]) == (4, 16, 1, 0)


def test_full_fine_tuning_by_rl_gets_its_own_rate(standin, capsys):
    cfg = _printed(capsys, ["train", "--model", str(standin), "--optim.lora.r", "0", "--print-config"])
    assert (cfg["optim"]["lora"]["r"], cfg["optim"]["lr"], cfg["updates"]) == (0, 1e-5, 6)
    cfg = _printed(capsys, ["train", "--model", str(standin), "--optim.lora.r", "8", "--print-config"])
    assert (cfg["optim"]["lora"]["r"], cfg["optim"]["lr"]) == (8, 5e-5)


@pytest.mark.parametrize("with_model", [False, True])
def test_the_tiny_policy_keeps_the_fields_own_defaults(with_model, vault_policy_dir, capsys):
    argv = ["train", "--print-config"] + (["--model", str(vault_policy_dir)] if with_model else [])
    cfg = _printed(capsys, argv)
    assert (cfg["updates"], cfg["rollout"]["groups"], cfg["rollout"]["group_size"]) == (40, 8, 8)
    assert (cfg["optim"]["lora"]["r"], cfg["optim"]["lr"], cfg["optim"]["minibatches"]) == (0, 2e-4, 2)
    assert (cfg["eval"]["episodes"], cfg["eval"]["every"]) == (128, 10)


def test_sft_picks_the_lora_recipe_when_lora_is_asked_for():
    full, fitted = fit_pretrained(SFTCommand(out="w", model="m"), "sft", {"out", "model"})
    assert (full.sft.episodes, full.sft.epochs, full.sft.batch_size, full.sft.lr, full.eval_episodes) == (
        128, 2, 8, 1e-4, 24)
    assert fitted.yours == {}
    lora, fitted = fit_pretrained(SFTCommand(out="w", model="m", lora_r=8), "sft", {"out", "model", "lora_r"})
    assert (lora.sft.episodes, lora.sft.epochs, lora.sft.batch_size, lora.sft.lr, lora.lora_r) == (64, 3, 4, 1e-3, 8)
    mine, fitted = fit_pretrained(SFTCommand(out="w", model="m", sft={"lr": 3e-3}), "sft", {"sft.lr"})
    assert mine.sft.lr == 3e-3 and fitted.yours == {"sft.lr": 3e-3} and "sft.lr" not in fitted.filled


def test_given_fields_reads_flags_set_and_the_config_file(tmp_path):
    (tmp_path / "c.yaml").write_text("optim:\n  lora:\n    r: 0\nrollout: {}\n")
    given = given_fields(["--config", str(tmp_path / "c.yaml"), "--set", "eval.every=3", "--sft.batch_size", "8",
                          "--optim.lr=1e-4", "--env-kw", "locks=2"])
    assert given == {"optim.lora.r", "eval.every", "sft.batch_size", "optim.lr", "env.kwargs.locks"}


def test_the_tiny_policy_is_told_by_its_template(standin, vault_policy_dir, tmp_path):
    from agentrl.policy import TINY_CHAT_TEMPLATE

    assert models.is_tiny_policy(vault_policy_dir) and not models.is_tiny_policy(standin)
    assert not models.is_tiny_policy("smollm2-135m-instruct") and not models.is_tiny_policy(tmp_path / "absent")
    older = tmp_path / "older"  # a template saved inside tokenizer_config.json, as older transformers did
    older.mkdir()
    (older / "tokenizer_config.json").write_text(json.dumps({"chat_template": TINY_CHAT_TEMPLATE}))
    assert models.is_tiny_policy(older)
    (older / "tokenizer_config.json").write_text("{not json")
    assert not models.is_tiny_policy(older)
    (older / "tokenizer_config.json").write_text(json.dumps(["a", "list"]))
    assert not models.is_tiny_policy(older)
