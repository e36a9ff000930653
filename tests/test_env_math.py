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
