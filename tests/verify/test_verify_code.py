"""Code verifier on real HumanEval data: canonical solutions pass, null solutions fail."""

from __future__ import annotations

import pytest

from agentrl.verify import CodeTask, CodeVerifier, NotVerifiable, VerifierError, humaneval_tasks, verify
from agentrl.verify.code import NULL_SOLUTIONS, split_check
from agentrl.verify.sandbox import LocalSandbox, TestCase

# tasks whose tests need the trusted prompt helpers (32 poly, 38/50 encoders), loops, floats, tuples
SUBSET = [
    "HumanEval/0",
    "HumanEval/2",
    "HumanEval/10",
    "HumanEval/32",
    "HumanEval/38",
    "HumanEval/50",
    "HumanEval/53",
    "HumanEval/107",
    "HumanEval/151",
    "HumanEval/163",
]


@pytest.fixture(scope="module")
def tasks() -> dict[str, CodeTask]:
    return {t.task_id: t for t in humaneval_tasks()}


def test_humaneval_loads_all_164_with_tests(tasks):
    assert len(tasks) == 164
    assert all(any(not c.setup for c in t.tests) and t.solution for t in tasks.values())


def test_canonical_subset_scores_one_and_nulls_score_zero(tasks):
    subset = [tasks[i] for i in SUBSET]
    v = CodeVerifier()
    answers = [t.solution for t in subset] + [body for _ in subset for body in NULL_SOLUTIONS.values()]
    jobs = subset + [t for t in subset for _ in NULL_SOLUTIONS]
    verdicts = v.verify_many(jobs, answers, workers=3)
    good, null = verdicts[: len(subset)], verdicts[len(subset) :]
    assert [v.score for v in good] == [1.0] * len(subset), [v.reason for v in good]
    assert [v.score for v in null] == [0.0] * len(null)


def test_wrong_solution_fails_with_a_reason(tasks):
    t = tasks["HumanEval/0"]
    v = CodeVerifier()(t, t.solution.replace("return True", "return False"))
    assert v.score == 0.0 and "tests passed; first failure" in v.reason


def test_partial_credit_counts_tests():
    task = CodeTask(
        "t", 'def f(x):\n    "f"\n', "f", (TestCase("a", "assert f(1) == 1"), TestCase("b", "assert f(2) == 4"))
    )
    assert CodeVerifier(partial_credit=True)(task, "    return x").score == 0.5
    assert CodeVerifier()(task, "    return x").score == 0.0


def test_split_check_keeps_setup_and_drops_constant_asserts():
    pre, cases = split_check(
        "M = 1\ndef check(candidate):\n    import math\n    assert True\n    for i in range(3):\n "
        "       assert candidate(i) == i\n"
    )
    assert pre.strip() == "M = 1"
    assert [(c.setup, c.code.splitlines()[0]) for c in cases] == [(True, "import math"), (False, "for i in range(3):")]


def test_sandbox_failure_is_an_error_not_a_zero(tasks):
    v = CodeVerifier(LocalSandbox(python="/nonexistent/python3"))
    with pytest.raises(VerifierError, match="HumanEval/0.*could not start"):
        v(tasks["HumanEval/0"], tasks["HumanEval/0"].solution)


def test_unknown_kind_is_not_verifiable():
    with pytest.raises(NotVerifiable, match="kind 'chess'"):
        verify({"kind": "chess"}, "e4")


@pytest.mark.slow
def test_all_164_canonical_pass_and_nulls_fail(tasks, request):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("slow (about a minute on 2 cores): run with -m slow, or benchmarks/humaneval_verify.py")
    ts = list(tasks.values())
    v = CodeVerifier()
    assert all(x.score == 1.0 for x in v.verify_many(ts, [t.solution for t in ts], workers=4))
    for body in NULL_SOLUTIONS.values():
        assert all(x.score == 0.0 for x in v.verify_many(ts, [body] * len(ts), workers=4))


# the two forged messages; the reply pipe is not named in argv any more, so the first
# writes to every descriptor it holds (a candidate can always find its own pipe)
FORGED_5 = (
    "import os, struct\nfor fd in range(3, 64):\n    try:\n        os.write(fd, struct.pack('>I', 1) + b'5')\n"
    "    except OSError:\n        pass\n"
)
NESTED = (
    "import os, struct\nm = b'[' * 100_000\nfor fd in range(3, 64):\n    try:\n        os.write(fd, "
    "struct.pack('>I', len(m)) + m)\n    except OSError:\n        pass\n"
)


@pytest.mark.parametrize("attack", [FORGED_5, NESTED], ids=["forged frame", "100,000 nested ["])
def test_forged_messages_score_zero_as_protocol_violations(tasks, attack):
    t = tasks["HumanEval/0"]
    # the canonical solution after the attack: it would pass every test if the forgery were ignored
    answer = t.solution + "\n" + attack
    v = CodeVerifier()(t, answer)
    assert v.score == 0.0 and v.reason.startswith("protocol violation"), v.reason
    assert CodeVerifier(partial_credit=True)(t, answer).score == 0.0


def test_a_code_episode_goes_on_after_a_forged_message():
    """Inside Code-v0 the forgery is the policy's failure (score 0), not an EnvError that stops training."""
    import json

    import agentrl

    env = agentrl.make("agentrl/Code-v0")

    def call(name, code):
        return f"<tool_call>{json.dumps({'name': name, 'arguments': {'code': code}})}</tool_call>"

    for attack in (FORGED_5, NESTED):
        env.reset(seed=0)
        obs, reward, terminated, truncated, _ = env.step(call("run_tests", env.task.solution + "\n" + attack))
        assert "protocol violation" in obs and not terminated
        obs, reward, terminated, truncated, _ = env.step(call("submit", env.task.solution + "\n" + attack))
        assert terminated and reward == 0.0
    env.reset(seed=0)  # and the next episode is judged as usual
    _, reward, terminated, *_ = env.step(call("submit", env.task.solution))
    assert terminated and reward == 1.0
