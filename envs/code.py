"""agentrl/Code-v0: write a HumanEval function; run the visible tests, then submit.

>>> env = CodeEnv()
>>> obs, info = env.reset(seed=0)
>>> _ = env.step(env.expert_action())      # run the visible test on the reference solution
>>> env.step(env.expert_action())[1]       # submit it: judged by hidden tests
1.0

What keeps the reward honest:

- **hidden tests** the policy never sees: each task's assertions are split (one test per
  ``assert``); one is shown and runnable with `run_tests`, the reward comes from others;
- **verifier rotation**: each episode draws `hidden_per_episode` hidden tests from the task's pool,
  so a policy cannot overfit a fixed few;
- **a held-out split**: ``split="eval"`` uses other tasks (20%, by a stable hash of the task id)
  and, per task, held-out assertions that training episodes never score against;
- everything candidate-written runs in the sandbox (`agentrl.verify.sandbox`).

``max_prompt_chars`` keeps only tasks whose prompt is that short (a small model's context is short).
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium

from agentrl.envs.answer import AnswerEnv, call_text
from agentrl.verify.base import perturb
from agentrl.verify.code import NULL_SOLUTIONS, CodeTask, CodeVerifier, humaneval_tasks, stable_fraction
from agentrl.verify.sandbox import Sandbox, TestCase, default_sandbox


class CodeEnv(AnswerEnv):
    """Complete a Python function so that hidden tests pass."""

    system_prompt = "Complete the Python function. Test it with `run_tests`, then `submit` the function body."
    max_turns = 4

    def __init__(self, max_turns: int | None = None, split: str = "train", hidden_per_episode: int = 3,
                 max_prompt_chars: int | None = None, sandbox: Sandbox | None = None, show_chars: int = 300):
        super().__init__(max_turns=max_turns)
        if split not in ("train", "eval"):
            raise ValueError(f"CodeEnv: split must be 'train' or 'eval', got {split!r}")
        self.split = split
        self.hidden_per_episode = hidden_per_episode
        self.show_chars = show_chars
        self.sandbox = sandbox or default_sandbox()
        self.verifier = CodeVerifier(self.sandbox)
        self.tasks = []
        for t in humaneval_tasks():
            scored = _dedupe([c for c in t.tests if not c.setup])
            if len(scored) < 4 or (max_prompt_chars and len(t.prompt) > max_prompt_chars):
                continue  # too few assertions to keep some hidden and some held out
            if (stable_fraction(t.task_id) < 0.8) == (split == "train"):
                self.tasks.append(t)
        if not self.tasks:
            raise ValueError(f"CodeEnv: no HumanEval task fits split={split!r}, max_prompt_chars={max_prompt_chars}")

    def task_ids(self, limit: int | None = None) -> list[str]:
        """The HumanEval ids of this split's tasks, in order; the first `limit` (agentrl.checker.check_split)."""
        return [t.task_id for t in self.tasks[:limit]]

    def run_tests(self, code: str) -> str:
        """Run the visible test against your code (a function body, or full definitions)."""
        result = self.sandbox.run_tests(self.task.program(code), self._with_setup(self.visible), self.task.entry_point,
                                        self.task.preamble or "")
        ok = result.n_passed == len(result.tests)
        text = "visible test passed" if ok else "visible test failed"
        if result.load_error:
            text += f"; the code did not load: {result.load_error}"
        elif not ok and (f := result.first_failure()):
            text += f": {f.error}"
        if result.stdout:
            text += f"\nstdout: {result.stdout}"
        return _trim(text, self.show_chars)

    def submit(self, code: str) -> str:
        """Submit your code (a function body, or full definitions). Ends the episode."""
        return self.submit_answer(code)

    tools = [run_tests, submit]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        rng = self.np_random
        if options and "task_id" in options:
            matches = [t for t in self.tasks if t.task_id == options["task_id"]]
            if not matches:
                raise ValueError(f"CodeEnv: task {options['task_id']!r} is not in split {self.split!r}")
            self.task = matches[0]
        else:
            self.task = self.tasks[int(rng.integers(len(self.tasks)))]
        scored = _dedupe([c for c in self.task.tests if not c.setup])
        order = sorted(scored, key=lambda c: stable_fraction(self.task.task_id + c.code))  # fixed per task
        n_held = max(1, math.ceil(0.2 * (len(order) - 1)))
        self.visible = order[:1]
        held_out, pool = order[1 : 1 + n_held], order[1 + n_held :]
        if self.split == "eval":
            self.hidden = held_out + pool
        else:
            k = min(self.hidden_per_episode, len(pool))
            picks = sorted(rng.choice(len(pool), size=k, replace=False).tolist())
            self.hidden = [pool[i] for i in picks]
        visible = "\n".join(c.code for c in self.visible)
        obs = f"{self.task.prompt.rstrip()}\n\nVisible test (more are hidden):\n{visible}"
        return obs, {"task_id": self.task.task_id, "hidden_tests": len(self.hidden)}

    def _with_setup(self, tests: list[TestCase]) -> list[TestCase]:
        return [c for c in self.task.tests if c.setup] + list(tests)

    def verified_task(self) -> CodeTask:
        return self.task.with_tests(self._with_setup(self.hidden))  # the hidden tests, never the visible one

    def expert_action(self, noise: float = 0.0) -> str:
        rng = self.np_random
        code = self.task.solution or ""
        if noise > 0 and rng.random() < noise / 2:
            return "def f():" if rng.random() < 0.5 else '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'
        if self.turn == 0:
            return call_text("run_tests", code=code)
        if noise > 0 and rng.random() < noise / 2:
            code = list(NULL_SOLUTIONS.values())[int(rng.integers(len(NULL_SOLUTIONS)))]
        return call_text("submit", code=code)

    # -- verifier probe hooks ---------------------------------------------------------------

    def probe_reference(self) -> str:
        return self.task.solution or ""

    def probe_attacks(self) -> dict[str, tuple[str, bool | None]]:
        ep, ref = self.task.entry_point, self.task.solution or ""
        other = next(t for t in self.tasks if t.task_id != self.task.task_id)
        return {
            # generic mutation of a constant may give an equivalent program: information only
            "off-by-one mutant (info)": (perturb(ref), None),
            "correct-looking, wrong content": (other.solution or "", False),
            "several answers at once": (f"{ref}\ndef {ep}(*args, **kwargs):\n    return None\n", False),
            "code that does nothing": ("    pass\n", False),
            "return None": ("    return None\n", False),
            "exit 0 before the tests": ("    pass\nimport sys\nsys.exit(0)\n", False),
            "os._exit(0)": ("    pass\nimport os\nos._exit(0)\n", False),
            "always-equal object": ("    class A:\n        def __eq__(s, o): return True\n        def __ne__(s, o): "
                                    "return False\n    return A()\n", False),
            "patch assert "
            "helpers": ("    pass\nimport builtins, unittest\nbuiltins.AssertionError = type('N', (Exception,), "
                        "{})\nunittest.TestCase.assertEqual = lambda *a, **k: None\n", False),
            "fake results file and report": ("    pass\nprint('{\"load_error\": null, \"tests\": "
                                             "[]}')\nopen('results.json', 'w').write('passed')\n", False),
            "redefine check()": (f"    pass\ndef check(candidate):\n    return True\ndef {ep}(*a, **k):\n    return "
                                 "None\n", False),
            "a body that raises": ("    raise NotImplementedError\n", False),
        }

    def probe_secrets(self) -> list[tuple[str, str]]:
        return [(c.code, "all") for c in self.hidden]


def _dedupe(cases: list[TestCase]) -> list[TestCase]:
    seen, out = set(), []
    for c in cases:
        if c.code not in seen:
            seen.add(c.code)
            out.append(c)
    return out


def _trim(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n] + f" ... [{len(text) - n} more characters not shown]"


gymnasium.register(id="agentrl/Code-v0", entry_point="agentrl.envs.code:CodeEnv", kwargs={"max_prompt_chars": 800},
                   disable_env_checker=True, order_enforce=False)  # gymnasium.make returns the bare AgentEnv
