"""The contract every built-in verifiable environment keeps (Code, SQL, Math): built from the
registry, a perfect expert, a noisy expert that is reproducible and costs something, no submission
is a zero (not an error), short observations. check_env itself runs in test_checker.py."""

from __future__ import annotations

import pytest

import agentrl
from agentrl.envs.code import CodeEnv
from agentrl.envs.math import MathEnv
from agentrl.envs.sql import SQLEnv

ENVS = {"agentrl/Code-v0": CodeEnv, "agentrl/SQL-v0": SQLEnv, "agentrl/Math-v0": MathEnv}


@pytest.fixture(scope="module", params=list(ENVS))
def env(request):
    return agentrl.make(request.param)


def play(env, seed, noise=0.0):
    obs, _ = env.reset(seed=seed)
    trace = [obs]
    while True:
        obs, reward, terminated, truncated, info = env.step(env.expert_action(noise))
        trace.append((obs, reward, terminated, truncated))
        if terminated or truncated:
            return reward, trace


def test_registered_and_built_from_the_registry(env):
    assert isinstance(env, ENVS[env.name])


def test_expert_solves_and_noisy_expert_is_reproducible(env):
    assert [play(env, s)[0] for s in range(4)] == [1.0] * 4
    noisy = [play(env, s, noise=0.6)[1] for s in range(6)]
    assert noisy == [play(env, s, noise=0.6)[1] for s in range(6)]  # same seed, same mistakes
    assert sum(t[-1][1] for t in noisy) < 6  # and the noise does cost something


def test_no_submission_is_a_zero_not_an_error(env):
    env.reset(seed=0)
    for _ in range(env.max_turns):
        obs, reward, terminated, truncated, _ = env.step("no tool call here")
    assert truncated and not terminated and reward == 0.0


def test_observations_stay_short(env):
    _, trace = play(env, 1)
    assert all(len(t[0]) <= 1200 for t in trace[1:])


def test_an_answer_env_is_its_tools_and_tasks_only():
    from dataclasses import dataclass

    from agentrl.envs.answer import AnswerEnv, call_text

    @dataclass
    class Verdict:
        score: float

    class Capital(AnswerEnv):
        verifier = staticmethod(lambda task, answer: Verdict(float(answer.strip().lower() == task)))

        def submit(self, city: str) -> str:
            """The capital. Ends the episode."""
            return self.submit_answer(city)

        tools = [submit]

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.task = "paris"
            return "The capital of France?", {}

    env = Capital()
    env.reset(seed=0)
    assert env.tool_schemas()[0]["function"]["parameters"]["required"] == ["city"]
    _, reward, terminated, _, _ = env.step(call_text("submit", city=" Paris"))
    assert (reward, terminated, env.submitted) == (1.0, True, " Paris")
    env.reset(seed=1)  # a new episode forgets the answer: nothing submitted scores 0
    assert env.submitted is None and env.verify() == 0.0
    _, reward, terminated, _, _ = env.step(call_text("submit", city="Lyon"))
    assert (reward, terminated) == (0.0, True)
