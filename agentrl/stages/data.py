"""Demonstration and preference data from files: JSONL conversations laid out as rollouts are.

One episode per line (or per `chosen`/`rejected` side of a pair)::

    {"system": "...", "tools": [<function schemas>],
     "messages": [{"role": "user", "content": "task"},
                  {"role": "assistant", "content": "<tool_call>...</tool_call>"},
                  {"role": "tool", "content": "result"},
                  {"role": "assistant", "content": "..."}],
     "reward": 1.0}

The first message is the task (user); then assistant and tool messages alternate, ending with
an assistant message. Each is tokenised with the model's chat layout exactly as the rollout does
(`ChatFormat`), so the loss mask covers the assistant's tokens and nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from agentrl.core import Episode, Turn
from agentrl.policy import ChatFormat


class DataError(ValueError):
    """A data file is missing, malformed, or holds nothing usable; the message names where."""


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant", "tool"]
    content: str


class Conversation(BaseModel):
    model_config = ConfigDict(extra="ignore")
    system: str | None = None
    tools: list[dict[str, Any]] = []
    messages: list[Message]
    reward: float = 0.0

    @model_validator(mode="after")
    def _shape(self) -> Conversation:
        msgs = self.messages
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
    prompt = chat.prompt_ids(conv.messages[0].content, conv.tools, conv.system)
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


def load_demos(path: str | Path, chat: ChatFormat) -> list[Episode]:
    """Demonstrations from a JSONL file of conversations."""
    out = []
    for n, obj in _lines(path):
        try:
            out.append(to_episode(Conversation.model_validate(obj), chat, group_id=n))
        except ValidationError as e:
            raise DataError(_where(path, n, e)) from None
    return out


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
