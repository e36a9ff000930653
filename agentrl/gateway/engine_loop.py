"""One thread owns the engine: calls from many sessions queue up and are generated in shared batches.

Agents call at their own times (each between its own tools), so there is no turn barrier to batch on.
A call waits for others to share its generate as long as the last generate took (at least `batch_wait`,
at most `MAX_WAIT`), and not at all once every open session has a call waiting: a forward costs nearly
the same for more rows, so a batch split in two costs two generates, while waiting costs at most one
(the rule `agentrl.rollout` follows for rows whose tools are slow). A session running its own tool holds
its engine row (the cache of its history) but no place in a generate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from agentrl.engines.base import Engine, Generation

MAX_WAIT = 2.0  # seconds a call may wait for others, however long generates take (a call is never held longer)


@dataclass
class _Job:
    row: int
    context: list[int]
    extension: list[int] | None  # None: (re)admit the row with `context`
    future: Future


class EngineLoop:
    """Generate the queued calls of many sessions against one engine, in batches, on a thread of its own.

    `submit(row, context, extension)` returns a future of the row's `Generation`; `release(row)` frees a
    row whose session ended. `open(engine)` starts a new engine session (a rollout's); `close()` stops the
    thread. `live` is asked how many sessions may call before the next generate (every open one)."""

    def __init__(self, batch_wait: float = 0.05, live: Callable[[], int] | None = None):
        self.batch_wait = batch_wait
        self.live = live or (lambda: 0)
        self._cond = threading.Condition()
        self._jobs: list[_Job] = []
        self._release: list[int] = []
        self._session: Any = None
        self._rows: set[int] = set()
        self._stopped = False
        self._paused = False
        self.last_generate = 0.0
        self.generates = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="agentrl-gateway-engine", daemon=True)
        self._thread.start()

    # -- called from other threads ---------------------------------------------------------------------

    def open(self, engine: Engine) -> None:
        """Generate from `engine` in a fresh session from now on. The rows of the last one are gone; calls still
        queued (a session of serve-policy's that waited out an update) join the new one with their whole context."""
        with self._cond:
            for job in self._jobs:
                job.extension = None
            self._release = []
            self._session, self._rows = engine.open([]), set()

    def submit(self, row: int, context: list[int], extension: list[int] | None) -> Future:
        future: Future = Future()
        with self._cond:
            if self._stopped or self._session is None:
                future.set_exception(RuntimeError("the gateway's engine is not serving (no rollout is open)"))
                return future
            self._jobs.append(_Job(row, context, extension, future))
            self._cond.notify_all()
        return future

    def release(self, row: int) -> None:
        with self._cond:
            self._release.append(row)
            self._cond.notify_all()

    def pause(self, paused: bool) -> None:
        """Hold every call while the weights change (an update in progress); they run after."""
        with self._cond:
            self._paused = paused
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            for job in self._jobs:
                job.future.set_exception(RuntimeError("the gateway closed"))
            self._jobs = []
            self._cond.notify_all()
        self._thread.join(timeout=30)

    # -- the thread -----------------------------------------------------------------------------------

    def _take(self) -> tuple[list[_Job], list[int]] | None:
        """Wait for work; return the batch to run and the rows to free (None: stop)."""
        with self._cond:
            while not self._stopped and (self._paused or not (self._jobs or self._release)):
                self._cond.wait()
            if self._stopped:
                return None
            if self._jobs:  # let others join the batch, briefly
                first = time.monotonic()
                limit = min(MAX_WAIT, max(self.batch_wait, self.last_generate))
                while not self._stopped and len(self._jobs) < self.live() and time.monotonic() - first < limit:
                    self._cond.wait(timeout=max(0.0, limit - (time.monotonic() - first)))
            jobs, self._jobs = self._jobs, []
            released, self._release = self._release, []
            return jobs, released

    def _run(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            jobs, released = taken
            try:
                self._step(jobs, released)
            except BaseException as e:  # an engine failure reaches every caller of the batch
                self.error = e
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(e)

    def _step(self, jobs: list[_Job], released: list[int]) -> None:
        session = self._session
        gone = [r for r in released if r in self._rows]
        if gone:
            session.drop(gone)
            self._rows.difference_update(gone)
        jobs = [j for j in jobs if j.future.set_running_or_notify_cancel()]
        rows = []
        for job in jobs:
            if job.extension is not None and job.row in self._rows:
                session.extend([job.extension], rows=[job.row])
            else:
                if job.row in self._rows:
                    session.drop([job.row])
                session.add([job.row], [job.context])
                self._rows.add(job.row)
            rows.append(job.row)
        if not rows:
            return
        started = time.perf_counter()
        session.start(rows)
        by_row: dict[int, Generation] = dict(session.collect())
        self.last_generate = time.perf_counter() - started
        self.generates += 1
        for job in jobs:
            job.future.set_result(by_row[job.row])

    def stats(self) -> dict[str, float]:
        session = self._session
        return {"prefill_tokens": float(getattr(session, "prefill_tokens", 0)),
                "positions_attended": float(getattr(session, "positions_attended", 0)),
                "positions_padding": float(getattr(session, "positions_padding", 0))}
