"""`agentrl/VaultMemory-v0`: a long-horizon task that needs memory across a context cut.

The agent first reads one note per door (each note reveals that door's code), then walks a patrol of
`patrols` steps whose logs are long and say nothing about the codes, and only then opens the doors in
order, each with the code its note gave. The episode's length is one knob: a perfect episode takes
``2 * doors + patrols`` turns (16 with the defaults, 64 with ``patrols=60``), and ``slack`` more turns
leave room for mistakes. The reward is 1.0 only when every door is open (the verifier); per-turn
progress (``1 / doors`` per opened door) is offered in ``info["step_reward"]``.

The task is built so that only memory carried across a context cut passes: the logs fill the
context, a code is three digits (a guess opens a door one time in 900), and nothing after a note
repeats its code. A context policy that keeps the last turns (`window`), stubs old tool results
(`drop-observations`) or stops at the budget (`truncate`) loses the codes; one whose summary lists
them (`summarize`) keeps them. `facts_kept(summary)` says which share of the codes the agent still
needs a summary holds, and the scripted expert writes such summaries when asked (`expert_summary`).

Every observation names the next action (errors too), as in Vault, so that every decision but the
codes needs only the last observation.

>>> env = VaultMemoryEnv(doors=2, patrols=3)
>>> obs, _ = env.reset(seed=3)
>>> while True:
...     obs, reward, terminated, truncated, info = env.step(env.expert_action())
...     if terminated or truncated:
...         break
>>> reward, terminated, info["turn"]
(1.0, True, 7)
"""

from __future__ import annotations

import json
import numbers
import re

import gymnasium
import numpy as np

from agentrl.core import AgentEnv

PLACES = ("hall", "gate", "dock", "yard", "lab", "roof", "cellar", "tower", "vault", "stair")
STATES = ("clear", "quiet", "locked", "dim", "warm", "cold", "wet", "dusty")


class VaultMemoryEnv(AgentEnv):
    """Read every door's code, patrol, then open every door with the code read long before."""

    system_prompt = "Open the vault. Remember what the notes say."

    def __init__(self, doors: int = 2, patrols: int = 12, slack: int = 2, log_lines: int = 6):
        for name, value in (("doors", doors), ("patrols", patrols), ("slack", slack), ("log_lines", log_lines)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"VaultMemory: {name} must be a whole number, got {value!r}")
        if not 1 <= doors <= 8:
            raise ValueError(f"VaultMemory: doors must be between 1 and 8, got {doors}")
        if not 0 <= patrols <= 256:
            raise ValueError(f"VaultMemory: patrols must be between 0 and 256, got {patrols}")
        if slack < 0:
            raise ValueError(f"VaultMemory: slack must be >= 0, got {slack}")
        if not 1 <= log_lines <= 40:
            raise ValueError(f"VaultMemory: log_lines must be between 1 and 40, got {log_lines}")
        super().__init__(max_turns=2 * doors + patrols + slack)
        self.doors, self.patrols, self.slack, self.log_lines = int(doors), int(patrols), int(slack), int(log_lines)
        self.codes: list[int] = []
        self.read = 0  # notes read
        self.patrolled = 0  # patrol steps walked
        self.opened = 0  # doors opened
        self._log_seed = 0
        self._known: dict[int, int] = {}  # door -> code: what the expert still holds in its context

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        rng = self.np_random
        self.codes = [int(c) for c in rng.integers(100, 1000, size=self.doors)]
        self._log_seed = int(rng.integers(2**31))  # the logs depend on the seed only, not on the actions before
        self.read = self.patrolled = self.opened = 0
        self._known = {}
        task = (f"{self.doors} doors, {self.patrols} patrol steps. Read each door's note, walk the patrol, then open "
                f"each door with its code. next: {self.next_action()}.")
        return task, {"state_key": self.state_key()}

    # -- tools ----------------------------------------------------------------------------------

    def note(self, door: int) -> str:
        """Read a door's note: it gives the door's code."""
        if self.read == self.doors or door != self.read + 1:
            return f"note {door} is not next. next: {self.next_action()}."
        self.read += 1
        return f"door {door} code {self.codes[door - 1]}. next: {self.next_action()}."

    def patrol(self, step: int) -> str:
        """Walk a patrol step and read its log."""
        if self.read < self.doors or self.patrolled == self.patrols or step != self.patrolled + 1:
            return f"patrol {step} is not next. next: {self.next_action()}."
        self.patrolled += 1
        return f"patrol {step} log:\n{self.log(step)}\nnext: {self.next_action()}."

    def open(self, door: int, code: int) -> str:
        """Open a door with its code."""
        if self.read < self.doors or self.patrolled < self.patrols or door != self.opened + 1:
            return f"door {door} is not next. next: {self.next_action()}."
        if code != self.codes[door - 1]:
            return f"wrong code for door {door}. next: {self.next_action()}."
        self.opened += 1
        self.add_step_reward(1.0 / self.doors)
        if self.opened == self.doors:
            return f"door {door} open. the vault is open."
        return f"door {door} open. next: {self.next_action()}."

    tools = [note, patrol, open]

    def step(self, action: str):
        obs, reward, terminated, truncated, info = super().step(action)
        if info["malformed"] and not (terminated or truncated):
            obs += f"\nnext: {self.next_action()}."  # error messages name the next action like every other observation
        return obs, reward, terminated, truncated, info

    def log(self, step: int) -> str:
        """A patrol step's log: `log_lines` lines drawn from the episode's seed and the step, so that the same
        step reads the same whatever came before it. One-digit numbers only, so no line looks like a code."""
        rng = np.random.default_rng([self._log_seed, step])
        return "\n".join(f"- {PLACES[rng.integers(len(PLACES))]} {int(rng.integers(1, 10))} "
                         f"{STATES[rng.integers(len(STATES))]}" for _ in range(self.log_lines))

    def next_action(self) -> str:
        if self.read < self.doors:
            return f"note {self.read + 1}"
        if self.patrolled < self.patrols:
            return f"patrol {self.patrolled + 1}"
        return f"open door {self.opened + 1}"

    # -- verifier and state -----------------------------------------------------------------------

    def is_terminal(self) -> bool:
        return self.opened == self.doors

    def verify(self) -> float:
        return float(self.opened == self.doors)

    def state_key(self):
        return (self.read, self.patrolled, self.opened)

    def needed_facts(self) -> dict[int, int]:
        """door -> code for every code the agent has read and still needs (its door is not open yet)."""
        return {d: self.codes[d - 1] for d in range(self.opened + 1, self.read + 1)}

    def facts_kept(self, summary: str) -> float:
        """The share of the codes the agent has read and still needs that `summary` holds (1.0 when it needs
        none). A code counts as held when it appears in the text as a number of its own: the door it belongs
        to is left to the reader, as a summary may word it ("door 1 code 417", "1: 417")."""
        needed = self.needed_facts()
        if not needed:
            return 1.0
        numbers_in = set(re.findall(r"(?<!\d)\d+(?!\d)", summary))
        return sum(str(code) in numbers_in for code in needed.values()) / len(needed)

    # -- the scripted expert ----------------------------------------------------------------------

    def expert_action(self, noise: float = 0.0) -> str:
        """Read the notes, patrol, open each door with the code it holds. With probability `noise / 5` on any
        turn it garbles the call (an error observation, then it carries on); with probability `noise / 4` on a
        patrol turn it walks the wrong step (a wasted turn). A door whose code it no longer holds (its summary
        dropped it, `expert_summary`) it opens with a guess, as a policy would."""
        rng = self.np_random
        if noise > 0 and rng.random() < noise / 5:
            garbled = [_call("nte", door=self.read + 1), _call("patrol", stp=self.patrolled + 1),
                       _call("open", door=self.opened + 1, code=123)[:-14]]
            return garbled[int(rng.integers(len(garbled)))]
        if self.read < self.doors:
            self._known[self.read + 1] = self.codes[self.read]  # the note's observation puts it in context
            return _call("note", door=self.read + 1)
        if self.patrolled < self.patrols:
            step = self.patrolled + 1
            if noise > 0 and rng.random() < noise / 4:
                step += 1 + int(rng.integers(2))
            return _call("patrol", step=step)
        door = self.opened + 1
        code = self._known.get(door)
        if code is None:
            code = int(rng.integers(100, 1000))
        return _call("open", door=door, code=code)

    def expert_summary(self, noise: float = 0.0) -> str:
        """What the expert writes when asked to summarise its context: the codes it holds for the doors not yet
        open, and the next action. With probability `noise / 8` it drops one code (and then no longer holds it:
        the summary is all that survives the cut), so that demonstrations show what a careless summary costs;
        rarer than a slip of play, since an episode asks for several summaries and each drop is fatal."""
        known = {d: c for d, c in sorted(self._known.items()) if d > self.opened}
        if known and noise > 0 and self.np_random.random() < noise / 8:
            del known[list(known)[int(self.np_random.integers(len(known)))]]
        self._known = dict(known)
        facts = " ".join(f"door {d} code {c}." for d, c in known.items())
        return f"{facts} next: {self.next_action()}.".strip()


def _call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


gymnasium.register(id="agentrl/VaultMemory-v0", entry_point="agentrl.envs.vault_memory:VaultMemoryEnv",
                   kwargs={"doors": 2, "patrols": 12, "slack": 2}, disable_env_checker=True, order_enforce=False)
