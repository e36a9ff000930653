"""Hermes / Qwen2.5 / Qwen3: a JSON object inside ``<tool_call>`` tags, one block per call.

    <tool_call>
    {"name": "open", "arguments": {"lock": 1, "code": 7}}
    </tool_call>

The default family: agentrl's own convention (`agentrl.core`), and the one a template with no tool
markers gets, with `instructions` in the system prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from agentrl.chat.calls import ToolCall, _as_arguments, _loads, _stray_key
from agentrl.chat.format import Block, Calls, ToolFormat, Tools

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"


def tagged_blocks(text: str, read: Callable[[str], tuple[ToolCall, ...]]) -> list[Block]:
    """Every ``<tool_call>...</tool_call>`` span of `text`, its body read by `read`: the span is what Hermes,
    qwen3-coder and GLM-4.5 share; what they write inside it differs."""
    out = []
    pos = 0
    while (start := text.find(OPEN_TAG, pos)) != -1:
        body = start + len(OPEN_TAG)
        end = text.find(CLOSE_TAG, body)
        if end == -1:  # everything after the last opening tag is an unfinished call
            out.append(Block(start, len(text), (
                ToolCall(None, {}, "a <tool_call> was opened but never closed with </tool_call>"),)))
            break
        pos = end + len(CLOSE_TAG)
        out.append(Block(start, pos, read(text[body:end])))
    return out


class Hermes(ToolFormat):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, the behaviour of `core.parse_tool_calls`
    (same calls, same messages). A `<tool_call>` never closed is a malformed call of its own, wherever it
    stands; a stray `</tool_call>` is ignored; "arguments" may be an object or a JSON string of one; a block
    may hold a JSON list of calls. A key besides "name" and "arguments" (the arguments written as
    "parameters") makes the call malformed.

    >>> Hermes().parse('<tool_call>{"name": "f", "arguments": "{\\\\"x\\\\": 1}"}</tool_call>')
    [ToolCall(name='f', arguments={'x': 1}, error=None)]
    >>> print(Hermes().parse('<tool_call>{"name": "f"</tool_call>')[0].error)
    the tool call is not valid JSON (Expecting ',' delimiter at char 12)
    >>> [c.name for c in Hermes().parse('<tool_call>[{"name": "f", "arguments": {}}, {"name": "g"}]</tool_call>')]
    ['f', 'g']
    """

    name = "hermes"
    hint = 'Call a tool as <tool_call>{"name": ..., "arguments": {...}}</tool_call>'
    convention = ('To call a tool, write a JSON object with its "name" and "arguments" inside '
                  "<tool_call></tool_call> tags, one block per call.")
    stop_strings = (CLOSE_TAG,)

    def blocks(self, text: str, tools: Tools | None = None) -> list[Block]:
        return tagged_blocks(text, _calls)

    def render(self, calls: Calls) -> str:
        return "\n".join(f"{OPEN_TAG}\n{_json({'name': n, 'arguments': a})}\n{CLOSE_TAG}" for n, a in calls)

    def matches(self, chat_template: str) -> bool:
        return OPEN_TAG in chat_template


def _json(value: object) -> str:
    """JSON for a block's body; a "</tool_call>" inside a string is written "<\\/tool_call>" (the same string
    to a JSON reader), so that it cannot end the block."""
    return json.dumps(value, ensure_ascii=False).replace(CLOSE_TAG, "<\\/tool_call>")


def _calls(body: str) -> tuple[ToolCall, ...]:
    """The calls of one block: an object, or a list of them (SmolLM2's documented form writes every call of
    a step in one block)."""
    obj, error = _loads(body)
    if error is not None:
        return (ToolCall(None, {}, error),)
    if isinstance(obj, list):
        if not obj:
            return (ToolCall(None, {}, "an empty list of tool calls"),)
        return tuple(_call(item) for item in obj)
    return (_call(obj),)


def _call(obj: object) -> ToolCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(None, {}, 'a tool call must be an object with a string "name"')
    if (stray := _stray_key(obj, obj["name"], "arguments")) is not None:
        return ToolCall(obj["name"], {}, stray)
    args = _as_arguments(obj.get("arguments", {}))
    if args is None:
        return ToolCall(obj["name"], {}, '"arguments" must be a JSON object')
    return ToolCall(obj["name"], args)
