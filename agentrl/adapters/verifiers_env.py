"""`VerifiersEnv`: a Prime Intellect `verifiers` environment (0.4's ``verifiers.v1``) as an agentrl env.

    env = make("verifiers:addition-v1", config={"num_tasks": 100})   # an installed taskset package, by its id
    env = VerifiersEnv(taskset=MyTaskset(MyConfig()))                 # or the objects themselves
    env = VerifiersEnv("my-game", env="user-sim", others={"user": reply_as_user})

A verifiers environment is a `Taskset` (its `TaskData` rows, a `Task` class with ``@vf.reward`` / ``@vf.metric``
/ ``@vf.stop`` methods and `Toolset` tool servers) and an `Env` (``run(task, agents)``: the control flow of one
episode, e.g. a game engine answering each move as the user; a plain taskset's is one agent run). verifiers runs
the model inside a harness program that reaches the model through an OpenAI-compatible endpoint. Here no model
server is needed: agentrl's policy is the model of one seat (`seat`), and this adapter is that seat's harness.
It runs the env's own ``run`` on an event loop of its own (a daemon thread per env), and each time the seat's
harness would call the model, `step` receives the policy's message instead.

What maps to what:

- **reset**: the task picked by the seed (``seed % len(taskset)``; the seed itself for an infinite taskset).
  ``TaskData.system_prompt`` is the system prompt, the prompt (or, for a prompt-less task, what the env's
  ``run`` opens the conversation with) the first observation.
- **tools**: every tool of the task's and the taskset's `Toolset` servers, under the name the verifiers
  harnesses give it (``<TOOL_PREFIX>_<tool>``), with the JSON schema its MCP server advertises. The servers run
  in-process (an ``MCPServer`` per server, its ``setup``/``setup_task`` hooks called, per episode for task
  servers, once for taskset servers); a tool's ``self.state`` is the episode's trace state, as over the
  server's state channel. A call is checked against the schema (bad arguments are an observation and count as
  malformed), then runs; its result, or what the tool raised (``error: ...``, as an MCP server answers), is
  the observation. A call past `tool_timeout` is an observation too (the episode goes on).
- **step**: the policy's message. Text without a call is the seat's reply (``answers_in_text``): it ends the
  harness segment, as a model's reply without a tool call does, and the env's ``run`` goes on (scores it, feeds
  the next user turn, or ends). So does a call of `answer_tool` (default ``answer``), whose ``text`` is the
  reply; it exists for policies that only write calls, and leaves the trace as if the text had been written.
  A message whose call is broken or names no tool is not run: the policy is told why, the count of malformed
  calls goes up, and the trace records the message and that feedback (as a user turn), as the policy saw them.
- **the reward**: the task's own scoring (``Task.score``: rewards with their weights, metrics, keyed results)
  when the seat's run closes, plus what the env's ``run`` / ``finalize`` records: ``trace.reward``, returned by
  the step that ends the episode. The rewards and metrics are in that step's ``info["verifiers"]``.
- **the end**: the env's ``run`` returning is ``terminated`` (whatever stopped it: the reply, a ``@vf.stop``,
  the game). Running out of `max_turns` (default: the seat's ``AgentConfig.max_turns``, else 16) stops the
  seat's run as verifiers' own turn limit does (``stop_condition = "max_turns"``), scores it and is
  ``truncated``.

What goes wrong is said, and no episode is lost to it: a reward or metric that raises, or gives NaN or an
infinity, a ``run``/``setup``/``finalize`` that raises, scoring past `score_timeout`, and an env whose code
holds its event loop past `timeout` (a hang) are each an `EnvError` that names the env, the episode, the task,
the turn and the hook (the rollout records that episode as errored and goes on). A hung loop is abandoned and
the next reset starts a fresh one.

Not mapped (each said when met): a task that needs a container (``NEEDS_CONTAINER``), a sandbox or a
``runtime`` in its hooks; judges (``vf.Judge``) and any hook that calls a model of its own reach the endpoint
their config names, as in verifiers, and hang or fail without one; other seats of a multi-agent env need
`others` (a function per seat that answers its conversation) or fail naming the seat; `Interaction.send` and
``steer``; images (observations are the messages' text).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import functools
import inspect
import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from agentrl.core import AgentEnv, EnvError

INSTALL_HINT = "the verifiers adapter needs the verifiers package (0.4): pip install 'agentrl[verifiers]'"
POLICY_MODEL = "agentrl-policy"  # the model name the seat's trace records
ANSWER_DESCRIPTION = (
    "Give your reply (it ends your turn, as a message without a tool call does); the task's reward functions read "
    "it as your answer."
)
_STOP = "__agentrl_stop__"  # the answer to a pending model call when agentrl ends the episode (budget, truncate)


def _serve_loop(loop: asyncio.AbstractEventLoop) -> None:
    """An env's event loop, on its daemon thread, until stopped."""
    try:
        loop.run_forever()
    finally:
        with contextlib.suppress(Exception):
            loop.close()


def _wind_down(loop: asyncio.AbstractEventLoop, grace: float = 5.0) -> None:
    """Cancel what runs on `loop` and stop it once that had `grace` seconds to unwind."""
    for task in asyncio.all_tasks(loop):
        task.cancel()
    loop.call_later(grace, loop.stop)


def _vf() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from e
    return vf


class VerifiersError(EnvError):
    """A verifiers environment failed: one of its hooks raised, gave no number, or hangs."""


class _HookFailed(Exception):
    """A reward or metric raised or gave a value that is not a finite number (named, for the error)."""


def _finite_or_raise(kind: str, name: str, value: Any) -> Any:
    values = value.items() if isinstance(value, Mapping) else [(name, value)]
    for key, v in values:
        try:
            number = float(v)
        except (TypeError, ValueError):
            raise _HookFailed(f"{kind} {key!r} returned {v!r}, not a number") from None
        if not math.isfinite(number):
            raise _HookFailed(f"{kind} {key!r} returned {number}")
    return value


def _guarded(fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
    """A reward/metric hook that names itself when it raises or returns NaN (the call and its metadata as before)."""

    @functools.wraps(fn)
    async def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        except Exception as e:
            raise _HookFailed(f"{kind} {fn.__name__!r} raised {type(e).__name__}: {e}") from e
        return _finite_or_raise(kind, fn.__name__, result)

    return guarded


def _needs_runtime(fn: Callable[..., Any]) -> bool:
    param = inspect.signature(fn).parameters.get("runtime")
    return param is not None and param.default is inspect.Parameter.empty


def _text_of(messages: list[Any]) -> str:
    """Messages as the observation text: user turns and tool results as they are, other roles tagged."""
    vf = _vf()
    parts = []
    for m in messages:
        text = vf.types.content_text(m.content) if m.content is not None else ""
        if m.role in ("user", "tool"):
            parts.append(text)
        elif text:
            parts.append(f"[{m.role}] {text}")
    return "\n".join(p for p in parts if p)


def _as_wire(messages: list[Any]) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True) for m in messages]


def _tidy(schema: dict[str, Any]) -> dict[str, Any]:
    """An MCP input schema without pydantic's titles (what the chat template renders for the policy)."""
    schema = dict(schema or {"type": "object", "properties": {}})
    schema.pop("title", None)
    props = {}
    for key, prop in schema.get("properties", {}).items():
        if isinstance(prop, dict):
            prop = {k: v for k, v in prop.items() if k != "title"}
        props[key] = prop
    if "properties" in schema:
        schema["properties"] = props
    return schema


class _Tool:
    """One tool as the policy sees it: its qualified name, description, schema, and where it runs."""

    def __init__(self, name: str, servers: _Servers, index: int, raw: str, description: str, schema: dict[str, Any]):
        from jsonschema import Draft202012Validator

        self.name, self.servers, self.index, self.raw = name, servers, index, raw
        self.description, self.parameters = description, _tidy(schema)
        self.validator = Draft202012Validator(self.parameters)

    @property
    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def problems(self, arguments: Any) -> str | None:
        if not isinstance(arguments, dict):
            return f"arguments must be an object, got {type(arguments).__name__}"
        found = sorted(self.validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
        if not found:
            return None
        return "; ".join(f"{'.'.join(map(str, p.absolute_path)) or 'arguments'}: {p.message[:200]}" for p in found[:5])


class _Servers:
    """A list of verifiers tool servers (`Toolset`s), each registered on an in-process ``MCPServer``."""

    def __init__(self, servers: list[Any], state_of: Callable[[], Any]):
        self.servers = list(servers)
        self._state_of = state_of
        self.mcp: list[Any] = []
        self._stack = contextlib.AsyncExitStack()

    async def open(self, task: Any | None) -> None:
        from mcp.server.mcpserver import MCPServer

        for server in self.servers:
            if getattr(server.config, "url", None):
                raise ValueError(
                    f"tool server {type(server).__name__} is configured with url="
                    f"{server.config.url!r}: the agentrl adapter runs every toolset in-process"
                )
            self._bind_state(server)
            await self._stack.enter_async_context(server._exit_stack)
            await server.setup()
            if task is not None:
                await server.setup_task(task)
            mcp = MCPServer(server.server_name or type(server).__name__)
            server.register(mcp)
            self.mcp.append(mcp)

    def _bind_state(self, server: Any) -> None:
        """A tool's ``self.state`` is the episode's trace state, read and written as the server's state channel
        does (validated into the server's state type, the trace's replaced when the call changed it)."""
        state_of = self._state_of

        async def pull() -> Any:
            trace = state_of()
            if trace is None:
                return server._state_cls()
            return server._state_adapter.validate_json(trace.state.model_dump_json())

        async def push(before: bytes) -> None:
            from verifiers.v1.mcp.server import _call_state

            trace, current = state_of(), _call_state.get()
            if trace is None or current is None:
                return
            after = server._state_adapter.dump_json(current)
            if after != before:
                trace.state = type(trace.state).model_validate_json(after)

        server._pull_state, server._push_state = pull, push

    async def tools(self, reserved: set[str]) -> list[_Tool]:
        out: list[_Tool] = []
        seen = set(reserved)
        for i, (server, mcp) in enumerate(zip(self.servers, self.mcp)):
            for tool in await mcp.list_tools():
                name = f"{server.server_name}_{tool.name}" if server.server_name else tool.name
                if name in seen:
                    raise ValueError(
                        f"two tools are called {name!r} (tool server {type(server).__name__}); give a "
                        "toolset a distinct TOOL_PREFIX, or pass answer_tool= another name"
                    )
                seen.add(name)
                out.append(_Tool(name, self, i, tool.name, tool.description or "", tool.input_schema))
        return out

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._stack.aclose()


class _Seat:
    """One seat of the env's agents, as ``Env.run`` addresses it (``agents.<name>``)."""

    def __init__(self, name: str, config: Any):
        self.name, self.config, self.trainable = name, config, True

    def _trace(self, task: Any) -> Any:
        vf = _vf()
        from verifiers.v1.state import state_cls
        from verifiers.v1.trace import AgentInfo, TraceTask

        config = self.config.model_copy(update={"model": self.config.model or POLICY_MODEL})
        return vf.Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            state=state_cls(type(task))(),
            agent=AgentInfo(config=config, name=self.name, trainable=self.trainable),
        )

    async def run(self, task: Any, **_: Any) -> Any:
        """One segment on the task's prompt, as ``Agent.run`` (the seat speaks first)."""
        if task.data.prompt is None:
            from verifiers.v1.errors import TaskError

            raise TaskError(
                "task has no prompt and no user to open the conversation; set task.prompt, or drive "
                "the run through agent.interaction() and open it with the first turn(message)"
            )
        async with self.interaction(task) as interaction:
            await interaction.turn()
            if interaction.trace.stop_condition is None:
                interaction.trace.stop("agent_completed")
        return interaction.trace

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any, **_: Any) -> Any:
        raise NotImplementedError

    async def provision(self, *_: Any, **__: Any) -> Any:
        raise NotImplementedError(f"seat {self.name!r}: the agentrl adapter provides no runtime boxes")


class _Missing(_Seat):
    """A seat nobody plays: agentrl's policy plays another one and `others` has no function for this one."""

    def __init__(self, name: str, config: Any, policy_seat: str):
        super().__init__(name, config)
        self.policy_seat = policy_seat

    def _refuse(self) -> Exception:
        return ValueError(
            f"seat {self.name!r} needs a model of its own: agentrl's policy plays seat "
            f"{self.policy_seat!r}; pass others={{{self.name!r}: fn}} (fn(messages) -> reply text)"
        )

    async def run(self, task: Any, **_: Any) -> Any:
        raise self._refuse()

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any, **_: Any) -> Any:
        raise self._refuse()
        yield  # pragma: no cover


class _Agents:
    """``agents`` as ``Env.setup``/``Env.run`` see it: one attribute per seat."""

    def __init__(self, seats: dict[str, _Seat]):
        self._agents = seats

    def __getattr__(self, name: str) -> _Seat:
        agents = self.__dict__.get("_agents")
        if agents is None or name not in agents:
            raise AttributeError(f"no agent {name!r}; this config declares {sorted(agents) if agents else []}")
        return agents[name]


class _Segment:
    """What ``Interaction.turn`` returns: verifiers' own `Segment` when it can be imported (it always can here)."""

    @staticmethod
    def make(messages: list[Any], terminated: bool = False) -> Any:
        from verifiers.v1.agent import Segment

        return Segment(messages=messages, terminated=terminated)


class _ScriptedSeat(_Seat):
    """A seat played by a function of the user's: ``fn(messages) -> reply`` (sync or async), where messages are the
    seat's conversation as OpenAI-style dicts; its trace is scored on its own task, as every verifiers run is."""

    def __init__(self, name: str, config: Any, fn: Callable[[list[dict[str, Any]]], Any], episode: _EpisodeRun):
        super().__init__(name, config)
        self.fn, self.episode = fn, episode

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any, **_: Any) -> Any:
        trace = self._trace(task)
        self.episode.vf_episode.traces.append(trace)
        interaction = _ScriptedInteraction(self, task, trace)
        try:
            yield interaction
        finally:
            if trace.stop_condition is None:
                trace.stop("user_closed")
            await self.episode.close_trace(task, trace, what=f"seat {self.name!r}")


class _ScriptedInteraction:
    def __init__(self, seat: _ScriptedSeat, task: Any, trace: Any):
        self.seat, self.task, self._trace, self._started = seat, task, trace, False
        self._over = False

    @property
    def trace(self) -> Any:
        return self._trace

    async def turn(self, message: Any = None) -> Any:
        from verifiers.v1 import graph

        vf = _vf()
        tail = _opening(self.task.data) if not self._started else []
        self._started = True
        tail += _user_messages(message)
        limit = self.seat.config.max_turns
        if self._over or (limit is not None and self._trace.num_turns >= limit):
            self._over = True
            if self._trace.stop_condition is None:
                self._trace.stop("max_turns")
            return _Segment.make([], terminated=True)
        messages = [*self._trace.messages, *tail]
        self.seat.episode.phase = f"the function playing seat {self.seat.name!r}"
        reply = self.seat.fn(_as_wire(messages))
        if inspect.isawaitable(reply):
            reply = await reply
        self.seat.episode.phase = self.seat.episode.outer
        turn = graph.prepare_turn(self._trace, messages, None)
        message = vf.AssistantMessage(content=str(reply))
        turn.commit(
            vf.Response(
                id=f"{self.seat.name}-{self._trace.num_turns}",
                created=int(time.time()),
                model=self.seat.name,
                message=message,
                finish_reason="stop",
            )
        )
        return _Segment.make([message])

    async def send(self, *_: Any, **__: Any) -> dict:
        raise NotImplementedError("Interaction.send is not supported by the agentrl adapter")

    steer = send


def _user_messages(message: Any) -> list[Any]:
    vf = _vf()
    if message is None:
        return []
    if isinstance(message, str):
        return [vf.UserMessage(content=message)]
    from verifiers.v1.dialects import parse_message

    return [parse_message(m) if isinstance(m, dict) else m for m in message]


def _opening(data: Any) -> list[Any]:
    """The messages a seat's run opens with: the task's system prompt and prompt (the null harness's placement)."""
    vf = _vf()
    out: list[Any] = []
    if data.system_prompt:
        out.append(vf.SystemMessage(content=data.system_prompt))
    if isinstance(data.prompt, str):
        out.append(vf.UserMessage(content=data.prompt))
    elif data.prompt is not None:
        out += [vf.types.UserMessage(**m) if isinstance(m, dict) else m for m in data.prompt]
    return out


class _PolicySeat(_Seat):
    """The seat agentrl's policy plays: its harness asks `step` for each model message."""

    def __init__(self, name: str, config: Any, episode: _EpisodeRun):
        super().__init__(name, config)
        self.episode = episode

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any, **_: Any) -> Any:
        episode = self.episode
        if episode.trace is not None:
            raise ValueError(
                f"seat {self.name!r} (agentrl's policy) was asked for a second run in one episode; an "
                "agentrl episode is one conversation of the policy"
            )
        trace = self._trace(task)
        episode.trace = trace
        episode.vf_episode.traces.append(trace)
        interaction = _PolicyInteraction(self, task, trace)
        await episode.open_task(task, trace)
        try:
            yield interaction
        finally:
            if trace.stop_condition is None:
                trace.stop("user_closed")
            await episode.close_trace(task, trace, what=f"seat {self.name!r}", servers=episode.task_servers)


class _PolicyInteraction:
    """``agent.interaction(task)`` for the policy's seat: each ``turn`` runs one harness segment, whose model calls
    are the policy's steps (see the module docstring for how a message is read)."""

    def __init__(self, seat: _PolicySeat, task: Any, trace: Any):
        from verifiers.v1.session import RolloutLimits, RolloutSession, hook_boundary

        self.seat, self.task, self._trace = seat, task, trace
        self._started = self._over = False
        stops = [(hook_boundary(fn, allow_trace=True), fn) for fn in task.hooks("stop")]
        from verifiers.v1.utils.decorators import discover_decorated

        interceptors = [(hook_boundary(fn, allow_trace=False), fn) for fn in discover_decorated(task, "intercept")]
        vf = _vf()
        self.session = RolloutSession(
            ctx=None,
            trace=trace,
            limits=RolloutLimits(),
            trace_stops=[fn for b, fn in stops if b is vf.Trace],
            request_stops=[fn for b, fn in stops if b is vf.Request],
            response_stops=[fn for b, fn in stops if b is vf.Response],
            request_interceptors=[fn for b, fn in interceptors if b is vf.Request],
            response_interceptors=[fn for b, fn in interceptors if b is vf.Response],
            gates_tools=True,
        )

    @property
    def trace(self) -> Any:
        return self._trace

    async def send(self, *_: Any, **__: Any) -> dict:
        raise NotImplementedError("Interaction.send / steer are not supported by the agentrl adapter")

    steer = send

    async def turn(self, message: Any = None) -> Any:
        prompted = not self._started and self.task.data.prompt is not None
        if self._over:
            raise RuntimeError("the exchange is over (the run ended); read interaction.trace")
        if message is None and not prompted:
            raise ValueError(
                "nothing to run a turn on: a bare turn() takes a prompted task's opening reply; this "
                "exchange takes its next user message"
            )
        if message is not None and prompted:
            raise ValueError(
                "the task's prompt opens this exchange: take its first reply with a bare turn() before "
                "answering (or hand the interaction a task with `prompt=None`)"
            )
        tail = _opening(self.task.data) if not self._started else []
        self._started = True
        tail += _user_messages(message)
        episode = self.seat.episode
        try:
            segment = await self._segment(tail)
        except Exception:
            episode.failed_at = episode.failed_at or episode.phase  # what raised, before clean-up renames the phase
            raise
        episode.phase = episode.outer
        if segment.terminated:
            self._over = True
        return segment

    async def _segment(self, tail: list[Any]) -> Any:
        from verifiers.v1 import graph
        from verifiers.v1.trace import ModelCall

        vf = _vf()
        trace, session, episode = self._trace, self.session, self.seat.episode
        produced: list[Any] = []
        while True:
            episode.phase = "the task's @vf.stop hooks"
            if trace.stop_condition is not None or await session.refused() is not None:
                return _Segment.make([], terminated=True) if not produced else _Segment.make(produced)
            request = vf.Request(messages=[*trace.messages, *tail], tools=episode.vf_tools or None)
            request, rewrites, stopped = await session.rewrite_request(request)
            trace.request_rewrites.extend(rewrites)
            if stopped is not None:
                graph.prepare_turn(trace, request.messages, request.tools).commit_prompt()
                trace.stop(stopped)
                return _Segment.make(produced, terminated=not produced)
            turn = graph.prepare_turn(trace, request.messages, request.tools)
            new = request.messages[len(turn.prefix_node_ids) :]
            episode.phase = "waiting for the policy"
            parsed = await episode.ask(new, request.messages)
            if parsed is _STOP:
                turn.commit_prompt()
                trace.stop("max_turns")
                return _Segment.make(produced, terminated=not produced)
            message, kind, calls, feedback = parsed
            response = vf.Response(
                id=f"turn-{trace.num_turns}",
                created=int(time.time()),
                model=POLICY_MODEL,
                message=message,
                finish_reason="tool_calls" if message.tool_calls else "stop",
            )
            episode.phase = "the task's response @vf.intercept / @vf.stop hooks"
            response, rewrites, stopped = await session.rewrite_response(response)
            node = turn.commit(response)
            trace.calls.append(ModelCall(node=node, model=POLICY_MODEL, finish_reason=response.finish_reason))
            trace.response_rewrites.extend(rewrites)
            produced.append(response.message)
            if stopped is None and response.message == message:
                episode.phase = "the task's tool-call @vf.stop hooks"
                stopped = await session.gate_tool_calls(node)
            if stopped is not None:
                trace.stop(stopped)
                return _Segment.make(produced)
            if response.message != message:
                kind = "reply"  # an interceptor replaced the message with inert text
            if kind == "malformed":
                tail = [vf.UserMessage(content=feedback)]
            elif kind == "tools":
                tail = await episode.run_tools(response.message, calls, node, session)
                produced += tail
                if feedback:
                    tail = [*tail, vf.UserMessage(content=feedback)]
            else:
                return _Segment.make(produced)


class _EpisodeRun:
    """One episode on the loop thread: the env's ``setup``/``run``/``finalize`` over `_Agents`, the policy seat's
    trace, its tools, and the hand-over of each model call to `VerifiersEnv.step`."""

    def __init__(self, owner: VerifiersEnv, task: Any, loop: asyncio.AbstractEventLoop):
        from verifiers.v1.episode import EnvInfo, Episode
        from verifiers.v1.trace import TraceTask

        self.owner, self.task, self.loop = owner, task, loop
        self.trace: Any = None
        self.vf_episode = Episode(
            env=EnvInfo(id=owner.name),
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        )
        self.phase = self.outer = "env.setup()"  # what runs now; `outer`: the env's hook that holds the loop
        self.failed_at: str | None = None  # the phase that raised inside the seat's harness, if one did
        self.asked: cf.Future = cf.Future()  # the observation, when the seat's harness waits for the policy
        self.answer: asyncio.Future | None = None
        self.tool_timeouts = 0
        self.task_servers: _Servers | None = None
        self.tools: list[_Tool] = []
        self.vf_tools: list[Any] = []
        self.system_prompt: str | None = None

    # -- the hand-over ---------------------------------------------------------------------------

    async def ask(self, new: list[Any], messages: list[Any]) -> Any:
        """Post what the policy has not seen yet (the prompt's system part goes to the system prompt) and wait
        for its parsed message, or `_STOP`."""
        if self.trace.num_turns == 0:  # the seat's first model call
            system = [m for m in new if m.role == "system"]
            self.system_prompt = "\n\n".join(_vf().types.content_text(m.content) for m in system) or None
            new = [m for m in new if m.role != "system"]
        self.answer = self.loop.create_future()
        self.asked.set_result(_text_of(new))
        return await self.answer

    # -- tools -----------------------------------------------------------------------------------

    async def open_task(self, task: Any, trace: Any) -> None:
        """The task's own setup hook and its tool servers (fresh per episode), with the taskset's beside them."""
        owner = self.owner
        self.phase = f"task {type(task).__name__}.setup()"
        from verifiers.v1.errors import TaskError, boundary
        from verifiers.v1.utils.decorators import invoke

        async with boundary(TaskError, "task setup"):
            result = invoke(task.setup, {"trace": trace, "runtime": None})
            if inspect.isawaitable(result):
                await result
        self.phase = "the task's tool servers (setup, setup_task)"
        self.task_servers = _Servers(type(task).toolsets(task.config), lambda: self.trace)
        await self.task_servers.open(task)
        reserved = {owner.answer_tool} if owner.answer_tool else set()
        shared = await owner._shared.tools(reserved) if owner._shared is not None else []
        own = await self.task_servers.tools(reserved | {t.name for t in shared})
        self.tools = [*shared, *own]
        owner._episode_tools = {t.name: t for t in self.tools}
        vf = _vf()
        self.vf_tools = [vf.Tool(name=t.name, description=t.description, parameters=t.parameters) for t in self.tools]

    async def run_tools(
        self, message: Any, calls: list[tuple[str, dict[str, Any], str | None]], node: int, session: Any
    ) -> list[Any]:
        """Each call's result as a `ToolMessage`: a pre-execution verdict of the task's hooks, the schema's
        complaint, the tool's result, what it raised, or its timeout."""
        from verifiers.v1 import graph

        vf = _vf()
        out = []
        branch = graph.path(self.trace, node)
        for call, (name, arguments, problem) in zip(message.tool_calls, calls):
            probe = vf.ToolMessage(tool_call_id=call.id, content="", name=name)
            key = session.tool_result_keys(vf.Request(messages=[*branch, probe])).get(len(branch))
            verdict = session.tool_decisions.get(key) if key is not None else None
            if verdict is not None:
                session.gated_tools.add(key)
                out.append(verdict)
                continue
            if problem is not None:
                text = f"error: bad arguments for {name}: {problem}"
            else:
                text = await self.call_tool(name, arguments)
            out.append(vf.ToolMessage(tool_call_id=call.id, content=text, name=name))
        return out

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        from agentrl.adapters.mcp_tools import result_text

        owner = self.owner
        tool = owner._episode_tools[name]
        mcp = tool.servers.mcp[tool.index]
        self.phase = f"tool {name!r}"
        try:
            result = await asyncio.wait_for(mcp.call_tool(tool.raw, arguments), owner.tool_timeout)
        except asyncio.TimeoutError:
            self.tool_timeouts += 1
            return f"error: tool {name!r} ran past its {owner.tool_timeout:g} s limit; its call was abandoned"
        except Exception as e:  # what the tool raised: an MCP server answers it as an error result
            text = str(e) or type(e).__name__
            return f"error: {text[:2000]}"
        return result_text(result, owner.max_result_chars)

    # -- scoring -----------------------------------------------------------------------------------

    async def close_trace(self, task: Any, trace: Any, what: str, servers: _Servers | None = None) -> None:
        """Finish a seat's run as ``Rollout.close`` does: the task's ``finalize``, then its scoring (rewards and
        metrics guarded so that a failure names its hook), each failure recorded on the trace."""
        from verifiers.v1.errors import TaskError, boundary
        from verifiers.v1.utils.decorators import invoke

        owner = self.owner
        failed = False
        try:
            if servers is not None:
                await servers.close()
            self.phase = f"task {type(task).__name__}.finalize() ({what})"
            async with boundary(TaskError, "task finalize"):
                result = invoke(task.finalize, {"trace": trace, "runtime": None})
                if inspect.isawaitable(result):
                    await result
            self.phase = f"scoring ({what}): the task's rewards and metrics"
            scored = _guarded_task(task)
            try:
                await asyncio.wait_for(scored.score(trace), owner.score_timeout)
            except asyncio.TimeoutError:
                raise TaskError(f"scoring ran past its {owner.score_timeout:g} s limit (score_timeout)") from None
        except Exception as e:
            failed = True
            trace.record_error(e)
        finally:
            trace.is_completed = True
            trace.ok = not failed
            self.phase = self.outer

    # -- the episode ---------------------------------------------------------------------------------

    async def run(self) -> Any:
        owner = self.owner
        agents = owner._make_agents(self)
        env = owner._vf_env
        label = type(env).__name__ if env is not None else "the single-agent run"
        if env is not None:
            self.phase = self.outer = f"{label}.setup()"
            await env.setup(agents)
            self.phase = self.outer = f"{label}.run()"
            await env.run(self.task, agents)
        else:
            self.phase = self.outer = "the single-agent run"
            await getattr(agents, owner.seat).run(self.task)
        if self.trace is None:
            raise ValueError(f"{label}.run() ended without a turn of seat {owner.seat!r} (agentrl's policy)")
        if env is not None:
            self.phase = self.outer = f"{label}.finalize()"
            await env.finalize(self.task, self.vf_episode)
        self.vf_episode.ok = all(t.ok for t in self.vf_episode.traces)
        return self.vf_episode


def _guarded_task(task: Any) -> Any:
    """A shallow copy of `task` whose rewards and metrics name themselves when they fail (`_guarded`)."""
    copy_ = object.__new__(type(task))
    copy_.__dict__.update(task.__dict__)
    original = task.hooks

    def hooks(attr: str) -> list[Callable[..., Any]]:
        fns = original(attr)
        return [_guarded(fn, attr) for fn in fns] if attr in ("reward", "metric") else fns

    copy_.hooks = hooks
    return copy_


class VerifiersEnv(AgentEnv):
    """A verifiers environment as an agentrl env (see the module docstring).

    `taskset_id`: an installed verifiers taskset package (``addition-v1``, ``owner/name@version`` as the hub
    names it, a built-in such as ``textarena``), loaded with its own `Env` when it exports one; `config`: its
    `TasksetConfig` fields. Or the objects: `taskset` (a `vf.Taskset`) and/or `env` (a `vf.Env`, whose taskset
    it is; with `taskset_id`, ``env`` may be an env id such as ``"user-sim"``). `env_config`: fields of the env's
    `EnvConfig` (with an id). `seat`: the agent seat the policy plays (default: the only one, else the one
    trainable seat). `others`: ``{seat: fn(messages) -> reply}`` for the other seats. `answer_tool`: the name of
    the reply tool (None: none). `tool_timeout`, `score_timeout`: seconds per tool call and per scoring; `timeout`:
    seconds any one reset or step may wait for the env's code (a hang past it is an `EnvError`).
    """

    answers_in_text: ClassVar[bool] = True  # a reply without a call is the seat's reply, not a malformed call

    def __init__(
        self,
        taskset_id: str | None = None,
        *,
        config: dict[str, Any] | None = None,
        env: Any = None,
        taskset: Any = None,
        env_config: dict[str, Any] | None = None,
        seat: str | None = None,
        others: dict[str, Callable[..., Any]] | None = None,
        max_turns: int | None = None,
        answer_tool: str | None = "answer",
        tool_timeout: float = 30.0,
        score_timeout: float = 60.0,
        timeout: float = 300.0,
        max_result_chars: int = 8000,
    ):
        _vf()  # without the package, say so before anything else
        for label, value in (("tool_timeout", tool_timeout), ("score_timeout", score_timeout), ("timeout", timeout)):
            if not value > 0:
                raise ValueError(f"VerifiersEnv: {label} must be > 0 seconds, got {value}")
        self.tool_timeout, self.score_timeout, self.timeout = float(tool_timeout), float(score_timeout), float(timeout)
        self.max_result_chars, self.answer_tool = int(max_result_chars), answer_tool
        self.others = dict(others or {})
        self._spec = (taskset_id, dict(config or {}), env if isinstance(env, str) else None, dict(env_config or {}))
        self._load(taskset_id, config, env, taskset, env_config)
        seats = self._seat_configs()
        self.seat = self._pick_seat(seats, seat)
        seat_turns = seats[self.seat].max_turns
        super().__init__(max_turns=max_turns or seat_turns or 16)
        self._tasks: list[Any] = []
        self._task_iter: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._shared: _Servers | None = None
        self._shared_tools: list[_Tool] | None = None
        self._episode_tools: dict[str, _Tool] = {}
        self._run: _EpisodeRun | None = None
        self._main: cf.Future | None = None
        self.task: Any = None  # the episode's `vf.Task`
        self.system_prompt: str | None = None
        self._check_task_class()
        self._note: str | None = None
        self._static_tools = self._call(self._list_tools(), "listing the tool servers' tools")

    # -- loading -----------------------------------------------------------------------------------

    def _load(
        self,
        taskset_id: str | None,
        config: dict[str, Any] | None,
        env: Any,
        taskset: Any,
        env_config: dict[str, Any] | None,
    ) -> None:
        vf = _vf()
        from verifiers.v1.utils.loaders import load_environment, resolve_env_config

        self._vf_env = None
        if taskset_id is not None:
            if taskset is not None or (env is not None and not isinstance(env, str)):
                raise ValueError("VerifiersEnv: give a taskset id, or the taskset/env objects, not both")
            if not isinstance(taskset_id, str) or not taskset_id:
                raise ValueError(f"VerifiersEnv: the taskset id must be a non-empty string, got {taskset_id!r}")
            raw = {**dict(env_config or {}), "taskset": {**dict(config or {}), "id": taskset_id}}
            if isinstance(env, str):
                raw["id"] = env
            try:
                self._vf_env = load_environment(resolve_env_config(raw))
            except ModuleNotFoundError as e:
                raise ValueError(f"verifiers taskset {taskset_id!r} cannot be loaded: {e}") from e
            self.taskset = self._vf_env.taskset
            self.label = taskset_id
        elif env is not None:
            if not isinstance(env, vf.Env):
                raise TypeError(
                    f"VerifiersEnv: env must be a verifiers.v1.Env (or an env id with a taskset id), "
                    f"got {type(env).__name__}"
                )
            self._vf_env = env
            self.taskset = taskset if taskset is not None else env.taskset
            self.label = env.config.taskset.id or type(self.taskset).__name__
        elif taskset is not None:
            if not isinstance(taskset, vf.Taskset):
                raise TypeError(f"VerifiersEnv: taskset must be a verifiers.v1.Taskset, got {type(taskset).__name__}")
            if config or env_config:
                raise ValueError(
                    "VerifiersEnv: config/env_config configure a taskset loaded by id; a Taskset object "
                    "carries its config already"
                )
            self.taskset = taskset
            self.label = type(taskset).__name__
        else:
            raise ValueError("VerifiersEnv: give a taskset id (an installed verifiers taskset), a taskset or an env")
        if isinstance(self._vf_env, vf.SingleAgentEnv) and type(self._vf_env).run is vf.SingleAgentEnv.run:
            self._vf_env = None  # a plain taskset: the single-agent run, here without an Env object

    def _seat_configs(self) -> dict[str, Any]:
        vf = _vf()
        from verifiers.v1.configs.agent import agent_config_fields

        if self._vf_env is None:
            return {"agent": vf.AgentConfig()}
        return agent_config_fields(self._vf_env.config)

    def _pick_seat(self, seats: dict[str, Any], seat: str | None) -> str:
        env_name = type(self._vf_env).__name__ if self._vf_env is not None else "the single-agent run"
        if seat is not None:
            if seat not in seats:
                raise ValueError(f"VerifiersEnv: {env_name} has no seat {seat!r}; its seats: {', '.join(seats)}")
            return seat
        if len(seats) == 1:
            return next(iter(seats))
        probe = _Agents({name: _Seat(name, cfg) for name, cfg in seats.items()})
        if self._vf_env is not None:
            with contextlib.suppress(Exception):  # setup() only says which seats are trainable
                asyncio.run(self._vf_env.setup(probe))
        trainable = [name for name in seats if getattr(probe, name).trainable and name not in self.others]
        if len(trainable) == 1:
            return trainable[0]
        raise ValueError(
            f"VerifiersEnv: {env_name} has seats {', '.join(seats)}; say which one agentrl's policy plays with seat="
        )

    def _check_task_class(self) -> None:
        cls = type(self.taskset).task_type()
        if getattr(cls, "NEEDS_CONTAINER", False):
            raise ValueError(
                f"task {cls.__name__} needs a container (NEEDS_CONTAINER); the agentrl adapter runs "
                "tasks in-process, without a runtime"
            )
        first = self._task_at(0)
        for attr in ("reward", "metric"):
            for fn in first.hooks(attr):
                if _needs_runtime(fn):
                    raise ValueError(
                        f"{attr} {fn.__name__!r} of task {cls.__name__} needs a runtime (a sandbox); the "
                        "agentrl adapter runs tasks in-process, without one"
                    )

    # -- the event loop ------------------------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=_serve_loop, args=(loop,), name=f"verifiers {self.label}", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
        return self._loop

    def _call(self, coro: Any, what: str) -> Any:
        """Run `coro` on the env's loop and wait for it (within `timeout`)."""
        future = asyncio.run_coroutine_threadsafe(coro, self._ensure_loop())
        try:
            return future.result(timeout=self.timeout)
        except cf.TimeoutError:
            future.cancel()
            self._abandon_loop()
            raise VerifiersError(f"{self._where()}: {what} hangs: no answer within {self.timeout:g} s") from None

    def _abandon_loop(self) -> None:
        """Leave a loop whose code holds it (a hang) to its daemon thread: its tasks are cancelled, and it stops a
        while after the hang lets go (if it ever does). The next reset starts a fresh loop."""
        loop, self._loop, self._thread = self._loop, None, None
        self._shared, self._shared_tools, self._run, self._main = None, None, None, None
        if loop is not None:
            loop.call_soon_threadsafe(_wind_down, loop)

    async def _list_tools(self) -> list[_Tool]:
        """The tool schemas before any episode: the taskset's servers, and a set of the task's (set up, not used)."""
        await self._open_shared()
        reserved = {self.answer_tool} if self.answer_tool else set()
        shared = await self._shared.tools(reserved)
        task = self._task_at(0)
        probe = _Servers(type(task).toolsets(task.config), lambda: None)
        try:
            await probe.open(None)
            own = await probe.tools(reserved | {t.name for t in shared})
        finally:
            await probe.close()
        return [*shared, *own]

    async def _open_shared(self) -> None:
        if self._shared is None:
            shared = _Servers(self.taskset.toolsets(self.taskset.config), lambda: self._run and self._run.trace)
            await shared.open(None)
            self._shared = shared
            self._shared_tools = await shared.tools({self.answer_tool} if self.answer_tool else set())

    # -- tasks ---------------------------------------------------------------------------------------

    def _task_at(self, index: int) -> Any:
        if self._task_iter is None:
            self._task_iter = iter(self.taskset)
        while len(self._tasks) <= index and self._task_iter is not None:
            nxt = next(self._task_iter, None)
            if nxt is None:
                self._task_iter = None
                break
            self._tasks.append(nxt)
        if not self._tasks:
            raise ValueError(f"verifiers taskset {self.label!r} has no tasks")
        if index >= len(self._tasks):
            return self._tasks[index % len(self._tasks)]
        return self._tasks[index]

    def _pick_task(self, seed: int | None) -> Any:
        index = int(seed) if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        if not self.taskset.bounded:
            return self._task_at(index)
        self._task_at(index)  # reads the whole (finite) taskset once when the index is past what was read
        if self._task_iter is not None:
            self._tasks += list(self._task_iter)
            self._task_iter = None
        return self._tasks[index % len(self._tasks)]

    def _make_agents(self, run: _EpisodeRun) -> _Agents:
        seats: dict[str, _Seat] = {}
        for name, cfg in self._seat_configs().items():
            if name == self.seat:
                seats[name] = _PolicySeat(name, cfg, run)
            elif name in self.others:
                seats[name] = _ScriptedSeat(name, cfg, self.others[name], run)
            else:
                seats[name] = _Missing(name, cfg, self.seat)
        return _Agents(seats)

    # -- what the policy sees ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return f"verifiers:{self.label}"

    @property
    def trace(self) -> Any:
        """The policy seat's `vf.Trace` of the current (or last) episode, None before its first turn."""
        return self._run.trace if self._run is not None else None

    def _tool_list(self) -> list[_Tool]:
        return list(self._episode_tools.values()) if self._episode_tools else list(self._static_tools)

    def tool_schemas(self) -> list[dict[str, Any]]:
        schemas = [t.schema for t in self._tool_list()]
        if self.answer_tool:
            schemas.append(
                {
                    "type": "function",
                    "function": {
                        "name": self.answer_tool,
                        "description": ANSWER_DESCRIPTION,
                        "parameters": {
                            "type": "object",
                            "properties": {"text": {"type": "string", "description": "your reply"}},
                            "required": ["text"],
                        },
                    },
                }
            )
        return schemas

    def _where(self) -> str:
        task = f" (task {self.task.data.idx})" if self.task is not None else ""
        return f"env {self.name}, episode {self._episode}{task}, turn {self._turn}"

    # -- reading the policy's message ----------------------------------------------------------------

    def _parse(self, action: str) -> tuple[Any, int]:
        """The policy's text as (the assistant message, its kind, the calls, feedback) and the malformed count."""
        vf = _vf()
        blocks = self.tool_format.blocks(action, self.tool_schemas())
        text = action
        for block in reversed(blocks):
            text = text[: block.start] + text[block.end :]
        text = text.strip()
        calls = [c for b in blocks for c in b.calls]
        if not calls:
            return (vf.AssistantMessage(content=action.strip()), "reply", [], None), 0
        tools = {t.name: t for t in self._tool_list()}
        errors, runs, answer = [], [], None
        for call in calls:
            if call.error is not None:
                errors.append(f"error: {call.error}")
            elif call.name == self.answer_tool and self.answer_tool:
                reply = call.arguments.get("text") if isinstance(call.arguments, dict) else None
                if not isinstance(reply, str) or set(call.arguments) - {"text"}:
                    errors.append(f"error: bad arguments for {self.answer_tool}: it takes one string, text")
                elif answer is None:
                    answer = reply
            elif call.name not in tools:
                names = ", ".join([*tools, *([self.answer_tool] if self.answer_tool else [])])
                errors.append(f"error: unknown tool {call.name!r}; tools: {names}")
            else:
                runs.append((call.name, call.arguments, tools[call.name].problems(call.arguments)))
        if errors:
            feedback = "\n".join([*errors, "(no call in this message was run)"])
            return (vf.AssistantMessage(content=action), "malformed", [], feedback), len(errors)
        if answer is not None:
            skipped = len(calls) - 1
            note = (
                f"({skipped} other call(s) in the message were not run: {self.answer_tool} ends the turn)"
                if skipped
                else None
            )
            self._note = note
            return (vf.AssistantMessage(content=answer), "reply", [], None), 0
        tool_calls = [
            vf.ToolCall(id=f"call_{self._turn}_{i}", name=name, arguments=json.dumps(arguments))
            for i, (name, arguments, _) in enumerate(runs)
        ]
        bad = sum(problem is not None for *_, problem in runs)
        message = vf.AssistantMessage(content=text or None, tool_calls=tool_calls)
        return (message, "tools", runs, None), bad

    # -- the gymnasium API ---------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self._stop_episode()
        self.task = self._pick_task(seed)
        loop = self._ensure_loop()
        if self._shared is None:
            self._call(self._open_shared(), "the taskset's tool servers (setup)")
        self._run = _EpisodeRun(self, self.task, loop)
        self._episode_tools, self._note = {}, None
        self._main = asyncio.run_coroutine_threadsafe(self._run.run(), loop)
        obs = self._wait("the start of the episode")
        if obs is None:
            raise VerifiersError(
                f"{self._where()}: the episode ended before the policy's first turn{self._failure_text()}"
            )
        self.system_prompt = self._run.system_prompt
        return obs, {"task": self.task.data.idx}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._ended:
            raise EnvError(f"{self._where()}: step() called after the episode ended; call reset()")
        if not isinstance(action, str):
            raise EnvError(f"{self._where()}: step() takes the action text, got {type(action).__name__}")
        if self._run is None or self._main is None:
            raise EnvError(f"{self._where()}: step() before reset()")
        self._turn += 1
        self._note = None
        parsed, bad = self._parse(action)
        self._malformed += bad
        timeouts_before = self._run.tool_timeouts
        obs = self._answer(parsed, "the policy's message")
        truncated = False
        if obs is not None and self._turn >= self.max_turns:
            truncated = True
            final = self._answer(_STOP, "the end of the turn budget")
            if final is not None:
                raise VerifiersError(
                    f"{self._where()}: the env asked for another turn after the seat's run was stopped at max_turns"
                )
        info: dict[str, Any] = {
            "turn": self._turn,
            "malformed_calls": self._malformed,
            "malformed": bad,
            "tool_timeouts": self._run.tool_timeouts - timeouts_before,
            "step_reward": 0.0,
            "state_key": None,
        }
        if self._note:
            obs = f"{obs}\n{self._note}" if obs else self._note
        reward = 0.0
        if obs is None or truncated:
            self._ended = True
            reward, summary = self._outcome()
            info["verifiers"] = summary
            if obs is None:
                obs = f"the episode is over ({summary['stop_condition']}); reward {reward:g}" + "".join(
                    f", {k} {v:g}" for k, v in summary["rewards"].items() if v is not None
                )
        return obs, reward, not truncated and self._ended, truncated, info

    def truncate(self) -> float:
        self._ended = True
        if self._main is not None and not self._main.done():
            if self._answer(_STOP, "the end of the episode (truncate)") is not None:
                raise VerifiersError(
                    f"{self._where()}: the env asked for another turn after the seat's run was stopped"
                )
        return self._outcome()[0]

    # -- internals -----------------------------------------------------------------------------------

    def _answer(self, parsed: Any, what: str) -> str | None:
        run = self._run
        nxt: cf.Future = cf.Future()
        run.asked = nxt
        answer = run.answer
        self._loop.call_soon_threadsafe(lambda: answer.done() or answer.set_result(parsed))
        return self._wait(what)

    def _wait(self, what: str) -> str | None:
        """The next observation, or None when the episode's coroutine ended (its failure raised as an `EnvError`)."""
        run, main = self._run, self._main
        done, _ = cf.wait([run.asked, main], timeout=self.timeout, return_when=cf.FIRST_COMPLETED)
        if not done:
            phase = run.phase
            main.cancel()
            self._abandon_loop()
            raise VerifiersError(
                f"{self._where()}: {phase} hangs: {what} got no answer within {self.timeout:g} s "
                "(timeout); the env's event loop is abandoned, the next reset starts a fresh one"
            )
        if run.asked.done():
            return run.asked.result()
        self._raise_if_failed()
        return None

    def _failure_text(self) -> str:
        main = self._main
        if main is None or not main.done() or main.cancelled() or main.exception() is None:
            return ""
        e = main.exception()
        return f": {self._run.failed_at or self._run.phase} raised {type(e).__name__}: {e}"

    def _raise_if_failed(self) -> None:
        main = self._main
        if main.cancelled():
            raise VerifiersError(f"{self._where()}: the episode was cancelled")
        e = main.exception()
        if e is not None:
            phase = self._run.failed_at or self._run.phase
            raise VerifiersError(f"{self._where()}: {phase} raised {type(e).__name__}: {e}") from e

    def _outcome(self) -> tuple[float, dict[str, Any]]:
        """The policy trace's reward once the episode's coroutine ended; its recorded errors raise."""
        main, run = self._main, self._run
        if main is None or run is None:
            return 0.0, {}
        if not main.done():
            self._wait("the end of the episode")
        self._raise_if_failed()
        trace = run.trace
        if trace.errors:
            err = trace.errors[-1]
            raise VerifiersError(f"{self._where()}: {err.type}: {err.message}")
        rewards = {k: (None if r is None else r.score) for k, r in trace.rewards.items()}
        reward = float(trace.reward)
        if not math.isfinite(reward):
            raise VerifiersError(f"{self._where()}: the reward is {reward} (rewards: {rewards})")
        summary = {
            "rewards": rewards,
            "metrics": dict(trace.metrics),
            "stop_condition": trace.stop_condition,
            "num_turns": trace.num_turns,
        }
        return reward, summary

    def _stop_episode(self) -> None:
        """Cancel an episode still in flight (a reset mid-episode), waiting briefly for its clean-up."""
        main, self._main = self._main, None
        if main is not None and not main.done():
            main.cancel()
            with contextlib.suppress(BaseException):
                main.result(timeout=5)

    def close(self) -> None:
        self._stop_episode()
        loop = self._loop
        if loop is not None and self._shared is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._shared.close(), loop).result(timeout=5)
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=5)
        self._loop = self._thread = None
        self._shared = self._shared_tools = None
        super().close()

    def __getstate__(self) -> dict[str, Any]:
        # a process worker runs its own loop; a taskset loaded by id is loaded again there
        state = super().__getstate__()
        for key in ("_loop", "_thread", "_shared", "_shared_tools", "_run", "_main", "_task_iter"):
            state[key] = None
        state["_episode_tools"] = {}
        state["_tasks"] = []
        if self._spec[0] is not None:
            state["_vf_env"] = state["taskset"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if self.taskset is None:
            taskset_id, config, env_id, env_config = self._spec
            self._load(taskset_id, config, env_id, None, env_config)
