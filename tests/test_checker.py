"""check_env over every built-in environment, and on environments that break the contract."""

from __future__ import annotations

import gymnasium as gym
import pytest

import agentrl.envs  # noqa: F401  (registers the built-ins)
from agentrl.checker import check_env
from agentrl.cli import main
from agentrl.core import AgentEnv

BUILT_IN = sorted(k for k in gym.registry if k.startswith("agentrl/"))


@pytest.mark.parametrize("env_id", BUILT_IN)
def test_every_built_in_env_passes(env_id):
    failed = [(r.name, r.message) for r in check_env(env_id) if not r.ok]
    assert failed == []


def test_vault_at_every_horizon_knob_value_passes():
    for locks in (1, 8, 32):
        assert all(r.ok for r in check_env("agentrl/Vault-v0", locks=locks))


class Sloppy(AgentEnv):
    """Non-deterministic (ignores the seed), never truncates, reward not a float."""

    max_turns = 2

    def poke(self) -> str:
        """Poke."""
        import random

        return str(random.random())

    tools = [poke]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        import random

        return f"start {random.random()}", {}

    def verify(self):
        return 0.0

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return obs, int(r), term, False, info


def test_broken_env_fails_the_right_checks():
    failed = {r.name for r in check_env(Sloppy) if not r.ok}
    assert {"determinism", "step", "turn_budget_truncates"} <= failed


def test_cli_check_env(capsys):
    assert main(["check-env", "agentrl/Vault-v0", "--kw", "locks=2"]) == 0
    assert main(["check-env", "test_checker:Sloppy"]) == 1
    assert "FAIL" in capsys.readouterr().out
    assert main(["check-env", "no_such_module:Env"]) == 2


_SHARED: list[str] = []  # one scratch list for every instance: the bug check_threads looks for


class Echo(AgentEnv):
    """Repeats the word it is told; `shared=True` passes the word through module state, as a library with a
    module-level buffer would."""

    max_turns = 3

    def __init__(self, shared: bool = False):
        super().__init__()
        self.shared = shared

    def say(self, word: str) -> str:
        """Say a word."""
        if not self.shared:
            return f"you said {word}"
        import time

        _SHARED.clear()
        _SHARED.append(word)
        time.sleep(0.002)  # another instance's call lands here
        return f"you said {_SHARED[-1]}"

    tools = [say]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.word = f"w{int(self.np_random.integers(1000))}"
        return f"say {self.word}", {}

    def expert_action(self, noise=0.0):
        return f'<tool_call>{{"name": "say", "arguments": {{"word": "{self.word}"}}}}</tool_call>'

    def verify(self):
        return 1.0


def test_threads_check_catches_state_shared_between_instances():
    results = {r.name: r for r in check_env(Echo, shared=True)}
    assert not results["threads"].ok
    assert "differs when 4 copies play at once" in results["threads"].message
    assert "process:N" in results["threads"].message
    assert {r.name for r in check_env(Echo, shared=False) if not r.ok} == set()


def test_threads_check_skips_an_env_that_cannot_be_pickled():
    env = Echo()
    env.lock = __import__("threading").Lock()  # not picklable
    result = next(r for r in check_env(env) if r.name == "threads")
    assert result.ok and result.message.startswith("skipped: the env cannot be pickled")


def test_sandbox_check_names_the_isolation_and_fails_without_it():
    from agentrl.checker import check_sandbox
    from agentrl.envs.code import CodeEnv
    from agentrl.envs.vault import VaultEnv
    from agentrl.verify.sandbox import Isolation, default_sandbox

    assert check_sandbox(VaultEnv(locks=2)).startswith("none needed")
    env = CodeEnv()
    assert env.sandbox is default_sandbox()
    note = check_sandbox(env)
    assert note.startswith(f"sandbox isolation: {default_sandbox().isolation.method}"), note

    class Unisolated:  # what a sandbox made by hand on a machine without namespaces reports
        isolation = Isolation(False, False, False, reasons=("not root, and no user namespace could be made",))

    env.sandbox = Unisolated()
    with pytest.raises(AssertionError, match="network, files and processes are NOT isolated"):
        check_sandbox(env)


class Planted(AgentEnv):
    """A declared split, to plant faults in: the train split's tasks are t0-t2, the eval split's `eval_tasks`;
    with `serve_train`, the eval split serves train tasks whatever it declares."""

    max_turns = 1
    TRAIN = ("t0", "t1", "t2")

    def __init__(self, split="train", eval_tasks=("e0", "e1"), serve_train=False):
        super().__init__()
        self.split = split
        self.tasks = list(self.TRAIN if split == "train" else eval_tasks)
        self.served = list(self.TRAIN) if serve_train else self.tasks

    def task_ids(self, limit=None):
        return self.tasks[:limit]

    def wait(self) -> str:
        """Wait a turn."""
        return "waited"

    tools = [wait]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        task = self.served[seed % len(self.served)]
        return f"task {task}", {"task_id": task}

    def verify(self):
        return 0.0


def split_result(env, **kwargs):
    return next(r for r in check_env(env, **kwargs) if r.name == "split")


def test_split_check_passes_on_disjoint_splits_and_says_how_many():
    result = split_result(Planted)
    assert result.ok and result.message.startswith("3 train and 2 eval tasks, none shared"), result.message


def test_a_planted_overlap_fails_naming_the_shared_task():
    result = split_result(Planted, eval_tasks=("e0", "t1"))
    assert not result.ok and "task 't1' is in both the train and the eval split" in result.message
    # built as the eval split, the check builds the train split from the same arguments and finds the same task
    result = split_result(Planted, split="eval", eval_tasks=("t2",))
    assert not result.ok and "'t2'" in result.message


def test_an_eval_split_that_serves_a_train_task_fails_naming_it_and_the_seed():
    result = split_result(Planted, serve_train=True)
    assert not result.ok
    assert "the eval split served task 't0' (a train task) on seed 0" in result.message, result.message


def test_split_check_without_a_split_or_without_the_arguments_says_why_it_did_nothing():
    assert split_result("agentrl/Vault-v0").message.startswith("none declared")
    result = split_result(Planted())  # an instance built by hand: its arguments are unknown
    assert result.ok and result.message.startswith("skipped"), result.message
    unnamed = Planted()
    unnamed.task_ids = None  # a split, but no way to name its tasks
    assert split_result(unnamed).message.startswith("unchecked: the env has a `split` but no task_ids()")


def test_splits_disjoint_takes_the_two_envs_in_their_order():
    from agentrl.checker import check_splits_disjoint

    with pytest.raises(AssertionError, match="the train split's env says split='eval'"):
        check_splits_disjoint(Planted(split="eval"), Planted(split="eval"))
    assert "none shared" in check_splits_disjoint(Planted(), Planted(split="eval"))


class TrainOnly(Planted):
    """An env whose arguments its eval split refuses, as BFCL refuses a subset that lists training entries."""

    def __init__(self, split="train", **kwargs):
        if split == "eval":
            raise ValueError("TrainOnly: no held-out split for these arguments")
        super().__init__(split=split, **kwargs)


def test_train_refuses_an_env_whose_held_out_split_cannot_be_built_before_any_work(capsys):
    assert main(["train", "--env.id", "test_checker:TrainOnly", "--updates", "0", "--model", "unused"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "the held-out evaluation's environment ({'split': 'eval'}) test_checker:TrainOnly" in err, err
    assert "no held-out split for these arguments" in err
    from agentrl.config import TrainConfig
    from agentrl.stages.pipeline import train

    with pytest.raises(ValueError, match="the held-out evaluation's env test_checker:TrainOnly"):
        train(TrainConfig(env={"id": "test_checker:TrainOnly"}, model="unused"))
