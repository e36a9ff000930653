"""Code-v0 specifics: hidden tests never shown and rotated, a held-out split, the tools.
Shared contract: test_env_common.py."""

from __future__ import annotations

import pytest

import agentrl
from agentrl.envs.code import CodeEnv

ENV_ID = "agentrl/Code-v0"


@pytest.fixture(scope="module")
def env():
    return agentrl.make(ENV_ID)


def test_hidden_tests_are_never_shown_and_rotate(env):
    for seed in range(8):
        obs, _ = env.reset(seed=seed)
        assert all(c.code in obs for c in env.visible)  # the check below can see a test in the prompt
        assert env.hidden and all(c.code not in obs for c in env.hidden)
    # rotation: one train-split task whose pool of hidden tests is larger than an episode's draw
    task_id = "HumanEval/3"
    assert task_id in {t.task_id for t in env.tasks}
    draws = []
    for seed in range(12):
        env.reset(seed=seed, options={"task_id": task_id})
        draws.append(frozenset(c.code for c in env.hidden))
        assert len(env.hidden) == env.hidden_per_episode and not draws[-1] & {c.code for c in env.visible}
    assert len(set(draws)) > 1  # different episodes of one task are judged by different hidden tests
    assert len(frozenset().union(*draws)) > env.hidden_per_episode


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
    obs, reward, terminated, *_ = env.step('<tool_call>{"name": "submit", "arguments": {"code": "    return '
                                           'None\\n"}}</tool_call>')
    assert terminated and reward == 0.0
