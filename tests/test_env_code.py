"""Code-v0 specifics: hidden tests never shown and rotated, a held-out split, the tools. Shared contract: test_env_common.py."""

from __future__ import annotations

import pytest

import agentrl
from agentrl.envs.code import CodeEnv

ENV_ID = "agentrl/Code-v0"


@pytest.fixture(scope="module")
def env():
    return agentrl.make(ENV_ID)


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
