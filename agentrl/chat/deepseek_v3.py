"""DeepSeek V3 / V3.1 / R1: calls inside a section of special tokens, in either of two layouts.

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>open
    ```json
    {"lock": 1}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>open<｜tool▁sep｜>{"lock": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

The first is what V3's and R1's templates write (the call's type, then its name and a fenced JSON block),
the second V3.1's. Both are read; the first is written. The markers' bars are fullwidth (U+FF5C) and their
spaces U+2581, as the tokenizer spells its special tokens.
"""

from __future__ import annotations

import json
import re

from agentrl.chat.calls import ToolCall, _as_arguments, _clip, _loads
from agentrl.chat.format import Block, Calls, ToolFormat, Tools, sections

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
FENCE = "```"
_NAME = re.compile(r"[^\s`{}\[\]<>]+")  # a tool name, as far as the layout can tell one


class DeepSeekV3(ToolFormat):
    """``<｜tool▁calls▁begin｜>`` then one ``<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>`` per call, then
    ``<｜tool▁calls▁end｜>``. The fence around V3's JSON may be left out; a section never closed keeps the
    calls completed in it and adds a malformed one that says so.

    >>> DeepSeekV3().parse('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>open\\n```json\\n'
    ...                    '{"lock": 1}\\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
    [ToolCall(name='open', arguments={'lock': 1}, error=None)]
    >>> DeepSeekV3().parse('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>open<｜tool▁sep｜>{"lock": 1}<｜tool▁call▁end｜>'
    ...                    '<｜tool▁calls▁end｜>')
    [ToolCall(name='open', arguments={'lock': 1}, error=None)]
    """

    name = "deepseek-v3"
    hint = ("Call a tool as <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME ```json {...} ```"
            "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    convention = (f"To call tools, write {CALLS_BEGIN}, then for each call {CALL_BEGIN}function{SEP}, the tool's name "
                  f"on its own line, its arguments as a JSON object in a ```json block and {CALL_END}; end with "
                  f"{CALLS_END}.")
    stop_strings = (CALLS_END,)

    def blocks(self, text: str, tools: Tools | None = None) -> list[Block]:
        return sections(text, (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END), _call)

    # Written in V3's layout, not V3.1's: the V3 and R1 templates write it, and the family bears their name.
    # Both layouts are read, so a V3.1 model's calls parse; demonstrations for a V3.1 model would want a family
    # that writes V3.1's layout, as mistral-v11 writes what mistral reads.
    def render(self, calls: Calls) -> str:
        parts = []
        for name, args in calls:
            if _NAME.fullmatch(name) is None:
                raise ValueError(f"deepseek-v3 cannot write the tool name {name!r} on its line")
            parts.append(f"{CALL_BEGIN}function{SEP}{name}\n{FENCE}json\n{_json(args)}\n{FENCE}{CALL_END}")
        return CALLS_BEGIN + "\n".join(parts) + CALLS_END

    def matches(self, chat_template: str) -> bool:
        return "tool▁calls▁begin" in chat_template


def _json(value: object) -> str:
    """JSON for the arguments; a "<｜" inside a string is written "\\u003c｜" (the same string to a JSON reader),
    so that no marker such as <｜tool▁call▁end｜> appears in it."""
    return json.dumps(value, ensure_ascii=False).replace("<｜", "\\u003c｜")


def _call(body: str) -> ToolCall:
    """One call from between its markers: the type "function", the separator, the name on its line and the
    arguments in a ```json block (V3, R1), or the name, the separator and the arguments (V3.1)."""
    head, sep, rest = body.partition(SEP)
    if not sep:
        return ToolCall(None, {}, f"a call is written NAME{SEP}{{arguments}} (or function{SEP}NAME and a ```json "
                                  f"block), got {_clip(body.strip())!r}")
    head, rest = head.strip(), rest.strip()
    if head == "function" and not rest.startswith(("{", "[")):  # V3: the name on its line, then the JSON
        m = _NAME.match(rest)
        if m is None:
            return ToolCall(None, {}, f"expected the tool's name after function{SEP}, got {_clip(rest)!r}")
        name, raw = m.group(), rest[m.end():].strip()
        raw = raw.removeprefix(FENCE).removeprefix("json").removesuffix(FENCE).strip()
    else:  # V3.1: the name before the separator
        if _NAME.fullmatch(head) is None:
            return ToolCall(None, {}, f"expected the tool's name before {SEP}, got {_clip(head)!r}")
        name, raw = head, rest
    value, error = _loads(raw)
    if error is not None:
        return ToolCall(name, {}, f"the arguments of {_clip(name)!r}: {error}")
    args = _as_arguments(value)
    if args is None:
        return ToolCall(name, {}, f"the arguments of {_clip(name)!r} must be a JSON object, got {_clip(raw)!r}")
    return ToolCall(name, args)
