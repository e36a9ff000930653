"""The AgentEnv contract: tool calls, malformed calls as counted observations, errors, budgets."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from agentrl.core import AgentEnv, EnvError, Tool, parse_tool_calls


def call(name: str, **args) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


class Submit(BaseModel):
    """Submit an answer."""

    answer: int

    def __call__(self, env: Counter) -> str:
        env.answer = self.answer
        env.finish()
        return f"submitted {self.answer}"


class Counter(AgentEnv):
    max_turns = 3

    def add(self, x: int) -> str:
        """Add x to the counter."""
        self.total += x
        self.add_step_reward(0.1)
        return f"total {self.total}"

    def boom(self) -> str:
        """A tool with a bug."""
        raise ZeroDivisionError("division by zero")

    tools = [add, boom, Submit]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.total, self.answer = 0, None
        return "Count to 3, then submit.", {}

    def verify(self) -> float:
        return float(self.answer == 3 and self.total == 3)


class BrokenVerifier(Counter):
    def verify(self) -> float:
        raise KeyError("gold answer missing")


def test_tool_schemas_from_functions_and_models():
    env = Counter()
    names = [s["function"]["name"] for s in env.tool_schemas()]
    assert names == ["add", "boom", "submit"]
    params = env.tool_schemas()[2]["function"]["parameters"]
    assert params["properties"] == {"answer": {"type": "integer"}} and params["required"] == ["answer"]


def test_tools_run_and_verifier_rewards_at_the_end():
    env = Counter()
    env.reset(seed=0)
    obs, r, term, trunc, info = env.step(call("add", x=3))
    assert (obs, r, term, trunc, info["step_reward"]) == ("total 3", 0.0, False, False, 0.1)
    obs, r, term, trunc, info = env.step(call("submit", answer=3))
    assert (obs, r, term, trunc) == ("submitted 3", 1.0, True, False)


@pytest.mark.parametrize(
    "action, needle",
    [
        ("I think the answer is 3", "no tool call found"),
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "mul", "arguments": {}}</tool_call>', "unknown tool 'mul'"),
        ('<tool_call>{"name": "add", "arguments": {"x": "three"}}</tool_call>', "bad arguments for add: x:"),
        ('<tool_call>{"name": "add", "arguments": {"y": 1}}</tool_call>', "x: Field required"),
        ('<tool_call>{"name": "add", "arguments": [1]}</tool_call>', '"arguments" must be a JSON object'),
        ('<tool_call>{"name": "add", "arguments": {"x": 1}}', "never closed"),
    ],
)
def test_malformed_call_is_a_counted_observation(action, needle):
    env = Counter()
    env.reset(seed=0)
    obs, r, term, trunc, info = env.step(action)
    assert needle in obs
    assert info["malformed"] == 1 and info["malformed_calls"] == 1
    assert not term and not trunc and r == 0.0
    _, _, _, _, info = env.step(action)
    assert info["malformed_calls"] == 2  # counted over the episode


@pytest.mark.parametrize(
    "action, needle",
    [
        # 1,000 deep: json raises RecursionError or decodes a list, by how deep the caller's stack already is
        ("<tool_call>" + "[" * 1000 + "]" * 1000 + "</tool_call>", "error"),
        ("<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>", "nested too deeply"),  # always RecursionError
        # int() limit
        ('<tool_call>{"name": "add", "arguments": {"x": ' + "7" * 4301 + "}}</tool_call>", "number too long"),
        ('<tool_call>{"name": "add", "arguments": "' + "[" * 5000 + '"}</tool_call>',
         '"arguments" must be a JSON object'),
        ('<tool_call>{"name": "add", "arguments": {"' + "k" * 10_000 + '": 1}}</tool_call>', "more characters"),
    ],
    ids=["nested-1000-deep", "nested-100000-deep", "int-of-4301-digits", "arguments-string-nested-5000-deep",
         "key-of-10000-characters"],
)
def test_inputs_that_crash_a_json_decoder_are_counted_observations(action, needle):
    env = Counter()
    env.reset(seed=0)
    obs, r, term, trunc, info = env.step(action)
    assert needle in obs and len(obs) < 1000  # the policy's own text is not echoed back whole
    assert info["malformed"] == 1 and info["malformed_calls"] == 1 and not term


def test_an_unclosed_call_after_a_closed_one_is_run_counted_and_explained():
    env = Counter()
    env.reset(seed=0)
    obs, _, term, _, info = env.step(call("add", x=1) + ' <tool_call>{"name": "add", "arguments": {"x": 1}}')
    assert obs.splitlines() == ["total 1", "error: a <tool_call> was opened but never closed with </tool_call>"]
    assert env.total == 1 and info["malformed"] == 1 and not term


def test_malformed_calls_after_the_ending_call_are_counted_but_nothing_more_runs():
    env = Counter()
    env.reset(seed=0)
    action = (call("add", x=3) + call("submit", answer=3) + call("add", x=9) + call("add", x="nine") + call("mul")
              + call("boom"))
    obs, r, term, _, info = env.step(action)
    assert term and r == 1.0 and env.total == 3  # add(9) and boom() were not run
    assert info["malformed"] == 2  # add("nine") and the unknown mul
    assert obs.splitlines() == ["total 3", "submitted 3", "(4 call(s) after the one that ended the episode were not "
                                "run)"]


def test_turn_budget_truncates_never_terminates():
    env = Counter()
    env.reset(seed=0)
    for _ in range(2):
        assert env.step(call("add", x=1))[3] is False
    obs, r, term, trunc, _ = env.step(call("add", x=1))
    assert trunc and not term and r == 0.0  # verifier still judged: no submission


def test_raising_tool_names_env_episode_and_turn():
    env = Counter()
    env.reset(seed=0)
    env.reset(seed=1)  # episode 1
    env.step(call("add", x=1))
    with pytest.raises(EnvError, match=r"env Counter, episode 1, turn 2: tool 'boom' raised ZeroDivisionError: "
                       r"division by zero"):
        env.step(call("boom"))


def test_raising_verifier_is_an_error_not_a_zero():
    env = BrokenVerifier()
    env.reset(seed=0)
    with pytest.raises(EnvError, match=r"episode 0, turn 1: verify\(\) raised KeyError"):
        env.step(call("submit", answer=3))


def test_parse_tool_calls_accepts_arguments_as_json_string():
    (c,) = parse_tool_calls('<tool_call>{"name": "add", "arguments": "{\\"x\\": 2}"}</tool_call>')
    assert c.arguments == {"x": 2} and c.error is None


def test_tool_needs_annotations():
    def f(x):
        return x

    with pytest.raises(TypeError, match="needs a type annotation"):
        Tool.from_callable(f)


def test_gymnasium_make_returns_the_bare_env_that_agentrl_make_builds():
    import gymnasium as gym

    import agentrl.envs  # noqa: F401  (registers the built-in ids)
    from agentrl.envs.vault import VaultEnv

    env = gym.make("agentrl/Vault-v0", locks=2)
    assert type(env) is VaultEnv and env.locks == 2 and env.spec.id == "agentrl/Vault-v0"
    assert type(agentrl.make("agentrl/Vault-v0", locks=2)) is VaultEnv
    gym.register(id="agentrl-test/Wrapped-v0", entry_point="agentrl.envs.vault:VaultEnv")  # checker + order wrappers
    try:
        with pytest.raises(TypeError, match="registered with gymnasium wrappers"):
            agentrl.make("agentrl-test/Wrapped-v0")
    finally:
        del gym.registry["agentrl-test/Wrapped-v0"]
