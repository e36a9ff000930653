"""An agentrl environment's tools as an MCP server over stdio (`agentrl serve-env ENV --mcp`, extra `[mcp]`).

The other way round from `agentrl.adapters.mcp_tools`: an MCP client (an agent harness, an IDE, another
framework's rollout) plays one episode stream of the env through tools. The server offers the env's own tools,
with the env's JSON schemas, and `reset`, which starts an episode and returns its first observation. A call to an
env tool is one env step: it is written in the env's own call format and stepped, so the env parses, validates
and answers it exactly as it answers the policy (a bad argument is an observation, counted as malformed). When the
step ends the episode, the answer says so and gives the verifier's reward; the next call must be `reset`. A tool
that raises in the env (an `EnvError`) is an error result naming it, and the server goes on.

One server process holds one env (stdio has one client); serve more clients with more processes. Standard
output is the protocol's alone: while serving, whatever the env (or a library under it) prints or logs to
stdout goes to stderr instead, so that it cannot corrupt a message.

The process lives as long as its client: a tool call runs under `tool_timeout` (the rollout's own
`agentrl.workers.ToolRunner`: past it the answer says the call timed out), and an env step runs on a daemon
thread, so that when the client closes stdin the server exits at once, also while a step still blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import sys
import threading
from collections.abc import Callable
from typing import Any

from agentrl.core import AgentEnv, EnvError
from agentrl.workers import ToolRunner

RESET = "reset"
TOOL_TIMEOUT = 60.0  # seconds, as `rollout.tool_timeout`


class EpisodeServer:
    """The env behind the MCP handlers: a tool call in, the observation (or an error) out. Kept apart from the
    transport so that it can be tested without one.

    >>> import agentrl.envs  # noqa: F401
    >>> from agentrl.registry import make
    >>> server = EpisodeServer(make("agentrl/Vault-v0", locks=1))
    >>> [t["name"] for t in server.tools()], server.call("clue", {"lock": 1})
    (['reset', 'clue', 'open'], ('no episode is running: call reset first', True))
    >>> server.call("reset", {"seed": 0})
    ('1 locks. Read each clue, then open the lock with the sum.', False)
    """

    def __init__(self, env: AgentEnv):
        names = [s["function"]["name"] for s in env.tool_schemas()]
        if RESET in names:
            raise ValueError(f"{type(env).__name__} has a tool named {RESET!r}, the name the MCP server gives to "
                             "starting an episode; rename the env's tool to serve it over MCP")
        self.env = env
        self.live = False

    def tools(self) -> list[dict[str, Any]]:
        """The MCP tool list: `reset`, then the env's tools with their schemas."""
        reset = {"name": RESET, "description": "Start a new episode (optionally from a seed); returns its first "
                 "observation. Call it first, and again after an episode ends.",
                 "inputSchema": {"type": "object", "properties": {"seed": {"type": "integer"}}}}
        own = [{"name": s["function"]["name"], "description": s["function"].get("description", ""),
                "inputSchema": s["function"].get("parameters") or {"type": "object", "properties": {}}}
               for s in self.env.tool_schemas()]
        return [reset, *own]

    def call(self, name: str, arguments: dict[str, Any] | None) -> tuple[str, bool]:
        """(text, is_error) for one tool call."""
        arguments = arguments or {}
        if name == RESET:
            seed = arguments.get("seed")
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                return f"reset: seed must be an integer, got {seed!r}", True
            try:
                observation, _ = self.env.reset(seed=seed)
            except Exception as e:  # an env bug: the client hears of it, and the server stays up for the next call
                self.live = False
                return f"the environment's reset raised {type(e).__name__}: {e}", True
            self.live = True
            return observation, False
        known = {s["function"]["name"] for s in self.env.tool_schemas()}
        if name not in known:
            return f"unknown tool {name!r}; tools: {', '.join([RESET, *sorted(known)])}", True
        if not self.live:
            return "no episode is running: call reset first", True
        try:
            observation, reward, terminated, truncated, _ = self.env.step(self.env.tool_format.render([(name,
                                                                                                        arguments)]))
        except EnvError as e:
            self.live = False
            return f"the environment failed: {e}", True
        except Exception as e:  # a bug in the env's step (not in a tool, which step turns into an EnvError)
            self.live = False
            return f"the environment's step raised {type(e).__name__}: {e}", True
        if terminated or truncated:
            self.live = False
            why = "ended" if terminated else "ran out of turns"
            observation += f"\n(the episode {why}: reward {reward:g}; call reset for another)"
        return observation, False


async def _on_daemon_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` on a daemon thread of its own, awaited: the event loop goes on answering, a cancelled wait
    abandons the thread, and the interpreter does not wait for it at exit (anyio's worker threads it would)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            (future.set_result if ok else future.set_exception)(value)

    def run() -> None:
        try:
            outcome = (True, fn(*args))
        except BaseException as e:  # handed to the awaiting task
            outcome = (False, e)
        with contextlib.suppress(RuntimeError):  # the loop is closed: its client has gone, nobody waits
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=run, name="agentrl-mcp-step", daemon=True).start()
    return await future


def serve_stdio(build: Callable[[], AgentEnv], name: str, tool_timeout: float | None = TOOL_TIMEOUT) -> None:
    """Serve the episode of the env `build()` makes over stdio until the client disconnects (closes stdin), and
    return then, even while a step blocks. The env is built and stepped with stdout set aside (a constructor or a
    tool that prints cannot corrupt the protocol either); its tools run under `tool_timeout` seconds each."""
    import anyio

    try:
        from mcp import types
        from mcp.server.lowlevel import Server
        from mcp.server.stdio import stdio_server
    except ImportError as e:  # the [mcp] extra
        raise ImportError(f"serving over MCP needs the mcp package: pip install 'agentrl[mcp]' ({e})") from None

    protocol = anyio.wrap_file(io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8"))
    with contextlib.redirect_stdout(sys.stderr):  # prints and rich's console (it writes to sys.stdout) go aside
        env = build()
        env.tool_runner = ToolRunner(default=tool_timeout)  # a hanging tool is an answer, as in a rollout
        episode = EpisodeServer(env)

        async def list_tools(ctx: Any, params: Any) -> Any:
            return types.ListToolsResult(tools=[types.Tool(**t) for t in episode.tools()])

        async def call_tool(ctx: Any, params: Any) -> Any:
            # env steps are synchronous (tools may block): off the event loop, so the session keeps answering pings
            text, error = await _on_daemon_thread(episode.call, params.name, params.arguments)
            return types.CallToolResult(content=[types.TextContent(text=text)], isError=error)

        server = Server(name, on_list_tools=list_tools, on_call_tool=call_tool)

        async def main() -> None:
            async with stdio_server(stdout=protocol) as (read, write):
                await server.run(read, write, server.create_initialization_options())

        anyio.run(main)


__all__ = ["EpisodeServer", "serve_stdio"]
