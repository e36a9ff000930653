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
