"""agentrl/Code-v0: contract (check_env), seeded determinism, the expert, the verifier wiring."""

from __future__ import annotations

import pytest

import agentrl
from agentrl.envs.code import CodeEnv

ENV_ID = "agentrl/Code-v0"


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
    assert isinstance(env, CodeEnv) and env.name == ENV_ID


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


def test_hidden_tests_are_never_shown_and_rotate(env):
    hidden_sets = set()
    for seed in range(8):
        obs, _ = env.reset(seed=seed)
        assert all(c.code not in obs for c in env.hidden)
        hidden_sets.add((env.task.task_id, tuple(c.code for c in env.hidden)))
    env.reset(seed=0, options={"task_id": env.task.task_id})
    draws = {tuple(c.code for c in (env.reset(seed=s, options={"task_id": "HumanEval/0"}) and env.hidden)) for s in range(6)} if any(
        t.task_id == "HumanEval/0" for t in env.tasks) else set()
    assert len(hidden_sets) == 8 and (not draws or len(draws) > 1)


def test_eval_split_is_held_out():
    train, ev = CodeEnv(split="train"), CodeEnv(split="eval")
    assert {t.task_id for t in train.tasks}.isdisjoint({t.task_id for t in ev.tasks})
    ev.reset(seed=0)
    assert len(ev.hidden) >= 3


def test_run_tests_tool_reports_and_submit_is_judged(env):
    env.reset(seed=2)
    call = '<tool_call>{"name": "run_tests", "arguments": {"code": "    return None\\n"}}</tool_call>'
    obs, *_ = env.step(call)
    assert obs.startswith("visible test failed")
    obs, reward, terminated, *_ = env.step('<tool_call>{"name": "submit", "arguments": {"code": "    return None\\n"}}</tool_call>')
    assert terminated and reward == 0.0
