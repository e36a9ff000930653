"""A Prime Intellect `verifiers` environment (0.4's ``verifiers.v1``) trained through the gateway, run by verifiers.

    # my_env.py
    from agentrl.adapters.verifiers_env import VerifiersAgent
    tasks = VerifiersAgent("addition-v1", config={"num_tasks": 100}).tasks

    agentrl train --agent agentrl.adapters.verifiers_env:solve --agent.tasks my_env.py:tasks --agent.demos ...

A verifiers environment drives the model itself: its harness program calls an OpenAI-compatible endpoint
through verifiers' interception server, runs the `Toolset` servers' tools and the env's control flow, and
its task scores the trace. Here that endpoint is agentrl's gateway (`agentrl.gateway`): each episode is
verifiers' own ``Env.run_episode(task, ctx)`` with ``ctx`` pointed at the episode's gateway session, so every
model call of the policy's seat is a turn of the episode, and `solve` returns the task's own reward. Nothing
of verifiers' rollout is re-created here; this module maps names, defaults and failures:

- **tasks**: ``tasks(seed)`` picks task ``seed % len(taskset)`` (the seed itself for an infinite taskset);
  held-out seeds (from ``eval.seed_offset``) go the same way.
- **the seat**: the policy plays the one seat without a ``client`` of its own (verifiers: a seat without one
  plays the run's model); other seats must name their own endpoint (``env_config``), or their calls would be
  trained as the policy's. The seat's harness defaults to verifiers' ``null`` chat loop (its tools: the
  `Toolset` servers', as OpenAI tools), every seat's runtime to ``subprocess`` (verifiers' default is a Prime
  sandbox), its ``max_turns`` to 16 (verifiers': none); a seat's own settings win.
- **the reward**: the seat's ``trace.reward`` (the task's ``@vf.reward``s with their weights, and what the
  env's ``run``/``finalize`` recorded). Rewards, metrics and the stop condition are kept per session in
  `VerifiersAgent.outcomes`.
- **failures**: what verifiers records on the episode or the trace (a hook that raised, a harness that
  exited badly, a setup, finalize, scoring or episode deadline), a reward or metric that is NaN or infinite,
  and a seat that ran more than once, make `solve` raise a `VerifiersError` naming the env, the task and the
  hook: the gateway's episode error.

verifiers runs its ``null`` harness as a uv script; its dependencies are verifiers' own, so the subprocess
runtime is pointed at this interpreter (no uv, no network). Each segment of the seat is that program, and each
task `Toolset` a server process of its own, started per episode, as verifiers runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import os
import re
import secrets
import sys
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

INSTALL_HINT = "the verifiers adapter needs the verifiers package (0.4): pip install 'agentrl[verifiers]'"
KEY_VAR = "AGENTRL_GATEWAY_API_KEY"  # verifiers reads an endpoint's key from a variable; its subprocess
# runtime keeps names holding "API_KEY" out of the harness's and the tools' processes
MAX_TURNS = 16


def _vf() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from e
    return vf


class VerifiersError(RuntimeError):
    """A verifiers episode failed: the message names the env, the task, and what verifiers recorded."""


@dataclass(frozen=True)
class Outcome:
    """One episode as verifiers scored it (`VerifiersAgent.outcomes`)."""

    session: str
    seed: int | None
    task: Any  # the `vf.Task`
    reward: float
    rewards: dict[str, float | None]
    metrics: dict[str, float]
    stop_condition: str | None
    num_turns: int
    trace: Any  # the seat's `vf.Trace`


@dataclass
class _Held:
    """An env's ``serving()`` (its interception server and taskset-wide tool servers) on one event loop, entered
    and left by one task of its own while any episode runs there."""

    env: Any
    lock: asyncio.Lock
    users: int = 0
    task: asyncio.Task | None = None
    stop: asyncio.Future | None = None


class VerifiersAgent:
    """A verifiers environment as an agent of the gateway (see the module docstring).

    `taskset_id`: an installed taskset package (``addition-v1``, ``owner/name@version``, a built-in), loaded as
    verifiers loads it; `config`: its `TasksetConfig` fields; `env`: an `Env` id (``"user-sim"``); `env_config`:
    the `EnvConfig` fields (a seat's: ``{"agent": {"max_turns": 4}}``). `seat`: the seat the policy plays (default:
    the one without a ``client``). `max_turns`: the seat's turn budget (default: its own, else 16). `harness`
    (``None``: the taskset's default), `score_timeout` (a seat's scoring) and `timeout` (a whole episode, seconds)
    fill in what the config leaves unset. `outcomes` keeps the last `keep` episodes.
    """

    def __init__(self, taskset_id: str, *, config: dict[str, Any] | None = None, env: str | None = None,
                 env_config: dict[str, Any] | None = None, seat: str | None = None, max_turns: int | None = None,
                 harness: str | None = "null", score_timeout: float = 60.0, timeout: float = 600.0, keep: int = 1024):
        _vf()  # without the package, say so before anything else
        from verifiers.v1.configs.agent import agent_config_fields
        from verifiers.v1.runtimes import SubprocessConfig
        from verifiers.v1.utils.loaders import harness_config_type, load_environment, resolve_env_config

        if not isinstance(taskset_id, str) or not taskset_id:
            raise ValueError(f"VerifiersAgent: give a taskset id (an installed verifiers taskset), got {taskset_id!r}")
        raw = {**dict(env_config or {}), "taskset": {**dict(config or {}), "id": taskset_id}}
        if env is not None:
            raw["id"] = env
        try:
            cfg = resolve_env_config(raw)
        except ModuleNotFoundError as e:
            raise ValueError(f"verifiers taskset {taskset_id!r} cannot be loaded: {e}") from e
        self.label = taskset_id
        self.seat = _pick_seat(cfg, seat, taskset_id + (f" (env {env})" if env else ""))
        update = {}
        for name, spec in agent_config_fields(cfg).items():
            own: dict[str, Any] = {}
            if "runtime" not in spec.model_fields_set:
                own["runtime"] = SubprocessConfig()
            if spec.harness is None and harness is not None:
                own["harness"] = harness_config_type(harness).model_validate({"id": harness})
            if name == self.seat:
                own["max_turns"] = max_turns or spec.max_turns or MAX_TURNS
                if spec.timeout.scoring is None:
                    own["timeout"] = spec.timeout.model_copy(update={"scoring": score_timeout})
            update[name] = spec.model_copy(update=own)
        self.seats = list(update)
        if cfg.timeout.episode is None:
            update["timeout"] = cfg.timeout.model_copy(update={"episode": timeout})
        self.env = load_environment(cfg.model_copy(update=update))
        self.max_turns: int = update[self.seat].max_turns
        self.outcomes: deque[Outcome] = deque(maxlen=keep)
        self._tasks: list[Any] = []
        self._task_iter: Any = None
        self._held: dict[asyncio.AbstractEventLoop, _Held] = {}
        self._lock = threading.RLock()  # the runner may solve on more than one event loop (threads)
        if self._task_at(0) is None:
            raise ValueError(f"verifiers taskset {taskset_id!r} has no tasks")

    # -- tasks ---------------------------------------------------------------------------------------

    def _task_at(self, index: int) -> Any:
        """Task `index` of the taskset (modulo its size once it is read whole); None for an empty taskset."""
        with self._lock:
            return self._read_to(index)

    def _read_to(self, index: int) -> Any:
        if self._task_iter is None and not self._tasks:
            self._task_iter = iter(self.env.taskset)
        bounded = self.env.taskset.bounded
        while self._task_iter is not None and (bounded or len(self._tasks) <= index):
            nxt = next(self._task_iter, None)
            if nxt is None:
                self._task_iter = None
                break
            self._tasks.append(nxt)
        return self._tasks[index % len(self._tasks)] if self._tasks else None

    def tasks(self, seed: int) -> dict[str, Any]:
        """The task for `seed` as `solve` takes it: its id (``<taskset>/<idx>``), its index, this agent."""
        task = self._task_at(int(seed))
        return {"task_id": f"{self.label}/{task.data.idx}", "index": int(seed), "agent": self}

    # -- one episode ---------------------------------------------------------------------------------

    async def solve(self, task: dict[str, Any], base_url: str, api_key: str, model: str, session: Any) -> float:
        """Run verifiers' episode of `task` against the gateway session at `base_url`; its reward."""
        from verifiers.v1.clients import EvalClientConfig, ModelContext

        _chat_program_here()
        os.environ[KEY_VAR] = api_key  # the run's token: the same for every session
        vf_task = self._task_at(task["index"])
        ctx = ModelContext(model=model, client=EvalClientConfig(base_url=base_url, api_key_var=KEY_VAR))
        async with self._serving() as env:
            episode = await env.run_episode(vf_task, ctx)
        return self._judged(episode, vf_task, session)

    def _judged(self, episode: Any, task: Any, session: Any) -> float:
        where = f"verifiers env {self.label}, task {task.data.idx}"
        if episode.errors:
            err = episode.errors[-1]
            raise VerifiersError(f"{where}: {err.type}: {err.message}")
        mine = [t for t in episode.traces if (t.agent.name or self.seat) == self.seat]
        if len(mine) != 1:
            raise VerifiersError(f"{where}: seat {self.seat!r} ran {len(mine)} times in one episode; an agentrl "
                                 "episode is one conversation of the policy")
        trace = mine[0]
        if trace.errors:
            err = trace.errors[-1]
            hook = _failed_hook(task, err.traceback or "")
            raise VerifiersError(f"{where}: {hook + ' ' if hook else ''}raised: {err.type}: {err.message}")
        if trace.is_timeout and trace.stop_condition != "agent_timeout":
            raise VerifiersError(f"{where}: {trace.stop_condition} (a verifiers deadline; the reward is unfinished)")
        rewards = {k: (None if r is None else r.score) for k, r in trace.rewards.items()}
        for kind, values in (("reward", rewards), ("metric", trace.metrics)):
            for key, value in values.items():
                if value is None or not math.isfinite(value):
                    raise VerifiersError(f"{where}: {kind} {key!r} returned {value}")
        reward = float(trace.reward)
        self.outcomes.append(Outcome(session.name, session.seed, task, reward, rewards, dict(trace.metrics),
                                     trace.stop_condition, trace.num_turns, trace))
        return reward

    @contextlib.asynccontextmanager
    async def _serving(self) -> Any:
        """The env served on this event loop while any of its episodes runs (one env object per loop: `serving()`
        keeps its servers on the env)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            held = self._held.get(loop)
            if held is None:
                env = self.env if not self._held else _load_again(self.env)
                held = self._held[loop] = _Held(env, asyncio.Lock())
        async with held.lock:
            if held.users == 0:
                ready, held.stop = loop.create_future(), loop.create_future()
                held.task = asyncio.create_task(_hold(held.env, ready, held.stop))
                await ready
            held.users += 1
        try:
            yield held.env
        finally:
            async with held.lock:
                held.users -= 1
                if held.users == 0:
                    held.stop.set_result(None)
                    await held.task

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"VerifiersAgent has no {name!r}: a verifiers env is not an AgentEnv, it trains through "
                             "the gateway (agentrl train --agent agentrl.adapters.verifiers_env:solve --agent.tasks "
                             "FILE.py:tasks; docs/verifiers.md)")


async def solve(task: dict[str, Any], base_url: str, api_key: str, model: str, session: Any) -> float:
    """`agentrl train --agent agentrl.adapters.verifiers_env:solve`: the episode of a `VerifiersAgent.tasks` task."""
    agent = task.get("agent") if isinstance(task, dict) else None
    if not isinstance(agent, VerifiersAgent):
        raise TypeError("agentrl.adapters.verifiers_env:solve takes the tasks of a VerifiersAgent: give --agent.tasks "
                        "FILE.py:tasks, where FILE.py has tasks = VerifiersAgent('<taskset id>').tasks")
    return await agent.solve(task, base_url, api_key, model, session)


def _pick_seat(cfg: Any, seat: str | None, name: str) -> str:
    """The seat the policy plays: `seat`, or the only one without a client; every other seat must have one."""
    from verifiers.v1.configs.agent import agent_config_fields

    seats = agent_config_fields(cfg)
    free = [k for k, spec in seats.items() if spec.client is None]
    if seat is not None and seat not in seats:
        raise ValueError(f"VerifiersAgent: {name} has no seat {seat!r}; its seats: {', '.join(seats)}")
    if seat is None and len(free) != 1:
        raise ValueError(f"VerifiersAgent: {name} has seats {', '.join(seats)} and {len(free)} without a client of "
                         "their own; say which one agentrl's policy plays with seat=")
    seat = seat or free[0]
    if seats[seat].client is not None:
        raise ValueError(f"VerifiersAgent: seat {seat!r} has a client of its own; agentrl's policy plays a seat "
                         "without one (its calls go to the gateway)")
    others = [k for k in free if k != seat]
    if others:
        raise ValueError(f"VerifiersAgent: seat {others[0]!r} needs a model of its own: agentrl's policy plays seat "
                         f"{seat!r}; give it one in env_config={{{others[0]!r}: {{'client': {{'base_url': ..., "
                         "'api_key_var': ...}, 'model': ...}}")
    return seat


def _failed_hook(task: Any, traceback: str) -> str | None:
    """The task's reward, metric or stop hook whose frame is deepest in `traceback` (verifiers names the stage)."""
    hooks = {fn.__name__: kind for kind in ("reward", "metric", "stop") for fn in task.hooks(kind)}
    found = [m for m in re.findall(r", in (\w+)\n", traceback) if m in hooks]
    return f"{hooks[found[-1]]} {found[-1]!r}" if found else None


async def _hold(env: Any, ready: asyncio.Future, stop: asyncio.Future) -> None:
    try:
        async with env.serving():
            ready.set_result(None)
            await stop
    except BaseException as e:
        if ready.done():
            raise  # the servers' teardown: the last episode's error
        ready.set_exception(e)  # the servers never came up: the episode's error


def __getattr__(name: str) -> Any:
    if name == "VerifiersEnv":  # the in-process adapter before the gateway
        raise ImportError("VerifiersEnv is gone: a verifiers environment now trains through the gateway, run by "
                          "verifiers itself (VerifiersAgent; docs/verifiers.md)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _load_again(env: Any) -> Any:
    from verifiers.v1.utils.loaders import load_environment

    return load_environment(env.config)


def _chat_program_here() -> None:
    """Point verifiers' subprocess runtime at this interpreter for its chat harness program (a uv script whose
    dependencies, openai, mcp, httpx, tenacity, are verifiers' own), as if uv had prepared it: no uv, no network."""
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    data = CHAT_PROGRAM_SOURCE.encode()
    path = f"{SubprocessRuntime.scripts_dir}/{hashlib.sha256(data).hexdigest()}.py"  # where verifiers keeps it
    if SubprocessRuntime._interpreters.get(path) == sys.executable and os.path.isfile(path):
        return
    os.makedirs(SubprocessRuntime.scripts_dir, exist_ok=True)
    tmp = f"{path}.{secrets.token_hex(8)}.tmp"  # one per caller: episodes may start on several threads at once
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    SubprocessRuntime._interpreters[path] = sys.executable
