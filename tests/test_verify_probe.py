"""The verifier probe: built-in envs pass it; a weak verifier and a leaky env are caught."""

from __future__ import annotations

import argparse

import pytest

from agentrl.envs.math import MathEnv
from agentrl.verify.probe import add_cli, run_verifier_probe


@pytest.mark.parametrize("env_id, seeds", [("agentrl/Math-v0", (0, 1, 2, 3)), ("agentrl/SQL-v0", (0, 1, 2, 3)), ("agentrl/Code-v0", (0, 1))])
def test_builtin_envs_accept_nothing_wrong(env_id, seeds):
    result = run_verifier_probe(env_id, seeds=seeds)
    assert result.wrongly_accepted == [] and result.leaks == [] and result.ok
    assert result.wrongly_rejected == []
    assert {r.attack for r in result.rows} >= {"reference answer", "empty answer", "prompt echoed back", "over-long answer", "several answers at once"}


class GullibleMath(MathEnv):
    """Accepts anything that contains the right number: the kind of verifier the probe must catch."""

    def verify(self) -> float:
        return float(self.submitted is not None and self.task.answer in self.submitted)


class LeakyMath(MathEnv):
    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return obs + f" (the answer is {self.task.answer})", info


def test_a_gullible_verifier_is_caught():
    result = run_verifier_probe(GullibleMath(), seeds=(0, 1))
    bad = {r.attack for r in result.wrongly_accepted}
    assert "several answers at once" in bad and "over-long answer" not in bad or bad
    assert not result.ok


def test_a_leaked_answer_is_flagged():
    result = run_verifier_probe(LeakyMath(), seeds=(0,))
    assert result.wrongly_accepted == [] and len(result.leaks) == 1 and "prompt" in result.leaks[0]
    assert not result.ok


def test_cli_exit_status():
    parser = argparse.ArgumentParser()
    add_cli(parser.add_subparsers())
    args = parser.parse_args(["verify-probe", "--env", "agentrl/SQL-v0", "--seeds", "2"])
    assert args.func(args) == 0
    args = parser.parse_args(["verify-probe", "--env", "tests.test_verify_probe:GullibleMath", "--seeds", "2"])
    assert args.func(args) == 1
