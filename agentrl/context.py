"""Context policies: what an episode does when its next turn would not fit the context budget.

A policy is chosen by name (`rollout.context.policy`) from `CONTEXT_POLICIES`. `truncate`, the default,
ends the episode as truncated, as agentrl always has. The others compact the conversation and the
episode goes on from the compacted context as a new segment (`Turn.segment_context`): the engine
drops the row's cache and starts it again on the new context, and every action is trained on exactly
the context it was sampled in (`agentrl.store.segment_batch`).

A conversation is a list of chat messages: the head (the system message, if any, and the task) and
then one assistant message and one tool message per turn. A policy that rewrites it is a pure
function of the messages, the head's length and the options:

>>> msgs = [{"role": "user", "content": "task"}] + [
...     {"role": r, "content": f"{r[0]}{k}"} for k in range(3) for r in ("assistant", "tool")]
>>> cfg = ContextConfig(policy="window", keep_turns=1)
>>> [m["content"] for m in CONTEXT_POLICIES["window"].compact(msgs, 1, cfg)]
['task', 'a2', 't2']
>>> [m["content"] for m in drop_observations(msgs, 1, ContextConfig(keep_turns=2, stub="-"))]
['task', 'a0', '-', 'a1', 't1', 'a2', 't2']

`summarize` is the one policy that asks the model: past `trigger` x the budget, the policy is given
`instruction` as a user message and its answer, the summary, is an action of its own (a `Turn` with
``kind="summary"``, no env step). The episode then continues from the head with the summary after the
task (`after_summary`). `env` asks the environment: its ``compact(messages) -> messages`` hook.

Where each policy is documented, with why its defaults are what they are: docs/context.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator

Messages = list[dict[str, str]]

DEFAULT_INSTRUCTION = (
    "Your context is almost full. Write a summary of the task so far that lets you continue without the "
    "earlier turns: every fact, code, number or name you were given that the task may still need, what you "
    "have done, and what is left to do. Write only the summary, no tool call."
)
SUMMARY_HEADER = "Summary of your progress so far (the earlier turns were removed to fit the context):\n"
DEFAULT_STUB = "[an older tool result, removed to fit the context]"


class ContextConfig(BaseModel):
    """`rollout.context`: what happens when an episode outgrows its context budget (docs/context.md).

    >>> ContextConfig().policy, ContextConfig(policy="summarize").trigger
    ('truncate', 0.75)
    """

    model_config = ConfigDict(extra="forbid")

    policy: str = Field(
        "truncate", description="truncate (default: the episode ends as truncated and is judged as it stands, as "
        "before; nothing changes for existing runs), drop-observations (older tool results become a short stub), "
        "window (system prompt, task and the last keep_turns turns), summarize (the policy writes a summary, a "
        "trained action, and the episode continues from system prompt, task and summary), env (the environment's "
        "compact(messages) hook). Each compaction opens a new segment.")
    budget: int | None = Field(
        None, ge=16, description="Context budget in tokens: the most a turn's context plus its new tokens may take. "
        "Default: rollout.max_context (the model's positions); set it lower to study long episodes on a short "
        "context. Never above rollout.max_context.")
    keep_turns: int = Field(
        4, ge=1, description="window: the last turns kept; drop-observations: the last tool results kept whole. 4 "
        "keeps the current step and its immediate lead-up; at least 1, so the latest observation always survives.")
    trigger: float = Field(
        0.75, gt=0, le=1, description="summarize: ask for the summary once the next turn would pass this share of "
        "the budget (or earlier, where the instruction and a summary of summary_max_tokens would not fit after it): "
        "a quarter of the budget leaves room for a turn's tokens, the instruction and the summary (the other "
        "policies need no room to write and compact at the budget itself).")
    instruction: str = Field(DEFAULT_INSTRUCTION, min_length=1, description="summarize: the user message that asks "
                             "for the summary; the default asks for every fact the task may still need.")
    summary_max_tokens: int = Field(
        256, ge=1, description="summarize: the summary is cut to this many tokens (at most the sampling's "
        "max_new_tokens): long enough for a few dozen facts, short enough to leave most of the budget to the task.")
    mask_summary: bool = Field(
        False, description="summarize, or an agent behind the gateway that marks its summariser's calls "
        "(metadata agentrl_kind=summary): leave the summary's tokens out of the loss (action mask 0). Off by default: "
        "a summary trained as an action learns to keep what the reward needs; masked summaries were reported to "
        "collapse (CompactionRL). On to reproduce or refute that.")
    stub: str = Field(DEFAULT_STUB, description="drop-observations: what replaces a dropped tool result.")

    @field_validator("policy")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in CONTEXT_POLICIES:
            raise ValueError(f"unknown context policy {v!r}; choose one of {', '.join(CONTEXT_POLICIES)}")
        return v

    def limit(self, max_context: int | None) -> int | None:
        """The token limit a turn's context and new tokens must fit: the budget, never past `max_context`.

        >>> ContextConfig(budget=512).limit(1024), ContextConfig().limit(1024), ContextConfig(budget=512).limit(None)
        (512, 1024, 512)
        """
        if self.budget is None or max_context is None:
            return self.budget if max_context is None else max_context
        return min(self.budget, max_context)

    def threshold(self, max_context: int | None) -> float | None:
        """Past how many tokens (context + new tokens) the policy compacts; None: it never does (truncate)."""
        limit = self.limit(max_context)
        if not get_policy(self.policy).compacts or limit is None:
            return None
        return self.trigger * limit if self.policy == "summarize" else limit


# --------------------------------------------------------------------------------------------
# The policies


@dataclass(frozen=True)
class ContextPolicy:
    """One context policy as the registry knows it: its name, a line of description, and how it rewrites
    the conversation (`compact(messages, head, config) -> messages`; None where the rollout does the work:
    truncate never compacts, summarize asks the model, env asks the environment)."""

    name: str
    description: str
    compact: Callable[[Messages, int, ContextConfig], Messages] | None = None
    compacts: bool = True  # False: the episode ends at the budget (truncate)
    asks_policy: bool = False  # the summary is sampled from the policy (summarize)
    asks_env: bool = False  # the env's own compact(messages) hook (env)


def window(messages: Messages, head: int, cfg: ContextConfig) -> Messages:
    """The head and the last `keep_turns` turns (an assistant message and its tool message each)."""
    return messages[:head] + messages[head:][-2 * cfg.keep_turns:]


def drop_observations(messages: Messages, head: int, cfg: ContextConfig) -> Messages:
    """Every tool result but the last `keep_turns` replaced by `stub`; the actions stay."""
    tools = [i for i in range(head, len(messages)) if messages[i]["role"] == "tool"]
    old = set(tools[:-cfg.keep_turns])
    return [{**m, "content": cfg.stub} if i in old else m for i, m in enumerate(messages)]


def summary_request(messages: Messages, cfg: ContextConfig) -> Messages:
    """The conversation with the instruction that asks for a summary, as the policy is given it."""
    return messages + [{"role": "user", "content": cfg.instruction}]


def after_summary(head: Messages, summary: str) -> Messages:
    """Where the episode continues after a summary: the head, the summary after the task in its user message
    (one user message: some templates refuse two in a row).

    >>> head = [{"role": "system", "content": "S"}, {"role": "user", "content": "T"}]
    >>> print(after_summary(head, "codes 1 2")[-1]["content"])
    T
    <BLANKLINE>
    Summary of your progress so far (the earlier turns were removed to fit the context):
    codes 1 2
    """
    *rest, task = head
    return rest + [{**task, "content": f"{task['content']}\n\n{SUMMARY_HEADER}{summary}"}]


CONTEXT_POLICIES: dict[str, ContextPolicy] = {}


def register_policy(policy: ContextPolicy) -> ContextPolicy:
    """Add a context policy; `rollout.context.policy` accepts its name from then on."""
    if policy.name in CONTEXT_POLICIES:
        raise ValueError(f"context policy {policy.name!r} is registered already")
    CONTEXT_POLICIES[policy.name] = policy
    return policy


def get_policy(name: str) -> ContextPolicy:
    if name not in CONTEXT_POLICIES:
        raise KeyError(f"unknown context policy {name!r}; choose one of {', '.join(CONTEXT_POLICIES)}")
    return CONTEXT_POLICIES[name]


register_policy(ContextPolicy("truncate", "end the episode as truncated when the next turn would not fit (the "
                              "default, agentrl's behaviour before context policies)", compacts=False))
register_policy(ContextPolicy("drop-observations", "replace older tool results by a short stub", drop_observations))
register_policy(ContextPolicy("window", "keep the system prompt, the task and the last keep_turns turns", window))
register_policy(ContextPolicy("summarize", "the policy writes a summary (a trained action); continue from system "
                              "prompt, task and summary", asks_policy=True))
register_policy(ContextPolicy("env", "the environment's own compact(messages) -> messages hook", asks_env=True))

__all__ = ["CONTEXT_POLICIES", "DEFAULT_INSTRUCTION", "SUMMARY_HEADER", "ContextConfig", "ContextPolicy",
           "after_summary", "drop_observations", "get_policy", "register_policy", "summary_request", "window"]
