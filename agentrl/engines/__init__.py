"""Generation backends behind one interface: `torch` (default, CPU or GPU) and `vllm` (GPU)."""

from agentrl.engines.base import Engine, Generation, SamplingConfig, ScriptedEngine, Session
from agentrl.engines.torch_engine import TorchEngine

__all__ = ["Engine", "Generation", "SamplingConfig", "ScriptedEngine", "Session", "TorchEngine"]
