"""Vault-v0's constructor at the edges of its parameters: every allowed value gives an env whose expert opens
the vault (with and without slips) and passes check_env; every other value is refused, naming the parameter."""

from __future__ import annotations

import numpy as np
import pytest

from agentrl.checker import check_env
from agentrl.envs.vault import VaultEnv

EDGES = [dict(locks=1), dict(locks=32), dict(slack=0), dict(slack=50), dict(max_operand=1), dict(max_operand=9),
         dict(locks=1, slack=0, max_operand=1), dict(locks=np.int64(2), max_operand=np.int64(1))]


def play(env: VaultEnv, seed: int, noise: float) -> tuple[float, bool, int]:
    env.reset(seed=seed)
    while True:
        _, reward, terminated, truncated, info = env.step(env.expert_action(noise))
        if terminated or truncated:
            return reward, terminated, info["turn"]


@pytest.mark.parametrize("kw", EDGES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_every_allowed_edge_builds_an_env_whose_expert_plays_it(kw):
    env = VaultEnv(**kw)
    assert env.max_turns == 2 * env.locks + env.slack and isinstance(env.locks, int)
    for seed in range(20):
        reward, terminated, turns = play(env, seed, noise=0.0)  # the clean expert: 2 turns a lock
        assert (reward, terminated, turns) == (1.0, True, 2 * env.locks)
        play(env, seed, noise=1.0)  # slips on every lock (the expert of max_operand=1 used to crash here)
        assert all(1 <= a <= env.max_operand and 1 <= b <= env.max_operand for a, b in env.clues)


def test_a_slip_of_max_operand_one_guesses_a_wrong_code():
    env = VaultEnv(locks=3, max_operand=1)
    env.reset(seed=0)
    guesses = {env.expert_action(noise=1.0) for _ in range(50)}  # the clue is never read: only slips and garbles
    assert '<tool_call>{"name": "open", "arguments": {"lock": 1, "code": 3}}</tool_call>' in guesses
    opens = {g for g in guesses if g.startswith('<tool_call>{"name": "open"') and g.endswith("</tool_call>")}
    assert opens and not any('"code": 2}' in g for g in opens)  # 1+1: a slip opens with a wrong code (garbles aside)


@pytest.mark.parametrize("kw", [dict(locks=1), dict(slack=0), dict(max_operand=1)],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_check_env_passes_at_the_edges(kw):
    failed = [r for r in check_env(VaultEnv, **kw) if not r.ok]
    assert not failed, failed


@pytest.mark.parametrize("kw, name", [(dict(locks=0), "locks"), (dict(locks=33), "locks"), (dict(slack=-1), "slack"),
                                      (dict(max_operand=0), "max_operand"), (dict(max_operand=10), "max_operand"),
                                      (dict(locks=2.5), "locks"), (dict(slack="1"), "slack"),
                                      (dict(max_operand=True), "max_operand")])
def test_values_outside_the_edges_are_refused_naming_the_parameter(kw, name):
    with pytest.raises(ValueError, match=f"Vault: {name} must be"):
        VaultEnv(**kw)
