"""Your agent, unchanged: an OpenAI-compatible gateway that keeps every token (docs/gateway.md).

An agent written around an OpenAI client calls the policy being trained through this endpoint; each
call is a turn of an `agentrl.core.Episode`, laid out token for token by the model's own chat template,
so the same store, credit assigners, loss and checkpoints train it as they train an `AgentEnv`.

- `agentrl.gateway.session`: one episode's calls as ids and turns (segments where the history was rewritten)
- `agentrl.gateway.engine_loop`: many sessions' calls batched on one engine
- `agentrl.gateway.service`: sessions, the token, the limits, the metrics (no wire format)
- `agentrl.gateway.openai_api`: OpenAI's chat-completions wire format
- `agentrl.gateway.server`: the HTTP routes on uvicorn
- `agentrl.gateway.agent`: the user's `solve` run in-process, one episode per task seed
"""

from agentrl.gateway.agent import Agent, AgentError, AgentRunner, SessionInfo, TaskSource
from agentrl.gateway.service import Gateway
from agentrl.gateway.session import AgentSession, Call, CallError

__all__ = ["Agent", "AgentError", "AgentRunner", "AgentSession", "Call", "CallError", "Gateway", "SessionInfo",
           "TaskSource"]
