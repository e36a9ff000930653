from __future__ import annotations

import pytest

from agentrl.verify import StateTask, VerifierError, verify


def test_predicate_scores():
    task = StateTask(lambda s: s["n"] >= 3, "n reached 3")
    assert verify(task, {"n": 3}).score == 1.0 and verify(task, {"n": 2}).score == 0.0
    assert verify(StateTask(lambda s: s / 4), 1).score == 0.25


def test_a_predicate_that_raises_or_misbehaves_is_an_error():
    with pytest.raises(VerifierError, match="raised KeyError"):
        verify(StateTask(lambda s: s["missing"], "needs a key"), {})
    with pytest.raises(VerifierError, match="not a bool or a score"):
        verify(StateTask(lambda s: 7), None)
