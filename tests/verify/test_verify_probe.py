"""The verifier probe: built-in envs pass it; a weak verifier and a leaky env are caught."""

from __future__ import annotations

import pytest

from agentrl.cli import main
from agentrl.envs.math import MathEnv
from agentrl.envs.sql import SQLEnv
from agentrl.verify.probe import run_verifier_probe


@pytest.mark.parametrize("env_id, seeds", [("agentrl/Math-v0", (0, 1, 2, 3)), ("agentrl/SQL-v0", (0, 1, 2, 3)),
                                           ("agentrl/Code-v0", (0, 1))])
def test_builtin_envs_accept_nothing_wrong(env_id, seeds):
    result = run_verifier_probe(env_id, seeds=seeds)
    assert result.wrongly_accepted == [] and result.leaks == [] and result.ok
    assert result.wrongly_rejected == []
    assert {r.attack for r in result.rows} >= {"reference answer", "empty answer", "prompt echoed back",
                                               "over-long answer", "several answers at once"}


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
    # "contains the right number" accepts exactly the answers that hold it next to other text
    assert {(r.attack, r.seed) for r in result.wrongly_accepted} == {
        (a, s) for a in ("several answers at once", "type: quoted string") for s in (0, 1)}
    assert not result.ok


def test_a_leaked_answer_is_flagged():
    result = run_verifier_probe(LeakyMath(), seeds=(0,))
    assert result.wrongly_accepted == [] and len(result.leaks) == 1 and "prompt" in result.leaks[0]
    assert not result.ok


class PeekingMath(MathEnv):
    """A tool the scripted expert never calls hands out the answer, and nothing is declared."""

    def notes(self) -> str:
        """Read the teacher's notes."""
        return f"notes: the result is {self.task.answer}."

    tools = [MathEnv.calculator, MathEnv.submit, notes]

    def probe_secrets(self) -> list[tuple[str, str]]:
        return []


class HintingSQL(SQLEnv):
    """A hint tool prints the gold query in another spelling (lower case, spread over lines)."""

    def hint(self, topic: str) -> str:
        """Get a hint on a topic."""
        return "try:\n  " + self.task.gold.lower().replace(" where ", "\n  where ")

    tools = [SQLEnv.query, SQLEnv.submit, hint]


class EchoingMath(MathEnv):
    """submit answers without ending the episode and repeats what it was given: an echo, not a leak."""

    def submit(self, answer: str) -> str:
        """Submit an answer (you may try again)."""
        self.submitted = answer
        return f"you submitted {answer}"

    tools = [MathEnv.calculator, submit]


def test_an_undeclared_tool_that_returns_the_answer_is_flagged():
    result = run_verifier_probe(PeekingMath(), seeds=(0, 1))
    assert len(result.leaks) == 2 and all("tool 'notes'" in leak for leak in result.leaks)
    assert "'27/5'" in result.leaks[0] and "'-9'" in result.leaks[1]
    assert not result.ok
    assert result.tools_called == {"calculator", "submit", "notes"}  # also the tool the expert never calls


def test_the_answer_in_another_spelling_is_found_in_a_tool_the_expert_never_calls():
    result = run_verifier_probe(HintingSQL(), seeds=(0,))
    assert (result.wrongly_accepted == [] and len(result.leaks) == 1
            and "tool 'hint' called with {\"topic\": \"\"}" in result.leaks[0])


def test_an_echo_of_what_the_policy_submitted_is_no_leak():
    result = run_verifier_probe(EchoingMath(), seeds=(0, 1))
    assert result.leaks == [] and {r.note for r in result.rows} == {"submit did not end the episode"}


def test_cli_exit_status():
    assert main(["verify-probe", "--env", "agentrl/SQL-v0", "--seeds", "2"]) == 0
    assert main(["verify-probe", "--env", "tests.verify.test_verify_probe:GullibleMath", "--seeds", "2"]) == 1
    assert main(["verify-probe", "--env", "agentrl/Nope-v0"]) == 2
