"""An agent of the user's own, run in-process against the gateway: `agentrl train --agent my_agent.py:solve`.

The agent is a function that solves one task by calling a model through an OpenAI client, runs its own
tools, and returns its reward::

    def solve(task, client):                     # or `async def`, with an AsyncOpenAI client
        messages = [{"role": "user", "content": task["question"]}]
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        ...
        return 1.0 if answer == task["answer"] else 0.0

`solve` may ask for any of these by parameter name: ``task``, ``client`` (an `openai.OpenAI`, or
`openai.AsyncOpenAI` for an async solve, already pointed at its session), ``base_url``, ``api_key``,
``model`` (for a framework that builds its own client), ``seed`` and ``session`` (a `SessionInfo`).
Returning None leaves the reward to ``verify(task, messages)``. Each update runs `solve` once per episode,
all of them at once; a `solve` that raises is an episode error naming its task (the run stops, as for an
env that raises), except after a call that overflowed the context, which ends the episode truncated.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import inspect
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.chat.layout import ChatFormat
from agentrl.config import AgentConfig
from agentrl.core import Episode
from agentrl.engines.base import Engine
from agentrl.gateway.server import Server, build_app
from agentrl.gateway.service import Gateway
from agentrl.loading import IMPORT_HINT, import_from_cwd
from agentrl.rollout import RolloutStats

PARAMS = ("task", "client", "base_url", "api_key", "model", "seed", "session")


class AgentError(ValueError):
    """The agent, its tasks or its hooks cannot be used as given; the message says which and why."""


@dataclass(frozen=True)
class SessionInfo:
    """What `solve` may ask for to build its own client: the session's base URL, the run's token, the model name."""

    name: str
    base_url: str
    api_key: str
    model: str
    seed: int | None


def load_callable(spec: str, what: str) -> Callable[..., Any]:
    """``path/to/file.py:fn`` or ``module:fn``, loaded; an `AgentError` says what is missing."""
    module, sep, attr = spec.rpartition(":")
    if not sep or not module or not attr:
        raise AgentError(f"{what} {spec!r}: expected path/to/file.py:function or module:function")
    try:
        mod = import_from_cwd(module)
    except ModuleNotFoundError as e:
        raise AgentError(f"{what} {spec!r}: cannot import {module} ({e}); {IMPORT_HINT}") from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise AgentError(f"{what} {spec!r}: {module} has no function {attr!r}")
    return fn


class TaskSource:
    """Tasks by seed: a function of the seed, or the records of a JSONL file (seed i -> record i mod n).

    Held-out tasks are another file, or the function at seeds >= `seed_offset`, or the file's last
    `heldout` records, which training then never draws."""

    def __init__(self, spec: str | Callable[[int], Any], heldout: str | None = None, heldout_count: int = 0,
                 seed_offset: int = 1_000_000):
        self.fn: Callable[[int], Any] | None = None
        self.records: list[Any] = []
        self.held: list[Any] = []
        self.seed_offset = seed_offset
        if callable(spec):
            self.fn, self.name = spec, getattr(spec, "__name__", "tasks")
        elif spec.endswith((".jsonl", ".json")) or Path(spec).is_file():
            self.records, self.name = _jsonl(spec), Path(spec).stem
        else:
            self.fn, self.name = load_callable(spec, "agent.tasks"), spec.rpartition(":")[2]
        if heldout is not None:
            self.held = _jsonl(heldout)
        elif self.records:
            if heldout_count >= len(self.records):
                raise AgentError(f"agent.tasks: {len(self.records)} records cannot spare {heldout_count} for held-out "
                                 "evaluation (eval.episodes); give agent.heldout, or more records")
            self.records, self.held = self.records[:len(self.records) - heldout_count], \
                self.records[len(self.records) - heldout_count:]

    def task(self, seed: int) -> tuple[Any, str]:
        """(the task, its id) for `seed`; seeds >= seed_offset are held-out."""
        heldout = seed >= self.seed_offset
        if self.fn is not None and not (heldout and self.held):
            try:
                task = self.fn(seed)
            except Exception as e:
                raise AgentError(f"agent.tasks {self.name}({seed}) raised {type(e).__name__}: {e}") from e
            return task, f"{self.name}:{_named(task) or seed}"
        pool = self.held if heldout else self.records
        k = (seed - self.seed_offset if heldout else seed) % len(pool)
        task = pool[k]
        return task, f"{self.name}:{_named(task) or ('heldout-' if heldout else '') + str(k)}"


def _named(task: Any) -> str | None:
    if isinstance(task, dict):
        for key in ("task_id", "id"):
            if isinstance(task.get(key), (str, int)) and not isinstance(task.get(key), bool):
                return str(task[key])
    return None


def _jsonl(path: str) -> list[Any]:
    p = Path(path)
    if not p.is_file():
        raise AgentError(f"no task file {path}")
    records = []
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except (json.JSONDecodeError, RecursionError) as e:
                    raise AgentError(f"{path}:{n}: not a JSON record ({getattr(e, 'msg', e)})") from None
    if not records:
        raise AgentError(f"{path} holds no task records")
    return records


class Agent:
    """The user's `solve` with its task source and hooks, from an `AgentConfig`."""

    def __init__(self, cfg: AgentConfig, heldout_count: int = 0, seed_offset: int = 1_000_000):
        self.cfg = cfg
        self.solve = load_callable(cfg.entry, "agent")
        self.name = cfg.entry.rpartition(":")[0].rpartition("/")[2].removesuffix(".py") or "agent"
        module = import_from_cwd(cfg.entry.rpartition(":")[0])
        tasks = cfg.tasks or getattr(module, "tasks", None)
        if tasks is None:
            raise AgentError(f"agent {cfg.entry}: no task source; give --agent.tasks (a JSONL file or module:fn) or "
                             "define tasks(seed) beside solve")
        self.tasks = TaskSource(tasks, cfg.heldout, heldout_count, seed_offset)
        self.verify = load_callable(cfg.verify, "agent.verify") if cfg.verify else getattr(module, "verify", None)
        self.state_key = load_callable(cfg.state_key, "agent.state_key") if cfg.state_key else None
        sig = inspect.signature(self.solve)
        unknown = [p for p in sig.parameters if p not in PARAMS]
        if unknown:
            raise AgentError(f"agent {cfg.entry}: solve() asks for {unknown}; it may ask for {', '.join(PARAMS)}")
        self.wants = list(sig.parameters)
        self.is_async = inspect.iscoroutinefunction(self.solve)


class AgentRunner:
    """Runs an `Agent`'s episodes through a gateway of its own (started here, on 127.0.0.1 by default).

    `rollout(engine, chat, seeds, ...)` is `agentrl.rollout.rollout` for an agent: one episode per seed, all at
    once, in the order of `seeds`, with their group ids."""

    def __init__(self, agent: Agent, gateway: Gateway | None = None):
        self.agent = agent
        self.gateway = gateway or Gateway(agent.cfg.gateway)
        self.server = Server(build_app(self.gateway), agent.cfg.gateway.host, agent.cfg.gateway.port,
                             max_connections=self.gateway.cfg.max_sessions + 64).start()
        self._loop: asyncio.AbstractEventLoop | None = None  # for async solves: one event loop, on a thread
        # one connection pool for every session's client: a client of its own would build an SSL context per
        # session, CPU that an update's sessions pay on top of the rollout (docs/benchmarks.md, "The gateway")
        self._http: dict[bool, Any] = {}
        self._made = threading.RLock()  # the loop and the pool are made once, whichever agent thread asks first
        self.rollouts = 0

    @property
    def base_url(self) -> str:
        return self.server.url

    def rollout(self, engine: Engine, chat: ChatFormat, seeds: Sequence[int], *, group_ids: Sequence[int] | None = None,
                max_context: int, policy_version: int = 0, row_offset: int = 0,
                on_episode: Callable[[int, int], None] | None = None) -> tuple[list[Episode], RolloutStats]:
        t0 = time.perf_counter()
        gw = self.gateway
        group_ids = list(group_ids) if group_ids is not None else list(range(len(seeds)))
        gw.open_rollout(engine, chat, max_context=max_context, version=policy_version)
        self.rollouts += 1
        names, tasks = [], []
        for i, seed in enumerate(seeds):
            task, task_id = self.agent.tasks.task(seed)
            hook = None
            if self.agent.state_key is not None:
                hook = (lambda t: lambda msgs: self.agent.state_key(t, msgs))(task)
            names.append(gw.open_session(group_id=group_ids[i], task_id=task_id, seed=seed, row=row_offset + i,
                                         name=f"r{self.rollouts}-{row_offset + i}", state_key=hook,
                                         env_id=f"agent:{self.agent.name}"))
            tasks.append(task)
        outcomes: list[Any] = [None] * len(seeds)
        pool = cf.ThreadPoolExecutor(max_workers=max(1, min(len(seeds), 512)), thread_name_prefix="agentrl-agent")
        futures = {pool.submit(self._run_one, names[i], tasks[i], seeds[i]): i for i in range(len(seeds))}
        ended = 0
        try:
            left = set(futures)
            while left:
                done, left = cf.wait(left, timeout=0.2, return_when=cf.FIRST_COMPLETED)
                for f in done:
                    i = futures[f]
                    outcomes[i] = f.result()
                    if self._finish(names[i], tasks[i], outcomes[i]):
                        ended += 1
                        if on_episode is not None:
                            on_episode(ended, len(seeds))
                for _ in gw.sweep():  # silent too long: ended truncated; its solve is left to finish alone
                    ended += 1
                    if on_episode is not None:
                        on_episode(ended, len(seeds))
                if gw.loop.error is not None:
                    raise RuntimeError(f"the gateway's engine failed: {gw.loop.error}") from gw.loop.error
                timed_out = {f for f in left if gw.session(names[futures[f]]).ended}
                left -= timed_out
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        episodes = []
        for name in names:
            episodes.append(gw.session(name).episode)
            gw.forget(name)
        stats = gw.rollout_stats(episodes, time.perf_counter() - t0)
        return episodes, stats

    def _run_one(self, name: str, task: Any, seed: int) -> tuple[str, Any]:
        """Call `solve` for one episode: ("reward", value) or ("error", exception)."""
        gw = self.gateway
        info = SessionInfo(name, f"{self.server.url}/sessions/{name}/v1", gw.token, gw.model_name, seed)
        given = {"task": task, "base_url": info.base_url, "api_key": info.api_key, "model": info.model, "seed": seed,
                 "session": info}
        try:
            if "client" in self.agent.wants:
                given["client"] = _client(info, self.agent.is_async, self._pool(self.agent.is_async))
            kwargs = {k: given[k] for k in self.agent.wants}
            if self.agent.is_async:
                value = asyncio.run_coroutine_threadsafe(self.agent.solve(**kwargs), self._event_loop()).result()
            else:
                value = self.agent.solve(**kwargs)
        except Exception as e:
            return ("error", e)
        return ("reward", value)

    def _finish(self, name: str, task: Any, outcome: tuple[str, Any]) -> bool:
        """End session `name` with `solve`'s outcome; False if it had ended already (timed out)."""
        gw = self.gateway
        s = gw.session(name)
        if s.ended:
            return False
        kind, value = outcome
        where = f"agent {self.agent.cfg.entry}, task {s.episode.task_id} (seed {s.episode.seed}, session {name})"
        if kind == "error":
            if gw.overflowed(name):  # the agent gave up after a call that did not fit: truncated, judged as it stands
                judged = self._verified(task, s, where, default=0.0)
                if isinstance(judged, str):
                    gw.end(name, None, error=judged)
                else:
                    gw.end(name, judged, truncated=True)
                return True
            gw.end(name, None, error=f"{where}: solve raised {type(value).__name__}: {value}")
            return True
        if value is None:
            if self.agent.verify is None:
                gw.end(name, None, error=f"{where}: solve returned None and the agent has no verify(task, messages)")
                return True
            value = self._verified(task, s, where)
            if isinstance(value, str):
                gw.end(name, None, error=value)
                return True
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            gw.end(name, None, error=f"{where}: solve returned {str(value)[:80]!r}, not a finite number (the reward)")
            return True
        gw.end(name, float(value))
        return True

    def _verified(self, task: Any, s: Any, where: str, default: Any = None) -> Any:
        if self.agent.verify is None:
            return default
        try:
            return float(self.agent.verify(task, s.transcript))
        except Exception as e:
            return f"{where}: verify raised {type(e).__name__}: {e}"

    def _pool(self, is_async: bool) -> Any:
        """The shared HTTP connection pool the sessions' clients use (made once; an async one on the agents' loop)."""
        with self._made:
            return self._http[is_async] if is_async in self._http else self._make_pool(is_async)

    def _make_pool(self, is_async: bool) -> Any:
        import httpx

        limits = httpx.Limits(max_connections=None, max_keepalive_connections=512)
        timeout = httpx.Timeout(self.gateway.cfg.session_timeout, connect=10.0)
        if is_async:
            async def make() -> Any:
                return httpx.AsyncClient(limits=limits, timeout=timeout)
            self._http[True] = asyncio.run_coroutine_threadsafe(make(), self._event_loop()).result()
        else:
            self._http[False] = httpx.Client(limits=limits, timeout=timeout)
        return self._http[is_async]

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._made:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="agentrl-agent-loop", daemon=True).start()
            return self._loop

    def close(self) -> None:
        if False in self._http:
            self._http[False].close()
        if True in self._http and self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._http[True].aclose(), self._loop).result(timeout=10)
        self.server.stop()
        self.gateway.close()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def __enter__(self) -> AgentRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _client(info: SessionInfo, is_async: bool, http: Any) -> Any:
    """An OpenAI client pointed at the session (no retries: a retried call would be a second turn), on the
    runner's shared connection pool `http`."""
    try:
        import openai
    except ImportError:
        raise AgentError("solve() asks for a client, which needs the openai package: pip install 'agentrl[gateway]' "
                         "(or ask for base_url, api_key and model instead)") from None
    cls = openai.AsyncOpenAI if is_async else openai.OpenAI
    return cls(base_url=info.base_url, api_key=info.api_key, max_retries=0, http_client=http)
