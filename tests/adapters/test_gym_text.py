"""A plain gymnasium text env (both spaces `spaces.Text`), registered here, wrapped without code: `gym:Id`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium import spaces

from agentrl import cli
from agentrl.adapters.gym_text import GymTextEnv
from agentrl.checker import check_env
from agentrl.core import EnvError
from agentrl.registry import make

LETTERS = "abcdefghijklmnopqrstuvwxyz"


class Reverse(gym.Env):
    """Write the word backwards: -0.5 per wrong answer, +1 for the right one (which ends the episode)."""

    observation_space = spaces.Text(max_length=200, charset=LETTERS + " :.")
    action_space = spaces.Text(max_length=12, min_length=1, charset=LETTERS)
    WORDS = ["cat", "moon", "river", "stone"]

    def __init__(self, explode_on: str | None = None):
        self.explode_on = explode_on
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.word = self.WORDS[int(self.np_random.integers(len(self.WORDS)))]
        self.steps = 0
        return f"reverse: {self.word}", {"length": len(self.word)}

    def step(self, action):
        self.steps += 1
        if action == self.explode_on:
            raise KeyError("a bug in the source env")
        if action == self.word[::-1]:
            return "right.", 1.0, True, False, {}
        return "wrong. try again", -0.5, False, False, {}


gym.register("TestReverse-v0", entry_point=Reverse, max_episode_steps=3)
gym.register("TestReverseNoLimit-v0", entry_point=Reverse)


def act(text):
    return f"<tool_call>{json.dumps({'name': 'act', 'arguments': {'text': text}})}</tool_call>"


def test_make_builds_it_from_the_gym_prefix():
    env = make("gym:TestReverse-v0")
    assert isinstance(env, GymTextEnv) and env.name == "gym:TestReverse-v0"
    assert env.max_turns == 3  # the spec's max_episode_steps
    assert [s["function"]["name"] for s in env.tool_schemas()] == ["act"]


def test_step_and_reset_map_rewards_and_termination():
    env = make("gym:TestReverseNoLimit-v0")
    obs, info = env.reset(seed=0)
    word = obs.removeprefix("reverse: ")
    assert info == {"length": len(word)}
    obs, reward, terminated, truncated, info = env.step(act("zz"))
    assert (obs, reward, terminated, truncated, info["step_reward"]) == ("wrong. try again", 0.0, False, False, -0.5)
    obs, reward, terminated, truncated, info = env.step(act(word[::-1]))
    # R is the return, -0.5 + 1.0, given on the step that ends the episode
    assert (obs, reward, terminated, truncated, info["step_reward"]) == ("right.", 0.5, True, False, 1.0)


def test_the_sources_time_limit_is_truncation():
    env = make("gym:TestReverse-v0", max_turns=10)  # our budget is looser: the source's TimeLimit (3) ends it
    env.reset(seed=0)
    results = [env.step(act("zz")) for _ in range(3)]
    assert [r[2:4] for r in results] == [(False, False), (False, False), (False, True)]
    assert results[-1][1] == -1.5  # three wrong answers
    with pytest.raises(EnvError, match="after the episode ended"):
        env.step(act("zz"))


def test_an_action_outside_the_space_is_counted_and_not_sent():
    env = make("gym:TestReverseNoLimit-v0")
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(act("Not Letters!"))
    assert "bad arguments for act" in obs and "characters from" in obs
    assert info["malformed"] == 1 and env.inner.unwrapped.steps == 0
    obs, *_, info = env.step("no tool call")
    assert "no tool call found" in obs and info["malformed_calls"] == 2 and env.inner.unwrapped.steps == 0


def test_a_source_that_raises_is_an_env_error_naming_where():
    env = make("gym:TestReverseNoLimit-v0", explode_on="boom")
    env.reset(seed=0)
    env.step(act("zz"))
    with pytest.raises(EnvError, match=r"env gym:TestReverseNoLimit-v0, episode 0, turn 2: .*KeyError"):
        env.step(act("boom"))


def test_spaces_that_are_not_text_are_refused():
    with pytest.raises(ValueError, match=r"gym:CartPole-v1: its observation_space is Box.*not gymnasium.spaces.Text"):
        make("gym:CartPole-v1")
    with pytest.raises(ValueError, match="gymnasium cannot build it"):
        make("gym:NoSuchEnv-v0")


def test_check_env_passes(capsys):
    failed = [(r.name, r.message) for r in check_env("gym:TestReverse-v0") if not r.ok]
    assert failed == []
    assert cli.main(["check-env", "gym:TestReverse-v0"]) == 0  # `agentrl check-env gym:Id`, in-process


def test_train_accepts_a_gym_id(capsys):
    # without --model the tiny policy needs an expert, which a plain gymnasium env has not: the env was built
    # (an unknown id would be refused first) and the answer is the no-expert advice
    assert cli.main(["train", "--env.id", "gym:TestReverse-v0"]) == 2
    assert "no scripted expert" in capsys.readouterr().err
    assert cli.main(["train", "--env.id", "gym:NoSuchEnv-v0"]) == 2
    assert "gymnasium cannot build it" in capsys.readouterr().err


def test_a_module_id_imports_from_the_current_folder(tmp_path, monkeypatch):
    # `agentrl train --env gym:games.parrot:Parrot-v0` from the folder holding games/: a console script
    # does not put that folder on sys.path, and gymnasium imports the module by name only
    (tmp_path / "games").mkdir()
    (tmp_path / "games" / "__init__.py").write_text("")
    (tmp_path / "games" / "parrot.py").write_text(
        "import gymnasium as gym\n"
        "from gymnasium import spaces\n"
        "class Parrot(gym.Env):\n"
        "    observation_space = action_space = spaces.Text(max_length=20)\n"
        "    def reset(self, *, seed=None, options=None):\n"
        "        super().reset(seed=seed)\n"
        "        return 'say hi', {}\n"
        "    def step(self, action):\n"
        "        return 'ok', float(action == 'hi'), True, False, {}\n"
        "gym.register('TestParrotCwd-v0', entry_point='games.parrot:Parrot')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "games", raising=False)
    try:
        env = make("gym:games.parrot:TestParrotCwd-v0")
        assert env.reset(seed=0)[0] == "say hi"
        assert env.step(act("hi"))[1] == 1.0
        with pytest.raises(ValueError, match="cannot import 'nogames.parrot'"):
            make("gym:nogames.parrot:TestParrotCwd-v0")
    finally:
        gym.registry.pop("TestParrotCwd-v0", None)
        for name in ("games", "games.parrot"):
            sys.modules.pop(name, None)


def test_the_guess_example_writes_demonstrations_from_a_plain_script(tmp_path):
    # the README's first command for the gym: adapter, run as a user would (no PYTHONPATH, the repo root as cwd)
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = tmp_path / "demos.jsonl"
    done = subprocess.run([sys.executable, "examples/gym_guess.py", "--demos", str(out), "--episodes", "20"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 20
    for row in rows:  # TRL's conversational format: user, then assistant tool calls answered by tool messages
        roles = [m["role"] for m in row["messages"]]
        assert roles[0] == "user" and roles[-1] == "assistant" and 1 <= roles.count("assistant") <= 4
        assert row["reward"] in (0.0, 1.0)


def test_a_gym_env_with_an_expert_method_has_an_expert_and_a_plain_one_has_none(monkeypatch):
    from agentrl.checker import has_expert
    from agentrl.stages.sft import expert_pass_rate

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))  # examples/ from the checkout

    guess = make("gym:examples.gym_guess:GuessNumber-v0")
    assert has_expert(guess)
    clean, noisy = expert_pass_rate(guess, range(64), 0.0), expert_pass_rate(guess, range(64), 1.0)
    assert clean >= 0.9 > noisy  # binary search wins 15 of 16; random possible guesses fewer
    assert expert_pass_rate(guess, range(64), 1.0) == noisy  # the slips come from the env's own seed
    assert not has_expert(make("gym:TestReverse-v0"))
