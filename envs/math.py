"""agentrl/Math-v0: generated arithmetic and algebra word problems, a calculator, math-verify.

>>> import agentrl
>>> env = MathEnv()
>>> obs, info = env.reset(seed=3)
>>> while True:
...     obs, reward, terminated, truncated, _ = env.step(env.expert_action())
...     if terminated or truncated:
...         break
>>> reward
1.0

The answer must be a simplified number (``numbers_only``): submitting the question's expression
("2 + 3") is not an answer. The calculator evaluates + - * / and parentheses exactly (fractions).
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction
from typing import Any

import gymnasium

from agentrl.envs.answer import AnswerEnv, call_text
from agentrl.pyparse import parse
from agentrl.verify.math import MathTask, MathVerifier

NAMES = ["Ann", "Ben", "Cy", "Dee", "Eli", "Fay"]
ITEMS = ["apples", "books", "coins", "pens", "cards"]


def fmt(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculate(expression: str) -> Fraction:
    """Exact arithmetic on + - * / and parentheses; raises ValueError on anything else.

    >>> fmt(calculate("(19 - 4) / 3")), fmt(calculate("7 / 2"))
    ('5', '7/2')
    """
    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")

    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return Fraction(str(node.value))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Div) and b == 0:
                raise ValueError("division by zero")
            return _OPS[type(node.op)](a, b)
        raise ValueError("only numbers, + - * / and parentheses are allowed")

    try:
        tree = parse(expression.replace("^", "**"), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an expression ({e.msg})") from None
    return ev(tree)


class MathEnv(AnswerEnv):
    """Solve a generated problem; `calculator` helps, `submit` ends the episode."""

    system_prompt = "Solve the problem. Use the calculator if you like, then submit the final number."
    max_turns = 4

    def __init__(self, max_turns: int | None = None,
                 kinds: tuple[str, ...] = ("arithmetic", "equation", "word", "fraction")):
        super().__init__(max_turns=max_turns)
        self.kinds = kinds
        self.verifier = MathVerifier(numbers_only=True)

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression exactly, e.g. "(19 - 4) / 3"."""
        try:
            return f"{expression} = {fmt(calculate(expression))}"
        except ValueError as e:
            return f"calculator error: {e}"

    def submit(self, answer: str) -> str:
        """Submit the final answer (a number such as 12, -3 or 7/2). Ends the episode."""
        return self.submit_answer(answer)

    tools = [calculator, submit]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        rng = self.np_random
        kind = self.kinds[int(rng.integers(len(self.kinds)))]
        for _ in range(100):  # redraw until the answer does not appear in the question (no leak)
            question, self.expression = self._problem(kind, rng)
            answer = fmt(calculate(self.expression))
            if answer not in question.replace(self.expression, ""):
                break
        self.task = MathTask(answer=answer, question=question, task_id=f"{kind}-{seed}")
        self._used_calculator = False
        return question, {"task_id": self.task.task_id}

    @staticmethod
    def _problem(kind: str, rng: Any) -> tuple[str, str]:
        r = lambda lo, hi: int(rng.integers(lo, hi + 1))  # noqa: E731
        if kind == "arithmetic":
            a, b, c = r(2, 30), r(2, 30), r(2, 9)
            expr = f"{a} + {b} * {c}" if r(0, 1) else f"({a} - {b}) * {c}"
            return f"What is {expr}?", expr
        if kind == "equation":
            x, a, b = r(-9, 12), r(2, 9), r(1, 30)
            return f"Solve for x: {a}x + {b} = {a * x + b}", f"({a * x + b} - {b}) / {a}"
        if kind == "word":
            name, item = NAMES[r(0, len(NAMES) - 1)], ITEMS[r(0, len(ITEMS) - 1)]
            a, n, k = r(2, 20), r(2, 6), r(2, 9)
            return (f"{name} has {a} {item} and buys {n} packs of {k} {item}. How many {item} does {name} have now?",
                    f"{a} + {n} * {k}")
        a, b = r(3, 40), r(2, 8)
        return (f"{name_of(rng)} shares {a} kg of rice equally among {b} bags. How many kg per bag (as a number)?",
                f"{a} / {b}")

    def expert_action(self, noise: float = 0.0) -> str:
        rng = self.np_random
        if noise > 0 and rng.random() < noise / 2:
            truncated_call = '<tool_call>{"name": "submit", "arguments": {"answer": '
            return truncated_call if rng.random() < 0.5 else "I think the answer is easy."
        if self.turn == 0:
            return call_text("calculator", expression=self.expression)
        answer = self.task.answer
        if noise > 0 and rng.random() < noise / 2:
            answer = fmt(Fraction(answer) + 1)  # an off-by-one slip
        return call_text("submit", answer=answer)

    # -- verifier probe hooks ---------------------------------------------------------------

    def probe_reference(self) -> str:
        return self.task.answer

    def probe_attacks(self) -> dict[str, tuple[str, bool]]:
        a = Fraction(self.task.answer)
        out = {
            # for "27 / 5" the expression is the reduced fraction itself, which is right
            "the question's expression": (self.expression, self.expression.replace(" ", "") == self.task.answer),
            "type: decimal form": (str(float(a)) if a.denominator in (1, 2, 4, 5, 8, 10) else fmt(a), True),
            "type: quoted string": (f"'{self.task.answer}'", False),
            "several answers at once": (f"{fmt(a + 1)}, {self.task.answer}", False),
            "boxed": (f"\\boxed{{{self.task.answer}}}", True),
        }
        if a.denominator != 1:
            out["type: rounded to an integer"] = (str(round(a)), False)
        return out

    def probe_secrets(self) -> list[tuple[str, str]]:
        return [(f"= {self.task.answer}?", "all"), (f"answer is {self.task.answer}", "all")]


def name_of(rng: Any) -> str:
    return NAMES[int(rng.integers(len(NAMES)))]


gymnasium.register(id="agentrl/Math-v0", entry_point="agentrl.envs.math:MathEnv", kwargs={},
                   disable_env_checker=True, order_enforce=False)  # gymnasium.make returns the bare AgentEnv
