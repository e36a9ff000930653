"""The contract: what a user writes (`AgentEnv`, tools) and what a rollout produces (`Turn`, `Episode`).

An `AgentEnv` is a gymnasium `Env` whose observations and actions are text. The policy acts by
writing tool calls in the Hermes/Qwen convention::

    <tool_call>{"name": "open", "arguments": {"lock": 1, "code": 7}}</tool_call>

`AgentEnv.step` parses the call, validates its arguments against the tool's schema, runs the tool
and returns the tool's result as the next observation. A call the policy got wrong (bad JSON,
unknown tool, bad arguments, no call at all) is not an error of the program: it becomes an
observation that explains the mistake, and it is counted in ``info["malformed_calls"]``. A tool or
verifier that *raises* is an error of the program: the episode is marked errored by raising
`EnvError`, whose message names the environment, the episode and the turn.

``terminated`` means the task reached an end the verifier can judge (solved, submitted, failed for
good); ``truncated`` means the turn budget ran out first. The verifier's reward ``R`` is returned by
the step that ends the episode, either way; every other step returns 0. Per-turn shaping, when an
environment has it, travels separately in ``info["step_reward"]`` so that assigners can choose to
use it or not.

>>> class Echo(AgentEnv):
...     max_turns = 2
...     def shout(self, text: str) -> str:
...         '''Repeat the text loudly.'''
...         self.heard = text
...         self.finish()
...         return text.upper()
...     tools = [shout]
...     def reset(self, *, seed=None, options=None):
...         super().reset(seed=seed)
...         self.heard = None
...         return "Say hi.", {}
...     def verify(self) -> float:
...         return float(self.heard == "hi")
>>> env = Echo()
>>> env.reset(seed=0)
('Say hi.', {})
>>> obs, reward, terminated, truncated, info = env.step(
...     '<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>')
>>> obs, reward, terminated, truncated, info["malformed_calls"]
('HI', 1.0, True, False, 0)
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
from gymnasium import spaces
from pydantic import BaseModel, ValidationError, create_model

from agentrl.chat.calls import ToolCall, _clip
from agentrl.chat.format import ToolFormat
from agentrl.chat.hermes import Hermes

__all__ = [
    "AgentEnv",
    "EnvError",
    "Episode",
    "Tool",
    "ToolCall",
    "ToolTimeout",
    "Turn",
    "parse_tool_calls",
]

HERMES = Hermes()  # the default call format: agentrl's own, and what the built-in experts write


class EnvError(RuntimeError):
    """A tool or verifier raised: a bug in the environment, never a reward of 0."""


class ToolTimeout(Exception):
    """A tool ran past its wall-clock limit. Not an error of the program: the policy is told, the
    episode goes on (raised by the tool runner a rollout's worker pool installs, `agentrl.workers`)."""

    def __init__(self, tool: str, seconds: float):
        super().__init__(f"tool {tool!r} ran past its {seconds:g} s limit")
        self.tool, self.seconds = tool, seconds


class AnyText(spaces.Text):
    """A text space that admits any unicode string up to `max_length` characters."""

    def __init__(self, max_length: int = 1_000_000):
        super().__init__(max_length=max_length, min_length=0)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"AnyText(max_length={self.max_length})"


# --------------------------------------------------------------------------------------------
# Tools


@dataclass(frozen=True)
class Tool:
    """A callable the policy may invoke, with the pydantic model that validates its arguments.

    Build one from a typed function (its docstring becomes the description) or from a pydantic
    model that defines ``__call__(self, env) -> str``:

    >>> def add(a: int, b: int) -> str:
    ...     '''Add two integers.'''
    ...     return str(a + b)
    >>> t = Tool.from_callable(add)
    >>> t.schema["function"]["parameters"]["required"]
    ['a', 'b']
    >>> t.run({"a": 2, "b": "3"}, env=None)
    '5'
    """

    name: str
    description: str
    params: type[BaseModel]
    fn: Callable[..., Any]
    takes_env: bool = False  # pydantic-model tools receive the env; functions are bound already
    timeout: float | None = None  # wall-clock limit in seconds; None: the rollout's default (`rollout.tool_timeout`)

    @classmethod
    def from_callable(cls, fn: Callable[..., Any], name: str | None = None) -> Tool:
        sig = inspect.signature(fn)
        fields: dict[str, Any] = {}
        for pname, p in sig.parameters.items():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"tool {fn.__name__!r}: *args/**kwargs cannot be described to a policy")
            if p.annotation is inspect.Parameter.empty:
                raise TypeError(f"tool {fn.__name__!r}: parameter {pname!r} needs a type annotation")
            default = ... if p.default is inspect.Parameter.empty else p.default
            fields[pname] = (p.annotation, default)
        tool_name = name or fn.__name__
        params = create_model(f"{tool_name}_args", __config__={"extra": "forbid"}, **fields)
        return cls(tool_name, inspect.getdoc(fn) or "", params, fn, timeout=getattr(fn, "timeout", None))

    @classmethod
    def from_model(cls, model: type[BaseModel]) -> Tool:
        if "__call__" not in vars(model):
            raise TypeError(f"tool model {model.__name__} must define __call__(self, env) -> str")
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", model.__name__).lower()
        return cls(name, inspect.getdoc(model) or "", model, model.__call__, takes_env=True,
                   timeout=getattr(model, "timeout", None))

    @property
    def is_async(self) -> bool:
        """An `async def` tool: a rollout awaits it on its event loop instead of giving it a thread."""
        return inspect.iscoroutinefunction(self.fn)

    @functools.cached_property
    def schema(self) -> dict[str, Any]:
        """The OpenAI/HF function schema that chat templates render for the policy (built once:
        every episode's prompt renders it)."""
        params = self.params.model_json_schema()
        params.pop("title", None)
        for prop in params.get("properties", {}).values():
            prop.pop("title", None)
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": params}}

    def run(self, arguments: dict[str, Any], env: Any) -> str:
        """Validate `arguments` (raises `ValidationError`) and call the tool (an `async def` one to its end)."""
        result = self.bind(arguments, env)()
        if inspect.isawaitable(result):
            import asyncio

            result = asyncio.run(_awaited(result))
        return str(result)

    def bind(self, arguments: dict[str, Any], env: Any) -> Callable[[], Any]:
        """Validate `arguments` (raises `ValidationError`) and return the call, not yet made: a tool
        runner decides where it runs (its value is a coroutine for an `async def` tool)."""
        args = self.params.model_validate(arguments)
        if self.takes_env:
            return functools.partial(args, env)
        return functools.partial(self.fn, **{k: getattr(args, k) for k in type(args).model_fields})


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every Hermes-style `<tool_call>...</tool_call>` in `text`, in order; malformed ones carry
    `error`. Never raises. (An env parses with its `tool_format`; this is the default family's.)

    >>> parse_tool_calls('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    [ToolCall(name='f', arguments={'x': 1}, error=None)]
    >>> [c.error is None for c in parse_tool_calls('<tool_call>{"name": "f"}</tool_call> <tool_call>{"name": "g"}')]
    [True, False]
    """
    return HERMES.parse(text)


def _validation_message(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = _clip(".".join(str(p) for p in e["loc"]) or "arguments")  # keys are the policy's text
        parts.append(f"{loc}: {e['msg']}")
        if len(parts) == 5 and err.error_count() > 5:  # a thousand bad keys need no thousand-line answer
            parts.append(f"and {err.error_count() - 5} more")
            break
    return "; ".join(parts)


# --------------------------------------------------------------------------------------------
# The environment


class AgentEnv(gym.Env[str, str]):
    """Base class for text environments with tools. Subclass it and provide:

    - ``tools``: typed functions or methods (the docstring is the description) or pydantic models
      with ``__call__(self, env) -> str``; methods listed in the class body are bound to the env.
    - ``reset(*, seed, options) -> (observation, info)``: call ``super().reset(seed=seed)`` first.
    - ``verify() -> float``: the verifier, the terminal reward; called once when the episode ends.
    - optionally ``is_terminal()`` (default: a tool called ``self.finish()``), ``state_key()``, and
      ``self.add_step_reward(x)`` from inside tools for per-turn progress.

    ``max_turns`` is the turn budget: running out of it gives ``truncated=True``, never
    ``terminated``. See the module docstring for a complete example.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    tools: ClassVar[Sequence[Any]] = ()
    system_prompt: ClassVar[str | None] = None
    max_turns: int = 16
    # Where tool calls run: None calls them here; a rollout's worker pool installs a runner
    # ``(tool, call) -> result`` that enforces wall-clock limits (`agentrl.workers.ToolRunner`).
    tool_runner: Callable[[Tool, Callable[[], Any]], Any] | None = None

    observation_space = AnyText()
    action_space = AnyText()
    # how the policy writes calls (agentrl.chat): the rollout sets the model's own; experts write Hermes
    tool_format: ToolFormat = HERMES

    def __init__(self, max_turns: int | None = None):
        if max_turns is not None:
            if max_turns < 1:
                raise ValueError(f"{type(self).__name__}: max_turns must be >= 1, got {max_turns}")
            self.max_turns = max_turns
        self._tools = {t.name: t for t in (self._bind_tool(x) for x in type(self).tools)}
        self._episode = -1
        self._turn = 0
        self._finished = False
        self._ended = False
        self._malformed = 0
        self._step_reward = 0.0
        self._timeouts = 0

    # -- hooks a subclass may override ------------------------------------------------------

    def verify(self) -> float:
        """The terminal reward. Override; raising marks the episode as errored."""
        raise NotImplementedError(f"{type(self).__name__} must implement verify()")

    def is_terminal(self) -> bool:
        """Has the task ended on its own terms? Default: a tool called `finish()`."""
        return self._finished

    def state_key(self) -> Hashable | None:
        """A hashable summary of the state (for step-level grouping); None if not defined."""
        return None

    def compact(self, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        """The conversation made to fit the context budget (``rollout.context.policy: env``): given the chat
        messages so far (system message if any, the task, then an assistant and a tool message per turn),
        return the messages the episode continues from. Override to compact with the env's own knowledge."""
        raise NotImplementedError(f"{type(self).__name__} has no compact(messages) hook (rollout.context.policy env)")

    def facts_kept(self, summary: str) -> float | None:
        """The share in [0, 1] of the facts the task still needs that `summary` keeps (logged as
        ``context/facts_kept`` under rollout.context summarize); None: this env cannot say."""
        return None

    def expert_action(self, noise: float = 0.0) -> str:
        """A scripted expert's next action (for demonstrations and tests).

        With probability-like `noise` in [0, 1] the expert makes mistakes of the kind a policy
        makes, drawn from `self.np_random` so that a seeded episode is reproducible.
        """
        raise NotImplementedError(f"{type(self).__name__} has no scripted expert")

    def expert_summary(self, noise: float = 0.0) -> str:
        """The scripted expert's answer when ``rollout.context`` summarize asks for a summary (the instruction
        arrives as a user message): the facts the task still needs and what is left to do, so that a warm start
        played under summarize learns to summarise. `noise` as in `expert_action`."""
        raise NotImplementedError(f"{type(self).__name__}'s expert writes no summaries")

    # -- helpers for tools ---------------------------------------------------------------------

    def finish(self) -> None:
        """Call from a tool to end the episode (e.g. after `submit`)."""
        self._finished = True

    def add_step_reward(self, value: float) -> None:
        """Call from a tool to record per-turn progress (reported as info['step_reward'])."""
        self._step_reward += float(value)

    # -- the gymnasium API ---------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.spec.id if self.spec is not None else type(self).__name__

    @property
    def turn(self) -> int:
        return self._turn

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The JSON schemas of the tools, as chat templates render them."""
        return [t.schema for t in self._tools.values()]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self._episode += 1
        self._turn = 0
        self._finished = False
        self._ended = False
        self._malformed = 0
        self._step_reward = 0.0
        return "", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._ended:
            raise EnvError(f"{self._where()}: step() called after the episode ended; call reset()")
        self._turn += 1
        self._step_reward = 0.0
        self._timeouts = 0
        observation, n_bad = self._run_tools(action)
        self._malformed += n_bad
        terminated = self._guard("is_terminal", self.is_terminal)
        truncated = not terminated and self._turn >= self.max_turns
        reward = 0.0
        if terminated or truncated:
            self._ended = True
            reward = float(self._guard("verify", self.verify))
        info = {
            "turn": self._turn,
            "malformed_calls": self._malformed,
            "malformed": n_bad,
            "tool_timeouts": self._timeouts,
            "step_reward": self._step_reward,
            "state_key": self._guard("state_key", self.state_key),
        }
        return observation, reward, terminated, truncated, info

    def truncate(self) -> float:
        """End the episode from outside (the policy's context is full); returns the verifier's reward."""
        self._ended = True
        return float(self._guard("verify", self.verify))

    def __getstate__(self) -> dict[str, Any]:
        # a process or Ray worker receives the env by pickle; the tools' argument models are built at
        # run time (not importable by name), so the tools are rebuilt from the class on arrival
        state = self.__dict__.copy()
        state.pop("_tools", None)
        state.pop("tool_runner", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._tools = {t.name: t for t in (self._bind_tool(x) for x in type(self).tools)}

    # -- internals -----------------------------------------------------------------------------

    def _bind_tool(self, obj: Any) -> Tool:
        if isinstance(obj, Tool):
            return obj
        if isinstance(obj, type) and issubclass(obj, BaseModel):
            return Tool.from_model(obj)
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__get__(self, type(self))
        elif inspect.isfunction(obj) and next(iter(inspect.signature(obj).parameters), None) == "self":
            obj = obj.__get__(self, type(self))  # a method listed in the class body
        if callable(obj):
            return Tool.from_callable(obj)
        raise TypeError(f"{type(self).__name__}.tools: {obj!r} is neither a typed function nor a pydantic model")

    def _where(self) -> str:
        return f"env {self.name}, episode {self._episode}, turn {self._turn}"

    def _guard(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except EnvError:
            raise
        except Exception as e:
            raise EnvError(f"{self._where()}: {what}() raised {type(e).__name__}: {e}") from e

    def _run_tools(self, action: str) -> tuple[str, int]:
        """Run the action's calls in order: (the observation, how many calls were malformed).

        Every malformed call is counted, also one written after a call that ended the episode:
        the count measures what the policy wrote, while only calls before the end are run.
        """
        if not isinstance(action, str):  # the rollout's bug, not the policy's
            raise EnvError(f"{self._where()}: step() takes the action text, got {type(action).__name__}")
        calls = self.tool_format.parse(action, self.tool_schemas())
        if not calls:
            names = ", ".join(self._tools)
            return f"error: no tool call found. {self.tool_format.hint}; tools: {names}.", 1
        outputs, bad, skipped = [], 0, 0
        for call in calls:
            tool = self._tools.get(call.name or "")
            if call.error is not None:
                error = call.error
            elif tool is None:
                error = f"unknown tool {_clip(repr(call.name))}; tools: {', '.join(self._tools)}"
            else:
                error = None
            if self._finished:  # calls after a terminal one are not run, but a malformed one still counts
                bad += error is not None or not _valid(tool, call.arguments)
                skipped += 1
                continue
            if error is not None:
                outputs.append(f"error: {error}")
                bad += 1
                continue
            try:
                if self.tool_runner is None:
                    outputs.append(tool.run(call.arguments, self))
                else:
                    outputs.append(str(self.tool_runner(tool, tool.bind(call.arguments, self))))
            except ToolTimeout as e:
                outputs.append(f"error: {e}; its call was abandoned, try another way")
                self._timeouts += 1
            except ValidationError as e:
                outputs.append(f"error: bad arguments for {tool.name}: {_validation_message(e)}")
                bad += 1
            except EnvError:
                raise
            except Exception as e:
                raise EnvError(f"{self._where()}: tool {tool.name!r} raised {type(e).__name__}: {e}") from e
        if skipped:
            outputs.append(f"({skipped} call(s) after the one that ended the episode were not run)")
        return "\n".join(outputs), bad


def _valid(tool: Tool | None, arguments: dict[str, Any]) -> bool:
    """Would `tool` accept `arguments`? (Checked without running it.)"""
    if tool is None:
        return False
    try:
        tool.params.model_validate(arguments)
    except ValidationError:
        return False
    return True


# --------------------------------------------------------------------------------------------
# What a rollout produces


@dataclass
class Turn:
    """One policy turn: the action it generated and what the environment answered.

    ``context_len`` is the number of tokens before the action (the prompt and all earlier turns);
    action tokens are trained, observation tokens never are.
    """

    context_len: int
    action_ids: list[int]
    logprobs: list[float]
    obs_ids: list[int]
    action: str = ""
    observation: str = ""
    step_reward: float = 0.0
    state_key: str | None = None
    malformed: int = 0
    hidden: list[float] | None = None  # policy hidden state before the action (turn critics)
    # the ids the model was given before this action when they are not the running sequence: the chat
    # template rewrote the history (dropped an earlier <think>, say), so this turn opens a new segment
    segment_context: list[int] | None = None
    # the policy update that sampled this action, where it may differ from the episode's (an agent's session
    # behind the gateway can outlive an update); None: the episode's `policy_version`
    policy_version: int | None = None
    # what the action was: "action" (answered by an env step) or "summary" (the policy's summary of the episode
    # so far under rollout.context summarize: no env step, its observation is empty, the next turn opens a segment)
    kind: str = "action"


@dataclass
class Episode:
    """One episode, turn-segmented. Its token sequence is
    ``prompt_ids + a_1 + o_1 + a_2 + o_2 + ... + a_K`` (the last observation is kept in `turns`
    for inspection but is never part of the sequence, since no action follows it).

    >>> ep = Episode(prompt_ids=[1, 2], turns=[Turn(2, [3], [-0.1], [4, 5]), Turn(5, [6, 7], [-0.2, -0.3], [8])])
    >>> ep.token_ids(), ep.action_mask()
    ([1, 2, 3, 4, 5, 6, 7], [0, 0, 1, 0, 0, 1, 1])
    """

    prompt_ids: list[int]
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    env_id: str = ""
    task_id: str = ""
    group_id: int = 0
    seed: int | None = None
    error: str | None = None
    tool_timeouts: int = 0  # tool calls that ran past their limit (the policy saw an error observation)
    policy_version: int = 0  # the policy update that generated it (for rollouts that run ahead of training)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def num_action_tokens(self) -> int:
        return sum(len(t.action_ids) for t in self.turns)

    @property
    def malformed_calls(self) -> int:
        return sum(t.malformed for t in self.turns)

    @property
    def passed(self) -> bool:
        return self.reward >= 1.0

    def token_ids(self) -> list[int]:
        ids = list(self.prompt_ids)
        for i, t in enumerate(self.turns):
            ids += t.action_ids
            if i < len(self.turns) - 1:
                ids += t.obs_ids
        return ids

    def action_mask(self) -> list[int]:
        mask = [0] * len(self.prompt_ids)
        for i, t in enumerate(self.turns):
            mask += [1] * len(t.action_ids)
            if i < len(self.turns) - 1:
                mask += [0] * len(t.obs_ids)
        return mask

    @property
    def segmented(self) -> bool:
        return any(t.segment_context is not None for t in self.turns)

    def segments(self) -> list[tuple[list[int], list[int]]]:
        """The sequences the model was actually given, as ``(ids, source)`` pairs: one for an episode laid
        out by appending (`token_ids`), one more for each turn that opened a new segment (its
        `Turn.segment_context`: the template rewrote the history before it). ``source[t]`` is the
        position in `token_ids` of the same action token, -1 on context tokens: every action token
        belongs to exactly one segment, so a segment's log-probs go back to the episode's layout.

        >>> ep = Episode([1], [Turn(1, [2], [-0.1], [3]), Turn(3, [4], [-0.2], [5], segment_context=[1, 9, 3])])
        >>> ep.segments()
        [([1, 2], [-1, 1]), ([1, 9, 3, 4], [-1, -1, -1, 3])]
        """
        ids, src = list(self.prompt_ids), [-1] * len(self.prompt_ids)
        out = []
        for i, t in enumerate(self.turns):
            if t.segment_context is not None and i > 0:
                out.append((ids, src))
                ids, src = list(t.segment_context), [-1] * len(t.segment_context)
            ids += t.action_ids
            src += range(t.context_len, t.context_len + len(t.action_ids))
            following = self.turns[i + 1] if i + 1 < len(self.turns) else None
            if following is not None and following.segment_context is None:
                ids += t.obs_ids
                src += [-1] * len(t.obs_ids)
        out.append((ids, src))
        return out
