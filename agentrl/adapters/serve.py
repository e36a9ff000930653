"""Serve any agentrl environment as an OpenEnv server (`agentrl serve-env ENV`).

The server is OpenEnv's own (`openenv.core.env_server.create_fastapi_app`): every WebSocket session
on ``/ws`` gets its own `AgentEnv` instance, so TRL, SkyRL, ART or agentrl's own OpenEnv adapter
(`agentrl.adapters.openenv.OpenEnvEnv`) can drive many episodes at once. The wire format:

- action: ``{"text": "<the policy's whole action text>"}``; the served env parses its tool calls,
  exactly as a local rollout does (a malformed call is an observation, counted).
- observation: ``text`` plus what `AgentEnv.step` puts in ``info`` (``terminated``, ``truncated``,
  ``step_reward``, ``state_key`` as its ``repr``, ``malformed``, ``malformed_calls``,
  ``tool_timeouts``, ``turn``), since OpenEnv sends only ``done`` and ``reward`` besides the
  observation's own fields (its ``metadata`` never crosses the wire). ``done`` is
  ``terminated or truncated``; ``reward`` is the verifier's reward on the step that ends the
  episode and 0 before, as agentrl's contract says.
- ``GET /schema``: the observation schema carries ``x-agentrl`` (the env's id, system prompt, tool
  schemas and turn budget), so a client knows what to show the policy before its first reset.

A tool or verifier that raises stays an error: OpenEnv answers the step with its error message,
which names the env, the episode and the turn.
"""

from __future__ import annotations

import functools
import logging
import socket
from typing import Any

from pydantic import ConfigDict, Field

from agentrl.core import AgentEnv
from agentrl.registry import make

PROTOCOL = 1  # the version of the fields above; a client refuses a server that speaks another


def describe(env: AgentEnv, env_id: str) -> dict[str, Any]:
    """What a client needs before its first reset: ``x-agentrl`` in the observation schema."""
    return {"protocol": PROTOCOL, "env": env_id, "system_prompt": env.system_prompt, "tools": env.tool_schemas(),
            "max_turns": env.max_turns}


def _jsonable(info: dict[str, Any]) -> dict[str, Any]:
    import json

    try:
        return json.loads(json.dumps(info))
    except (TypeError, ValueError):  # an info value JSON cannot carry: sent as text rather than dropped silently
        return {k: v if isinstance(v, (str, int, float, bool, type(None))) else repr(v) for k, v in info.items()}


@functools.cache
def server_types() -> tuple[type, type, type]:
    """(TextAction, AgentObservation, AgentEnvironment), built on openenv-core's base classes when first asked
    for: the extra is optional, and importing OpenEnv's server stack takes seconds."""
    try:
        from openenv.core.env_server.interfaces import Environment
        from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
    except ImportError as e:
        raise ImportError(f"serving over OpenEnv needs openenv-core: pip install 'agentrl[openenv]' ({e})") from e

    class TextAction(Action):
        """The policy's whole action text, tool calls and all."""

        text: str = Field(description="the action text, with tool calls as <tool_call>{...}</tool_call>")


    class AgentObservation(Observation):
        """What `AgentEnv.reset` / `step` returned, in fields (OpenEnv does not send `metadata`)."""

        text: str = Field(description="the observation text the policy reads")
        terminated: bool = False
        truncated: bool = False
        step_reward: float = 0.0
        state_key: str | None = Field(None, description="repr() of the env's state_key(), None when it has none")
        malformed: int = 0
        malformed_calls: int = 0
        tool_timeouts: int = 0
        turn: int = 0
        info: dict[str, Any] = Field(default_factory=dict, description="reset()'s info, when JSON can carry it")


    class AgentEnvironment(Environment):
        """One OpenEnv session's environment: a fresh `AgentEnv` from `make(env_id, **kwargs)`."""

        SUPPORTS_CONCURRENT_SESSIONS = True  # each session builds its own AgentEnv; nothing is shared

        def __init__(self, env_id: str, kwargs: dict[str, Any]):
            super().__init__()
            self.env_id = env_id
            self.env = make(env_id, **kwargs)
            self._state = State()

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> AgentObservation:
            obs, info = self.env.reset(seed=seed, options=kwargs.get("options"))
            self._state = State(episode_id=episode_id, step_count=0)
            return AgentObservation(text=obs, info=_jsonable(info), reward=0.0, done=False)

        def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> AgentObservation:
            obs, reward, terminated, truncated, info = self.env.step(action.text)
            self._state.step_count += 1
            key = info.get("state_key")
            return AgentObservation(
                text=obs, reward=float(reward), done=bool(terminated or truncated), terminated=bool(terminated),
                truncated=bool(truncated), step_reward=float(info.get("step_reward") or 0.0),
                state_key=None if key is None else repr(key), malformed=int(info.get("malformed", 0)),
                malformed_calls=int(info.get("malformed_calls", 0)), tool_timeouts=int(info.get("tool_timeouts", 0)),
                turn=int(info.get("turn", self._state.step_count)))

        @property
        def state(self) -> State:
            return self._state

        def get_metadata(self) -> EnvironmentMetadata:
            return EnvironmentMetadata(name=self.env_id, description=self.env.system_prompt or type(self.env).__doc__
                                       or "",
                                       version=f"agentrl-openenv/{PROTOCOL}")

    return TextAction, AgentObservation, AgentEnvironment


class _ClosedByClient(logging.Filter):
    """OpenEnv's WebSocket handler closes a socket that its client has closed already, and uvicorn logs the
    refusal as an ASGI error with a traceback, once per episode-runner that leaves; nothing failed, so it is
    dropped (every other error is still logged)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        while exc is not None:
            if type(exc).__name__ in ("WebSocketDisconnect", "ClientDisconnected"):
                return False
            exc = exc.__context__
        return True


def build_app(env_id: str, kwargs: dict[str, Any] | None = None, max_sessions: int = 256) -> Any:
    """The FastAPI app that serves `env_id` (built once here, so that a bad id fails before serving)."""
    kwargs = dict(kwargs or {})
    log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _ClosedByClient) for f in log.filters):
        log.addFilter(_ClosedByClient())
    probe = make(env_id, **kwargs)
    # the schema's x-agentrl: what the policy is shown, known before a session starts
    from openenv.core.env_server import create_fastapi_app

    TextAction, AgentObservation, AgentEnvironment = server_types()
    extra = {"x-agentrl": describe(probe, env_id)}
    observation_cls = type("AgentrlObservation", (AgentObservation,),
                           {"model_config": ConfigDict(**AgentObservation.model_config, json_schema_extra=extra)})
    factory = functools.partial(AgentEnvironment, env_id, kwargs)
    return create_fastapi_app(factory, TextAction, observation_cls, max_concurrent_envs=max_sessions)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket; port 0 takes a free one (read it back with ``getsockname()``)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def serve(env_id: str, kwargs: dict[str, Any] | None = None, host: str = "127.0.0.1", port: int = 8000,
          max_sessions: int = 256, on_ready: Any = None) -> None:
    """Serve until interrupted. `on_ready(url)` is called once the socket listens (the CLI prints it)."""
    import uvicorn

    app = build_app(env_id, kwargs, max_sessions)
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    if on_ready is not None:
        on_ready(f"http://{host}:{bound}")
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
