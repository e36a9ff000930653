"""Pythonic calls (Llama 3.2 / Llama 4 pythonic templates, ToolACE): a Python list of calls.

    [open(lock=1, code=7), read(path="notes.txt")]

Read with `ast`, never run: an argument must be a literal (a string, number, True/False/None, or a
list or dict of them; JSON's true/false/null are accepted too). Anything else is a malformed call
that says so. Llama 4's ``<|python_start|>...<|python_end|>`` and Llama 3's ``<|python_tag|>`` around
the list belong to the block.
"""

from __future__ import annotations

import ast
import json
import keyword
import re
import unicodedata
from typing import Any

from agentrl import pyparse
from agentrl.chat.calls import ToolCall, _clip
from agentrl.chat.format import Block, Calls, ToolFormat, Tools, matching_close

# Where a call list begins: "[" then a (dotted) name and "(". A Markdown link "[text](url)" is not one.
# (Whitespace is matched only after a tag: a bare `[ \t]*` would rescan every run of spaces from each of its
# positions, quadratic in the run.)
_START = re.compile(r"(?:(?:<\|python_start\|>|<\|python_tag\|>)[ \t]*)?(\[)\s*[A-Za-z_][\w.]*\s*\(")
_END = re.compile(r"[ \t]*<\|python_end\|>")
# A template that documents the pythonic convention shows a call list with keyword arguments.
_DOCUMENTED = re.compile(r"\[\s*func_?\w*\s*\(\s*\w+\s*=")
_JSON_NAMES = {"true": True, "false": False, "null": None}
_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")  # what _START finds


class Pythonic(ToolFormat):
    """``[f(a=1, b="x"), g()]``: keyword arguments with literal values.

    >>> for call in Pythonic().parse('[get_weather(city="Paris", days=3), now()]'):
    ...     print(call)
    ToolCall(name='get_weather', arguments={'city': 'Paris', 'days': 3}, error=None)
    ToolCall(name='now', arguments={}, error=None)
    >>> print(Pythonic().parse('[f(x=y)]')[0].error)
    the argument 'x' of f must be a literal value (a string, number, True/False/None, list or dict), got 'y'
    """

    name = "pythonic"
    hint = "Call tools as a Python list of calls: [NAME(arg=value, ...)]"
    convention = ("To call tools, write a Python list of calls with keyword arguments and literal values, "
                  "[tool_name(arg=value, ...), ...].")

    def blocks(self, text: str, tools: Tools | None = None) -> list[Block]:
        out = []
        pos = 0
        while (m := _START.search(text, pos)) is not None:
            bracket = m.start(1)
            end = matching_close(text, bracket, python=True)
            if end is None:
                out.append(Block(m.start(), len(text), (ToolCall(None, {}, (
                    "a list of calls was opened with [ but never closed with ]")),)))
                break
            calls = _calls(text[bracket:end])
            if (tail := _END.match(text, end)) is not None:
                end = tail.end()
            out.append(Block(m.start(), end, tuple(calls)))
            pos = end
        return out

    def render(self, calls: Calls) -> str:
        return "[" + ", ".join(_render_call(n, a) for n, a in calls) + "]"

    def matches(self, chat_template: str) -> bool:
        return _DOCUMENTED.search(chat_template) is not None


def _calls(source: str) -> list[ToolCall]:
    try:
        tree = pyparse.parse(source, mode="eval")
    except SyntaxError as e:
        return [ToolCall(None, {}, f"the list of calls is not valid Python ({e.msg}"
                                   f"{f' at char {e.offset}' if e.offset else ''}): {_clip(source)}")]
    except (RecursionError, MemoryError):
        return [ToolCall(None, {}, "the list of calls is nested too deeply to read")]
    except ValueError as e:  # a NUL character, a lone surrogate
        return [ToolCall(None, {}, f"the list of calls cannot be read as Python ({_clip(str(e))})")]
    body = tree.body  # type: ignore[attr-defined]
    if not isinstance(body, ast.List) or not body.elts:
        return [ToolCall(None, {}, f"write the calls as a Python list, [name(arg=value, ...)], got {_clip(source)}")]
    return [_call(node, source) for node in body.elts]


def _call(node: ast.expr, source: str) -> ToolCall:
    if not isinstance(node, ast.Call):
        return ToolCall(None, {}, f"each item of the list must be a call, name(arg=value, ...), got "
                                  f"{_clip(_segment(source, node))}")
    name = _dotted(node.func)
    if name is None:
        return ToolCall(None, {}, f"a call must name its tool, got {_clip(_segment(source, node.func))}")
    if node.args:
        return ToolCall(name, {}, f"the arguments of {_clip(name)} must be named, {name}(arg=value, ...), "
                                  f"got {_clip(_segment(source, node.args[0]))} without a name")
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            return ToolCall(name, {}, f"the arguments of {_clip(name)} must be written out, not unpacked with **")
        if kw.arg in args:
            return ToolCall(name, {}, f"the argument {kw.arg!r} of {_clip(name)} is given twice")
        try:
            args[kw.arg] = _literal(kw.value)
        except ValueError:
            got = _clip(_segment(source, kw.value))
            return ToolCall(name, {}, f"the argument {kw.arg!r} of {_clip(name)} must be a literal value (a string, "
                                      f"number, True/False/None, list or dict), got {got!r}")
        except RecursionError:
            return ToolCall(name, {}, f"the argument {kw.arg!r} of {_clip(name)} is nested too deeply to read")
    return ToolCall(name, args)


def _literal(node: ast.expr) -> Any:
    """A JSON-like value from a literal node; ValueError for anything else (a name, an expression, a tuple
    is read as a list, bytes and complex numbers are refused)."""
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (str, int, float, bool))):
        return node.value
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd))
            and isinstance(node.operand, ast.Constant) and type(node.operand.value) in (int, float)):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                raise ValueError("a dict key must be a string")
            out[k.value] = _literal(v)
        return out
    raise ValueError(type(node).__name__)


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := _dotted(node.value)) is not None:
        return f"{base}.{node.attr}"
    return None


def _segment(source: str, node: ast.AST) -> str:
    return ast.get_source_segment(source, node) or type(node).__name__


def _render_call(name: str, args: dict[str, Any]) -> str:
    if _TOOL_NAME.fullmatch(name) is None or not all(_is_name(part) for part in name.split(".")):
        raise ValueError(f"pythonic calls cannot name the tool {name!r}: not an ASCII Python identifier")
    parts = []
    for key, value in args.items():
        if not _is_name(key):
            raise ValueError(f"pythonic calls cannot pass the argument {key!r}: not a Python identifier")
        parts.append(f"{key}={_render_value(value)}")
    return f"{name}({', '.join(parts)})"


def _is_name(text: str) -> bool:
    """Can `text` stand as a keyword argument's name (and come back unchanged: Python folds identifiers by NFKC)?"""
    return text.isidentifier() and not keyword.iskeyword(text) and unicodedata.normalize("NFKC", text) == text


def _render_value(value: Any) -> str:
    """A Python literal for a JSON-like value (strings in double quotes, as the models write them)."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"pythonic calls cannot write the number {value!r} as a literal")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a Python string literal too
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_render_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_render_value(str(k))}: {_render_value(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"pythonic calls cannot write a {type(value).__name__} as a literal")
