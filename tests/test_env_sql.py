"""agentrl/SQL-v0: contract (check_env), seeded determinism, the expert, the verifier wiring."""

from __future__ import annotations

import pytest

import agentrl
from agentrl.envs.sql import SQLEnv

ENV_ID = "agentrl/SQL-v0"


@pytest.fixture(scope="module")
def env():
    return agentrl.make(ENV_ID)


def play(env, seed, noise=0.0):
    obs, _ = env.reset(seed=seed)
    trace = [obs]
    while True:
        obs, reward, terminated, truncated, info = env.step(env.expert_action(noise))
        trace.append((obs, reward, terminated, truncated))
        if terminated or truncated:
            return reward, trace


def test_check_env_passes(env):
    from agentrl.checker import check_env

    failed = [(r.name, r.message) for r in check_env(env) if not r.ok]
    assert failed == []


def test_registered_and_built_from_the_registry(env):
    assert isinstance(env, SQLEnv) and env.name == ENV_ID


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


def test_query_tool_truncates_and_refuses_writes(env):
    env.reset(seed=0)
    obs = env.query("SELECT * FROM emp")
    assert "more rows not shown" in obs and len(obs) <= 300
    assert env.query("DELETE FROM emp").startswith("error: not authorized")
    assert env.query("SELECT COUNT(*) FROM emp").startswith("1 rows: 8")
