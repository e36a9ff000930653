"""The verifier interface: (task, answer) -> Verdict(score, reason), deterministic.

>>> from agentrl.verify.math import MathTask
>>> verify(MathTask(answer="1/2"), "0.5")
Verdict(score=1.0, reason='equivalent to the reference 1/2')
>>> verify({"kind": "chess"}, "e4")
Traceback (most recent call last):
...
agentrl.verify.base.NotVerifiable: no verifier for tasks of kind 'chess'; known kinds: code, math, sql, state

A *wrong answer* is a score of 0 with a reason. A verifier that cannot do its job (the sandbox did not
start, a key is missing, the task's own reference is broken) raises `VerifierError`: a reward of 0
would silently teach the policy something false.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["NotVerifiable", "Verdict", "Verifier", "VerifierError", "perturb", "register_verifier", "verify",
           "verifier_for"]


class NotVerifiable(ValueError):
    """The task is of a kind no verifier knows (or lacks what its verifier needs)."""


class VerifierError(RuntimeError):
    """The verifier failed to judge (infrastructure or a broken reference): never a score of 0."""


@dataclass(frozen=True)
class Verdict:
    """A score in [0, 1] and a one-line reason for logs; `details` carries structured extras
    (per-test results, compared rows) and is left out of the repr."""

    score: float
    reason: str
    details: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.score <= 1.0:
            raise ValueError(f"Verdict.score must be in [0, 1], got {self.score}")

    @property
    def passed(self) -> bool:
        return self.score >= 1.0


@runtime_checkable
class Verifier(Protocol):
    """Anything callable as ``verifier(task, answer) -> Verdict``; `kind` names the tasks it judges."""

    kind: str

    def __call__(self, task: Any, answer: Any) -> Verdict: ...


_REGISTRY: dict[str, Any] = {}


def register_verifier(kind: str, factory: Any) -> None:
    """Make `verify` route tasks of `kind` to ``factory()`` (built lazily, once)."""
    _REGISTRY[kind] = factory


def _kind(task: Any) -> str | None:
    if isinstance(task, Mapping):
        return task.get("kind")
    return getattr(task, "kind", None)


_instances: dict[str, Verifier] = {}


def verifier_for(task: Any) -> Verifier:
    """The default verifier for `task`'s kind; `NotVerifiable` if there is none."""
    kind = _kind(task)
    if kind not in _REGISTRY:
        raise NotVerifiable(f"no verifier for tasks of kind {kind!r}; known kinds: {', '.join(sorted(_REGISTRY))}")
    if kind not in _instances:
        _instances[kind] = _REGISTRY[kind]()
    return _instances[kind]


def verify(task: Any, answer: Any) -> Verdict:
    """Judge `answer` to `task` with the default verifier of the task's kind."""
    return verifier_for(task)(task, answer)


def perturb(ref: str) -> str:
    """A correct-looking answer with wrong content: the last integer changed, else a character.

    >>> perturb("x = 41"), perturb("abc"), perturb("")
    ('x = 42', 'abx', 'x')
    """
    m = list(re.finditer(r"\d+", ref))
    if m:
        last = m[-1]
        return ref[: last.start()] + str(int(last.group()) + 1) + ref[last.end():]
    return ref[:-1] + ("x" if not ref.endswith("x") else "y") if ref else "x"
