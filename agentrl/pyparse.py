"""`ast.parse` for code that runs in worker threads (tools, verifiers)."""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, mode: str = "exec") -> ast.AST:
    """`ast.parse` under one process-wide lock. CPython 3.11's converter from the parser's tree to `ast`
    objects keeps its recursion counter in interpreter-wide state, not per call, so two threads parsing at
    once can fail with "SystemError: AST constructor recursion depth mismatch" (reported upstream as a rare
    failure of threaded programs, python/cpython#106905); the calculator tool raised it once in a
    thread-pool rollout of RG-Calc-v0. A parse of a tool argument takes microseconds, so the lock costs
    nothing measurable."""
    with _LOCK:
        return ast.parse(source, mode=mode)
