"""Generation backends behind one interface: `torch` (default, CPU or GPU) and `vllm` (GPU)."""

from agentrl.engines.base import Engine, Generation, SamplingConfig, ScriptedEngine, Session
from agentrl.engines.torch_engine import TorchEngine
from agentrl.engines.vllm_engine import VLLMEngine  # imports vLLM only when one is built

__all__ = ["Engine", "Generation", "SamplingConfig", "ScriptedEngine", "Session", "TorchEngine", "VLLMEngine"]
