"""Kimi K2: calls inside a section of special tokens, each named by its id ``functions.NAME:IDX``.

    <|tool_calls_section_begin|>
    <|tool_call_begin|>functions.open:0<|tool_call_argument_begin|>{"lock": 1}<|tool_call_end|>
    <|tool_calls_section_end|>

written without the line breaks. IDX counts the calls of the conversation; the call is NAME's, whatever its
index.
"""

from __future__ import annotations

import json
import re

from agentrl.chat.calls import ToolCall, _as_arguments, _clip, _loads
from agentrl.chat.format import Block, Calls, ToolFormat, Tools, sections

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGUMENT_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
PREFIX = "functions."
_INDEX = re.compile(r":\d+\Z")
_NAME = re.compile(r"[^\s<>]+")  # a tool name, as far as the id can tell one


class KimiK2(ToolFormat):
    """``<|tool_calls_section_begin|>`` then one ``<|tool_call_begin|>functions.NAME:IDX
    <|tool_call_argument_begin|>{...}<|tool_call_end|>`` per call, then ``<|tool_calls_section_end|>``.
    An id without its ``:IDX`` still names the call; a section never closed keeps the calls completed in it
    and adds a malformed one that says so.

    >>> KimiK2().parse('<|tool_calls_section_begin|><|tool_call_begin|>functions.open:0<|tool_call_argument_begin|>'
    ...                '{"lock": 1}<|tool_call_end|><|tool_calls_section_end|>')
    [ToolCall(name='open', arguments={'lock': 1}, error=None)]
    >>> for call in KimiK2().render([("open", {"lock": 1}), ("say", {})]).split(CALL_BEGIN):
    ...     print(call)
    <|tool_calls_section_begin|>
    functions.open:0<|tool_call_argument_begin|>{"lock": 1}<|tool_call_end|>
    functions.say:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>
    """

    name = "kimi-k2"
    hint = ("Call a tool as <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0"
            "<|tool_call_argument_begin|>{...}<|tool_call_end|><|tool_calls_section_end|>")
    convention = (f"To call tools, write {SECTION_BEGIN}, then for each call {CALL_BEGIN}, its id functions.NAME:IDX "
                  f"(IDX counting the calls from 0), {ARGUMENT_BEGIN}, its arguments as a JSON object and {CALL_END}; "
                  f"end with {SECTION_END}.")
    stop_strings = (SECTION_END,)

    def blocks(self, text: str, tools: Tools | None = None) -> list[Block]:
        return sections(text, (SECTION_BEGIN, SECTION_END, CALL_BEGIN, CALL_END), _call)

    def render(self, calls: Calls) -> str:
        parts = []
        for index, (name, args) in enumerate(calls):
            if _NAME.fullmatch(name) is None:
                raise ValueError(f"kimi-k2 cannot write the tool name {name!r} in a call's id")
            parts.append(f"{CALL_BEGIN}{PREFIX}{name}:{index}{ARGUMENT_BEGIN}{_json(args)}{CALL_END}")
        return SECTION_BEGIN + "".join(parts) + SECTION_END

    def matches(self, chat_template: str) -> bool:
        return "tool_calls_section_begin" in chat_template


def _json(value: object) -> str:
    """JSON for the arguments; a "<|" inside a string is written "\\u003c|" (the same string to a JSON reader),
    so that no special token such as <|tool_call_end|> appears in it."""
    return json.dumps(value, ensure_ascii=False).replace("<|", "\\u003c|")


def _call(body: str) -> ToolCall:
    """One call from between its markers: its id, ``<|tool_call_argument_begin|>`` and its arguments."""
    call_id, sep, raw = body.partition(ARGUMENT_BEGIN)
    call_id, raw = call_id.strip(), raw.strip()
    if not sep:
        return ToolCall(None, {}, f"a call is written functions.NAME:IDX{ARGUMENT_BEGIN}{{arguments}}, got "
                                  f"{_clip(body.strip())!r}")
    name = _INDEX.sub("", call_id.removeprefix(PREFIX))
    if not call_id.startswith(PREFIX) or _NAME.fullmatch(name) is None:
        return ToolCall(None, {}, f"a call's id is functions.NAME:IDX, got {_clip(call_id)!r}")
    value, error = _loads(raw)
    if error is not None:
        return ToolCall(name, {}, f"the arguments of {_clip(name)!r}: {error}")
    args = _as_arguments(value)
    if args is None:
        return ToolCall(name, {}, f"the arguments of {_clip(name)!r} must be a JSON object, got {_clip(raw)!r}")
    return ToolCall(name, args)
