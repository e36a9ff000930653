"""Many sandbox jobs at once, on a thread pool."""

from __future__ import annotations

import concurrent.futures as cf
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from .contract import Sandbox
from .local import LocalSandbox

R = TypeVar("R")


class SandboxPool:
    """Run many sandbox jobs at once. Threads only wait on child processes, so `workers` may
    exceed the core count a little (process start-up is partly I/O).

    >>> pool = SandboxPool(LocalSandbox(), workers=2)
    >>> [r.stdout for r in pool.map(lambda sb, c: sb.run_program(c), ["print(1)", "print(2)"])]
    ['1\\n', '2\\n']
    >>> pool.close()
    """

    def __init__(self, sandbox: Sandbox | None = None, workers: int | None = None):
        self.sandbox = sandbox or LocalSandbox()
        self.workers = workers or max(2, os.cpu_count() or 2)
        self._ex = cf.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="agentrl-sandbox")

    def submit(self, fn: Callable[..., R], *args: Any) -> cf.Future[R]:
        """``fn(sandbox, *args)`` on a pool thread."""
        return self._ex.submit(fn, self.sandbox, *args)

    def map(self, fn: Callable[..., R], *iterables: Iterable[Any]) -> list[R]:
        """``[fn(sandbox, *xs) for xs in zip(*iterables)]``, concurrently, in order. The first
        job that raises (a sandbox failure) raises here."""
        futures = [self._ex.submit(fn, self.sandbox, *xs) for xs in zip(*iterables)]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._ex.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
