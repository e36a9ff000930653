r"""Demonstration and preference data from files: JSONL conversations laid out as rollouts are.

One episode per line (or per `chosen`/`rejected` side of a pair); three lines of `demos.jsonl`::

    {"messages": [{"role": "user", "content": "Compute 3*4+5."}, {"role": "assistant", "content": "<tool_call>{\"name\": \"calc\", \"arguments\": {\"expression\": \"3*4+5\"}}</tool_call>"}, {"role": "tool", "content": "17"}, {"role": "assistant", "content": "<tool_call>{\"name\": \"answer\", \"arguments\": {\"value\": 17}}</tool_call>"}]}
    {"messages": [{"role": "system", "content": "Solve the task with the tools."}, {"role": "user", "content": "Compute 2*9+4."}, ...], "reward": 1.0}
    {"system": "Solve the task with the tools.", "tools": [], "messages": [...]}

- `messages`: an optional `system` message first, then the task (`user`), then `assistant` and
  `tool` messages alternating, ending with an `assistant` message. An assistant message is the
  policy's whole action text (tool calls as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`);
  a tool message is what the environment answered.
- `system` (or a leading system message, not both) and `tools` (function schemas as
  `AgentEnv.tool_schemas()` gives them): left out, they are the environment's own system prompt
  and tool list (`agentrl sft --env.id ...`), so the demonstration's prompt is the one its
  rollouts will see; given (even empty), they are used as they are.
- `reward`: optional (default 0.0), for preference data and statistics; SFT trains on every line.

Each message is tokenised with the model's chat layout exactly as the rollout does
(`ChatFormat`), so the loss mask covers the assistant's tokens and nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentrl.core import Episode, Turn
from agentrl.policy import ChatFormat


class DataError(ValueError):
    """A data file is missing, malformed, or holds nothing usable; the message names where."""


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class Conversation(BaseModel):
    model_config = ConfigDict(extra="ignore")
    system: str | None = Field(None, description="The system prompt; None: the environment's (see the module docstring).")
    tools: list[dict[str, Any]] | None = Field(None, description="Tool schemas; None: the environment's.")
    messages: list[Message]
    reward: float = 0.0

    @model_validator(mode="after")
    def _shape(self) -> Conversation:
        msgs = self.messages
        if msgs and msgs[0].role == "system":
            if self.system is not None:
                raise ValueError("the system prompt is given twice (the `system` field and a leading system message): keep one")
            self.system = msgs[0].content
            self.messages = msgs = msgs[1:]
        if any(m.role == "system" for m in msgs):
            raise ValueError("a system message may only come first")
        if len(msgs) < 2 or msgs[0].role != "user":
            raise ValueError("messages must start with the user's task and hold at least one assistant turn")
        for i, m in enumerate(msgs[1:], start=1):
            expected = "assistant" if i % 2 == 1 else "tool"
            if m.role != expected:
                raise ValueError(f"messages[{i}] is {m.role!r}, expected {expected!r} (assistant and tool turns alternate)")
        if msgs[-1].role != "assistant":
            raise ValueError("the last message must be the assistant's")
        return self


class PreferencePair(BaseModel):
    model_config = ConfigDict(extra="ignore")
    chosen: Conversation
    rejected: Conversation


def to_episode(conv: Conversation, chat: ChatFormat, group_id: int = 0) -> Episode:
    """Tokenise a conversation into the same turn layout a rollout produces."""
    prompt = chat.prompt_ids(conv.messages[0].content, conv.tools or [], conv.system)
    ep = Episode(prompt_ids=prompt, reward=conv.reward, terminated=True, group_id=group_id)
    ctx = len(prompt)
    msgs = conv.messages[1:]
    for i in range(0, len(msgs), 2):
        action = chat.action_ids(msgs[i].content)
        obs_text = msgs[i + 1].content if i + 1 < len(msgs) else ""
        obs = chat.observation_ids(obs_text, ended_with_eos=action[-1] == chat.eos_id) if i + 1 < len(msgs) else []
        ep.turns.append(Turn(ctx, action, [0.0] * len(action), obs, msgs[i].content, obs_text))
        ctx += len(action) + len(obs)
    return ep


def _lines(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such file")
    rows = []
    for n, line in enumerate(p.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{p}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise DataError(f"{p}:{n}: each line must be a JSON object")
        rows.append((n, obj))
    if not rows:
        raise DataError(f"{p}: the file holds no records")
    return rows


def _where(path: str | Path, n: int, e: ValidationError) -> str:
    errs = "; ".join(f"{'.'.join(map(str, x['loc'])) or 'record'}: {x['msg']}" for x in e.errors())
    return f"{path}:{n}: {errs}"


def load_conversations(path: str | Path, system: str | None = None, tools: list[dict[str, Any]] | None = None,
                       ) -> list[tuple[int, Conversation]]:
    """(line number, conversation) for every record; a missing `system` / `tools` is filled with these
    (the environment's), so that the demonstration's prompt is the one its rollouts will see."""
    out = []
    for n, obj in _lines(path):
        try:
            conv = Conversation.model_validate(obj)
        except ValidationError as e:
            raise DataError(_where(path, n, e)) from None
        update = {k: v for k, v in {"system": system, "tools": tools}.items() if getattr(conv, k) is None and v is not None}
        out.append((n, conv.model_copy(update=update)))
    return out


def load_demos(path: str | Path, chat: ChatFormat, system: str | None = None,
               tools: list[dict[str, Any]] | None = None) -> list[Episode]:
    """Demonstrations from a JSONL file of conversations (`system` / `tools`: see `load_conversations`)."""
    return [to_episode(conv, chat, group_id=n) for n, conv in load_conversations(path, system, tools)]


def load_pairs(path: str | Path, chat: ChatFormat) -> tuple[list[tuple[Episode, Episode]], dict[str, int]]:
    """Preference pairs from JSONL; a pair whose two sides are the same is skipped and counted."""
    pairs, skipped = [], {"identical": 0}
    for n, obj in _lines(path):
        try:
            pair = PreferencePair.model_validate(obj)
        except ValidationError as e:
            raise DataError(_where(path, n, e)) from None
        if pair.chosen.messages == pair.rejected.messages:
            skipped["identical"] += 1
            continue
        pairs.append((to_episode(pair.chosen, chat, n), to_episode(pair.rejected, chat, n)))
    if not pairs:
        raise DataError(f"{path}: no usable pairs ({skipped['identical']} had chosen == rejected)")
    return pairs, skipped
