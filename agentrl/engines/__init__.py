"""Generation backends behind one interface: `torch` (default, CPU or GPU) and `vllm` (GPU).

The registry says what the rest of agentrl needs to know about an engine before one is built:
whether it returns the policy's hidden states (turn critics and learned PRMs read them), whether it
keeps its own copy of the weights that must be synced after every update, and whether it needs a
GPU. `build` names a function ``(policy, sampling, seed, capture_hidden) -> Engine``, imported
only when a run builds the engine, so configuration loads without torch.

>>> get_engine_spec("vllm").returns_hidden, get_engine_spec("vllm").syncs_weights
(False, True)
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from agentrl.lookup import lookup, register


@dataclass(frozen=True)
class EngineSpec:
    name: str
    build: str  # "module:function" with signature (policy, sampling, seed, capture_hidden) -> Engine
    description: str
    returns_hidden: bool  # the hidden state at each turn's last context token comes back with the generation
    syncs_weights: bool  # holds its own weights: the trainer calls engine.sync_weights(model) after each update
    needs_cuda: bool = False  # refused on device cpu (TrainConfig) and where torch sees no GPU (load)

    def load(self) -> Any:
        """The builder; an engine that needs a GPU is refused here, before its heavy imports, when there is none."""
        if self.needs_cuda:
            import torch

            if not torch.cuda.is_available():
                raise RuntimeError(f"engine {self.name} needs a CUDA GPU and torch sees none "
                                   "(torch.cuda.is_available() is False); use --engine torch")
        module, _, attr = self.build.partition(":")
        return getattr(importlib.import_module(module), attr)


ENGINES: dict[str, EngineSpec] = {}


def register_engine(spec: EngineSpec, *, replace: bool = False) -> EngineSpec:
    return register(ENGINES, spec.name, spec, what="engine", replace=replace)


def get_engine_spec(name: str) -> EngineSpec:
    return lookup(ENGINES, name, what="engine")


register_engine(EngineSpec("torch", "agentrl.engines.torch:for_policy", returns_hidden=True, syncs_weights=False,
                           description="transformers forward, one batched step per token, each row's KV cache kept "
                           "across turns"))
register_engine(EngineSpec("vllm", "agentrl.engines.vllm_engine:for_policy", returns_hidden=False, syncs_weights=True,
                           needs_cuda=True, description="vllm.LLM with prefix caching; weights pushed after every "
                           "update ([vllm] extra, GPU)"))

_LAZY = {"Engine": "base", "Generation": "base", "ScriptedEngine": "base", "Session": "base",
         "TorchEngine": "torch", "VLLMEngine": "vllm_engine"}


def __getattr__(name: str) -> Any:  # the engines themselves import torch: load them when first asked for
    if name == "SamplingConfig":  # what an engine samples with: the config's, named here where engines are made
        return importlib.import_module("agentrl.config").SamplingConfig
    if name in _LAZY:
        return getattr(importlib.import_module(f"agentrl.engines.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'agentrl.engines' has no attribute {name!r}")


__all__ = ["ENGINES", "EngineSpec", "SamplingConfig", "get_engine_spec", "register_engine", *_LAZY]
