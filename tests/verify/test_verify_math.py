from __future__ import annotations

import threading

import pytest

from agentrl.verify import MathTask, MathVerifier, VerifierError, verify


@pytest.mark.parametrize(
    "gold, answer, score",
    [
        ("1", "1.0", 1.0), ("1/2", "0.5", 1.0), ("7/2", "\\frac{7}{2}", 1.0), ("7", "７", 1.0),
        ("5", "The answer is 5.", 1.0),
        ("1/3", "0.33", 0.0), ("1", "l", 0.0), ("3", "З", 0.0), ("5", "55", 0.0), ("5", "", 0.0), ("5", "4 or 5", 0.0),
        ("5", "4, 5", 0.0), ("5", "I think 5 apples", 0.0), ("5", "9" * 1000, 0.0),
    ],
)
def test_equivalence(gold, answer, score):
    assert verify(MathTask(gold), answer).score == score


def test_numbers_only_rejects_unsimplified_answers():
    v = MathVerifier(numbers_only=True)
    assert v(MathTask("5"), "2+3").score == 0.0 and v(MathTask("3"), "6/2").score == 0.0
    assert v(MathTask("7/2"), "7/2").score == 1.0 and v(MathTask("7/2"), "3.5").score == 1.0


def test_works_off_the_main_thread():
    out = []
    t = threading.Thread(target=lambda: out.append(verify(MathTask("1/2"), "0.5").score))
    t.start()
    t.join()
    assert out == [1.0]


def test_unparseable_reference_is_an_error():
    with pytest.raises(VerifierError, match="does not parse"):
        verify(MathTask("???"), "1")
