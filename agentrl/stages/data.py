r"""Demonstration and preference data from files: JSONL conversations laid out as rollouts are.

One episode per line (or per `chosen`/`rejected` side of a pair); three lines of `demos.jsonl`::

    {"messages": [{"role": "user", "content": "Compute 3*4+5."}, {"role": "assistant", "content": "<tool_call>{\"name\":
    \"calc\", \"arguments\": {\"expression\": \"3*4+5\"}}</tool_call>"}, {"role": "tool", "content": "17"}, {"role":
    "assistant", "content": "<tool_call>{\"name\": \"answer\", \"arguments\": {\"value\": 17}}</tool_call>"}]}
    {"messages": [{"role": "system", "content": "Solve the task with the tools."}, {"role": "user", "content": "Compute
    2*9+4."}, ...], "reward": 1.0}
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

TRL's formats are read as they are:

- **conversational** (`messages`, OpenAI style): an assistant message may carry ``tool_calls``
  (``[{"type": "function", "function": {"name": ..., "arguments": {...} or a JSON string}}]``) and
  ``content`` null; it becomes the action text the policy writes, its content followed by one
  ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` per call. ``tool`` messages may carry
  ``tool_call_id`` / ``name``; consecutive ones (parallel calls) are joined with newlines into one
  observation, as an env joins its tools' outputs. ``tools`` may be a list or a JSON string.
- **preference**: ``chosen`` / ``rejected`` as message lists (TRL) or as conversations
  (``{"messages": [...]}``), optionally after a shared ``prompt`` (a message list, or a string for
  the user's task); with a string ``prompt``, ``chosen`` / ``rejected`` may be strings too (TRL's
  standard format: one assistant turn each).

A path is a JSONL file or a folder written by `datasets` ``save_to_disk`` (read with
``datasets.load_from_disk``, the ``[datasets]`` extra; a `DatasetDict` is read from its ``train``
split, or its only one). Store tool-call ``arguments`` there as JSON strings: Arrow merges every row's
argument keys into one struct and fills the missing ones with null. A bad record is named by its file
and line, or folder and row.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentrl.chat.layout import ChatFormat
from agentrl.core import Episode, Turn


class DataError(ValueError):
    """A data file is missing, malformed, or holds nothing usable; the message names where."""


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool"]
    content: str


def _tool_call_text(call: Any, i: int) -> str:
    """One OpenAI-style tool call as the `<tool_call>` text the policy writes."""
    if not isinstance(call, dict):
        raise ValueError(f"tool_calls[{i}] must be an object, got {type(call).__name__}")
    fn = call.get("function", call)  # {"type": "function", "function": {...}}, or the function object itself
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ValueError(f'tool_calls[{i}] needs a "function" with a string "name"')
    args = fn.get("arguments", {})
    if isinstance(args, str):  # OpenAI sends arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            raise ValueError(f"tool_calls[{i}].function.arguments is not valid JSON ({e.msg})") from None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ValueError(f"tool_calls[{i}].function.arguments must be an object")
    return f"<tool_call>{json.dumps({'name': fn['name'], 'arguments': args})}</tool_call>"


_TRL_KEYS = {"tool_calls", "tool_call_id", "name"}  # OpenAI/TRL message keys folded into agentrl's (role, content)


def _from_openai(messages: Any) -> Any:
    """TRL's conversational messages in agentrl's layout; anything else is left for the model to judge."""
    if not isinstance(messages, list):
        return messages
    out: list[Any] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not (_TRL_KEYS & m.keys() or m.get("content") is None):
            out.append(m)
            continue
        unknown = set(m) - _TRL_KEYS - {"role", "content"}
        if unknown:
            raise ValueError(f"messages[{i}]: unknown keys {sorted(unknown)}")
        role, content, calls = m.get("role"), m.get("content"), m.get("tool_calls") or []
        if calls and role != "assistant":
            raise ValueError(f"messages[{i}]: only an assistant message may carry tool_calls, not {role!r}")
        if not isinstance(calls, list):
            raise ValueError(f"messages[{i}].tool_calls must be a list")
        if content is not None and not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be text or null")
        text = (content or "") + "".join(_tool_call_text(c, k) for k, c in enumerate(calls))
        if not text and role != "tool":
            raise ValueError(f"messages[{i}]: a {role} message with neither content nor tool_calls")
        out.append({"role": role, "content": text})
    merged: list[Any] = []
    for m in out:  # parallel calls' results, one tool message each, are one observation
        if merged and isinstance(m, dict) and m.get("role") == "tool" and isinstance(merged[-1], dict) \
                and merged[-1].get("role") == "tool" and isinstance(m.get("content"), str):
            merged[-1] = {"role": "tool", "content": f"{merged[-1]['content']}\n{m['content']}"}
        else:
            merged.append(m)
    return merged


class Conversation(BaseModel):
    model_config = ConfigDict(extra="ignore")
    system: str | None = Field(None, description="The system prompt; None: the environment's (see the module "
                               "docstring).")
    tools: list[dict[str, Any]] | None = Field(None, description="Tool schemas; None: the environment's.")
    messages: list[Message]
    reward: float = 0.0

    @model_validator(mode="before")
    @classmethod
    def _openai(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data, messages=_from_openai(data.get("messages")))
        if isinstance(data.get("tools"), str):  # datasets store a list of schemas as JSON text (Arrow needs one type)
            try:
                data["tools"] = json.loads(data["tools"])
            except json.JSONDecodeError as e:
                raise ValueError(f"tools is a string but not valid JSON ({e.msg})") from None
        return data

    @model_validator(mode="after")
    def _shape(self) -> Conversation:
        msgs = self.messages
        if msgs and msgs[0].role == "system":
            if self.system is not None:
                raise ValueError("the system prompt is given twice (the `system` field and a leading system message): "
                                 "keep one")
            self.system = msgs[0].content
            self.messages = msgs = msgs[1:]
        if any(m.role == "system" for m in msgs):
            raise ValueError("a system message may only come first")
        if len(msgs) < 2 or msgs[0].role != "user":
            raise ValueError("messages must start with the user's task and hold at least one assistant turn")
        for i, m in enumerate(msgs[1:], start=1):
            expected = "assistant" if i % 2 == 1 else "tool"
            if m.role != expected:
                raise ValueError(f"messages[{i}] is {m.role!r}, expected {expected!r} (assistant and tool turns "
                                 "alternate)")
        if msgs[-1].role != "assistant":
            raise ValueError("the last message must be the assistant's")
        return self


class PreferencePair(BaseModel):
    model_config = ConfigDict(extra="ignore")
    chosen: Conversation
    rejected: Conversation

    @model_validator(mode="before")
    @classmethod
    def _trl(cls, data: Any) -> Any:
        """TRL's preference rows: sides as message lists or strings, after an optional shared prompt."""
        if not isinstance(data, dict):
            return data
        prompt = data.get("prompt")
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if prompt is not None and not isinstance(prompt, list):
            raise ValueError("prompt must be a list of messages or the user's task as a string")
        out = dict(data)
        for side in ("chosen", "rejected"):
            value = data.get(side)
            if isinstance(value, str):
                if prompt is None:
                    raise ValueError(f"{side} is a string, which needs a prompt (TRL's standard format)")
                value = [{"role": "assistant", "content": value}]
            if isinstance(value, list):
                value = {"messages": (prompt or []) + value}
                for key in ("system", "tools"):
                    if data.get(key) is not None:
                        value[key] = data[key]
            elif prompt is not None and isinstance(value, dict):
                value = dict(value, messages=prompt + list(value.get("messages") or []))
            out[side] = value
        return out


def to_episode(conv: Conversation, chat: ChatFormat, group_id: int = 0) -> Episode:
    """Tokenise a conversation into the same turn layout a rollout produces."""
    prompt = chat.prompt_ids(conv.messages[0].content, conv.tools or [], conv.system)
    ep = Episode(prompt_ids=prompt, reward=conv.reward, terminated=True, group_id=group_id)
    ctx = len(prompt)
    msgs = conv.messages[1:]
    for i in range(0, len(msgs), 2):
        action = chat.action_ids(msgs[i].content)
        obs_text = msgs[i + 1].content if i + 1 < len(msgs) else ""
        obs = chat.following(action, obs_text) if i + 1 < len(msgs) else []
        ep.turns.append(Turn(ctx, action, [0.0] * len(action), obs, msgs[i].content, obs_text))
        ctx += len(action) + len(obs)
    return ep


def _rows_on_disk(p: Path) -> list[tuple[int, dict[str, Any]]]:
    """A `save_to_disk` folder's rows (numbered from 1, as a file's lines are)."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"{p}: a folder is read as a `datasets` dataset saved with save_to_disk, which needs the "
                        "datasets package: pip install 'agentrl[datasets]'") from None
    try:
        data = datasets.load_from_disk(str(p))
    except (FileNotFoundError, ValueError) as e:
        raise DataError(f"{p}: not a dataset saved with save_to_disk ({e})") from None
    if isinstance(data, datasets.DatasetDict):
        if "train" not in data and len(data) != 1:
            raise DataError(f"{p}: a DatasetDict with splits {sorted(data)} and no 'train': save the split to read")
        data = data["train"] if "train" in data else next(iter(data.values()))
    # Arrow gives every row every column, null where a row had none: a null field is an absent one
    rows = [(i, {k: v for k, v in row.items() if v is not None}) for i, row in enumerate(data, start=1)]
    if not rows:
        raise DataError(f"{p}: the dataset holds no rows")
    return rows


def _where_row(path: str | Path, n: int) -> str:
    return f"{path}[row {n}]" if Path(path).is_dir() else f"{path}:{n}"


def _lines(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    p = Path(path)
    if p.is_dir():
        return _rows_on_disk(p)
    if not p.is_file():
        raise DataError(f"{p}: no such file or dataset folder")
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
    return f"{_where_row(path, n)}: {errs}"


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
        update = {k: v for k, v in {"system": system, "tools": tools}.items() if getattr(conv, k) is None
                  and v is not None}
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
