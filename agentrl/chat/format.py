"""`ToolFormat`: how one model family writes tool calls, read (`parse`) and written (`render`).

A family's parser finds the call *blocks* in a text (`blocks`): each is a span of the text and the calls
written in it. `parse` is every block's calls in order; `agentrl.chat.convert` replaces each block by
another family's rendering of its calls, keeping the text around it.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.chat.calls import ToolCall, _clip, _loads

Calls = Sequence[tuple[str, dict[str, Any]]]  # what `render` writes: (name, arguments) pairs
Tools = Sequence[dict[str, Any]]  # OpenAI function schemas, as `AgentEnv.tool_schemas()` returns them


@dataclass(frozen=True)
class Block:
    """One call block in a text: `text[start:end]` holds `calls` (one for most families, several for a
    list such as Mistral's ``[TOOL_CALLS][...]`` or a pythonic ``[f(), g()]``)."""

    start: int
    end: int
    calls: tuple[ToolCall, ...]


class ToolFormat(ABC):
    """How one model family writes tool calls. Subclasses set `name`, `hint`, `convention` and
    `stop_strings`, and implement `blocks`, `render` and `matches`.

    >>> from agentrl.chat import get_format
    >>> fmt = get_format("hermes")
    >>> fmt.render([("open", {"lock": 1})])
    '<tool_call>\\n{"name": "open", "arguments": {"lock": 1}}\\n</tool_call>'
    >>> fmt.parse('I will open it. <tool_call>{"name": "open", "arguments": {"lock": 1}}</tool_call>')
    [ToolCall(name='open', arguments={'lock': 1}, error=None)]
    """

    name: str  # kebab-case id, as `--tool-format` takes it
    hint: str  # the one-line reminder for a turn that holds no call at all
    convention: str  # one sentence for `instructions`: how a call is written in this family
    stop_strings: tuple[str, ...] = ()  # text after which generation can stop (the end of a call)

    @abstractmethod
    def blocks(self, text: str, tools: Tools | None = None) -> list[Block]:
        """Every call block in `text`, in order. Never raises: a call written wrong is a `ToolCall` with
        `error` set. `tools` (the schemas) is for families whose values are text (qwen3-coder, glm-4.5)."""

    @abstractmethod
    def render(self, calls: Calls) -> str:
        """The text this family's model writes for `calls`; `parse` of it gives the calls back. Raises
        `ValueError` for a call the family cannot write (a name or value its syntax has no room for)."""

    @abstractmethod
    def matches(self, chat_template: str) -> bool:
        """Whether a tokenizer's chat template source renders tool calls this family's way."""

    def parse(self, text: str, tools: Tools | None = None) -> list[ToolCall]:
        """Every call in `text`, in order; malformed ones carry `error`. Never raises."""
        return [call for block in self.blocks(text, tools) for call in block.calls]

    def instructions(self, tools: Tools) -> str:
        """System-prompt text for chat templates that ignore ``tools=``: the schemas, this family's
        convention and a one-line example with the first tool. Empty when there are no tools."""
        if not tools:
            return ""
        first = _function(tools[0])
        example = self.render([(first.get("name", "tool"), example_arguments(first.get("parameters") or {}))])
        lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        return (f"# Tools\n\nYou can call these tools, each described by a JSON schema on its own line:\n"
                f"<tools>\n{lines}\n</tools>\n\n{self.convention} For example:\n{example}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    """The ``{"name", "description", "parameters"}`` part of a schema, wrapped (OpenAI) or bare."""
    inner = tool.get("function")
    return inner if isinstance(inner, dict) else tool


def parameter_schemas(tools: Tools | None) -> dict[str, dict[str, Any]]:
    """Tool name -> parameter name -> that parameter's JSON schema."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        fn = _function(tool)
        props = (fn.get("parameters") or {}).get("properties") or {}
        if isinstance(fn.get("name"), str) and isinstance(props, dict):
            out[fn["name"]] = props
    return out


_PLACEHOLDERS = {"string": "...", "integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}


def example_arguments(parameters: dict[str, Any]) -> dict[str, Any]:
    """Arguments for an example call: each required parameter (every one if none is marked) with its
    default, first enum value or a placeholder of its type.

    >>> example_arguments({"properties": {"lock": {"type": "integer"}, "note": {"type": "string"}},
    ...                    "required": ["lock"]})
    {'lock': 1}
    """
    props = parameters.get("properties") or {}
    required = parameters.get("required") or list(props)
    args = {}
    for name in required:
        spec = props.get(name) or {}
        if "default" in spec:
            args[name] = spec["default"]
        elif spec.get("enum"):
            args[name] = spec["enum"][0]
        else:
            args[name] = _PLACEHOLDERS.get(spec.get("type"), "...")
    return args


def read_json(text: str, at: int) -> tuple[Any, int, str | None]:
    """The JSON object or list that begins at `text[at]`: (value, end, None) or (None, end, why not), where
    `end` is just past the value, or the end of the text when it never closes. Never raises.

    Its extent is found first (`matching_close`) and only that span decoded: a decoder run on the whole
    rest of the text would cost, at each failure, a scan back to the text's start (JSONDecodeError counts
    the lines before the error), quadratic over a text of many broken calls.

    >>> read_json('x {"a": [1]} and more', 2)
    ({'a': [1]}, 12, None)
    """
    if text[at:at + 1] not in ("{", "["):
        return None, at, f"expected a JSON object, got {_clip(text[at:at + 20])!r}"
    end = matching_close(text, at)
    if end is None:
        return None, len(text), "the JSON was opened but never closed"
    value, error = _loads(text[at:end])
    return value, end, error


def matching_close(text: str, start: int, python: bool = False) -> int | None:
    """The index just past the bracket that closes the one at `text[start]`, or None if it never closes.

    Brackets inside string literals do not count: JSON's ``"..."`` with backslash escapes, and with
    `python` also ``'...'`` and triple-quoted strings. Brackets of all three kinds count alike: the
    parser that reads the span afterwards reports a mismatch precisely. One pass, so finding every
    block of a text stays linear in its length.

    >>> matching_close('[f(x="])"), g()] tail', 0, python=True)
    16
    """
    quotes = "\"'" if python else '"'
    depth = 0
    i, n = start, len(text)
    while i < n:
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        elif c in quotes:
            delim = c * 3 if python and text.startswith(c * 3, i) else c
            i += len(delim)
            while i < n and not text.startswith(delim, i):
                i += 2 if text[i] == "\\" else 1
            if i >= n:
                return None
            i += len(delim) - 1
        i += 1
    return None


def sections(text: str, markers: tuple[str, str, str, str], read: Callable[[str], ToolCall]) -> list[Block]:
    """The blocks of a family that writes its calls in a section of marker tokens (DeepSeek, Kimi K2):
    `markers` is (section begin, section end, call begin, call end), and `read` makes a call of the text
    between a call's markers. Each section is a block. Text between calls is ignored. A call runs to the
    first call end after it, as a Hermes block runs to its first close: one that holds another call's
    begin was never closed, and is one malformed call with it. A section never closed keeps the calls
    completed in it and adds a malformed call that says so; one without a call is malformed too.

    >>> (block,) = sections("x <s><c>f</c><c>g</s>", ("<s>", "</s>", "<c>", "</c>"), lambda body: ToolCall(body, {}))
    >>> block.start, block.end, [call.name or call.error for call in block.calls]
    (2, 21, ['f', 'a call opened with <c> was never closed with </c>'])
    """
    begin, end, call_begin, call_end = markers
    out = []
    pos = 0
    while (start := text.find(begin, pos)) != -1:
        body = start + len(begin)
        stop = text.find(end, body)
        closed = stop != -1
        stop = stop if closed else len(text)
        calls = []
        at = body
        while (call := text.find(call_begin, at, stop)) != -1:
            inner = call + len(call_begin)
            close = text.find(call_end, inner, stop)
            if close == -1 or text.find(call_begin, inner, close) != -1:
                calls.append(ToolCall(None, {}, f"a call opened with {call_begin} was never closed with {call_end}"))
                if close == -1:
                    break
            else:
                calls.append(read(text[inner:close]))
            at = close + len(call_end)
        if not closed:
            calls.append(ToolCall(None, {}, f"the tool calls section was opened with {begin} but never closed "
                                            f"with {end}"))
        elif not calls:
            calls.append(ToolCall(None, {}, f"the tool calls section holds no call: write {call_begin}...{call_end} "
                                            "inside it"))
        pos = stop + len(end) if closed else len(text)
        out.append(Block(start, pos, tuple(calls)))
        if not closed:
            break
    return out
