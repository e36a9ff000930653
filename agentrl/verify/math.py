"""Math verifier: is the answer mathematically equivalent to the reference? (via `math-verify`)

>>> v = MathVerifier()
>>> v(MathTask(answer="7/2"), "3.5").score, v(MathTask(answer="7/2"), "\\\\frac{7}{2}").score
(1.0, 1.0)
>>> v(MathTask(answer="7/2"), "3 or 4").reason
'more than one answer given (found a separator)'

Stricter than math-verify alone, on purpose: the answer must be *one* expression of bounded length
(several candidates at once would let a policy hedge), and unicode is NFKC-normalised first, so a
full-width ``７`` counts as 7 while a look-alike letter (``l`` for 1, Cyrillic ``З`` for 3) does not.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from dataclasses import dataclass
from typing import Any, ClassVar

from agentrl.verify.base import NotVerifiable, Verdict, VerifierError, register_verifier

__all__ = ["MathTask", "MathVerifier"]

_SEPARATORS = re.compile(r"[,;|]|\bor\b|\band\b|\\lor|\\vee", re.IGNORECASE)
_BOXED = re.compile(r"^\\boxed\{(.*)\}$", re.DOTALL)
_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)(\s*/\s*[-+]?\d+)?|[-+]?\\d?frac\{-?\d+\}\{-?\d+\}")
_FRACTION = re.compile(r"([-+]?\d+)\s*/\s*([-+]?\d+)")
_PREFIX = re.compile(r"^(the\s+)?(final\s+)?answer\s*(is|:|=)\s*", re.IGNORECASE)


@dataclass(frozen=True)
class MathTask:
    """A reference answer (a number or expression, plain or LaTeX) and, for logs, its question."""

    answer: str
    question: str = ""
    task_id: str = ""
    kind: ClassVar[str] = "math"


@dataclass
class MathVerifier:
    """`max_chars` bounds the answer (sympy on a 10,000-character tower of powers would hang);
    `float_rounding` is the number of decimals math-verify compares floats at."""

    max_chars: int = 64
    float_rounding: int = 6
    numbers_only: bool = False  # True: "2+3" is not an answer to "what is 2+3?", only 5 (or 5.0, 10/2) is
    kind: ClassVar[str] = "math"

    def __call__(self, task: Any, answer: Any) -> Verdict:
        task = _as_task(task)
        try:
            from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
        except ImportError as e:
            raise VerifierError("the math verifier needs the `math-verify` package: pip install math-verify") from e
        if not isinstance(answer, str):
            return Verdict(0.0, f"the answer is a {type(answer).__name__}, not text")
        text = unicodedata.normalize("NFKC", answer).strip()
        text = _PREFIX.sub("", text).strip().rstrip(".").strip()
        if m := _BOXED.match(text):
            text = m.group(1).strip()
        if not text:
            return Verdict(0.0, "empty answer")
        if len(text) > self.max_chars:
            return Verdict(0.0, f"answer longer than {self.max_chars} characters")
        gold_text = unicodedata.normalize("NFKC", task.answer).strip()
        if _SEPARATORS.search(text) and not _SEPARATORS.search(gold_text):
            return Verdict(0.0, "more than one answer given (found a separator)")
        if re.search(r"[A-Za-z]{2,}", re.sub(r"\\[A-Za-z]+", "", text)):
            # extraction would pick one number out of prose ("I think 5 apples"); ask for math only
            return Verdict(0.0, f"the answer is not just math: {text[:40]!r}")
        if self.numbers_only and not _NUMBER.fullmatch(text):
            return Verdict(0.0, f"{text[:40]!r} is not a number (this task wants a simplified number)")
        if self.numbers_only and (frac := _FRACTION.fullmatch(text)):
            num, den = int(frac.group(1)), int(frac.group(2))
            if den == 0 or den == 1 or _gcd(num, den) != 1 or den < 0:
                return Verdict(0.0, f"{text[:40]!r} is not a simplified number")
        if not text.isascii():
            return Verdict(0.0, "the answer contains characters that are not plain math (look-alikes?)")
        # math-verify times out with signal.alarm, which only works in the main thread; elsewhere
        # the length bound above is what keeps sympy from hanging.
        timeout = 5 if threading.current_thread() is threading.main_thread() else None
        configs = [LatexExtractionConfig(), ExprExtractionConfig()]
        gold = parse(f"${gold_text}$", extraction_config=configs, parsing_timeout=timeout)
        if not any(not isinstance(g, str) for g in gold):  # only the raw-string fallback: nothing parsed
            raise VerifierError(f"math verifier, task {task.task_id or task.question[:40]!r}: the reference answer "
                                f"{task.answer!r} does not parse")
        pred = parse(f"${text}$", extraction_config=configs, parsing_timeout=timeout)
        if not any(not isinstance(p, str) for p in pred):
            return Verdict(0.0, f"could not read {text[:40]!r} as a number or expression")
        ok = verify(gold, pred, float_rounding=self.float_rounding, timeout_seconds=timeout)
        if ok:
            return Verdict(1.0, f"equivalent to the reference {task.answer}")
        return Verdict(0.0, f"{text[:40]} is not equivalent to the reference")


def _gcd(a: int, b: int) -> int:
    import math

    return math.gcd(a, b)


def _as_task(task: Any) -> MathTask:
    if isinstance(task, MathTask):
        return task
    if isinstance(task, dict) and task.get("kind") == "math":
        if "answer" not in task:
            raise NotVerifiable("math task has no reference 'answer'")
        return MathTask(str(task["answer"]), task.get("question", ""), task.get("task_id", ""))
    raise NotVerifiable(f"the math verifier cannot judge a {type(task).__name__}")


register_verifier("math", MathVerifier)
