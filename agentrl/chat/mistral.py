"""Mistral: calls after the ``[TOOL_CALLS]`` token, in either of the two forms its tokenizers use.

    [TOOL_CALLS][{"name": "open", "arguments": {"lock": 1}}, {"name": "read", "arguments": {}}]
    [TOOL_CALLS]open[ARGS]{"lock": 1}[TOOL_CALLS]read[ARGS]{}

The first is what v3 tokenizers write (Mistral 7B v0.3, Nemo: family ``mistral``), the second v11+ ones
(Mistral Small 3.1+, Devstral, Magistral: ``mistral-v11``).

Both families read both forms (a v13 ``[CALL_ID]id`` before ``[ARGS]`` is skipped, so is an "id" key);
they differ in what they write.
"""

from __future__ import annotations

import json
import re

from agentrl.chat.calls import ToolCall, _as_arguments, _clip, _stray_key
from agentrl.chat.format import Block, Calls, ToolFormat, Tools, read_json

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_NAME = re.compile(r"\s*([^\s\[\]{}]+)\s*")  # v11: the tool name runs up to [ARGS], [CALL_ID] or the object
_CALL_ID = re.compile(r"\[CALL_ID\]\s*[^\s\[{]*\s*")
_SPACE = re.compile(r"\s*")
_JSON_TYPES = {list: "a list", str: "a string", bool: "true or false", type(None): "null"}


class Mistral(ToolFormat):
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``: a JSON list of calls (v3 tokenizers).

    >>> Mistral().parse('[TOOL_CALLS] [{"name": "f", "arguments": {"x": 1}, "id": "a1b2c3d4e"}]')
    [ToolCall(name='f', arguments={'x': 1}, error=None)]
    >>> Mistral().parse('[TOOL_CALLS]f[ARGS]{"x": 1}[TOOL_CALLS]g[ARGS]{}')
    [ToolCall(name='f', arguments={'x': 1}, error=None), ToolCall(name='g', arguments={}, error=None)]
    """

    name = "mistral"
    hint = 'Call tools as [TOOL_CALLS][{"name": ..., "arguments": {...}}]'
    convention = ('To call tools, write [TOOL_CALLS] followed by a JSON list of the calls, each '
                  '{"name": tool name, "arguments": {argument name: value}}.')

    def blocks(self, text: str, tools: Tools | None = None) -> list[Block]:
        out = []
        pos = 0
        while (start := text.find(TOOL_CALLS, pos)) != -1:
            at = _SPACE.match(text, start + len(TOOL_CALLS)).end()
            end, calls = _list(text, at) if text.startswith("[", at) else _named(text, at)
            out.append(Block(start, end, tuple(calls)))
            pos = max(end, start + len(TOOL_CALLS))
        return out

    def render(self, calls: Calls) -> str:
        return TOOL_CALLS + json.dumps([{"name": n, "arguments": a} for n, a in calls], ensure_ascii=False)

    def matches(self, chat_template: str) -> bool:
        return TOOL_CALLS in chat_template


class MistralV11(Mistral):
    """``[TOOL_CALLS]NAME[ARGS]{...}``, once per call (v11+ tokenizers: Mistral Small 3.1+, Devstral, Magistral).

    >>> MistralV11().render([("f", {"x": 1}), ("g", {})])
    '[TOOL_CALLS]f[ARGS]{"x": 1}[TOOL_CALLS]g[ARGS]{}'
    """

    name = "mistral-v11"
    hint = "Call a tool as [TOOL_CALLS]NAME[ARGS]{...}"
    convention = ("To call a tool, write [TOOL_CALLS], the tool's name, [ARGS] and a JSON object of its arguments; "
                  "repeat that for each call.")

    def render(self, calls: Calls) -> str:
        parts = []
        for name, args in calls:
            if _NAME.fullmatch(name) is None or name != name.strip():
                raise ValueError(f"mistral-v11 cannot write the tool name {name!r} before [ARGS]")
            parts.append(f"{TOOL_CALLS}{name}{ARGS}{json.dumps(args, ensure_ascii=False)}")
        return "".join(parts)

    def matches(self, chat_template: str) -> bool:
        return TOOL_CALLS in chat_template and ARGS in chat_template


def _list(text: str, at: int) -> tuple[int, list[ToolCall]]:
    """v3: a JSON list of call objects at `text[at]`."""
    value, end, error = read_json(text, at)
    if error is not None:
        return end, [ToolCall(None, {}, f"after {TOOL_CALLS}, {error}")]
    if not isinstance(value, list) or not value:
        return end, [ToolCall(None, {}, f'after {TOOL_CALLS} write a non-empty JSON list of calls, '
                                        f'[{{"name": ..., "arguments": {{...}}}}], got {_clip(text[at:end])}')]
    return end, [_object(item) for item in value]


def _named(text: str, at: int) -> tuple[int, list[ToolCall]]:
    """v11+: ``NAME[ARGS]{...}`` at `text[at]` (``[CALL_ID]id`` may come before ``[ARGS]``); a lone object
    ``{"name": ..., "arguments": ...}`` is read too."""
    if text.startswith("{", at):
        value, end, error = read_json(text, at)
        if error is not None:
            return end, [ToolCall(None, {}, f"after {TOOL_CALLS}, {error}")]
        return end, [_object(value)]
    m = _NAME.match(text, at)
    if m is None:
        return at, [ToolCall(None, {}, f"after {TOOL_CALLS} write the tool's name, {ARGS} and a JSON object of "
                                       f"its arguments, got {_ahead(text, at)}")]
    name, at = m.group(1), m.end()
    if (cid := _CALL_ID.match(text, at)) is not None:
        at = cid.end()
    if text.startswith(ARGS, at):
        at = _SPACE.match(text, at + len(ARGS)).end()
    elif not text.startswith("{", at):
        return at, [ToolCall(name, {}, f"after the tool name {_clip(name)!r} write {ARGS} and a JSON object of "
                                       f"its arguments, got {_ahead(text, at)}")]
    value, end, error = read_json(text, at)
    if error is not None:
        return end, [ToolCall(name, {}, f"the arguments of {_clip(name)!r} after {ARGS}: {error}")]
    args = _as_arguments(value)
    if args is None:
        return end, [ToolCall(name, {}, f"the arguments of {_clip(name)!r} after {ARGS} must be a JSON object, "
                                        f"got {_clip(text[at:end])}")]
    return end, [ToolCall(name, args)]


def _object(item: object) -> ToolCall:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        got = "an object without a string name" if isinstance(item, dict) else _JSON_TYPES.get(type(item), "a number")
        return ToolCall(None, {}, f'each call in the list must be an object with a string "name", got {got}')
    if (stray := _stray_key(item, item["name"], "arguments", allowed=("id",))) is not None:
        return ToolCall(item["name"], {}, stray)
    args = _as_arguments(item.get("arguments", {}))
    if args is None:
        return ToolCall(item["name"], {}, f'"arguments" of {_clip(item["name"])!r} must be a JSON object')
    return ToolCall(item["name"], args)


def _ahead(text: str, at: int, n: int = 40) -> str:
    """What the model wrote from `at`, for an error: a few characters, without copying the rest of the text."""
    return repr(text[at:at + n]) + ("..." if len(text) > at + n else "")
