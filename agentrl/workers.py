"""Where environments run during a rollout: a pool of workers, so that slow tools overlap.

A rollout hands every environment call (`reset`, `step`, and `truncate`, which runs the verifier) to
an `EnvPool` and gets a `concurrent.futures.Future` back; the rollout keeps generating for the rows
whose observation has arrived while the others' tools still run. One setting chooses the pool
(`rollout.env_workers`):

- ``thread:N`` (default): N threads in this process. Most slow tools wait (on a remote API, a
  subprocess, a sandbox), and waiting threads overlap perfectly. The envs are the caller's objects.
- ``process:N``: N worker processes, for environments whose Python itself is the cost (the GIL
  serialises it in threads). Each episode's env is pickled to one process at `reset` and lives
  there until the episode ends, so the caller's env objects are not stepped (read nothing from
  them after a rollout; the episodes carry everything).
- ``ray:N``: N Ray actors (extra ``[ray]``), the same as processes but placed by Ray, so heavy
  environments can live on other machines of a cluster.

Every worker runs tool calls through a `ToolRunner`: an ``async def`` tool is awaited on the
worker's event loop (many of them at once, on one thread), a plain tool runs on a thread of its own
so that its caller can stop waiting for it. A tool that runs past its limit (`Tool.timeout`, else
the pool's per-tool overrides, else its default) raises `ToolTimeout` inside `AgentEnv.step`,
which tells the policy so and goes on with the episode; the call is abandoned, its thread left to
end alone, and a fresh thread serves the next call (a coroutine is cancelled outright).

The pool never changes what an episode contains: each env's calls are made in order, one at a
time, and every random draw of an env comes from its own seeded generator.

>>> parse_workers("process:4")
('process', 4)
>>> with make_pool("thread:2") as pool:
...     pool.submit(0, None, "step", "x").exception() is not None  # no env: the call fails, the pool goes on
True
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import itertools
import multiprocessing as mp
import os
import pickle
import re
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from agentrl.core import AgentEnv, Tool, ToolTimeout

__all__ = ["EnvPool", "ProcessPool", "RayPool", "SerialPool", "ThreadPool", "ToolRunner", "make_pool", "parse_workers"]

WORKERS_RE = re.compile(r"^(?:(thread|process|ray):([1-9][0-9]*)|(serial))$")
DEFAULT_WORKERS = "thread:64"
# threads serving one process or Ray worker: its envs' I/O-bound tools still overlap each other
THREADS_PER_PROCESS = 32


def parse_workers(spec: str) -> tuple[str, int]:
    """``"thread:64"`` -> ``("thread", 64)``; ``"serial"`` -> ``("serial", 1)``; anything else is
    refused with the accepted forms."""
    m = WORKERS_RE.match(spec.strip()) if isinstance(spec, str) else None
    if m is None:
        raise ValueError(f"env_workers must be thread:N, process:N, ray:N (N >= 1) or serial, got {spec!r}")
    if m.group(3):
        return "serial", 1
    return m.group(1), int(m.group(2))


# --------------------------------------------------------------------------------------------
# Tool calls with a wall-clock limit


class _EventLoop:
    """One asyncio loop on a daemon thread, shared by every async tool call of a process."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None or cls._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="agentrl-tools-loop", daemon=True).start()
                cls._loop = loop
            return cls._loop


class ToolRunner:
    """Runs one tool call under its wall-clock limit (see the module docstring).

    `default` is the limit of tools without one of their own (None: no limit); `overrides` maps a
    tool's name to its limit and wins over `Tool.timeout`, so a config can retune a tool it did not write.
    """

    def __init__(self, default: float | None = None, overrides: Mapping[str, float] | None = None):
        self.default = default
        self.overrides = dict(overrides or {})
        self.abandoned = 0  # calls given up on (their threads end alone, or their coroutines were cancelled)

    def limit(self, tool: Tool) -> float | None:
        if tool.name in self.overrides:
            return self.overrides[tool.name]
        return tool.timeout if tool.timeout is not None else self.default

    def __call__(self, tool: Tool, call: Callable[[], Any]) -> Any:
        limit = self.limit(tool)
        if tool.is_async:
            future = asyncio.run_coroutine_threadsafe(call(), _EventLoop.get())
            try:
                return future.result(limit)
            except cf.TimeoutError:
                future.cancel()  # a coroutine can be stopped: cancel it, nothing is left running
                self.abandoned += 1
                raise ToolTimeout(tool.name, limit) from None
        if limit is None:
            return call()
        # A thread cannot be stopped from outside, so the call runs on a thread of its own: on a
        # timeout this one stops waiting and the env goes on; the stuck thread is left to end alone
        # (a daemon, so it never holds up exit) and the next call gets a new one.
        box: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                box["value"] = call()
            except BaseException as e:  # handed to the caller, which raises it as the tool's error
                box["error"] = e
            done.set()

        threading.Thread(target=target, name=f"agentrl-tool-{tool.name}", daemon=True).start()
        if not done.wait(limit):
            self.abandoned += 1
            raise ToolTimeout(tool.name, limit)
        if "error" in box:
            raise box["error"]
        return box["value"]


def _call_env(env: AgentEnv, runner: ToolRunner, method: str, args: tuple[Any, ...]) -> Any:
    env.tool_runner = runner
    if method == "reset":
        return env.reset(seed=args[0])
    if method == "step":
        return env.step(args[0])
    if method == "truncate":
        return env.truncate()
    if method in ("compact", "facts_kept"):  # the context policy's hooks (agentrl.context): a raise is the env's bug
        return env._guard(method, lambda: getattr(env, method)(*args))
    raise ValueError(f"unknown env call {method!r}")


# --------------------------------------------------------------------------------------------
# Pools


class EnvPool:
    """Runs env calls for a rollout. `submit(slot, env, method, *args)` returns a future of
    ``env.<method>(*args)``; `slot` names the episode (the rollout's env index), so that a remote
    pool sends the env once, at `reset`, and finds it again at every later call."""

    kind = ""

    def __init__(self, workers: int, tool_timeout: float | None = None,
                 tool_timeouts: Mapping[str, float] | None = None):
        if workers < 1:
            raise ValueError(f"{type(self).__name__}: workers must be >= 1, got {workers}")
        self.workers = workers
        self.tool_timeout = tool_timeout
        self.tool_timeouts = dict(tool_timeouts or {})

    @property
    def spec(self) -> str:
        return f"{self.kind}:{self.workers}"

    def submit(self, slot: int, env: AgentEnv, method: str, *args: Any) -> cf.Future:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class SerialPool(EnvPool):
    """Every call made at once, in the caller's thread: env steps one after another, as a loop
    without a pool makes them (the baseline of benchmarks/tool_latency.py, and a fixed schedule
    for tests that compare runs bit for bit)."""

    kind = "serial"

    def __init__(self, workers: int = 1, tool_timeout: float | None = None,
                 tool_timeouts: Mapping[str, float] | None = None):
        super().__init__(1, tool_timeout, tool_timeouts)
        self.runner = ToolRunner(tool_timeout, self.tool_timeouts)

    @property
    def spec(self) -> str:
        return "serial"

    def submit(self, slot: int, env: AgentEnv, method: str, *args: Any) -> cf.Future:
        future: cf.Future = cf.Future()
        try:
            future.set_result(_call_env(env, self.runner, method, args))
        except Exception as e:
            future.set_exception(e)
        return future


class ThreadPool(EnvPool):
    """Env calls on threads of this process; the envs are the caller's own objects."""

    kind = "thread"

    def __init__(self, workers: int = 64, tool_timeout: float | None = None,
                 tool_timeouts: Mapping[str, float] | None = None):
        super().__init__(workers, tool_timeout, tool_timeouts)
        self.runner = ToolRunner(tool_timeout, self.tool_timeouts)
        self.executor = cf.ThreadPoolExecutor(workers, thread_name_prefix="agentrl-env")

    def submit(self, slot: int, env: AgentEnv, method: str, *args: Any) -> cf.Future:
        return self.executor.submit(_call_env, env, self.runner, method, args)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


class _Host:
    """The envs of one remote worker (a process or a Ray actor), by slot."""

    def __init__(self, tool_timeout: float | None, tool_timeouts: Mapping[str, float]):
        self.envs: dict[int, AgentEnv] = {}
        self.runner = ToolRunner(tool_timeout, tool_timeouts)

    def call(self, slot: int, env_bytes: bytes | None, method: str, args: tuple[Any, ...]) -> Any:
        if env_bytes is not None:
            self.envs[slot] = pickle.loads(env_bytes)
        env = self.envs.get(slot)
        if env is None:
            raise RuntimeError(f"worker has no env for slot {slot}: reset it first")
        return _call_env(env, self.runner, method, args)


def _serve(conn: Any, tool_timeout: float | None, tool_timeouts: dict[str, float]) -> None:
    """A worker process: answer (request id, slot, env, method, args) messages until told to stop."""
    host = _Host(tool_timeout, tool_timeouts)
    send_lock = threading.Lock()
    executor = cf.ThreadPoolExecutor(THREADS_PER_PROCESS)
    slot_locks: dict[int, threading.Lock] = {}

    def handle(rid: int, slot: int, env_bytes: bytes | None, method: str, args: tuple[Any, ...]) -> None:
        try:
            with slot_locks.setdefault(slot, threading.Lock()):  # one call at a time per env
                reply = (rid, True, host.call(slot, env_bytes, method, args))
        except BaseException as e:
            reply = (rid, False, e)
        with send_lock:
            try:
                conn.send(reply)
            except Exception as e:  # an unpicklable result or error: say what it was
                conn.send((rid, False, RuntimeError(f"{method} returned something that cannot be sent back: {e!r}")))

    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        executor.submit(handle, *msg)
    executor.shutdown(wait=False, cancel_futures=True)


class ProcessPool(EnvPool):
    """Env calls in worker processes (spawned, so no torch state is forked); episode `slot` lives in
    process ``slot % workers``."""

    kind = "process"

    def __init__(self, workers: int = 2, tool_timeout: float | None = None,
                 tool_timeouts: Mapping[str, float] | None = None):
        super().__init__(workers, tool_timeout, tool_timeouts)
        ctx = mp.get_context("spawn")
        self._ids = itertools.count()
        self._futures: dict[int, cf.Future] = {}
        self._lock = threading.Lock()
        self._conns, self._procs, self._send_locks = [], [], []
        for i in range(workers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, tool_timeout, self.tool_timeouts), name=f"agentrl-env-{i}",
                               daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
            self._send_locks.append(threading.Lock())
            threading.Thread(target=self._receive, args=(i,), name=f"agentrl-env-reader-{i}", daemon=True).start()
        self._finalizer = weakref.finalize(self, ProcessPool._shutdown, self._conns, self._procs)

    def _receive(self, i: int) -> None:
        conn = self._conns[i]
        while True:
            try:
                rid, ok, value = conn.recv()
            except (EOFError, OSError):
                err = RuntimeError(f"env worker process {i} exited (code {self._procs[i].exitcode})")
                with self._lock:
                    lost = [f for rid, f in self._futures.items() if rid % self.workers == i]
                for f in lost:
                    if not f.done():
                        f.set_exception(err)
                return
            with self._lock:
                future = self._futures.pop(rid, None)
            if future is not None:
                future.set_result(value) if ok else future.set_exception(value)

    def submit(self, slot: int, env: AgentEnv, method: str, *args: Any) -> cf.Future:
        i = slot % self.workers
        # request ids are congruent to their worker, so a dead worker's requests can be failed
        rid = next(self._ids) * self.workers + i
        future: cf.Future = cf.Future()
        with self._lock:
            self._futures[rid] = future
        env_bytes = pickle.dumps(env) if method == "reset" else None
        with self._send_locks[i]:
            self._conns[i].send((rid, slot, env_bytes, method, args))
        return future

    @staticmethod
    def _shutdown(conns: list[Any], procs: list[Any]) -> None:
        for conn in conns:
            try:
                conn.send(None)
                conn.close()
            except (OSError, BrokenPipeError):
                pass
        for proc in procs:
            proc.join(timeout=2)
            if proc.is_alive():
                proc.kill()  # a tool stuck past its limit keeps its thread; the process ends anyway
                proc.join(timeout=2)

    def close(self) -> None:
        self._finalizer()


class RayPool(EnvPool):
    """Env calls in Ray actors (extra ``[ray]``); episode `slot` lives in actor ``slot % workers``.

    Where the actors run is Ray's choice, and which Ray is the usual one: if Ray is already
    initialised in this process (a user's own ``ray.init(...)``), that one; else ``ray.init(address)``,
    which with ``address=None`` connects to the cluster named by the ``RAY_ADDRESS`` environment
    variable (``auto``: the cluster this machine belongs to, an error if there is none; set for you
    by ``ray job submit``), else to a cluster started on this machine by ``ray start --head``, else
    starts a local Ray for this process. The actors are spread over the cluster's nodes
    (``scheduling_strategy="SPREAD"``) and ask for no CPU of their own, as a thread pool's threads
    do; `actor_options` (Ray's ``.options(...)``: ``num_cpus``, ``resources``, ``runtime_env``)
    replaces that.

    What the thread and process pools do, the actors do: each has a `ToolRunner` (tool timeouts, a
    fresh thread after an abandoned call), runs one call at a time per env, sends an env once, at
    `reset`, and a raising env's `EnvError` reaches the rollout as itself (not Ray's wrapper), so
    it still names env, episode and turn. An actor that dies (an env that crashed its process, a
    node lost) fails its calls with a `RuntimeError` naming it, and is replaced by a fresh one at
    the next `reset` it is sent. `close` kills the actors; a Ray this pool started is left running
    for the process's next pool (evaluation makes one per evaluation) and ends when the process does.
    """

    kind = "ray"
    _init_lock = threading.Lock()

    def __init__(self, workers: int = 2, tool_timeout: float | None = None,
                 tool_timeouts: Mapping[str, float] | None = None, address: str | None = None,
                 actor_options: Mapping[str, Any] | None = None):
        super().__init__(workers, tool_timeout, tool_timeouts)
        try:
            import ray
            from ray import cloudpickle
        except ImportError as e:
            raise ImportError("env_workers ray:N needs the [ray] extra: pip install 'agentrl[ray]'") from e
        self.ray, self._dumps = ray, cloudpickle.dumps
        with RayPool._init_lock:
            if not ray.is_initialized():
                try:
                    ray.init(address=address, log_to_driver=False)
                except ConnectionError as e:
                    where = address if address is not None else os.environ.get("RAY_ADDRESS")
                    raise ConnectionError(f"env_workers ray:{workers}: no Ray cluster at {where!r} "
                                          f"(address argument, else RAY_ADDRESS): {e}") from e
        options = {"num_cpus": 0, "scheduling_strategy": "SPREAD", "max_concurrency": THREADS_PER_PROCESS}
        options.update(actor_options or {})
        self._host = ray.remote(_RayHost).options(**options)
        self._lock = threading.Lock()
        self.actors = [self._new_actor() for _ in range(workers)]
        self.replaced = 0  # actors that died and were replaced
        self._finalizer = weakref.finalize(self, RayPool._kill, ray, self.actors)

    def _new_actor(self) -> Any:
        return self._host.remote(self.tool_timeout, self.tool_timeouts)

    def submit(self, slot: int, env: AgentEnv, method: str, *args: Any) -> cf.Future:
        i = slot % self.workers
        with self._lock:
            if not self.actors:
                raise RuntimeError("RayPool: submit after close()")
            actor = self.actors[i]
            if actor is None:  # it died: a reset can start its episode on a fresh actor, a step cannot
                if method != "reset":
                    future: cf.Future = cf.Future()
                    future.set_exception(RuntimeError(f"Ray env actor {i} died; slot {slot} has no env until its "
                                                      "next reset"))
                    return future
                actor = self.actors[i] = self._new_actor()
                self.replaced += 1
        env_bytes = self._dumps(env) if method == "reset" else None
        # cloudpickle: an env class defined in __main__ or a notebook travels by value; one from an
        # importable module travels by name, so that module must be importable on the actor's node
        ref_future = actor.call.remote(slot, env_bytes, method, args).future()
        future = cf.Future()
        ref_future.add_done_callback(lambda f: self._settle(f, future, i, actor, slot, method))
        return future

    def _settle(self, done: cf.Future, future: cf.Future, i: int, actor: Any, slot: int, method: str) -> None:
        """Hand Ray's answer on as the thread pool would give it: the env's own exception, not
        Ray's wrapper (whose text is a remote traceback); an actor's death as a RuntimeError."""
        error = done.exception()
        if error is None:
            future.set_result(done.result())
            return
        if isinstance(error, self.ray.exceptions.RayActorError):
            with self._lock:
                if self.actors and self.actors[i] is actor:
                    self.actors[i] = None
            future.set_exception(RuntimeError(f"Ray env actor {i} died during {method} of slot {slot} (a crashed "
                                              f"env process or a lost node): {error}"))
            return
        cause = getattr(error, "cause", None)
        future.set_exception(cause if isinstance(cause, BaseException) else error)

    @staticmethod
    def _kill(ray: Any, actors: list[Any]) -> None:
        if not ray.is_initialized():
            return  # Ray is shut down (at exit): the actors went with it
        for actor in actors:
            if actor is not None:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # already dead, or Ray shutting down: nothing is left to stop
                    pass

    def close(self) -> None:
        with self._lock:
            actors, self.actors = list(self.actors), []
        self._finalizer.detach()
        RayPool._kill(self.ray, actors)


class _RayHost(_Host):
    """`_Host` as a threaded Ray actor; a per-slot lock keeps each env's calls in order."""

    def __init__(self, tool_timeout: float | None, tool_timeouts: Mapping[str, float]):
        super().__init__(tool_timeout, tool_timeouts)
        self.locks: dict[int, threading.Lock] = {}
        self.locks_lock = threading.Lock()

    def call(self, slot: int, env_bytes: bytes | None, method: str, args: tuple[Any, ...]) -> Any:
        with self.locks_lock:
            lock = self.locks.setdefault(slot, threading.Lock())
        with lock:
            return super().call(slot, env_bytes, method, args)

    def abandoned(self) -> int:
        """Tool calls this actor gave up on (their threads may still run)."""
        return self.runner.abandoned


POOLS: dict[str, type[EnvPool]] = {"serial": SerialPool, "thread": ThreadPool, "process": ProcessPool, "ray": RayPool}


def make_pool(spec: str = DEFAULT_WORKERS, tool_timeout: float | None = None,
              tool_timeouts: Mapping[str, float] | None = None) -> EnvPool:
    """The pool a `rollout.env_workers` string names (see `parse_workers`)."""
    kind, n = parse_workers(spec)
    return POOLS[kind](n, tool_timeout, tool_timeouts)
