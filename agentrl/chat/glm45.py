"""GLM-4.5 / GLM-4.6: the tool's name inside ``<tool_call>`` tags, then each argument as a key and a value.

    <tool_call>open
    <arg_key>lock</arg_key>
    <arg_value>1</arg_value>
    </tool_call>

A value is text: a string as it is, anything else as JSON. So, as for qwen3-coder, its type comes from
the tool's schema when `parse` is given one (``"3"`` is 3 for an integer parameter, stays ``"3"`` for a
string one); without a schema a value that reads as JSON is that JSON value, anything else the string.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentrl.chat.calls import ToolCall, _clip
from agentrl.chat.format import Block, Calls, ToolFormat, Tools, parameter_schemas
from agentrl.chat.hermes import CLOSE_TAG, OPEN_TAG, tagged_blocks
from agentrl.chat.qwen3_coder import _typed

KEY, END_KEY, VALUE, END_VALUE = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
_NAME = re.compile(r"[^\s<>{}]+")  # a tool name, as far as the layout can tell one
_SPACE = re.compile(r"\s*")


class Glm45(ToolFormat):
    """``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>``, with line breaks
    between the parts. A value keeps its text exactly: the template writes none around it.

    >>> text = '<tool_call>open\\n<arg_key>lock</arg_key>\\n<arg_value>3</arg_value>\\n</tool_call>'
    >>> Glm45().parse(text)
    [ToolCall(name='open', arguments={'lock': 3}, error=None)]
    >>> schema = [{"type": "function", "function": {"name": "open", "parameters": {
    ...     "properties": {"lock": {"type": "string"}}}}}]
    >>> Glm45().parse(text, tools=schema)[0].arguments
    {'lock': '3'}
    """

    name = "glm-4.5"
    hint = "Call a tool as <tool_call>NAME<arg_key>ARG</arg_key><arg_value>VALUE</arg_value></tool_call>"
    convention = ("To call a tool, write its name inside <tool_call></tool_call> tags, followed by each argument as "
                  "<arg_key>ARG</arg_key><arg_value>VALUE</arg_value> on its own line (strings as plain text, other "
                  "values as JSON); one block per call.")
    stop_strings = (CLOSE_TAG,)

    def blocks(self, text: str, tools: Tools | None = None) -> list[Block]:
        schemas = parameter_schemas(tools)
        return tagged_blocks(text, lambda body: (_call(body, schemas),))

    def render(self, calls: Calls) -> str:
        return "\n".join(_render_one(name, args) for name, args in calls)

    def matches(self, chat_template: str) -> bool:
        return KEY in chat_template


def _render_one(name: str, args: dict[str, Any]) -> str:
    if _NAME.fullmatch(name) is None:
        raise ValueError(f"glm-4.5 cannot write the tool name {name!r} before its arguments")
    parts = [f"{OPEN_TAG}{name}\n"]
    for key, value in args.items():
        if not key or key != key.strip() or any(c in key for c in "<>"):
            raise ValueError(f"glm-4.5 cannot write the argument name {key!r} inside {KEY}")
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if END_VALUE in text or CLOSE_TAG in text:
            raise ValueError(f"glm-4.5 cannot write the value of {key!r}: it holds {END_VALUE} or {CLOSE_TAG}")
        parts.append(f"{KEY}{key}{END_KEY}\n{VALUE}{text}{END_VALUE}\n")
    parts.append(CLOSE_TAG)
    return "".join(parts)


def _call(body: str, schemas: dict[str, dict[str, Any]]) -> ToolCall:
    """The call in one ``<tool_call>`` body: the name, then its key and value pairs."""
    first = body.find(KEY)
    head = (body if first == -1 else body[:first]).strip()
    if head.startswith("{"):
        return ToolCall(None, {}, "this model's tool calls are not JSON: write the tool's name, then each argument "
                                  f"as {KEY}ARG{END_KEY}{VALUE}VALUE{END_VALUE}, inside <tool_call>, got "
                                  f"{_clip(body.strip())}")
    if _NAME.fullmatch(head) is None:
        return ToolCall(None, {}, f"expected the tool's name right after <tool_call>, got {_clip(head)!r}")
    name, params = head, schemas.get(head, {})
    args: dict[str, Any] = {}
    pos = len(body) if first == -1 else first
    while pos < len(body):
        if not body.startswith(KEY, pos):
            return ToolCall(name, {}, f"expected {KEY} or </tool_call> in the call to {_clip(name)!r}, got "
                                      f"{_clip(body[pos:].strip())!r}")
        end_key = body.find(END_KEY, pos)
        if end_key == -1:
            return ToolCall(name, {}, f"a {KEY} in the call to {_clip(name)!r} was never closed with {END_KEY}")
        key = body[pos + len(KEY):end_key].strip()
        if not key or KEY in key:
            return ToolCall(name, {}, f"expected {KEY}ARG{END_KEY} with the argument's name in the call to "
                                      f"{_clip(name)!r}, got {_clip(body[pos:end_key + len(END_KEY)])!r}")
        if key in args:
            return ToolCall(name, {}, f"the argument {_clip(key)!r} of {_clip(name)} is given twice")
        at = _SPACE.match(body, end_key + len(END_KEY)).end()
        if not body.startswith(VALUE, at):
            return ToolCall(name, {}, f"after {KEY}{_clip(key)}{END_KEY} write {VALUE}VALUE{END_VALUE}, got "
                                      f"{_clip(body[at:].strip())!r}")
        end_value = body.find(END_VALUE, at)
        if end_value == -1:
            return ToolCall(name, {}, f"the value of {_clip(key)!r} was never closed with {END_VALUE}")
        args[key] = _typed(body[at + len(VALUE):end_value], params.get(key))
        pos = _SPACE.match(body, end_value + len(END_VALUE)).end()
    return ToolCall(name, args)
