"""`MCPEnv`: an `AgentEnv` whose tools are served by an MCP server (the `mcp` SDK, stdio or streamable HTTP).

    class Lookup(MCPEnv):
        server = MCPServerSpec(command=("python", "my_server.py"))   # or url="http://127.0.0.1:8000/mcp"
        tools = [answer]                                             # tools of the env's own, beside the server's

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return "Find the capital of ...", {}

        def verify(self) -> float: ...

The server's tool list becomes the env's tool schemas (its own JSON schemas, as the chat template renders
them); a call is validated against that schema (a bad one is an observation and counts as malformed, as for
local tools), goes through ``tools/call``, and its result is the observation: the text parts, else the
structured content as JSON; a result the server marks ``isError`` reads ``error: ...``, which the policy can
learn from. Each call has `MCPServerSpec.call_timeout`: past it the server is pinged, and a server that still
answers gives the policy a timeout observation (the episode goes on), one that does not is an `EnvError`
naming the server (the episode ends as errored, the others go on). A server that exits is an `EnvError` with
the tail of its stderr.

**One server per env, or shared.** By default each env starts its own server process (a stdio server) or
session (HTTP) at its first `reset`, so a stateful server's state belongs to one episode stream; a rollout of
64 envs runs 64 servers. ``share=True`` gives every env of a process one session: cheap, for servers whose
tools keep no state between calls. Sessions close with the env (`close`) or the process.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures as cf
import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

from agentrl.core import AgentEnv, EnvError, Tool, ToolTimeout

PING_SECONDS = 5.0  # how long a server that let a call time out has to answer a probe (tools/list) before it is hung


@dataclass(frozen=True)
class MCPServerSpec:
    """Where an MCP server is: a `command` to start (stdio: the server's stdout is the protocol, its stderr
    goes to a log file that errors quote) or a streamable-HTTP `url`."""

    command: tuple[str, ...] = ()
    url: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # extra environment variables for a started server
    cwd: str | None = None
    call_timeout: float = 30.0  # seconds a tool call may take (then: a ping decides between timeout and hang)
    connect_timeout: float = 60.0  # seconds to start the server and list its tools
    share: bool = False  # one session for every env of the process (stateless servers only)
    name: str | None = None  # how errors call it; default: the command's last word, or the URL
    max_result_chars: int = 8000  # a result longer than this is cut (an observation must fit a context)

    def __post_init__(self) -> None:
        if isinstance(self.command, str):
            object.__setattr__(self, "command", (self.command,))
        object.__setattr__(self, "command", tuple(self.command))
        if isinstance(self.env, Mapping):
            object.__setattr__(self, "env", tuple(sorted(self.env.items())))
        if bool(self.command) == bool(self.url):
            raise ValueError("MCPServerSpec: give a command (a stdio server) or a url (streamable HTTP), not both")
        if self.call_timeout <= 0 or self.connect_timeout <= 0:
            raise ValueError("MCPServerSpec: timeouts must be > 0 seconds")

    @property
    def label(self) -> str:
        return self.name or (f"MCP server {self.url}" if self.url else f"MCP server {' '.join(self.command)!r}")


class MCPServerError(EnvError):
    """The server cannot be reached, died, or hangs."""


class MCPSession:
    """One live client session with a server, on an event loop of its own (a daemon thread), so that envs
    call it synchronously from any thread. Opened at construction; raises `MCPServerError` if the server
    does not start and list its tools within `connect_timeout`."""

    def __init__(self, spec: MCPServerSpec):
        try:
            from mcp import Client, StdioServerParameters
            from mcp.client.stdio import stdio_client
            from mcp.client.streamable_http import streamable_http_client
        except ImportError as e:  # pragma: no cover - mcp is a dependency of the [dev] and [mcp] extras
            raise ImportError("MCPEnv needs the mcp package: pip install 'agentrl[mcp]'") from e
        self.spec = spec
        self._log = tempfile.NamedTemporaryFile("w+", prefix="agentrl-mcp-", suffix=".log", delete=False)
        if spec.command:
            params = StdioServerParameters(command=spec.command[0], args=list(spec.command[1:]),
                                           env=dict(spec.env) or None, cwd=spec.cwd)
            transport = stdio_client(params, errlog=self._log)
        else:
            transport = streamable_http_client(spec.url)
        self._client = Client(transport, read_timeout_seconds=spec.call_timeout)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"mcp {spec.label}", daemon=True)
        self._thread.start()
        self._closing: asyncio.Event | None = None
        self.failure: BaseException | None = None
        ready: cf.Future = cf.Future()
        self._main = asyncio.run_coroutine_threadsafe(self._serve(ready), self._loop)
        try:
            self.tools: list[Any] = ready.result(timeout=spec.connect_timeout)
        except cf.TimeoutError:
            self.close(polite=False)  # it never listed its tools: nothing to end politely
            raise MCPServerError(f"{spec.label} did not start and list its tools within {spec.connect_timeout:g} s"
                                 f"{self._stderr_tail()}") from None
        except Exception as e:
            self.close()
            raise MCPServerError(f"{spec.label} could not be started: {type(e).__name__}: {e}"
                                 f"{self._stderr_tail()}") from e

    async def _serve(self, ready: cf.Future) -> None:
        self._closing = asyncio.Event()
        try:
            async with self._client as client:
                tools, cursor = [], None
                while True:  # the tool list may come in pages
                    page = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
                    tools += page.tools
                    cursor = getattr(page, "next_cursor", None)
                    if not cursor:
                        break
                ready.set_result(tools)
                await self._closing.wait()
        except BaseException as e:  # the server died or the transport broke: said on the next call
            self.failure = e
            if not ready.done():
                ready.set_exception(e)
            if not isinstance(e, Exception):
                raise

    def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """The server's `CallToolResult` for one call. Raises `ToolTimeout` for a slow call on a server that
        still answers a ping, `MCPServerError` for one that does not, or that has gone."""
        self._check_alive(name)
        spec = self.spec
        future = asyncio.run_coroutine_threadsafe(
            self._client.call_tool(name, arguments, read_timeout_seconds=spec.call_timeout), self._loop)
        try:
            return future.result(timeout=spec.call_timeout + PING_SECONDS)
        except (cf.TimeoutError, TimeoutError):
            future.cancel()
            timed_out = True
        except Exception as e:
            if "timed out" not in str(e).lower():
                self._check_alive(name)
                self.failure = e  # the transport broke: every later call says the server is gone
                raise MCPServerError(f"{spec.label}: tools/call {name!r} failed: {type(e).__name__}: {e}"
                                     f"{self._stderr_tail()}") from e
            timed_out = True
        if timed_out and self._answers_ping():
            raise ToolTimeout(name, spec.call_timeout)
        raise MCPServerError(f"{spec.label} hangs: tools/call {name!r} got no answer within {spec.call_timeout:g} s "
                             f"and a ping none within {PING_SECONDS:g} s{self._stderr_tail()}")

    def _answers_ping(self) -> bool:
        if self._main.done():
            return False
        # a request any server answers (ping is gone from the 2026 protocol): a busy-but-alive server answers it
        ping = asyncio.run_coroutine_threadsafe(self._client.list_tools(), self._loop)
        try:
            ping.result(timeout=PING_SECONDS)
            return True
        except Exception:
            ping.cancel()
            return False

    def _check_alive(self, name: str) -> None:
        if self._main.done() or self.failure is not None:
            why = f": {type(self.failure).__name__}: {self.failure}" if self.failure else ""
            raise MCPServerError(f"{self.spec.label} is gone (before tools/call {name!r}){why}{self._stderr_tail()}")

    def _stderr_tail(self, n: int = 600) -> str:
        try:
            with open(self._log.name, errors="replace") as f:
                tail = f.read()[-n:].strip()
        except OSError:
            return ""
        return f"; its stderr ends: {tail}" if tail else ""

    def close(self, wait: float = 5.0, polite: bool = True) -> None:
        """End the session (a started server exits with it) and its thread: politely, then by cancelling a
        session that is stuck (a server that never finished its handshake), waiting for the transport to
        stop the server process."""
        if polite and self._closing is not None and not self._main.done():
            self._loop.call_soon_threadsafe(self._closing.set)
            with contextlib.suppress(Exception):
                self._main.result(timeout=wait)
        if not self._main.done():
            self._main.cancel()
            with contextlib.suppress(BaseException):
                self._main.result(timeout=wait)
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        self._log.close()
        with contextlib.suppress(OSError):
            os.unlink(self._log.name)


_SHARED: dict[MCPServerSpec, tuple[MCPSession, int]] = {}
_SHARED_LOCK = threading.Lock()


def open_session(spec: MCPServerSpec) -> MCPSession:
    """A session for `spec`: a new one, or with ``share=True`` the process's one (counted, `release` it)."""
    if not spec.share:
        return MCPSession(spec)
    with _SHARED_LOCK:
        session, users = _SHARED.get(spec, (None, 0))
        if session is None or session.failure is not None or session._main.done():
            session, users = MCPSession(spec), 0
        _SHARED[spec] = (session, users + 1)
        return session


def release(session: MCPSession) -> None:
    if not session.spec.share:
        session.close()
        return
    with _SHARED_LOCK:
        held, users = _SHARED.get(session.spec, (None, 0))
        if held is session and users > 1:
            _SHARED[session.spec] = (session, users - 1)
            return
        if held is session:
            del _SHARED[session.spec]
    session.close()


@atexit.register
def _close_shared() -> None:
    for session, _ in list(_SHARED.values()):
        session.close()
    _SHARED.clear()


class _Arguments(BaseModel):
    """A call's arguments, checked against the server's JSON schema (set per tool by `_mcp_tool`)."""

    model_config = ConfigDict(extra="allow")
    _tool: ClassVar[str] = ""
    _validator: ClassVar[Any] = None

    @model_validator(mode="before")
    @classmethod
    def _against_schema(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError(f"arguments must be an object, got {type(data).__name__}")
        problems = sorted(cls._validator.iter_errors(data), key=lambda e: list(e.absolute_path))
        if problems:
            raise ValueError("; ".join(f"{'.'.join(map(str, p.absolute_path)) or 'arguments'}: {p.message[:200]}"
                                       for p in problems[:5]))
        return data

    def __call__(self, env: MCPEnv) -> str:
        return env.call_mcp(self._tool, dict(self.model_extra or {}))


@dataclass(frozen=True)
class MCPTool(Tool):
    """A tool of an MCP server: the server's own JSON schema is what the policy sees."""

    input_schema: dict[str, Any] = field(default_factory=dict)

    @property
    def schema(self) -> dict[str, Any]:  # type: ignore[override]
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.input_schema}}


def _mcp_tool(tool: Any, timeout: float) -> MCPTool:
    from jsonschema import Draft202012Validator

    schema = dict(tool.input_schema or {"type": "object", "properties": {}})
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    args = type(f"{tool.name}_mcp_args", (_Arguments,), {})
    args._tool, args._validator = tool.name, Draft202012Validator(schema)
    # the rollout's own limit only as a backstop: the session's call timeout and ping decide first
    return MCPTool(tool.name, tool.description or "", args, args.__call__, takes_env=True,
                   timeout=timeout + 2 * PING_SECONDS + 5, input_schema=schema)


def result_text(result: Any, limit: int) -> str:
    """A `CallToolResult` as the observation: its text parts, else its structured content as JSON; other
    content (images, audio, resources) named; ``error: ...`` when the server says the call failed."""
    parts = []
    for item in result.content or []:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
        elif kind == "resource" and getattr(item.resource, "text", None) is not None:
            parts.append(item.resource.text)
        else:
            parts.append(f"[{kind or type(item).__name__} content]")
    text = "\n".join(parts)
    if not text.strip() and result.structured_content is not None:
        text = json.dumps(result.structured_content)
    if len(text) > limit:
        text = text[:limit] + f"... ({len(text) - limit} more characters)"
    return f"error: {text}" if result.is_error else text


class MCPEnv(AgentEnv):
    """An env whose tools come from `server` (an `MCPServerSpec`), beside any tools of its own. Subclass it:
    set `server`, write `reset` (the task) and `verify`; `mcp_tools` names the server's tools to offer
    (default: all of them). See the module docstring."""

    server: ClassVar[MCPServerSpec]
    mcp_tools: ClassVar[Sequence[str] | None] = None

    def __init__(self, max_turns: int | None = None):
        super().__init__(max_turns)
        if not isinstance(getattr(type(self), "server", None), MCPServerSpec):
            raise TypeError(f"{type(self).__name__}.server must be an MCPServerSpec (a command or a url)")
        self._session: MCPSession | None = None

    @property
    def session(self) -> MCPSession:
        """The live session, opened on first use (the first `reset` or `tool_schemas`). One that broke stays
        broken (its calls say so) until the next `reset` opens a fresh one: state never vanishes mid-episode."""
        if self._session is None:
            self._session = open_session(self.server)
            self._add_server_tools(self._session)
        return self._session

    def _reopen_if_broken(self) -> None:
        if self._session is not None and (self._session.failure is not None or self._session._main.done()):
            release(self._session)
            self._session = None

    def _add_server_tools(self, session: MCPSession) -> None:
        offered = {t.name: t for t in session.tools}
        wanted = list(offered) if self.mcp_tools is None else list(self.mcp_tools)
        missing = [n for n in wanted if n not in offered]
        if missing:
            raise MCPServerError(f"{self.server.label} has no tool {missing[0]!r}; it has {', '.join(offered)}")
        for name in wanted:
            if name in self._tools and not isinstance(self._tools[name], MCPTool):
                raise TypeError(f"{type(self).__name__}: the env's own tool {name!r} has the name of a tool of "
                                f"{self.server.label}; rename one, or leave it out with mcp_tools")
            self._tools[name] = _mcp_tool(offered[name], self.server.call_timeout)

    def call_mcp(self, name: str, arguments: dict[str, Any]) -> str:
        """One call to the server's tool `name`; its result as the observation text."""
        try:
            result = self.session.call(name, arguments)
        except MCPServerError as e:
            raise MCPServerError(f"{self._where()}: {e}") from e
        return result_text(result, self.server.max_result_chars)

    def tool_schemas(self) -> list[dict[str, Any]]:
        self.session  # noqa: B018  (the server's tools join the env's on first use)
        return super().tool_schemas()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self._reopen_if_broken()
        try:
            self.session  # noqa: B018
        except MCPServerError as e:
            raise MCPServerError(f"{self._where()}: {e}") from e
        return super().reset(seed=seed, options=options)

    def close(self) -> None:
        if self._session is not None:
            release(self._session)
            self._session = None
        super().close()

    def __getstate__(self) -> dict[str, Any]:  # a process worker opens a session of its own
        state = super().__getstate__()
        state["_session"] = None
        return state
