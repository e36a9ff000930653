"""State-predicate verifier, for agent tasks whose success is a property of the final state.

>>> task = StateTask(lambda s: s["door"] == "open", "the door is open")
>>> StateVerifier()(task, {"door": "open"})
Verdict(score=1.0, reason='the door is open: yes')
>>> StateVerifier()(task, {"door": "shut"}).score
0.0

The predicate is environment code, so a predicate that raises is a bug (`VerifierError`), not a 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from agentrl.verify.base import NotVerifiable, Verdict, VerifierError, register_verifier

__all__ = ["StateTask", "StateVerifier"]


@dataclass(frozen=True)
class StateTask:
    """`predicate(state)` returns a bool or a score in [0, 1]; `description` says what it checks."""

    predicate: Callable[[Any], bool | float]
    description: str = "goal reached"
    kind: ClassVar[str] = "state"


@dataclass
class StateVerifier:
    kind: ClassVar[str] = "state"

    def __call__(self, task: Any, answer: Any) -> Verdict:
        if not isinstance(task, StateTask):
            raise NotVerifiable(f"the state verifier needs a StateTask, got {type(task).__name__}")
        try:
            value = task.predicate(answer)
        except Exception as e:
            raise VerifierError(f"state predicate {task.description!r} raised {type(e).__name__}: {e}") from e
        if isinstance(value, bool):
            return Verdict(float(value), f"{task.description}: {'yes' if value else 'no'}")
        if isinstance(value, (int, float)) and 0.0 <= float(value) <= 1.0:
            return Verdict(float(value), f"{task.description}: {float(value):.3g}")
        raise VerifierError(f"state predicate {task.description!r} returned {value!r}, not a bool or a score in [0, 1]")


register_verifier("state", StateVerifier)
