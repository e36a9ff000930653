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

**What a server may do.** agentrl owns the stdio servers it starts: each runs in a process group of its own,
and closing the session (also one that never finished its handshake) stops the whole group, after a short
grace for a polite exit. Its stdout is read a bounded message at a time: an answer over
`MCPServerSpec.max_message_bytes` is not read but skipped as it streams, and the call reads as an error
observation (the policy can ask for less). At connect, the tool list may take `MAX_TOOL_PAGES` pages and
`MAX_TOOLS` tools; the tools the env takes must have names a tool call can carry (`TOOL_NAME`), once each. A
server that writes to stdout what is not an MCP message, or answers with what MCP does not allow, is an
`MCPServerError` of one line that names it and says what it did.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures as cf
import contextlib
import json
import os
import re
import signal
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

from agentrl.core import AgentEnv, EnvError, Tool, ToolTimeout

PING_SECONDS = 5.0  # how long a server that let a call time out has to answer a probe (tools/list) before it is hung
MAX_TOOL_PAGES = 64  # tools/list pages read at connect: a nextCursor that never ends is an error, not a loop
MAX_TOOLS = 512  # tools a server may list: far more than a prompt can show a policy
TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # a name that every tool-call format and chat template can carry
STOP_SECONDS = 2.0  # a closing server's grace to exit after its stdin closes, before its process group is killed


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
    # a stdio server's message longer than this is not read (its call is an error observation); room for a long
    # tool list, and far more than max_result_chars
    max_message_bytes: int = 4 * 1024 * 1024

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
        if self.max_message_bytes < 1024:
            raise ValueError(f"MCPServerSpec: max_message_bytes must be >= 1024, got {self.max_message_bytes}")

    @property
    def label(self) -> str:
        return self.name or (f"MCP server {self.url}" if self.url else f"MCP server {' '.join(self.command)!r}")


class MCPServerError(EnvError):
    """The server cannot be reached, died, hangs, or broke the protocol."""


class _Refused(Exception):
    """What a server offered at connect is not taken (its message is the reason, said as is)."""


def _one_line(e: BaseException) -> str:
    """An exception as one line: the first leaf of an exception group, a validation error's first problem."""
    while isinstance(getattr(e, "exceptions", None), (list, tuple)) and e.exceptions:  # an (anyio) exception group
        e = e.exceptions[0]
    if isinstance(e, _Refused):
        return str(e)
    errors = getattr(e, "errors", None)
    if callable(errors) and type(e).__name__ == "ValidationError":  # pydantic: the SDK refused the server's answer
        first = errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "the message"
        return f"its answer is not valid MCP ({getattr(e, 'title', 'message')}: {where}: {first.get('msg')})"
    text = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {text}"[:300]


def _message_parser() -> Any:
    """bytes -> a JSON-RPC message, as the SDK's own stdio client parses a line."""
    from mcp import types

    adapter = getattr(types, "jsonrpc_message_adapter", None)
    return adapter.validate_json if adapter is not None else types.JSONRPCMessage.model_validate_json


_ANSWER_ID = re.compile(rb'"id"\s*:\s*(-?[0-9]{1,18}|"[^"\\]{0,128}")')


class _StdioServer:
    """A stdio MCP server that agentrl starts and owns: a process group of its own (`stop` ends the group, from any
    thread), stdout read a bounded message at a time. The SDK's stdio client reads a line whole, joining its chunks
    quadratically (a 100 MB answer took a session down), and stops its process only when its async exit runs,
    which a cancelled session that never finished its handshake does not reach."""

    def __init__(self, spec: MCPServerSpec, errlog: Any):
        self.spec, self.errlog = spec, errlog
        self.process: Any = None  # anyio's Process, once started
        self.failure: str | None = None  # what the server did wrong on the wire, said in the session's errors
        self._asked: dict[Any, str] = {}  # the id of each request in flight -> its method

    @contextlib.asynccontextmanager
    async def streams(self) -> Any:
        import anyio
        from mcp.client.stdio import get_default_environment
        from mcp.shared.message import SessionMessage

        parse = _message_parser()
        spec = self.spec
        self.process = process = await anyio.open_process(
            list(spec.command), env=get_default_environment() | dict(spec.env), cwd=spec.cwd, stderr=self.errlog,
            start_new_session=True)
        read_send, read_recv = anyio.create_memory_object_stream(0)
        write_send, write_recv = anyio.create_memory_object_stream(0)

        async def deliver(line: bytes) -> bool:
            if not line.strip():
                return True
            try:
                message = parse(line)
            except ValueError:
                shown = line[:80].decode("utf-8", "replace")
                self.failure = (f"it wrote to stdout a line that is not an MCP message ({shown!r}); a stdio server's "
                                "stdout is the protocol's alone (its logs belong on stderr)")
                return False
            answered = getattr(getattr(message, "root", message), "id", None)
            if answered is not None and getattr(getattr(message, "root", message), "method", None) is None:
                self._asked.pop(answered, None)
            await read_send.send(SessionMessage(message))
            return True

        async def read_stdout() -> None:
            limit, line, skipping = spec.max_message_bytes, bytearray(), False
            async with read_send:
                while True:
                    try:
                        chunk = await process.stdout.receive(1 << 16)
                    except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                        return
                    start = 0
                    while start <= len(chunk):
                        end = chunk.find(b"\n", start)
                        piece = chunk[start:] if end < 0 else chunk[start:end]
                        if not skipping:
                            line += piece
                            if len(line) > limit:  # stop here: the rest of this message is skipped as it streams
                                answer = self._oversized(bytes(line[:512]))
                                line.clear()
                                skipping = True
                                if answer is not None and not await deliver(answer):
                                    return
                        if end < 0:
                            break
                        if skipping:
                            skipping = False
                        else:
                            whole, line = bytes(line), bytearray()
                            if not await deliver(whole):
                                return
                        start = end + 1

        async def write_stdin() -> None:
            async with write_recv:
                async for session_message in write_recv:
                    message = getattr(session_message.message, "root", session_message.message)
                    if getattr(message, "id", None) is not None and getattr(message, "method", None):
                        if len(self._asked) >= 1024:  # requests that were never answered: the oldest forgotten
                            self._asked.pop(next(iter(self._asked)))
                        self._asked[message.id] = message.method
                    data = session_message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    try:
                        await process.stdin.send(data.encode())
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                        return

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(read_stdout)
            tasks.start_soon(write_stdin)
            try:
                yield read_recv, write_send
            finally:
                with contextlib.suppress(Exception):
                    await process.stdin.aclose()  # a polite server exits on this; `stop` ends the rest
                tasks.cancel_scope.cancel()

    def _oversized(self, head: bytes) -> bytes | None:
        """The answer that stands for a message over `max_message_bytes` that begins with `head`: a tool call's is
        an error result the policy reads, any other request's an error; None (dropped) if it answers nothing."""
        before = re.split(rb'"(?:result|error|params|method)"', head, maxsplit=1)[0]
        found = _ANSWER_ID.search(before)
        if found is None:
            return None
        request = json.loads(found.group(1))
        method = self._asked.pop(request, None)
        if method is None:
            return None
        said = f"the server's answer was over {self.spec.max_message_bytes} bytes (max_message_bytes) and was not read"
        if method == "tools/call":
            answer: dict[str, Any] = {"result": {"content": [{"type": "text", "text": f"{said}; ask for less"}],
                                                 "isError": True}}
        else:
            answer = {"error": {"code": -32603, "message": f"{said} (an answer to {method})"}}
        return json.dumps({"jsonrpc": "2.0", "id": request, **answer}).encode()

    def stop(self, grace: float) -> None:
        """End the server's whole process group (what it started goes too): its stdin is closed already, so a
        polite server has `grace` seconds to exit, then SIGTERM, then SIGKILL. Blocking; from any thread."""
        process = self.process
        if process is None:
            return
        deadline = time.monotonic() + grace
        while process.returncode is None and time.monotonic() < deadline:
            time.sleep(0.01)
        for sig, wait in ((signal.SIGTERM, 1.0), (getattr(signal, "SIGKILL", signal.SIGTERM), 2.0)):
            if process.returncode is not None:
                break
            _signal_group(process.pid, sig)
            deadline = time.monotonic() + wait
            while process.returncode is None and time.monotonic() < deadline:
                time.sleep(0.01)
        _signal_group(process.pid, getattr(signal, "SIGKILL", signal.SIGTERM))  # what it left behind in its group

    async def release(self) -> None:
        """Close the stopped process's asyncio transport while its loop runs (left to the garbage collector, it
        would close itself on a loop that is gone, and say so on stderr)."""
        close = getattr(getattr(self.process, "_transport", None), "close", None)
        if callable(close):
            close()


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        if hasattr(os, "killpg"):
            os.killpg(pid, sig)  # the server leads its own group (start_new_session)
        else:  # pragma: no cover - Windows: the process alone
            os.kill(pid, sig)


_LIVE: weakref.WeakSet = weakref.WeakSet()  # sessions with a server process, stopped at exit if still open


class MCPSession:
    """One live client session with a server, on an event loop of its own (a daemon thread), so that envs
    call it synchronously from any thread. Opened at construction; raises `MCPServerError` if the server
    does not start and list its tools within `connect_timeout`."""

    def __init__(self, spec: MCPServerSpec):
        try:
            from mcp import Client
            from mcp.client.streamable_http import streamable_http_client
        except ImportError as e:  # pragma: no cover - mcp is a dependency of the [dev] and [mcp] extras
            raise ImportError("MCPEnv needs the mcp package: pip install 'agentrl[mcp]'") from e
        self.spec = spec
        self._log = tempfile.NamedTemporaryFile("w+", prefix="agentrl-mcp-", suffix=".log", delete=False)
        self._server: _StdioServer | None = None
        if spec.command:
            self._server = _StdioServer(spec, self._log)
            transport = self._server.streams()
            _LIVE.add(self)
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
            tail = self._stderr_tail()
            self.close(polite=False)
            raise MCPServerError(f"{spec.label} could not be started: {self._why(e)}{tail}") from None

    async def _serve(self, ready: cf.Future) -> None:
        self._closing = asyncio.Event()
        try:
            async with self._client as client:
                tools: list[Any] = []
                cursor = None
                for _ in range(MAX_TOOL_PAGES):  # the tool list may come in pages, a bounded number of them
                    page = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
                    tools += page.tools
                    if len(tools) > MAX_TOOLS:
                        raise _Refused(f"it lists more than {MAX_TOOLS} tools (agentrl.adapters.mcp_tools.MAX_TOOLS)")
                    cursor = getattr(page, "next_cursor", None)
                    if not cursor:
                        break
                else:
                    raise _Refused(f"its tools/list goes on past {MAX_TOOL_PAGES} pages (a nextCursor that never "
                                   "ends; agentrl.adapters.mcp_tools.MAX_TOOL_PAGES)")
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
                raise MCPServerError(f"{spec.label}: tools/call {name!r} failed: {self._why(e)}"
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

    def _why(self, e: BaseException) -> str:
        """What went wrong, in one line: what the server did on the wire, if that was it, else the exception."""
        return (self._server.failure if self._server is not None and self._server.failure else None) or _one_line(e)

    def _check_alive(self, name: str) -> None:
        if self._main.done() or self.failure is not None:
            why = f": {self._why(self.failure)}" if self.failure else ""
            raise MCPServerError(f"{self.spec.label} is gone (before tools/call {name!r}){why}{self._stderr_tail()}")

    def _stderr_tail(self, n: int = 600) -> str:
        try:
            with open(self._log.name, errors="replace") as f:
                tail = f.read()[-n:].strip()
        except OSError:
            return ""
        return f"; its stderr ends: {tail}" if tail else ""

    def close(self, wait: float = 5.0, polite: bool = True) -> None:
        """End the session and its thread: politely, then by cancelling a session that is stuck (a server that
        never finished its handshake); then a started server's whole process group is stopped (a grace to exit
        when polite, then signals), while the loop still runs to see it exit."""
        if polite and self._closing is not None and not self._main.done():
            self._loop.call_soon_threadsafe(self._closing.set)
            with contextlib.suppress(Exception):
                self._main.result(timeout=wait)
        if not self._main.done():
            self._main.cancel()
            with contextlib.suppress(BaseException):
                self._main.result(timeout=wait)
        if self._server is not None:
            self._server.stop(grace=STOP_SECONDS if polite else 0.0)
            _LIVE.discard(self)
            if self._loop.is_running():
                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(self._server.release(), self._loop).result(timeout=wait)
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
    for session in list(_LIVE):  # sessions of envs never closed: their servers do not outlive this process
        if session._server is not None:
            session._server.stop(grace=0.0)


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
            session = open_session(self.server)
            try:
                self._add_server_tools(session)
            except BaseException:
                release(session)  # a server whose tools are refused is not kept running
                raise
            self._session = session
        return self._session

    def _reopen_if_broken(self) -> None:
        if self._session is not None and (self._session.failure is not None or self._session._main.done()):
            release(self._session)
            self._session = None

    def _add_server_tools(self, session: MCPSession) -> None:
        names = [t.name for t in session.tools]
        offered = {t.name: t for t in session.tools}
        wanted = list(offered) if self.mcp_tools is None else list(self.mcp_tools)
        for name in wanted:
            if name in offered and not (isinstance(name, str) and TOOL_NAME.fullmatch(name)):
                raise MCPServerError(f"{self.server.label} offers a tool named {name!r}, which a tool call cannot "
                                     "carry (1-64 of A-Z a-z 0-9 _ . -): leave it out with mcp_tools")
            if names.count(name) > 1:
                raise MCPServerError(f"{self.server.label} offers {names.count(name)} tools named {name!r}: a call "
                                     "could not say which one it means")
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
