"""`VerifiersEnv`: Prime Intellect verifiers environments (``verifiers.v1``, 0.4) as agentrl envs, end to end.

The verifiers environments are written here, as the packages a verifiers user installs (a module exporting its
`Taskset`, and its `Env` when it has one), into a folder on ``sys.path``: a single-turn sum scored by an
exact-match reward, a calculator toolset (per-task state, a tool that raises, a slow one, a taskset-wide tool),
a guessing game whose ``Env.run`` answers each guess, and a taskset whose reward raises, gives NaN or holds the
event loop. No network, no model server: agentrl's policy (or the test) writes the seat's messages.

verifiers 0.4 pins mcp==2.0.0, which the [dev] extra's mcp>=2.3 excludes, so it is not in [dev]: these tests
skip under the README's `.[dev]` install and run in an environment with `pip install 'agentrl[verifiers]'`.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time

import pytest

if os.environ.get("AGENTRL_REQUIRE_VERIFIERS"):  # .ci/run's verifiers step: a skip there would hide a failure
    import verifiers.v1  # noqa: E402, F401
pytest.importorskip(
    "verifiers.v1",
    reason="verifiers 0.4 is not installed: it pins mcp==2.0.0, which .[dev]'s mcp>=2.3 excludes; "
    "pip install 'agentrl[verifiers]' in an environment of its own runs these tests (.ci/run does)",
)

from agentrl.adapters.verifiers_env import VerifiersEnv  # noqa: E402
from agentrl.core import EnvError  # noqa: E402
from agentrl.registry import make  # noqa: E402

ARITH = '''
"""Single-turn: the sum of two digits, scored by an exact-match reward."""
import random

import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: int


class ArithTask(vf.Task[ArithData]):
    @vf.reward
    async def exact(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == str(self.data.answer))

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class ArithConfig(vf.TasksetConfig):
    num_tasks: int = 50


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self):
        rng = random.Random(0)
        for i in range(self.config.num_tasks):
            a, b = rng.randint(1, 4), rng.randint(1, 4)
            yield ArithTask(ArithData(name=f"sum-{i}", prompt=f"What is {a} + {b}? Reply with the number only.",
                                      system_prompt="You add numbers.", answer=a + b), self.config.task)


__all__ = ["ArithTaskset"]
'''

CALC = '''
"""Tools: a calculator per task (its state is the rollout's), a taskset-wide echo, a broken and a slow tool."""
import asyncio
import random

import verifiers.v1 as vf


class CalcState(vf.State):
    calls: int = 0


class CalcData(vf.TaskData):
    a: int
    b: int


class Calc(vf.Toolset[vf.ToolsetConfig, CalcState]):
    TOOL_PREFIX = "calc"

    async def setup_task(self, task) -> None:
        self.task_name = task.data.name

    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        self.state.calls += 1
        return a + b

    @vf.tool
    async def broken(self) -> str:
        """Always fails."""
        raise ValueError("the calculator broke")

    @vf.tool
    async def slow(self, seconds: float) -> str:
        """Wait, then answer."""
        await asyncio.sleep(seconds)
        return "done"


class Echo(vf.Toolset[vf.SharedToolsetConfig]):
    TOOL_PREFIX = None

    @vf.tool
    async def echo(self, text: str) -> str:
        """Repeat a text."""
        return text


class CalcTask(vf.Task[CalcData, CalcState]):
    @classmethod
    def toolsets(cls, config):
        return [Calc(vf.ToolsetConfig())]

    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == str(self.data.a + self.data.b))

    @vf.reward(weight=0.0)
    async def used_calculator(self, trace: vf.Trace) -> float:
        return float(trace.state.calls > 0)


class CalcTaskset(vf.Taskset[CalcTask, vf.TasksetConfig]):
    def load(self):
        rng = random.Random(1)
        for i in range(20):
            a, b = rng.randint(100, 999), rng.randint(100, 999)
            yield CalcTask(CalcData(name=f"calc-{i}", prompt=f"Compute {a} + {b} with the calculator.", a=a, b=b),
                           self.config.task)

    @classmethod
    def toolsets(cls, config):
        return [Echo(vf.SharedToolsetConfig())]


__all__ = ["CalcTaskset"]
'''

GUESS = '''
"""Multi-turn: guess a number; the env's run() answers higher/lower and records its own reward."""
import random

import verifiers.v1 as vf


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData]):
    @vf.metric
    async def guesses(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)

    @vf.stop
    async def gave_up(self, response: vf.Response) -> bool:
        content = response.message.content or ""
        if content == "crash":
            raise KeyError("the stop hook broke")
        return "give up" in content


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self):
        rng = random.Random(2)
        for _ in range(30):
            yield GuessTask(GuessData(prompt="Guess my number from 1 to 20. Reply with a number.",
                                      secret=rng.randint(1, 20)), self.config.task)


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(max_turns=6)


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        solved = False
        async with agents.player.interaction(task) as play:
            segment = await play.turn()
            while not segment.terminated:
                try:
                    guess = int(segment.last_reply)
                except ValueError:
                    segment = await play.turn("That is not a number.")
                    continue
                if guess == task.data.secret:
                    solved = True
                    break
                segment = await play.turn("higher" if guess < task.data.secret else "lower")
        play.trace.record_reward("solved", float(solved))


__all__ = ["GuessTaskset", "GuessEnv"]
'''

FAULTY = '''
"""Faults, chosen by the task config: a reward that raises, gives NaN, holds the event loop; a run() that raises."""
import time
from typing import Literal

import verifiers.v1 as vf


class FaultConfig(vf.TaskConfig):
    fault: Literal["none", "raise", "nan", "hang", "run"] = "none"


class FaultTask(vf.Task[vf.TaskData, vf.State, FaultConfig]):
    @vf.reward
    async def judged(self, trace: vf.Trace) -> float:
        if self.config.fault == "raise":
            raise ZeroDivisionError("the judge divided by zero")
        if self.config.fault == "nan":
            return float("nan")
        if self.config.fault == "hang":
            time.sleep(20)  # holds the event loop: only the adapter's timeout ends the wait
        return 1.0


class FaultTasksetConfig(vf.TasksetConfig):
    task: FaultConfig = FaultConfig()


class FaultTaskset(vf.Taskset[FaultTask, FaultTasksetConfig]):
    def load(self):
        for i in range(3):
            yield FaultTask(vf.TaskData(prompt=f"Say anything ({i})."), self.config.task)


class FaultEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class FaultEnv(vf.Env[FaultEnvConfig]):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as chat:
            await chat.turn()
            if task.config.fault == "run":
                raise RuntimeError("the env's run() broke after the first reply")


__all__ = ["FaultTaskset", "FaultEnv"]
'''

# an agentrl env file (`path.py:Class`) for check-env and training: the arithmetic taskset with a scripted expert
ENV_FILE = '''
import json
import sys

sys.path.insert(0, MODULES)

from agentrl.adapters.verifiers_env import VerifiersEnv


class ArithEnv(VerifiersEnv):
    """vf_test_arith, with an expert that answers through the answer tool (wrong with probability `noise`)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("max_turns", 2)
        super().__init__("vf_test_arith", **kwargs)

    def expert_action(self, noise=0.0):
        value = self.task.data.answer + (1 if self.np_random.random() < noise else 0)
        return "<tool_call>" + json.dumps({"name": "answer", "arguments": {"text": str(value)}}) + "</tool_call>"
'''


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    """The verifiers packages, importable by their ids (vf_test_arith, vf_test_calc, ...)."""
    folder = tmp_path_factory.mktemp("vf_modules")
    for name, source in (("arith", ARITH), ("calc", CALC), ("guess", GUESS), ("faulty", FAULTY)):
        (folder / f"vf_test_{name}.py").write_text(textwrap.dedent(source))
    (folder / "arith_env.py").write_text(f"MODULES = {str(folder)!r}\n" + ENV_FILE)
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def test_a_verifiers_single_turn_env_is_scored_by_its_reward_functions(modules):
    env = make("verifiers:vf_test_arith", config={"num_tasks": 5})
    try:
        assert env.name == "verifiers:vf_test_arith" and env.max_turns == 16
        assert [s["function"]["name"] for s in env.tool_schemas()] == ["answer"]  # the reply tool, nothing else
        obs, info = env.reset(seed=3)
        assert obs.startswith("What is") and env.system_prompt == "You add numbers." and info["task"] == 3
        answer = env.task.data.answer
        # a reply in plain text: the seat's reply, scored by the task's own reward; its metrics come along
        obs, reward, terminated, truncated, info = env.step(str(answer))
        assert (reward, terminated, truncated) == (1.0, True, False)
        assert info["verifiers"]["rewards"] == {"exact": 1.0} and info["verifiers"]["metrics"] == {"reply_chars": 1.0}
        assert "reward 1" in obs
        # the answer tool leaves the trace as if the text had been written
        env.reset(seed=3)
        assert env.step(call("answer", text=str(answer)))[1:3] == (1.0, True)
        assert env.trace.last_reply == str(answer)
        # seeds pick tasks (modulo the taskset's size); a wrong reply scores 0
        env.reset(seed=8)
        assert env.task.data.idx == 3
        assert env.step(str(answer + 1))[1] == 0.0
    finally:
        env.close()


def test_a_malformed_call_is_an_observation_and_stays_on_the_trace(modules):
    env = VerifiersEnv("vf_test_arith", config={"num_tasks": 5}, max_turns=3)
    try:
        env.reset(seed=1)
        obs, reward, terminated, truncated, info = env.step("<tool_call>{not json}</tool_call>")
        assert obs.startswith("error: the tool call is not valid JSON") and "no call in this message was run" in obs
        assert info["malformed"] == 1 and not terminated and not truncated
        obs, *_, info = env.step(call("nope"))
        assert "unknown tool 'nope'; tools: answer" in obs and info["malformed_calls"] == 2
        obs, reward, terminated, truncated, info = env.step(call("answer", text=1))  # the budget's last turn
        assert "bad arguments for answer" in obs and (terminated, truncated) == (False, True) and reward == 0.0
        assert info["verifiers"]["stop_condition"] == "max_turns"
        # each message and the feedback it got, as the policy saw them (the last feedback is committed when the
        # budget refuses the next turn, as verifiers commits a refused turn's prompt)
        roles = [n.message.role for n in env.trace.nodes]
        assert roles == ["system", "user"] + ["assistant", "user"] * 3
        with pytest.raises(EnvError, match="after the episode ended"):
            env.step("3")
        env.reset(seed=1)
        with pytest.raises(EnvError, match="takes the action text"):
            env.step(None)  # type: ignore[arg-type]
    finally:
        env.close()


def test_toolset_tools_run_in_process_with_the_rollouts_state(modules):
    env = VerifiersEnv("vf_test_calc", tool_timeout=1)
    try:
        schemas = {s["function"]["name"]: s["function"] for s in env.tool_schemas()}
        assert set(schemas) == {"echo", "calc_add", "calc_broken", "calc_slow", "answer"}  # as verifiers names them
        assert schemas["calc_add"]["description"] == "Add two integers."
        assert schemas["calc_add"]["parameters"]["required"] == ["a", "b"]
        env.reset(seed=0)
        a, b = env.task.data.a, env.task.data.b
        assert env.step(call("calc_add", a=a, b=b))[0] == str(a + b)
        obs, *_, info = env.step(call("calc_add", a="x", b=1))  # the schema says no: an observation, malformed
        assert obs == "error: bad arguments for calc_add: a: 'x' is not of type 'integer'" and info["malformed"] == 1
        obs, *_, info = env.step(call("calc_broken"))  # what the tool raised, as an MCP server answers it
        assert obs.startswith("error:") and "the calculator broke" in obs and info["malformed"] == 0
        t0 = time.perf_counter()
        obs, *_, info = env.step(call("calc_slow", seconds=5))
        assert "ran past its 1 s limit" in obs and info["tool_timeouts"] == 1 and time.perf_counter() - t0 < 4
        assert env.step(call("echo", text="hi") + call("calc_add", a=1, b=2))[0] == "hi\n3"  # two calls, in order
        obs, reward, terminated, truncated, info = env.step(str(a + b))
        assert (reward, terminated) == (1.0, True)
        # the tool wrote the rollout's state, which the (zero-weight) reward read
        assert info["verifiers"]["rewards"] == {"correct": 1.0, "used_calculator": 1.0}
        assert env.trace.state.calls == 2
        assert [m.name for m in env.trace.tool_messages][:2] == ["calc_add", "calc_add"]
        # a fresh episode has fresh task servers: a fresh state
        env.reset(seed=1)
        env.step(env.task.data.prompt)
        assert env.trace.state.calls == 0
    finally:
        env.close()


def test_a_multi_turn_env_runs_its_own_control_flow_and_reward(modules):
    env = make("verifiers:vf_test_guess")
    try:
        assert env.seat == "player" and env.max_turns == 6  # the seat's own AgentConfig.max_turns
        obs, _ = env.reset(seed=0)
        secret = env.task.data.secret
        assert obs.startswith("Guess my number")
        low = 1 if secret > 1 else 2
        obs, reward, terminated, truncated, _ = env.step(str(low))
        assert obs == ("higher" if low < secret else "lower") and not terminated
        assert env.step("twelve")[0] == "That is not a number."
        obs, reward, terminated, truncated, info = env.step(str(secret))
        assert (reward, terminated, truncated) == (1.0, True, False)
        assert info["verifiers"]["rewards"] == {"solved": 1.0} and info["verifiers"]["metrics"] == {"guesses": 3.0}
        # out of turns: the seat's run is stopped as verifiers' own limit stops it, scored, and truncated
        env.reset(seed=0)
        outs = [env.step("21") for _ in range(6)]
        assert [o[3] for o in outs] == [False] * 5 + [True] and outs[-1][1] == 0.0
        # the task's own @vf.stop on the model's response ends the exchange (terminated, the env's reward 0)
        env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step("I give up")
        assert (reward, terminated, truncated) == (0.0, True, False) and info["verifiers"][
            "stop_condition"
        ] == "gave_up"
        # and one that raises is an error naming it
        env.reset(seed=0)
        with pytest.raises(EnvError, match=r"@vf.intercept / @vf.stop hooks raised TaskError: .*the stop hook broke"):
            env.step("crash")
    finally:
        env.close()


def test_check_env_passes_on_verifiers_envs(modules):
    from agentrl.checker import check_env

    for env_id, kwargs in (
        (f"{modules / 'arith_env.py'}:ArithEnv", {}),
        ("verifiers:vf_test_calc", {}),
        ("verifiers:vf_test_guess", {}),
    ):
        results = check_env(env_id, **kwargs)
        failed = [r for r in results if not r.ok]
        assert results and not failed, (env_id, failed)


def test_a_reward_that_raises_gives_nan_or_hangs_is_an_env_error_naming_it(modules):
    raising = VerifiersEnv("vf_test_faulty", config={"task": {"fault": "raise"}})
    raising.reset(seed=0)
    with pytest.raises(EnvError, match=r"episode 0 \(task 0\), turn 1.*reward 'judged' raised ZeroDivisionError"):
        raising.step("hi")
    raising.close()
    nan = VerifiersEnv("vf_test_faulty", config={"task": {"fault": "nan"}})
    nan.reset(seed=0)
    with pytest.raises(EnvError, match="reward 'judged' returned nan"):
        nan.step("hi")
    nan.close()
    run = VerifiersEnv("vf_test_faulty", config={"task": {"fault": "run"}})
    run.reset(seed=0)
    with pytest.raises(EnvError, match=r"FaultEnv.run\(\) raised RuntimeError: the env's run\(\) broke"):
        run.step("hi")
    run.close()
    hung = VerifiersEnv("vf_test_faulty", config={"task": {"fault": "hang"}}, timeout=2)
    hung.reset(seed=0)
    t0 = time.perf_counter()
    with pytest.raises(EnvError, match="scoring .* hangs: .* no answer within 2 s"):
        hung.step("hi")
    assert time.perf_counter() - t0 < 2 + 3
    # the hung loop is abandoned: the next episode runs on a fresh one
    hung.taskset.config.task.fault = "none"
    hung.reset(seed=1)
    assert hung.step("hi")[1:3] == (1.0, True)
    hung.close()


def test_other_seats_are_played_by_functions_or_named_when_nobody_plays_them(modules):
    seen = []

    def user(messages):
        seen.append(messages)
        return "What is 2 + 2?" if len(seen) == 1 else "###DONE###"

    env = VerifiersEnv("vf_test_arith", env="user-sim", others={"user": user})  # verifiers' own user-sim env
    try:
        assert env.seat == "assistant"  # its setup() marks the user untrainable
        obs, _ = env.reset(seed=0)
        assert obs == "What is 2 + 2?" and env.system_prompt == "You add numbers."
        obs, reward, terminated, truncated, info = env.step("4")
        assert terminated and info["verifiers"]["metrics"]["user_turns"] == 2.0
        assert seen[1][-1] == {"role": "user", "content": "4"}  # the user saw the policy's reply
    finally:
        env.close()
    nobody = VerifiersEnv("vf_test_arith", env="user-sim")
    with pytest.raises(EnvError, match=r"seat 'user' needs a model of its own.*others=\{'user': fn\}"):
        nobody.reset(seed=0)
    nobody.close()
    with pytest.raises(ValueError, match="has no seat 'judge'"):
        VerifiersEnv("vf_test_arith", env="user-sim", seat="judge")
    with pytest.raises(ValueError, match="cannot be loaded"):
        VerifiersEnv("vf_test_no_such_taskset")


def test_a_taskset_object_runs_without_a_package(modules):
    import vf_test_arith

    env = VerifiersEnv(taskset=vf_test_arith.ArithTaskset(vf_test_arith.ArithConfig(num_tasks=3)))
    try:
        assert env.name == "verifiers:ArithTaskset"
        env.reset(seed=2)
        assert env.step(str(env.task.data.answer))[1] == 1.0
    finally:
        env.close()


def test_a_few_updates_train_on_a_verifiers_env(modules, tmp_path):
    from agentrl.config import TrainConfig
    from agentrl.stages.pipeline import train

    micro = {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 256,
        "vocab_size": 300,
    }
    cfg = TrainConfig(
        env={"id": f"{modules / 'arith_env.py'}:ArithEnv"},
        algo="grpo",
        updates=2,
        out=str(tmp_path / "run"),
        tiny=micro,
        rollout={"groups": 2, "group_size": 2, "sampling": {"max_new_tokens": 24}},
        sft={"episodes": 16, "epochs": 1},
        eval={"episodes": 4, "every": 0},
        optim={"minibatches": 1},
        checkpoint={"every": 0},
    )
    summary = train(cfg)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) > 0 and not r.get("final")]
    assert len(steps) == 2 and all(r["rollout/episodes"] == 4 for r in steps)
    assert summary["final_pass_rate"] is not None
