"""The vLLM engine under a multi-process launch, on CPU with a stand-in for `vllm.LLM`: each rank's
LLM gets vLLM's external launcher on cuda:LOCAL_RANK and its own seed; one process is unchanged; a
rank without a GPU of its own, or tensor parallelism asked of a data-parallel run, is refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from agentrl.engines import SamplingConfig
from agentrl.engines import vllm_engine as ve
from agentrl.engines.vllm_engine import VLLMEngine, launch_ranks

STOP, EOS = 90, 91


@pytest.fixture
def made(monkeypatch):
    """What the engine passed to `vllm.LLM`, and which GPU it set."""
    record: dict = {}
    fake = SimpleNamespace(LLM=lambda **kw: record.setdefault("llm", kw) and "llm", SamplingParams=dict,
                           TokensPrompt=dict, LoRARequest=tuple, version="0.11.0")
    monkeypatch.setattr(ve, "_import_vllm", lambda: fake)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: record.setdefault("device", d))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    return record


def launch(monkeypatch, rank, local, world, gpus):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(local))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)


def test_one_process_is_unchanged(made):
    assert launch_ranks() == (0, 0, 1)
    eng = VLLMEngine.from_policy("/m", SamplingConfig(), [STOP], EOS, 0, seed=7)
    assert "distributed_executor_backend" not in made["llm"] and made["llm"]["seed"] == 7 and "device" not in made
    assert eng.seeds.random() == __import__("random").Random(7).random()


def test_each_rank_builds_its_own_engine_on_its_own_gpu(made, monkeypatch):
    launch(monkeypatch, rank=3, local=1, world=4, gpus=2)  # second machine of two, its second GPU
    eng = VLLMEngine.from_policy("/m", SamplingConfig(), [STOP], EOS, 0, seed=7, max_model_len=512)
    kw = made["llm"]
    assert kw["distributed_executor_backend"] == "external_launcher" and kw["tensor_parallel_size"] == 1
    assert kw["seed"] == 10 and kw["max_model_len"] == 512 and made["device"] == 1
    assert eng.seeds.random() == __import__("random").Random(10).random()  # request seeds: this rank's stream


def test_a_rank_without_its_own_gpu_is_refused(made, monkeypatch):
    launch(monkeypatch, rank=2, local=2, world=3, gpus=2)
    with pytest.raises(RuntimeError, match=r"rank 2 has LOCAL_RANK=2 but this machine shows 2 CUDA GPU"):
        VLLMEngine.from_policy("/m", SamplingConfig(), [STOP], EOS, 0, seed=7)
    assert "llm" not in made


def test_tensor_parallel_is_refused_under_data_parallel_ranks(made, monkeypatch):
    launch(monkeypatch, rank=0, local=0, world=2, gpus=2)
    with pytest.raises(ValueError, match="tensor_parallel_size must be 1, got 2"):
        VLLMEngine.from_policy("/m", SamplingConfig(), [STOP], EOS, 0, tensor_parallel_size=2)


@pytest.mark.parametrize("env,message", [({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
                                         ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK=2, LOCAL_RANK=2, WORLD_SIZE=2")])
def test_a_broken_launch_environment_is_named(made, monkeypatch, env, message):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=message):
        launch_ranks()
