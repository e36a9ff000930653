"""Math-v0 specifics: an exact, safe calculator; the answer never in the question.
Shared contract: test_env_common.py."""

from __future__ import annotations

import pytest

import agentrl

ENV_ID = "agentrl/Math-v0"


@pytest.fixture(scope="module")
def env():
    return agentrl.make(ENV_ID)


def test_calculator_is_exact_and_safe(env):
    env.reset(seed=0)
    assert env.calculator("(19 - 4) / 3") == "(19 - 4) / 3 = 5"
    assert env.calculator("__import__('os')").startswith("calculator error")
    assert env.calculator("9 ** 9 ** 9").startswith("calculator error")


def test_answer_never_in_the_question(env):
    for seed in range(50):
        obs, _ = env.reset(seed=seed)
        assert f" {env.task.answer} " not in f" {obs.replace(env.expression, '')} ".replace("?", " ")


def test_calculator_parses_are_serialised_across_threads(monkeypatch):
    # CPython 3.11's AST converter shares a recursion counter between threads ("AST constructor recursion
    # depth mismatch", seen once from the calculator in a thread-pool rollout): parses must never overlap
    import ast
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    import agentrl.pyparse
    from agentrl.envs.math import calculate

    inside, most, guard = [0], [0], threading.Lock()
    real = ast.parse

    def slow_parse(*args, **kwargs):
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.002)  # long enough for another thread to enter if nothing stops it
        try:
            return real(*args, **kwargs)
        finally:
            with guard:
                inside[0] -= 1

    monkeypatch.setattr(agentrl.pyparse.ast, "parse", slow_parse)
    with ThreadPoolExecutor(8) as pool:
        values = list(pool.map(lambda i: calculate(f"({i} + 1) * 2"), range(64)))
    assert values == [(i + 1) * 2 for i in range(64)]
    assert most[0] == 1
