"""agentrl: multi-turn agentic RL for language-model policies, from verifiable rewards."""

from agentrl.core import AgentEnv, EnvError, Episode, Tool, ToolCall, Turn, make, parse_tool_calls

__version__ = "0.1.0"

__all__ = ["AgentEnv", "EnvError", "Episode", "Tool", "ToolCall", "Turn", "make", "parse_tool_calls", "__version__"]
