"""The shape shared by the envs whose episode ends with one submitted answer (Code, SQL, Math).

Such an env has a `submit` tool that stores the answer and ends the episode, a `task` drawn in `reset`,
and a `verifier` that scores the answer against the task; nothing submitted scores 0. `AnswerEnv` holds
that part, so a subclass writes only what differs: its tools (its `submit` is one line, which keeps the
argument name and the docstring the policy reads), its tasks, and, where the verifier sees more than
the task (Code's hidden tests), `verified_task`.
"""

from __future__ import annotations

import json
from typing import Any

from agentrl.core import AgentEnv


class AnswerEnv(AgentEnv):
    """An `AgentEnv` ended by one submitted answer, scored by `self.verifier(self.verified_task(), answer)`."""

    submitted: str | None = None
    task: Any
    verifier: Any

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        out = super().reset(seed=seed, options=options)
        self.submitted = None  # before the subclass draws its task: a new episode has no answer yet
        return out

    def submit_answer(self, answer: str) -> str:
        """What a `submit` tool does: keep the answer and end the episode."""
        self.submitted = answer
        self.finish()
        return "submitted"

    def verified_task(self) -> Any:
        """What the verifier scores the answer against (default: the task)."""
        return self.task

    def verify(self) -> float:
        if self.submitted is None:
            return 0.0
        return self.verifier(self.verified_task(), self.submitted).score


def call_text(name: str, **arguments: Any) -> str:
    """A tool call as the experts write it (the Hermes format the envs' prompts ask for).

    >>> call_text("submit", answer="7/2")
    '<tool_call>{"name": "submit", "arguments": {"answer": "7/2"}}</tool_call>'
    """
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"
