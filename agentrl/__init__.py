"""agentrl: multi-turn agentic RL for language-model policies, from verifiable rewards."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_CORE = ("AgentEnv", "EnvError", "Episode", "Tool", "ToolCall", "Turn", "parse_tool_calls")


def __getattr__(name: str) -> Any:
    # `import agentrl.config` (the command line's first step) must not pay for gymnasium and numpy
    if name in _CORE:
        return getattr(importlib.import_module("agentrl.core"), name)
    if name == "make":
        return importlib.import_module("agentrl.registry").make
    raise AttributeError(f"module 'agentrl' has no attribute {name!r}")


__all__ = [*_CORE, "make", "__version__"]
