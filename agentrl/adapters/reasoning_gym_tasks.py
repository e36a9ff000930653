"""reasoning-gym's procedurally generated tasks as agentrl environments, scored by reasoning-gym's own
`score_answer` (``pip install agentrl[reasoning-gym]``).

- ``agentrl/RG-v0``: single-turn. The task's question, one ``answer`` call, its score.
- ``agentrl/RG-Calc-v0``: multi-turn. The same question with an exact ``calculator`` and a ``note``
  scratchpad beside ``answer``; the turn budget is ``max_turns`` (default 4).
- ``agentrl/RG-Chain-v0``: chain_sum worked one operation a turn: ``difficulty`` terms take
  ``difficulty - 1`` calculator calls and an answer, within ``difficulty + slack`` turns; the reward is
  the final answer's score alone (no step scores): the horizon probe's fifth family.

``task`` is any reasoning-gym dataset name (``chain_sum``, ``leg_counting``, ``word_sorting``, ...);
``config`` passes that dataset's own options; ``difficulty`` is one knob for the tasks listed in
`DIFFICULTY` (the number of terms, animals or numbers), which a config entry overrides. Episode
``seed`` picks the item, ``dataset_seed`` the dataset.

The held-out split: reasoning-gym makes item ``i`` of a dataset of seed ``s`` from ``random.Random(s + i)``,
so the datasets of seeds 0 and 7 are the same items shifted by 7, and another ``dataset_seed`` is not held out.
An item is therefore named by its generator seed ``s + i`` (``info["task_id"]``: ``chain_sum-12345``), and
``split="eval"`` draws from generator seeds 2**31 and up, which no training dataset reaches (``dataset_seed`` is
capped below ``2**31 - ITEMS``). Questions may still repeat across the splits where a task's space is small
(chain_sum with two one-digit terms has 200): the items differ, the texts need not.

The reward is `score_answer`'s value, partial credit included (some tasks give a fraction for a
near answer); an episode passes at 1.0. A scorer that raises stops the episode as an error.

>>> env = ReasoningGymEnv(task="chain_sum", difficulty=2)
>>> obs, info = env.reset(seed=0)
>>> obs, env.entry["answer"]
('State the final answer to the following arithmetic problem: 1 - 7 =', '-6')
>>> env.step(env.expert_action())[1:3]
(1.0, True)
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import gymnasium

from agentrl.core import AgentEnv
from agentrl.envs.math import calculate, fmt

INSTALL_HINT = "reasoning-gym tasks need the reasoning-gym package: pip install 'agentrl[reasoning-gym]'"

# One knob per task, the dataset's own size parameters: the difficulty is the number of things to combine.
DIFFICULTY: dict[str, Callable[[int], dict[str, Any]]] = {
    "chain_sum": lambda d: {"min_terms": d, "max_terms": d, "min_digits": 1, "max_digits": 1},
    "basic_arithmetic": lambda d: {"min_terms": d, "max_terms": d, "min_digits": 1, "max_digits": 2},
    "products": lambda d: {"min_terms": d, "max_terms": d, "min_digits": 1, "max_digits": 2},
    "leg_counting": lambda d: {"min_animals": d, "max_animals": d},
    "gcd": lambda d: {"min_numbers": d, "max_numbers": d},
    "word_sorting": lambda d: {"min_words": d, "max_words": d},
}
ONE_OPERATION = re.compile(r"\s*-?\d+\s*[-+*/]\s*-?\d+\s*")  # RG-Chain's calculator: two numbers, one operator
ITEMS = 1_000_000  # items per dataset; an item is generated from (dataset_seed, index) when read
# The eval split's generator seeds start here; a training dataset's items stay below it. Python's Random seeds an
# int by its absolute value, so a negative dataset_seed would alias a positive one: it is refused.
EVAL_SEEDS = 2**31
MAX_SEED = EVAL_SEEDS - ITEMS  # the largest dataset_seed


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _dataset(task: str, difficulty: int | None, config: dict[str, Any] | None, dataset_seed: int) -> Any:
    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from e
    if task not in DATASETS:
        near = difflib.get_close_matches(task, list(DATASETS), n=3)
        raise ValueError(f"RG: unknown reasoning-gym task {task!r}" + (f"; did you mean {', '.join(near)}?" if near else
                         f"; tasks: {', '.join(sorted(DATASETS))}"))
    options: dict[str, Any] = {}
    if difficulty is not None:
        if task not in DIFFICULTY:
            raise ValueError(f"RG: task {task!r} has no difficulty knob here (those that do: {', '.join(DIFFICULTY)}); "
                             "set its own options through config instead")
        if not 1 <= difficulty <= 20:
            raise ValueError(f"RG: difficulty must be between 1 and 20, got {difficulty}")
        options.update(DIFFICULTY[task](difficulty))
    options.update(config or {})
    try:
        return reasoning_gym.create_dataset(task, seed=dataset_seed, size=ITEMS, **options)
    except (TypeError, ValueError, AssertionError) as e:  # reasoning-gym validates its configs with assert
        raise ValueError(f"RG: reasoning-gym rejected the config of task {task!r} ({options}): "
                         f"{type(e).__name__}: {e}") from e


class ReasoningGymEnv(AgentEnv):
    """One reasoning-gym item per episode; `answer` ends it and reasoning-gym scores the answer."""

    system_prompt = "Answer the question with the answer tool."
    max_turns = 1

    def __init__(self, task: str = "chain_sum", difficulty: int | None = None, config: dict[str, Any] | None = None,
                 dataset_seed: int = 0, max_turns: int | None = None, split: str = "train"):
        super().__init__(max_turns=max_turns)
        if split not in ("train", "eval"):
            raise ValueError(f"RG: split must be 'train' or 'eval', got {split!r}")
        if isinstance(dataset_seed, bool) or not isinstance(dataset_seed, int) or not 0 <= dataset_seed <= MAX_SEED:
            raise ValueError(f"RG: dataset_seed must be an int in [0, {MAX_SEED}] (the eval split's items start at "
                             f"generator seed {EVAL_SEEDS}), got {dataset_seed!r}")
        self.task, self.difficulty, self.dataset_seed, self.split = task, difficulty, dataset_seed, split
        self.first_seed = dataset_seed + (EVAL_SEEDS if split == "eval" else 0)  # item i: random.Random(first_seed + i)
        self.dataset = _dataset(task, difficulty, config, self.first_seed)
        self.entry: dict[str, Any] = {}
        self.submitted: str | None = None

    def answer(self, answer: str) -> str:
        """Submit the final answer, written as the question asks. Ends the episode."""
        self.submitted = answer
        self.finish()
        return "submitted"

    tools = [answer]

    def task_ids(self, limit: int | None = None) -> list[str]:
        """The items of this env's split, named by generator seed, in order; the first `limit` (all: ITEMS)."""
        n = ITEMS if limit is None else max(0, min(limit, ITEMS))
        return [f"{self.task}-{self.first_seed + i}" for i in range(n)]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        index = int(self.np_random.integers(ITEMS))
        self.entry = self.dataset[index]
        self.submitted = None
        return self.entry["question"], {"task_id": f"{self.task}-{self.first_seed + index}"}

    def verify(self) -> float:
        return float(self.dataset.score_answer(self.submitted, self.entry))

    def _wrong_answer(self) -> str:
        reference = str(self.entry["answer"])
        try:
            return fmt(Fraction(reference) + 1)  # an off-by-one slip
        except (ValueError, ZeroDivisionError):
            return reference[::-1] if reference[::-1] != reference else reference + " " + reference

    def expert_action(self, noise: float = 0.0) -> str:
        """The dataset's reference answer. With probability `noise / 2` a wrong answer (off by one, or the
        reference reversed), with probability `noise / 5` a garbled call."""
        rng = self.np_random
        if noise > 0 and rng.random() < noise / 5:
            return '<tool_call>{"name": "answer", "arguments": {"answer": ' if rng.random() < 0.5 else "I know it."
        if noise > 0 and rng.random() < noise / 2:
            return _call("answer", answer=self._wrong_answer())
        return _call("answer", answer=str(self.entry["answer"]))


class ReasoningGymCalcEnv(ReasoningGymEnv):
    """The same tasks with a calculator and a scratchpad; the expert checks arithmetic on the calculator
    first where the item carries its expression (chain_sum, basic_arithmetic, products)."""

    system_prompt = "Work out the answer; the calculator and the notes are yours to use. Then answer."
    max_turns = 4

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression exactly, e.g. "(19 - 4) / 3"."""
        try:
            return f"{expression} = {fmt(calculate(expression))}"
        except ValueError as e:
            return f"calculator error: {e}"

    def note(self, text: str) -> str:
        """Write a line on the scratchpad; every call answers with the pad's last 10 lines."""
        self.notes.append(text[:200])  # the policy's text: 200 characters a line, the last 10 lines shown
        first = max(0, len(self.notes) - 10)
        return "notes:\n" + "\n".join(f"{first + i + 1}. {n}" for i, n in enumerate(self.notes[first:]))

    tools = [calculator, note, ReasoningGymEnv.answer]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self.notes: list[str] = []
        return super().reset(seed=seed, options=options)

    def _checkable_expression(self) -> str | None:
        expression = self.entry.get("metadata", {}).get("expression")
        if not isinstance(expression, str):
            return None
        try:
            return expression if fmt(calculate(expression)) == str(self.entry["answer"]) else None
        except ValueError:
            return None

    def expert_action(self, noise: float = 0.0) -> str:
        """Turn 0: the item's expression on the calculator, where it has one; then the reference answer
        (noisy as in `ReasoningGymEnv.expert_action`)."""
        if self.turn == 0 and (expression := self._checkable_expression()) is not None:
            if not (noise > 0 and self.np_random.random() < noise / 2):  # a slip: answering without checking
                return _call("calculator", expression=expression)
        return super().expert_action(noise)


class ReasoningGymChainEnv(ReasoningGymCalcEnv):
    """chain_sum with a calculator that takes one operation a call: a sum of `difficulty` terms is
    `difficulty - 1` calls and an answer, so the knob sets the horizon. Only the answer is scored:
    the env offers no step scores, so an assigner that reads them has none to read.

    >>> env = ReasoningGymChainEnv(difficulty=3, slack=1)
    >>> obs, _ = env.reset(seed=0)
    >>> env.max_turns, obs.split(": ")[-1]
    (4, '1 - 7 + 5 =')
    >>> while not env.step(env.expert_action())[2]:
    ...     pass
    >>> env.turn, env.verify()
    (3, 1.0)
    """

    system_prompt = ("Work out the sum one operation at a time: the calculator takes two numbers a call. "
                     "Then answer.")

    def __init__(self, difficulty: int = 3, slack: int = 1, dataset_seed: int = 0, split: str = "train"):
        if difficulty < 2 or slack < 0:
            raise ValueError(f"RG-Chain: need difficulty >= 2 and slack >= 0, got {difficulty} and {slack}")
        super().__init__(task="chain_sum", difficulty=difficulty, dataset_seed=dataset_seed,
                         max_turns=difficulty + slack, split=split)
        self.slack = slack

    def calculator(self, expression: str) -> str:
        """Evaluate one operation on two numbers, e.g. "-3 + 8"."""
        if not ONE_OPERATION.fullmatch(expression):
            return "calculator error: one operation on two numbers a call, e.g. \"-3 + 8\""
        try:
            value = calculate(expression)
        except ValueError as e:  # the policy's text ("05 + 3", "4 / 0"): an observation, not a failed episode
            return f"calculator error: {e}"
        if self.folded + 1 < len(self.partials) and value == self.partials[self.folded + 1]:
            self.folded += 1  # the next partial sum: what the expert carries on from
        return f"{expression} = {fmt(value)}"

    tools = [calculator, ReasoningGymEnv.answer]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        tokens = self.entry["metadata"]["expression"].split()  # "7 - 7 + 7": terms and operators, spaced
        self.terms = [int(tokens[0])] + [int(op + t) for op, t in zip(tokens[1::2], tokens[2::2])]
        self.partials = [sum(self.terms[: k + 1]) for k in range(len(self.terms))]
        self.folded = 0  # partial sums reached on the calculator
        return obs, info

    def state_key(self) -> int:
        """How far the sum has got: the partial sums reached on the calculator. Within a group (one task) two
        episodes at the same count stand at the same point, whatever turns they wasted on the way, so gigpo
        compares their returns from there."""
        return self.folded

    def expert_action(self, noise: float = 0.0) -> str:
        """The next operation on the running total, then the answer. A slip (probability `noise` a turn)
        is a miscopied number (a wasted turn; the slack absorbs it) or, one slip in four, an answer given
        before the sum is done."""
        rng = self.np_random
        k = self.folded
        if k + 1 == len(self.partials):
            return _call("answer", answer=str(self.partials[k]))
        term = self.terms[k + 1]
        if noise > 0 and rng.random() < noise:
            if rng.random() < 0.25:
                return _call("answer", answer=str(self.partials[k]))
            term += 1
        sign = "-" if term < 0 else "+"
        return _call("calculator", expression=f"{self.partials[k]} {sign} {abs(term)}")


gymnasium.register(id="agentrl/RG-v0", entry_point="agentrl.adapters.reasoning_gym_tasks:ReasoningGymEnv",
                   kwargs={"task": "chain_sum", "difficulty": 3}, disable_env_checker=True, order_enforce=False)
gymnasium.register(id="agentrl/RG-Calc-v0", entry_point="agentrl.adapters.reasoning_gym_tasks:ReasoningGymCalcEnv",
                   kwargs={"task": "basic_arithmetic", "difficulty": 3}, disable_env_checker=True, order_enforce=False)
gymnasium.register(id="agentrl/RG-Chain-v0", entry_point="agentrl.adapters.reasoning_gym_tasks:ReasoningGymChainEnv",
                   kwargs={"difficulty": 3, "slack": 1}, disable_env_checker=True, order_enforce=False)
