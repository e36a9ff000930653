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
which names the env, the episode and the turn. A step before any reset is refused with an error that says so.

The doors (`Guard`, `make_server`), each bounded, because a served env runs the tools any client asks for:

- **who comes in**: every HTTP request and WebSocket handshake carries the server's token, made with
  `secrets` at start and printed (`Authorization: Bearer <token>`, or HTTP Basic with the token as password,
  which is what a client that takes only a URL sends for ``http://agentrl:<token>@host:port``); `token=None`
  (``--no-token``) serves without one. A request with an ``Origin`` header that is not a loopback origin is
  refused: that header comes from a browser, and browsers apply no CORS to WebSockets, so without this check
  any web page could drive the env. On a loopback address a ``Host`` that is not loopback is refused too (a
  DNS-rebinding page). A non-loopback address is refused unless asked for (`allow_remote`).
- **how long**: a tool call runs under `tool_timeout` through the rollout's own `agentrl.workers.ToolRunner`
  (past it the policy reads that the call timed out, and the episode goes on); a session whose client sends
  nothing for `idle_timeout` is closed and its env freed; a client that leaves mid-step frees its session at
  once (the step's thread ends when its tool returns or times out); a connection that has not finished a
  request head (a WebSocket upgrade is one) within `handshake_timeout` is closed.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hmac
import ipaddress
import json
import logging
import re
import secrets
import socket
from typing import Any
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field

from agentrl.core import AgentEnv
from agentrl.registry import make
from agentrl.workers import ToolRunner

PROTOCOL = 1  # the version of the fields above; a client refuses a server that speaks another
TOKEN_ENV = "AGENTRL_ENV_TOKEN"  # where agentrl's client (and `serve-env`, when set) reads the token
TOOL_TIMEOUT = 60.0  # seconds, as `rollout.tool_timeout`: a served episode is the one a local rollout plays
IDLE_TIMEOUT = 300.0  # seconds; a turn's generation must fit, and agentrl's client reopens a closed session at reset
HANDSHAKE_TIMEOUT = 10.0  # seconds to send a whole request head: a loopback client needs milliseconds
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # an action is the policy's text: far below this; uvicorn's default is 16 MiB
_TOKEN_RE = re.compile(r"[A-Za-z0-9_.~-]{16,256}")  # URL-safe, so that it can travel as a URL's password


def describe(env: AgentEnv, env_id: str) -> dict[str, Any]:
    """What a client needs before its first reset: ``x-agentrl`` in the observation schema."""
    return {"protocol": PROTOCOL, "env": env_id, "system_prompt": env.system_prompt, "tools": env.tool_schemas(),
            "max_turns": env.max_turns}


def new_token() -> str:
    """A fresh server token (43 URL-safe characters, 256 random bits)."""
    return secrets.token_urlsafe(32)


def check_token(token: str) -> str:
    """`token` if it can serve as one (16-256 URL-safe characters), else a ValueError that says what is wrong."""
    if not isinstance(token, str) or not _TOKEN_RE.fullmatch(token):
        raise ValueError("a server token must be 16 to 256 characters of A-Z a-z 0-9 _ . ~ - (got "
                         f"{len(token) if isinstance(token, str) else type(token).__name__} characters)")
    return token


def is_loopback(host: str | None) -> bool:
    """Whether `host` (a name or an address, IPv6 with or without brackets) names this machine only."""
    if not host:
        return False
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _jsonable(info: dict[str, Any]) -> dict[str, Any]:
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
        """One OpenEnv session's environment: a fresh `AgentEnv` from `make(env_id, **kwargs)`, its tools run
        under `tool_timeout` seconds each."""

        SUPPORTS_CONCURRENT_SESSIONS = True  # each session builds its own AgentEnv; nothing is shared

        def __init__(self, env_id: str, kwargs: dict[str, Any], tool_timeout: float | None = TOOL_TIMEOUT):
            super().__init__()
            self.env_id = env_id
            self.env = make(env_id, **kwargs)
            self.env.tool_runner = ToolRunner(default=tool_timeout)  # a hanging tool is an observation, as in a rollout
            self._state = State()
            self._live = False  # an episode has been reset (an env stepped before its reset has no task to play)

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> AgentObservation:
            self._live = False
            obs, info = self.env.reset(seed=seed, options=kwargs.get("options"))
            self._live = True
            self._state = State(episode_id=episode_id, step_count=0)
            return AgentObservation(text=obs, info=_jsonable(info), reward=0.0, done=False)

        def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> AgentObservation:
            if not self._live:
                raise RuntimeError(f"env {self.env_id}: no episode is running: send reset before step")
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


# -- the doors ----------------------------------------------------------------------------------------

_NO_HTTP_STEP = ("serve-env plays episodes over the WebSocket /ws only: an HTTP /step gets a fresh env that no "
                 "reset started; reset and step over /ws (agentrl.adapters.openenv:OpenEnvEnv does)")


class Guard:
    """The ASGI app in front of OpenEnv's: who may come in (the token, the Origin, the Host) and how long a
    WebSocket session may sit idle or outlive its client (see the module docstring).

    OpenEnv's ``/ws`` handler builds the session's env after its first receive (the handshake) and then waits
    for messages; so from its second receive on, the session exists: idle time is counted there, and a client
    that leaves while a message is being handled cancels the handler, whose cleanup frees the session at once.
    """

    def __init__(self, app: Any, token: str | None, idle_timeout: float | None = IDLE_TIMEOUT,
                 loopback_only: bool = True):
        self.app, self.token, self.idle_timeout, self.loopback_only = app, token, idle_timeout, loopback_only

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            return await self.app(scope, receive, send)
        refusal = self.refusal(scope)
        if refusal is None and scope["type"] == "http" and scope.get("method") == "POST" and scope["path"] == "/step":
            refusal = (409, _NO_HTTP_STEP)
        if refusal is not None:
            return await _refuse(scope, receive, send, *refusal)
        if scope["type"] == "websocket":
            return await self._session(scope, receive, send)
        return await self.app(scope, receive, send)

    def refusal(self, scope: dict[str, Any]) -> tuple[int, str] | None:
        """(status, reason) for a request that may not come in, None for one that may."""
        headers: dict[str, str] = {}
        for name, value in scope.get("headers", []):
            key = name.decode("latin-1").lower()
            if key in headers and key in ("origin", "host", "authorization"):  # no guessing which one counts
                return 400, f"duplicate {key} header"
            headers[key] = value.decode("latin-1")
        origin = headers.get("origin")
        if origin is not None and not is_loopback(urlsplit(origin).hostname):
            return 403, (f"cross-origin request from {origin!r} refused: a served env answers only clients on this "
                         "machine that are not web pages")
        if self.loopback_only and "host" in headers and not is_loopback(urlsplit("//" + headers["host"]).hostname):
            return 403, f"Host {headers['host']!r} refused: this server listens on a loopback address only"
        if self.token is not None and not self._authorized(headers.get("authorization", "")):
            return 401, (f"missing or wrong token: send the token serve-env printed as 'Authorization: Bearer "
                         f"<token>' (agentrl's OpenEnvEnv reads {TOKEN_ENV})")
        return None

    def _authorized(self, header: str) -> bool:
        scheme, _, credential = header.strip().partition(" ")
        credential = credential.strip()
        if scheme.lower() == "basic":  # a URL's password, http://agentrl:<token>@host (clients that take a URL only)
            try:
                credential = base64.b64decode(credential, validate=True).decode("utf-8").partition(":")[2]
            except ValueError:
                return False
        elif scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(credential.encode("utf-8"), self.token.encode("utf-8"))

    async def _session(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        inbox: asyncio.Queue = asyncio.Queue(maxsize=4)  # the client's messages, read ahead to see it leave
        state = {"receives": 0, "waiting": False, "closed": False, "cancelled": False}
        app_task: asyncio.Task | None = None

        async def pump() -> None:
            while True:
                message = await receive()
                await inbox.put(message)
                if message["type"] == "websocket.disconnect":
                    if state["receives"] >= 2 and not state["waiting"] and app_task is not None:
                        state["cancelled"] = True  # it left mid-message: stop waiting for the step, free the session
                        app_task.cancel()
                    return

        async def app_receive() -> dict[str, Any]:
            state["receives"] += 1
            if state["receives"] < 2:  # the handshake: no session yet
                return await inbox.get()
            state["waiting"] = True
            try:
                return await asyncio.wait_for(inbox.get(), self.idle_timeout)
            except asyncio.TimeoutError:
                state["closed"] = True
                await send({"type": "websocket.close", "code": 1001,
                            "reason": f"idle for {self.idle_timeout:g} s: session closed"})
                return {"type": "websocket.disconnect", "code": 1001}
            finally:
                state["waiting"] = False

        async def app_send(message: dict[str, Any]) -> None:
            if not state["closed"]:
                await send(message)

        app_task = asyncio.ensure_future(self.app(scope, app_receive, app_send))
        reader = asyncio.ensure_future(pump())
        try:
            await app_task
        except asyncio.CancelledError:
            if not state["cancelled"] or not app_task.cancelled():
                raise  # the server is stopping this connection, not the client leaving
        finally:
            reader.cancel()
            if not app_task.done():
                app_task.cancel()


async def _refuse(scope: dict[str, Any], receive: Any, send: Any, status: int, reason: str) -> None:
    body = json.dumps({"detail": reason}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    await receive()  # websocket.connect
    if "websocket.http.response" in scope.get("extensions", {}):  # the handshake answered with the reason
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})  # the server answers 403


@functools.cache
def h11_with_head_timeout() -> type:
    """uvicorn's HTTP/1.1 protocol, plus a limit on how long a connection may take to send a request head.
    uvicorn arms its keep-alive timer only after a response, so a client that opens a connection and sends
    half a head (of a WebSocket upgrade, say) would hold it forever; here it is closed after
    ``config.agentrl_handshake_timeout`` seconds, counted from the connection or from its last response."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class H11WithHeadTimeout(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            seconds = getattr(self.config, "agentrl_handshake_timeout", HANDSHAKE_TIMEOUT)
            self._head_timer = self.loop.call_later(seconds, self._head_overdue)

        def _head_overdue(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or self.transport.get_protocol() is not self:
                return  # gone, or upgraded to a WebSocket (its head came in time)
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a request is being served: its head came in time
            self.transport.close()

    return H11WithHeadTimeout


def build_app(env_id: str, kwargs: dict[str, Any] | None = None, max_sessions: int = 256, *, token: str | None,
              tool_timeout: float | None = TOOL_TIMEOUT, idle_timeout: float | None = IDLE_TIMEOUT,
              loopback_only: bool = True) -> Any:
    """The ASGI app that serves `env_id`: OpenEnv's FastAPI app behind a `Guard` (built once here, so that a bad
    id fails before serving). `token=None` serves without a token."""
    if token is not None:
        check_token(token)
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
    factory = functools.partial(AgentEnvironment, env_id, kwargs, tool_timeout)
    app = create_fastapi_app(factory, TextAction, observation_cls, max_concurrent_envs=max_sessions)
    return Guard(app, token, idle_timeout=idle_timeout, loopback_only=loopback_only)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket; port 0 takes a free one (read it back with ``getsockname()``)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # uvicorn sets none on sockets handed to it; without it each response waits out the client's delayed ACK
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def make_server(env_id: str, kwargs: dict[str, Any] | None = None, *, token: str | None, host: str = "127.0.0.1",
                max_sessions: int = 256, tool_timeout: float | None = TOOL_TIMEOUT,
                idle_timeout: float | None = IDLE_TIMEOUT, handshake_timeout: float = HANDSHAKE_TIMEOUT) -> Any:
    """The `uvicorn.Server` that `serve` runs (``.run(sockets=[bind(host, port)])``), with every timeout set."""
    import uvicorn

    app = build_app(env_id, kwargs, max_sessions, token=token, tool_timeout=tool_timeout, idle_timeout=idle_timeout,
                    loopback_only=is_loopback(host))
    # a dead peer is found by the WebSocket ping within 40 s; a stop waits 5 s for steps that still run
    config = uvicorn.Config(app, log_level="warning", http=h11_with_head_timeout(), ws="auto",
                            timeout_keep_alive=5, ws_ping_interval=20.0, ws_ping_timeout=20.0,
                            ws_max_size=MAX_MESSAGE_BYTES, timeout_graceful_shutdown=5)
    config.agentrl_handshake_timeout = handshake_timeout  # read by the HTTP protocol of every connection
    return uvicorn.Server(config)


def serve(env_id: str, kwargs: dict[str, Any] | None = None, host: str = "127.0.0.1", port: int = 8000,
          max_sessions: int = 256, on_ready: Any = None, *, token: str | None, allow_remote: bool = False,
          tool_timeout: float | None = TOOL_TIMEOUT, idle_timeout: float | None = IDLE_TIMEOUT,
          handshake_timeout: float = HANDSHAKE_TIMEOUT) -> None:
    """Serve until interrupted. `on_ready(url)` is called once the socket listens (the CLI prints it).
    `token=None` serves without one; a `host` other than a loopback address needs `allow_remote`."""
    if not is_loopback(host) and not allow_remote:
        raise ValueError(f"host {host} is not a loopback address: pass allow_remote to serve the env's tools to "
                         "the network")
    server = make_server(env_id, kwargs, token=token, host=host, max_sessions=max_sessions, tool_timeout=tool_timeout,
                         idle_timeout=idle_timeout, handshake_timeout=handshake_timeout)
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    if on_ready is not None:
        on_ready(f"http://{host}:{bound}")
    server.run(sockets=[sock])
