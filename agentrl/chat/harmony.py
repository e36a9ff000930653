"""Harmony (gpt-oss): a call is a commentary message addressed to ``functions.NAME``, its content JSON.

    <|start|>assistant<|channel|>commentary to=functions.open <|constrain|>json<|message|>{"lock": 1}<|call|>

The recipient may also stand in the role part (``<|start|>assistant to=functions.open<|channel|>...``).
gpt-oss's generation prompt ends in ``<|start|>assistant``, so a sampled turn begins at ``<|channel|>``;
messages without a recipient (the analysis channel, a final answer) are text, not calls. The text must
be decoded with its special tokens (``skip_special_tokens=False``, as `agentrl.policy` does).
"""

from __future__ import annotations

import json
import re

from agentrl.chat.calls import ToolCall, _as_arguments, _clip, _loads
from agentrl.chat.format import Block, Calls, ToolFormat, Tools

START, CHANNEL, MESSAGE, CALL = "<|start|>", "<|channel|>", "<|message|>", "<|call|>"
_ENDS = re.compile(r"<\|call\|>|<\|end\|>|<\|return\|>|<\|start\|>")  # what ends a message's content
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


class Harmony(ToolFormat):
    """``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>``.

    >>> Harmony().parse('<|channel|>analysis<|message|>Open it.<|end|><|start|>assistant<|channel|>commentary '
    ...                 'to=functions.open <|constrain|>json<|message|>{"lock": 1}<|call|>')
    [ToolCall(name='open', arguments={'lock': 1}, error=None)]
    """

    name = "harmony"
    hint = "Call a tool as <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>"
    convention = ("To call a tool, write a commentary message addressed to functions.NAME whose content is a JSON "
                  "object of its arguments, ending with <|call|>.")
    stop_strings = (CALL,)

    def blocks(self, text: str, tools: Tools | None = None) -> list[Block]:
        out = []
        pos = 0
        while (body := text.find(MESSAGE, pos)) != -1:
            header_at, header = pos, text[pos:body]
            content = body + len(MESSAGE)
            m = _ENDS.search(text, content)
            stop = len(text) if m is None else m.start()  # where the content ends
            # the block takes its terminator, but a <|start|> already opens the next message's header
            pos = stop if m is None or m.group() == START else m.end()
            recipient = _RECIPIENT.search(header)
            if recipient is None:
                continue  # a message to the user or the analysis channel: text
            start = header.rfind(START)  # the block is the message's header and content, not text before it
            if start == -1:
                start = min(p for p in (header.find(CHANNEL), recipient.start()) if p != -1)
            closed = m is not None and m.group() == CALL
            out.append(Block(header_at + start, pos, (_call(recipient.group(1), text[content:stop], closed),)))
        return out

    def render(self, calls: Calls) -> str:
        return (START + "assistant").join(
            f"{CHANNEL}commentary to=functions.{_name(n)} <|constrain|>json{MESSAGE}"
            f"{_json(a)}{CALL}" for n, a in calls)

    def matches(self, chat_template: str) -> bool:
        return CHANNEL in chat_template or CALL in chat_template or START + "assistant" in chat_template


def _name(name: str) -> str:
    if not name or any(c.isspace() or c == "<" for c in name):
        raise ValueError(f"harmony cannot address a call to the tool name {name!r}")
    return name


def _json(value: object) -> str:
    """JSON for a message's content; a "<|" inside a string is written "\\u003c|" (the same string to a JSON
    reader), so that no special token such as <|call|> appears in it."""
    return json.dumps(value, ensure_ascii=False).replace("<|", "\\u003c|")


def _call(recipient: str, content: str, closed: bool) -> ToolCall:
    if not recipient.startswith("functions.") or recipient == "functions.":
        return ToolCall(None, {}, f"a tool is called by addressing the message to=functions.NAME, "
                                  f"got to={_clip(recipient)}")
    name = recipient.removeprefix("functions.")
    value, error = _loads(content.strip())
    if error is not None:
        unclosed = "" if closed else f" (a call ends with {CALL})"
        return ToolCall(name, {}, f"the arguments of {_clip(name)!r}: {error}{unclosed}")
    args = _as_arguments(value)
    if args is None:
        return ToolCall(name, {}, f"the message to functions.{_clip(name)} must be a JSON object of its arguments, "
                                  f"got {_clip(content.strip())}")
    return ToolCall(name, args)
