"""Llama 3.1 / 3.2 / 3.3, JSON-based tool calling: the reply is a JSON object with "name" and "parameters".

    {"name": "open", "parameters": {"lock": 1, "code": 7}}

optionally after ``<|python_tag|>``, several separated by ``;``, ending in ``<|eom_id|>`` or ``<|eot_id|>``.
"""

from __future__ import annotations

import json
import re

from agentrl.chat.calls import ToolCall, _as_arguments, _loads, _stray_key
from agentrl.chat.format import Block, Calls, ToolFormat, Tools, matching_close

PYTHON_TAG = "<|python_tag|>"
# Where a call begins: an object whose first key is one a call has (Llama writes "name" first, at times
# "type": "function" before it). The prose's other braces are not calls.
_START = re.compile(r'(?:<\|python_tag\|>\s*)?(\{)\s*"(?:name|type|parameters|arguments)"\s*:')
_SEPARATOR = re.compile(r"\s*;\s*")


class Llama3Json(ToolFormat):
    """``{"name": ..., "parameters": {...}}`` (also "arguments"), anywhere in the reply. A key besides these
    and "type" makes the call malformed: "params" or "input" hold arguments under a key Llama does not write.

    >>> Llama3Json().parse('<|python_tag|>{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}')
    [ToolCall(name='f', arguments={'x': 1}, error=None), ToolCall(name='g', arguments={}, error=None)]
    """

    name = "llama3-json"
    hint = 'Call a tool by replying with {"name": ..., "parameters": {...}}'
    convention = ('To call a tool, reply with only a JSON object {"name": tool name, "parameters": {argument '
                  'name: value}}; separate several calls with ";".')
    stop_strings = ("<|eom_id|>", "<|eot_id|>")

    def blocks(self, text: str, tools: Tools | None = None) -> list[Block]:
        out: list[Block] = []
        pos = 0
        while (m := _START.search(text, pos)) is not None:
            calls = []
            at: re.Match[str] | None = m
            while at is not None:  # `f; g` is one block of two calls
                brace = at.start(1)
                end = matching_close(text, brace)
                if end is None:  # the rest of the text is an unfinished object
                    calls.append(ToolCall(None, {}, "a tool call's JSON object was opened with { but never closed "
                                                    "with }"))
                    out.append(Block(m.start(), len(text), tuple(calls)))
                    return out
                calls.append(_call(text[brace:end]))
                sep = _SEPARATOR.match(text, end)
                at = _START.match(text, sep.end()) if sep is not None else None
            out.append(Block(m.start(), end, tuple(calls)))
            pos = end
        return out

    def render(self, calls: Calls) -> str:
        return "; ".join(json.dumps({"name": n, "parameters": a}, ensure_ascii=False) for n, a in calls)

    def matches(self, chat_template: str) -> bool:
        headers = "<|start_header_id|>" in chat_template or "<|header_start|>" in chat_template
        return PYTHON_TAG in chat_template or "ipython" in chat_template or (headers and "parameters" in chat_template)


def _call(body: str) -> ToolCall:
    obj, error = _loads(body)
    if error is not None:
        return ToolCall(None, {}, error)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(None, {}, 'a tool call must be a JSON object with a string "name", '
                                  'written {"name": ..., "parameters": {...}}')
    # "arguments" is read for "parameters" (some Llama fine-tunes write it); both at once is one too many
    key = "arguments" if "arguments" in obj and "parameters" not in obj else "parameters"
    if (stray := _stray_key(obj, obj["name"], key, allowed=("type",))) is not None:
        return ToolCall(obj["name"], {}, stray)
    args = _as_arguments(obj.get(key, {}))
    if args is None:
        return ToolCall(obj["name"], {}, f'"{key}" must be a JSON object of the arguments')
    return ToolCall(obj["name"], args)
