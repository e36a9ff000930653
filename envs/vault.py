"""`agentrl/Vault-v0`: a long-horizon tool-use task whose horizon is one knob, `locks`.

The agent must open `locks` locks in order. Lock k opens with a code that it can only work out by
first reading the lock's clue (another tool call): the clue is a sum of two small numbers, the code
is that sum. So a perfect episode takes ``2 * locks`` turns, and the turn budget
``2 * locks + slack`` leaves room for ``slack`` mistakes. The reward is 1.0 only when every lock is
open (a state predicate), so an outcome-only learner cannot tell which turn went wrong; per-turn
progress (``1 / locks`` per opened lock) is offered in ``info["step_reward"]`` for assigners that
want it, and ``state_key`` is ``(locks opened, clue read)``.

Every observation names the lock to work on next (error messages too), so each turn's decision needs only the last
observation and the horizon changes nothing but the number of turns (an earlier version said
"5 left" and made the policy count: the tiny policy lost count after lock 3 at 8 locks).

>>> env = VaultEnv(locks=2, slack=1)
>>> obs, _ = env.reset(seed=3)
>>> while True:
...     obs, reward, terminated, truncated, info = env.step(env.expert_action())
...     if terminated or truncated:
...         break
>>> reward, terminated, info["turn"]
(1.0, True, 4)
"""

from __future__ import annotations

import json
import numbers

import gymnasium

from agentrl.core import AgentEnv


class VaultEnv(AgentEnv):
    """Open every lock in order; each lock's code is the sum its clue states."""

    system_prompt = "Open the vault."

    def __init__(self, locks: int = 3, slack: int = 1, max_operand: int = 4):
        for name, value in (("locks", locks), ("slack", slack), ("max_operand", max_operand)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # 2.5 locks would fail at reset
                raise ValueError(f"Vault: {name} must be a whole number, got {value!r}")
        if not 1 <= locks <= 32:
            raise ValueError(f"Vault: locks must be between 1 and 32, got {locks}")
        if slack < 0:
            raise ValueError(f"Vault: slack must be >= 0, got {slack}")
        if not 1 <= max_operand <= 9:
            raise ValueError(f"Vault: max_operand must be between 1 and 9, got {max_operand}")
        super().__init__(max_turns=2 * locks + slack)
        self.locks, self.slack, self.max_operand = int(locks), int(slack), int(max_operand)
        self.clues: list[tuple[int, int]] = []
        self.opened = 0
        self.clue_read = False

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        rng = self.np_random
        self.clues = [(int(rng.integers(1, self.max_operand + 1)), int(rng.integers(1, self.max_operand + 1)))
                      for _ in range(self.locks)]
        self.opened = 0
        self.clue_read = False
        return f"{self.locks} locks. Read each clue, then open the lock with the sum.", {"state_key": self.state_key()}

    # -- tools ----------------------------------------------------------------------------------

    def clue(self, lock: int) -> str:
        """Read the clue of a lock."""
        if lock != self.opened + 1:
            return f"lock {lock} is not next; lock {self.opened + 1} is."
        a, b = self.clues[self.opened]
        self.clue_read = True
        return f"lock {lock}: {a}+{b}"

    def open(self, lock: int, code: int) -> str:
        """Open a lock with its code."""
        if lock != self.opened + 1:
            return f"lock {lock} is not next; lock {self.opened + 1} is."
        if code != sum(self.clues[self.opened]):
            return f"wrong code for lock {lock}."
        self.opened += 1
        self.clue_read = False
        self.add_step_reward(1.0 / self.locks)
        if self.opened == self.locks:
            return f"lock {lock} open. the vault is open."
        return f"lock {lock} open. next: lock {lock + 1}."

    tools = [clue, open]

    def step(self, action: str):
        obs, reward, terminated, truncated, info = super().step(action)
        if info["malformed"] and not (terminated or truncated):
            obs += f"\nnext: lock {self.opened + 1}."  # error messages name the next lock like every other observation
        return obs, reward, terminated, truncated, info

    # -- verifier and state -----------------------------------------------------------------------

    def is_terminal(self) -> bool:
        return self.opened == self.locks

    def verify(self) -> float:
        return float(self.opened == self.locks)

    def state_key(self):
        return (self.opened, self.clue_read)

    def expert_action(self, noise: float = 0.0) -> str:
        """Read the clue, then open with the sum. With probability `noise` at each lock-turn where
        the clue is still unread, the expert slips: it guesses a code without reading the clue
        (almost always wrong: a wasted turn). With probability `noise / 5` on any turn it garbles
        the call (an error observation, then it carries on), so that demonstrations also show how
        to recover from an error message. Its code after reading a clue is always right, so
        demonstrations teach the sums cleanly and the mistake left for RL to remove is a choice
        of turn, the kind outcome-only reward hides."""
        rng = self.np_random
        lock = self.opened + 1
        code = sum(self.clues[self.opened])
        if noise > 0 and rng.random() < noise / 5:
            garbled = [
                _call("opne", lock=lock, code=code),  # unknown tool
                _call("clue", door=lock),  # bad argument
                _call("open", lock=lock, code=code)[:-14],  # unclosed call
            ]
            return garbled[int(rng.integers(len(garbled)))]
        if self.clue_read:
            return _call("open", lock=lock, code=code)
        if noise > 0 and rng.random() < noise:
            # a wrong code a clue could give; with max_operand 1 every clue is 1+1, so one past it
            wrong = [c for c in range(2, 2 * self.max_operand + 1) if c != code] or [code + 1]
            return _call("open", lock=lock, code=int(rng.choice(wrong)))
        return _call("clue", lock=lock)


def _call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


gymnasium.register(id="agentrl/Vault-v0", entry_point="agentrl.envs.vault:VaultEnv", kwargs={"locks": 3, "slack": 1},
                   disable_env_checker=True, order_enforce=False)  # gymnasium.make returns the bare AgentEnv
