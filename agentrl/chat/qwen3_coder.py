"""Qwen3-Coder: XML inside ``<tool_call>`` tags, each argument's value written as text.

    <tool_call>
    <function=open>
    <parameter=lock>
    1
    </parameter>
    </function>
    </tool_call>

A value is text, so its type comes from the tool's schema when `parse` is given one (``"3"`` is 3 for an
integer parameter, stays ``"3"`` for a string one); without a schema a value that reads as JSON is
that JSON value, anything else the string.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentrl.chat.calls import ToolCall, _clip, _loads
from agentrl.chat.format import Block, Calls, ToolFormat, Tools, parameter_schemas
from agentrl.chat.hermes import CLOSE_TAG, OPEN_TAG, tagged_blocks

FUNCTION, END_FUNCTION = "<function=", "</function>"
PARAMETER, END_PARAMETER = "<parameter=", "</parameter>"
_INT = re.compile(r"[+-]?\d+")


class Qwen3Coder(ToolFormat):
    """``<tool_call><function=NAME><parameter=P>VALUE</parameter>...</function></tool_call>``.

    Lenient where the model's omission loses nothing: a missing ``</parameter>`` ends at the next
    parameter or at ``</function>``, a missing ``</function>`` at ``</tool_call>``. One newline on each
    side of a value is the layout's, not the value's.

    >>> text = '<tool_call>\\n<function=open>\\n<parameter=lock>\\n3\\n</parameter>\\n</function>\\n</tool_call>'
    >>> Qwen3Coder().parse(text)
    [ToolCall(name='open', arguments={'lock': 3}, error=None)]
    >>> schema = [{"type": "function", "function": {"name": "open", "parameters": {
    ...     "properties": {"lock": {"type": "string"}}}}}]
    >>> Qwen3Coder().parse(text, tools=schema)[0].arguments
    {'lock': '3'}
    """

    name = "qwen3-coder"
    hint = "Call a tool as <tool_call><function=NAME><parameter=ARG>VALUE</parameter></function></tool_call>"
    convention = ("To call a tool, write <function=NAME>...</function> inside <tool_call></tool_call> tags, each "
                  "argument in its own <parameter=ARG>VALUE</parameter> block (strings as plain text, other values "
                  "as JSON); one block per call.")
    stop_strings = (CLOSE_TAG,)

    def blocks(self, text: str, tools: Tools | None = None) -> list[Block]:
        schemas = parameter_schemas(tools)
        return tagged_blocks(text, lambda body: tuple(_functions(body, schemas)))

    def render(self, calls: Calls) -> str:
        return "\n".join(_render_one(name, args) for name, args in calls)

    def matches(self, chat_template: str) -> bool:
        return FUNCTION in chat_template and PARAMETER in chat_template


def _render_one(name: str, args: dict[str, Any]) -> str:
    _check_tag_text("tool name", name)
    parts = [f"{OPEN_TAG}\n{FUNCTION}{name}>\n"]
    for key, value in args.items():
        _check_tag_text("parameter name", key)
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if any(tag in text for tag in (END_PARAMETER, PARAMETER, END_FUNCTION, FUNCTION, CLOSE_TAG)):
            raise ValueError(f"qwen3-coder cannot write the value of {key!r}: it holds one of the format's tags")
        parts.append(f"{PARAMETER}{key}>\n{text}\n{END_PARAMETER}\n")
    parts.append(f"{END_FUNCTION}\n{CLOSE_TAG}")
    return "".join(parts)


def _check_tag_text(what: str, text: str) -> None:
    if not text or text != text.strip() or any(c in text for c in "<>\n"):
        raise ValueError(f"qwen3-coder cannot write the {what} {text!r} inside a tag")


def _functions(body: str, schemas: dict[str, dict[str, Any]]) -> list[ToolCall]:
    """The calls in one ``<tool_call>`` body: each ``<function=...>`` in it (one, as a rule)."""
    starts = [m.start() for m in re.finditer(re.escape(FUNCTION), body)]
    if not starts:
        stripped = body.strip()
        if stripped.startswith("{"):
            return [ToolCall(None, {}, "this model's tool calls are XML, not JSON: write "
                             "<function=NAME><parameter=ARG>VALUE</parameter></function> inside <tool_call>, "
                             f"got {_clip(stripped)}")]
        return [ToolCall(None, {}, f"expected <function=NAME> inside <tool_call>, got {_clip(stripped)!r}")]
    calls = []
    for i, start in enumerate(starts):
        stop = starts[i + 1] if i + 1 < len(starts) else len(body)
        calls.append(_function(body[start + len(FUNCTION):stop], schemas))
    return calls


def _function(rest: str, schemas: dict[str, dict[str, Any]]) -> ToolCall:
    """One call from the text after ``<function=``: ``NAME>`` then its parameters."""
    close = rest.find(">")
    name = rest[:close].strip() if close != -1 else ""
    if close == -1 or not name or "\n" in name or "<" in name:
        return ToolCall(None, {}, f"expected <function=NAME> with the tool's name before '>', got "
                                  f"{_clip(FUNCTION + rest)!r}")
    inner = rest[close + 1:]
    end = inner.find(END_FUNCTION)
    inner = inner if end == -1 else inner[:end]
    params = schemas.get(name, {})
    args: dict[str, Any] = {}
    for piece in inner.split(PARAMETER)[1:]:
        close = piece.find(">")
        key = piece[:close].strip() if close != -1 else ""
        if close == -1 or not key or "\n" in key:
            return ToolCall(name, {}, f"expected <parameter=ARG> with the argument's name before '>', got "
                                      f"{_clip(PARAMETER + piece)!r}")
        if key in args:
            return ToolCall(name, {}, f"the parameter {_clip(key)!r} of {_clip(name)} is given twice")
        value = piece[close + 1:]
        value = value.split(END_PARAMETER, 1)[0]
        value = value.removeprefix("\n").removesuffix("\n")
        args[key] = _typed(value, params.get(key))
    return ToolCall(name, args)


def _typed(value: str, schema: dict[str, Any] | None) -> Any:
    """A parameter's text as the value its schema asks for; left as text when it does not read as one,
    so that validating the arguments says what is wrong with it."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "string":
        return value
    stripped = value.strip()
    if kind == "integer":
        return int(stripped) if _INT.fullmatch(stripped) and len(stripped) < 4300 else value
    if kind == "boolean":
        return {"true": True, "false": False}.get(stripped.lower(), value)
    if kind == "null" and stripped.lower() in ("null", "none"):
        return None
    decoded, error = _loads(stripped)
    if error is not None:
        return value
    if kind == "number" and not (isinstance(decoded, (int, float)) and not isinstance(decoded, bool)):
        return value
    if kind in ("array", "object") and not isinstance(decoded, list if kind == "array" else dict):
        return value
    return decoded
