"""Prime Intellect verifiers environments (``verifiers.v1``, 0.4) trained through the gateway, end to end.

The verifiers environments are written here, as the packages a verifiers user installs (a module exporting its
`Taskset`, and its `Env` when it has one; a `Toolset` in a module of its own that serves it when run), into a
folder on ``sys.path`` and ``PYTHONPATH`` (verifiers starts tool servers as processes): a single-turn sum scored
by an exact-match reward, a calculator toolset (per-rollout state, a tool that raises, a taskset-wide tool), a
guessing game whose ``Env.run`` answers each guess, and a taskset whose reward raises, gives NaN or outlives its
deadline. Each episode is verifiers' own: its harness program calls a real gateway, whose engine here is a
script reading the conversation it was given (`Reader`). No network, no model server.

verifiers 0.4 pins mcp==2.0.0, which the [dev] extra's mcp>=2.3 excludes, so it is not in [dev]: these tests
skip under the README's `.[dev]` install and run in an environment with `pip install 'agentrl[verifiers]'`.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap

import pytest

if os.environ.get("AGENTRL_REQUIRE_VERIFIERS"):  # .ci/run's verifiers step: a skip there would hide a failure
    import verifiers.v1  # noqa: E402, F401
pytest.importorskip(
    "verifiers.v1",
    reason="verifiers 0.4 is not installed: it pins mcp==2.0.0, which .[dev]'s mcp>=2.3 excludes; "
    "pip install 'agentrl[verifiers]' in an environment of its own runs these tests (.ci/run does)",
)
pytest.importorskip("starlette", reason="the gateway needs starlette and uvicorn (pip install 'agentrl[gateway]')")

from agentrl.adapters.verifiers_env import VerifiersAgent  # noqa: E402
from agentrl.config import AgentConfig, GatewayConfig, TinyModelConfig  # noqa: E402
from agentrl.engines.base import Generation  # noqa: E402
from agentrl.gateway import Agent, AgentRunner, Gateway  # noqa: E402
from agentrl.gateway.server import Server, build_app  # noqa: E402
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

CALC_TOOLS = '''
"""The calculator a task's rollout gets (its state is the rollout's): served as a process when run."""
import verifiers.v1 as vf


class CalcState(vf.State):
    calls: int = 0


class Calc(vf.Toolset[vf.ToolsetConfig, CalcState]):
    TOOL_PREFIX = "calc"

    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        self.state.calls += 1
        return a + b

    @vf.tool
    async def broken(self) -> str:
        """Always fails."""
        raise ValueError("the calculator broke")


if __name__ == "__main__":
    Calc.run()
'''

ECHO_TOOLS = '''
"""A taskset-wide tool, one server for every rollout."""
import verifiers.v1 as vf


class Echo(vf.Toolset[vf.SharedToolsetConfig]):
    TOOL_PREFIX = None

    @vf.tool
    async def echo(self, text: str) -> str:
        """Repeat a text."""
        return text


if __name__ == "__main__":
    Echo.run()
'''

CALC = '''
"""Tools: a calculator per task, a taskset-wide echo."""
import random

import verifiers.v1 as vf
from vf_test_calc_tools import Calc, CalcState
from vf_test_echo import Echo


class CalcData(vf.TaskData):
    a: int
    b: int


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
"""Faults, chosen by the task config: a reward that raises, gives NaN, outlives its deadline; a run() that raises."""
import asyncio
from typing import Literal

import verifiers.v1 as vf


class FaultConfig(vf.TaskConfig):
    fault: Literal["none", "raise", "nan", "slow", "run"] = "none"


class FaultTask(vf.Task[vf.TaskData, vf.State, FaultConfig]):
    @vf.reward
    async def judged(self, trace: vf.Trace) -> float:
        if self.config.fault == "raise":
            raise ZeroDivisionError("the judge divided by zero")
        if self.config.fault == "nan":
            return float("nan")
        if self.config.fault == "slow":
            await asyncio.sleep(20)
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

# what `agentrl train --agent agentrl.adapters.verifiers_env:solve --agent.tasks vf_agents.py:<name>` reads
AGENTS = '''
from agentrl.adapters.verifiers_env import VerifiersAgent

arith = VerifiersAgent("vf_test_arith", config={"num_tasks": 5}).tasks
train_arith = VerifiersAgent("vf_test_arith", max_turns=2).tasks
calc = VerifiersAgent("vf_test_calc").tasks
guess = VerifiersAgent("vf_test_guess").tasks
faults = [VerifiersAgent("vf_test_faulty", config={"task": {"fault": f}}, score_timeout=2)
          for f in ("raise", "nan", "run", "slow", "none")]


def faulty(seed):  # seed k: the k-th fault's env (one rollout for all of them)
    return faults[seed % len(faults)].tasks(0)
'''

MICRO = TinyModelConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=1, max_position_embeddings=512, vocab_size=400)


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    """The verifiers packages, importable by their ids (vf_test_arith, ...), here and in the processes verifiers
    starts (its tool servers run ``python -m <module>``)."""
    folder = tmp_path_factory.mktemp("vf_modules")
    for name, source in (("arith", ARITH), ("calc_tools", CALC_TOOLS), ("echo", ECHO_TOOLS), ("calc", CALC),
                         ("guess", GUESS), ("faulty", FAULTY)):
        (folder / f"vf_test_{name}.py").write_text(textwrap.dedent(source))
    (folder / "vf_agents.py").write_text(textwrap.dedent(AGENTS))
    sys.path.insert(0, str(folder))
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(folder), *([old] if old else [])])
    yield folder
    sys.path.remove(str(folder))
    if old is None:
        os.environ.pop("PYTHONPATH")
    else:
        os.environ["PYTHONPATH"] = old


def demos(n: int = 40) -> list[dict]:
    """Conversations of the sum task in OpenAI's format: the tiny policy's tokenizer, and its warm start."""
    import random

    rng = random.Random(5)
    out = []
    for _ in range(n):
        a, b = rng.randint(1, 4), rng.randint(1, 4)
        out.append({"messages": [{"role": "system", "content": "You add numbers."},
                                 {"role": "user", "content": f"What is {a} + {b}? Reply with the number only."},
                                 {"role": "assistant", "content": str(a + b)}]})
    return out


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    from agentrl.policy import Policy
    from agentrl.stages.data import load_conversations
    from agentrl.stages.sft import tiny_policy_from_conversations

    folder = tmp_path_factory.mktemp("vf_policy")
    (folder / "demos.jsonl").write_text("".join(json.dumps(d) + "\n" for d in demos()))
    convs = [c for _, c in load_conversations(folder / "demos.jsonl")]
    tiny_policy_from_conversations(convs, folder / "model", MICRO, seed=0)
    return Policy.load(folder / "model").chat


class Reader:
    """An engine whose action for a row is `policy(row, messages)`, where messages are the (role, text) pairs of
    the context the gateway gave that row, read back from its ids."""

    def __init__(self, chat, policy):
        self.chat, self.policy, self.sampling = chat, policy, None

    def open(self, prompts):
        engine = self

        class Session:
            turn_level = True

            def __init__(self):
                self.ids, self.started = {}, []

            def add(self, rows, prompts):
                self.ids.update({r: list(p) for r, p in zip(rows, prompts)})

            def extend(self, chunks, rows=None):
                for r, c in zip(rows, chunks):
                    self.ids[r] += list(c)

            def drop(self, rows):
                for r in rows:
                    self.ids.pop(r, None)

            def start(self, rows):
                self.started += list(rows)

            def collect(self):
                out = []
                for r in self.started:
                    text = engine.chat.tokenizer.decode(self.ids[r], skip_special_tokens=False)
                    said = re.findall(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", text, re.S)
                    ids = engine.chat.action_ids(engine.policy(r, said))
                    self.ids[r] += ids
                    out.append((r, Generation(ids, [-0.5] * len(ids), "eos")))
                self.started = []
                return out

        return Session()


def roll(chat, modules, tasks: str, policy, seeds, max_context=8192):
    """Episodes of `seeds` through a real gateway: the in-process runner on ``verifiers_env:solve`` and the
    task source `tasks` (a function of vf_agents.py), the engine a `Reader` of `policy`."""
    agent = Agent(AgentConfig(entry="agentrl.adapters.verifiers_env:solve", tasks=f"{modules / 'vf_agents.py'}:{tasks}",
                              gateway=GatewayConfig(batch_wait=0.0)))
    with AgentRunner(agent) as runner:
        return runner.rollout(Reader(chat, policy), chat, seeds, max_context=max_context)[0]


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def numbers(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def outcome(tasks, seed):
    return [o for o in tasks.__self__.outcomes if o.seed == seed][-1]


def test_a_single_turn_env_is_scored_by_its_own_reward_functions(chat, modules):
    def adds(row, said):  # rows 0, 1: right; row 2: wrong
        a, b = numbers(said[-1][1])[:2]
        return str(a + b + (row == 2))

    episodes = roll(chat, modules, "arith", adds, [3, 8, 4])
    import vf_agents

    agent = vf_agents.arith.__self__
    assert agent.seat == "agent" and agent.max_turns == 16  # verifiers' single-agent seat; agentrl's turn budget
    assert [e.reward for e in episodes] == [1.0, 1.0, 0.0] and all(e.terminated and not e.error for e in episodes)
    # seeds pick tasks modulo the taskset's size: 8 is task 3 again
    assert episodes[0].task_id == episodes[1].task_id == "arith:vf_test_arith/3"
    assert [e.num_turns for e in episodes] == [1, 1, 1] and episodes[0].env_id == "agent:agentrl.adapters.verifiers_env"
    text = chat.tokenizer.decode(episodes[0].prompt_ids, skip_special_tokens=False)
    assert "You add numbers." in text and "Reply with the number only." in text  # system prompt and prompt
    first = outcome(vf_agents.arith, 3)
    assert first.rewards == {"exact": 1.0} and first.metrics == {"reply_chars": 1.0}
    assert first.stop_condition == "agent_completed" and first.task.data.idx == 3
    assert outcome(vf_agents.arith, 4).rewards == {"exact": 0.0}


def test_a_malformed_call_is_read_as_verifiers_harness_reads_it_and_counted(chat, modules):
    # the gateway returns a call it cannot read as text (and counts it); verifiers' harness takes a message
    # without calls as the seat's reply, so the task scores it
    episodes = roll(chat, modules, "arith", lambda row, said: "<tool_call>{not json}</tool_call>", [1])
    assert episodes[0].malformed_calls == 1 and episodes[0].num_turns == 1 and episodes[0].reward == 0.0


def test_toolset_tools_are_offered_and_run_by_verifiers_with_the_rollouts_state(chat, modules):
    seen = {}

    def calculates(row, said):
        seen.setdefault(row, []).append(said)
        a, b = numbers(said[1][1])[:2] if said[0][0] == "system" else numbers(said[0][1])[:2]
        tool = [text for role, text in said if role == "user" and text.startswith("<tool_response>")]
        if row == 0:  # the calculator, then its answer
            return call("calc_add", a=a, b=b) if not tool else str(numbers(tool[-1])[0])
        script = [call("calc_broken"), call("calc_add", a="x", b=1), call("echo", text="hi"), str(a + b)]
        return script[len(tool)]

    episodes = roll(chat, modules, "calc", calculates, [0, 1])
    import vf_agents

    system = seen[0][0][0][1]  # the tools in the system prompt, as verifiers' harness offers them
    assert all(f"\n{name}(" in system for name in ("calc_add", "calc_broken", "echo"))
    assert "calc_add(a: integer, b: integer): Add two integers." in system
    assert [e.reward for e in episodes] == [1.0, 1.0] and [e.num_turns for e in episodes] == [2, 4]
    solved = outcome(vf_agents.calc, 0)
    assert solved.rewards == {"correct": 1.0, "used_calculator": 1.0} and solved.trace.state.calls == 1
    replies = [text for role, text in seen[1][-1] if text.startswith("<tool_response>")]
    assert "the calculator broke" in replies[0]  # what the tool raised, as its MCP server answers it
    assert "validation error" in replies[1].lower() and "'x'" in replies[1]  # the schema said no
    assert "hi" in replies[2]
    # the calculator was never called in that episode: its own state says so (fresh servers per episode)
    assert outcome(vf_agents.calc, 1).rewards == {"correct": 1.0, "used_calculator": 0.0}
    # a call past the context: verifiers' harness ends the segment, the task scores it, the episode is truncated
    fits = len(episodes[0].prompt_ids) + len(episodes[0].turns[0].action_ids) + 2
    short = roll(chat, modules, "calc", calculates, [0], max_context=fits)[0]
    assert short.truncated and not short.error and short.num_turns == 1 and short.reward == 0.0


def test_a_multi_turn_env_runs_its_own_control_flow_stops_and_reward(chat, modules):
    lows = {}

    def plays(row, said):
        if row == 0:  # bisects on the env's answers
            lo, hi = lows.setdefault(row, [1, 20])
            if said[-1][1] == "higher":
                lo = last[row] + 1
            elif said[-1][1] == "lower":
                hi = last[row] - 1
            lows[row] = [lo, hi]
            last[row] = (lo + hi) // 2
            return str(last[row])
        return {1: "21", 2: "I give up", 3: "crash"}[row]

    last: dict = {}
    episodes = roll(chat, modules, "guess", plays, [0, 0, 0, 0])
    solved, out_of_turns, gave_up, crashed = episodes
    assert solved.reward == 1.0 and solved.terminated and solved.num_turns <= 5
    import vf_agents

    scored = [o for o in vf_agents.guess.__self__.outcomes if o.reward == 1.0][-1]
    assert scored.rewards == {"solved": 1.0} and scored.metrics == {"guesses": float(solved.num_turns)}
    # out of turns: verifiers' own limit (the seat's max_turns, 6) ends the exchange; scored as it stands
    assert out_of_turns.num_turns == 6 and out_of_turns.reward == 0.0 and not out_of_turns.error
    assert any(o.stop_condition == "max_turns" for o in vf_agents.guess.__self__.outcomes)
    # the task's @vf.stop on the model's response ends the exchange (the env's reward 0)
    assert gave_up.num_turns == 1 and gave_up.reward == 0.0 and not gave_up.error, gave_up.error
    assert any(o.stop_condition == "gave_up" for o in vf_agents.guess.__self__.outcomes)
    # and one that raises is an episode error naming the env, the task and verifiers' stage
    assert re.search(r"verifiers env vf_test_guess, task 0: .*response interception failed: KeyError: 'the stop "
                     "hook broke'", crashed.error or ""), crashed.error


def test_a_reward_that_raises_gives_nan_or_outlives_its_deadline_is_an_episode_error_naming_it(chat, modules):
    episodes = roll(chat, modules, "faulty", lambda row, said: "hi", [0, 1, 2, 3, 4])
    raised, nan, run, slow, fine = (e.error or "" for e in episodes)
    assert re.search(r"verifiers env vf_test_faulty, task 0: reward 'judged' raised: .*ZeroDivisionError: the judge "
                     "divided by zero", raised), raised
    assert "verifiers env vf_test_faulty, task 0: reward 'judged' returned nan" in nan
    assert "task 0: EnvError: FaultEnv.run(): RuntimeError: the env's run() broke" in run
    assert "scoring_timeout" in slow
    assert not fine and episodes[4].reward == 1.0  # the same env, no fault: scored as usual
    assert all("task faulty:vf_test_faulty/0" in e for e in (raised, nan, run, slow))  # the runner names the task


def test_other_seats_need_their_own_model_and_the_policy_plays_its_own(chat, modules):
    with pytest.raises(ValueError, match=r"seat 'user' needs a model of its own: agentrl's policy plays seat "
                       "'assistant'"):
        VerifiersAgent("vf_test_arith", env="user-sim", seat="assistant")
    with pytest.raises(ValueError, match="say which one agentrl's policy plays with seat="):
        VerifiersAgent("vf_test_arith", env="user-sim")
    with pytest.raises(ValueError, match="has no seat 'judge'"):
        VerifiersAgent("vf_test_arith", env="user-sim", seat="judge")
    with pytest.raises(ValueError, match="cannot be loaded"):
        VerifiersAgent("vf_test_no_such_taskset")
    # the user on a model of its own (here another gateway, a script behind it): the policy plays the assistant
    users = Gateway(GatewayConfig(batch_wait=0.0))
    users.open_rollout(Reader(chat, lambda row, said: "What is 2 + 2?" if len(said) < 4 else "###DONE###"), chat,
                       max_context=8192)
    users.open_session(group_id=0, task_id="user", name="user")
    server = Server(build_app(users)).start()
    os.environ["VF_TEST_USER_KEY"] = users.token
    try:
        client = {"type": "eval", "base_url": f"{server.url}/sessions/user/v1", "api_key_var": "VF_TEST_USER_KEY"}
        user = {"model": "user", "client": client}
        agent = VerifiersAgent("vf_test_arith", env="user-sim", env_config={"user": user})
        assert agent.seat == "assistant" and agent.seats == ["assistant", "user"]
        agent_runner = AgentRunner(_agent_of(agent))
        try:
            episodes = agent_runner.rollout(Reader(chat, lambda row, said: "4"), chat, [0], max_context=8192)[0]
        finally:
            agent_runner.close()
    finally:
        server.stop()
        users.close()
    assert not episodes[0].error and episodes[0].num_turns == 1
    done = agent.outcomes[-1]
    assert done.metrics["user_turns"] == 2.0 and done.trace.last_reply == "4"


def _agent_of(verifiers_agent):
    import vf_agents

    vf_agents.user_sim = verifiers_agent.tasks
    return Agent(AgentConfig(entry="agentrl.adapters.verifiers_env:solve", tasks="vf_agents:user_sim",
                             gateway=GatewayConfig(batch_wait=0.0)))


def test_make_returns_the_agent_and_says_how_to_train_it(modules):
    agent = make("verifiers:vf_test_arith", config={"num_tasks": 5})
    assert isinstance(agent, VerifiersAgent) and agent.tasks(7)["task_id"] == "vf_test_arith/2"
    with pytest.raises(AttributeError, match="trains through the gateway .*--agent agentrl.adapters.verifiers_env:"):
        agent.reset(seed=0)
    with pytest.raises(ImportError, match="VerifiersEnv is gone: .* trains through the gateway"):
        from agentrl.adapters.verifiers_env import VerifiersEnv  # noqa: F401


def test_a_few_updates_train_on_a_verifiers_env(modules, tmp_path):
    from agentrl.config import TrainConfig
    from agentrl.stages.pipeline import train

    (tmp_path / "demos.jsonl").write_text("".join(json.dumps(d) + "\n" for d in demos(64)))
    cfg = TrainConfig(
        agent={"entry": "agentrl.adapters.verifiers_env:solve", "tasks": f"{modules / 'vf_agents.py'}:train_arith",
               "demos": str(tmp_path / "demos.jsonl"), "gateway": {"batch_wait": 0.0}},
        algo="grpo",
        updates=2,
        out=str(tmp_path / "run"),
        tiny=MICRO.model_dump(),
        rollout={"groups": 2, "group_size": 2, "sampling": {"max_new_tokens": 8}},
        sft={"epochs": 1},
        eval={"episodes": 2, "every": 0},
        optim={"minibatches": 1},
        checkpoint={"every": 0},
    )
    summary = train(cfg)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) > 0 and not r.get("final")]
    assert len(steps) == 2 and all(r["rollout/episodes"] == 4 for r in steps)
    assert all(r["gateway/calls_per_episode"] >= 1 for r in steps)
    assert summary["final_pass_rate"] is not None
