"""The tool-call formats of model families (`agentrl.chat`): what each parser reads from text the models
really write, what it says about text written wrong, that it never raises, that `render` and `parse` are
inverse, that a chat template is recognised by its markers, and that `convert` rewrites a scripted
expert's Hermes calls into each family's form.

Every table below is this file's own: the texts follow each family's published convention (the models'
chat templates and their serving stacks' documentation), with the layout variants models emit.
"""

from __future__ import annotations

import ast
import json
import keyword
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agentrl.chat import (
    FORMATS,
    ToolCall,
    ToolFormat,
    convert,
    detect_format,
    get_format,
    ignores_tools,
    register_format,
)
from agentrl.chat.format import example_arguments, matching_close

NAMES = sorted(FORMATS)
TEXT_VALUED = ("qwen3-coder", "glm-4.5")  # families that write values as text, typed by the tool's schema


class Err(NamedTuple):
    """An expected malformed call: a fragment of its message (and its name, when the parser knows it)."""

    fragment: str
    name: str | None = None


def _typed(value: Any) -> str:
    """A value's text that tells 1, 1.0 and True apart (== does not) and keeps dict order."""
    return repr(value)


def check(calls: list[ToolCall], expected: list[Any]) -> None:
    assert len(calls) == len(expected), calls
    for call, want in zip(calls, expected):
        if isinstance(want, Err):
            assert call.error is not None and want.fragment in call.error, call
            assert len(call.error) < 500  # the policy's own text is clipped, never echoed whole
            if want.name is not None:
                assert call.name == want.name
        else:
            name, args = want
            assert call.error is None, call
            assert (call.name, _typed(call.arguments)) == (name, _typed(args))


# -- conformance tables ---------------------------------------------------------------------------------

VALUES = {"i": -3, "x": 2.5, "b": True, "n": None, "l": [1, "a", False], "d": {"k": {"j": [], "e": 1e-07}}}

HERMES = [
    ("single", '<tool_call>\n{"name": "open", "arguments": {"lock": 1, "code": 7}}\n</tool_call>',
     [("open", {"lock": 1, "code": 7})]),
    ("compact", '<tool_call>{"name":"open","arguments":{"lock":1}}</tool_call>', [("open", {"lock": 1})]),
    ("spaced", '<tool_call>  \n\n {"name" : "open" , "arguments" : {"lock" : 1}}  \n</tool_call>',
     [("open", {"lock": 1})]),
    ("several", '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": '
     '{"x": 1}}\n</tool_call>', [("a", {}), ("b", {"x": 1})]),
    ("values", '<tool_call>{"name": "f", "arguments": ' + json.dumps(VALUES) + "}</tool_call>", [("f", VALUES)]),
    ("text around", "<think>\nThe lock wants code 7.\n</think>\nOpening it.\n<tool_call>\n"
     '{"name": "open", "arguments": {"lock": 1}}\n</tool_call>\nDone.', [("open", {"lock": 1})]),
    ("arguments as a JSON string", '<tool_call>{"name": "f", "arguments": "{\\"x\\": [1, 2]}"}</tool_call>',
     [("f", {"x": [1, 2]})]),
    ("no arguments", '<tool_call>{"name": "now"}</tool_call>', [("now", {})]),
    ("unicode", '<tool_call>{"name": "say", "arguments": {"text": "héllo 世界 🙂"}}</tool_call>',
     [("say", {"text": "héllo 世界 🙂"})]),
    ("a stray close is text", "all done </tool_call>", []),
    ("no call", "The answer is 42.", []),
    ("bad JSON", '<tool_call>{"name": "f", "arguments": {"x": 1}</tool_call>', [Err("not valid JSON")]),
    ("name not a string", '<tool_call>{"name": 3, "arguments": {}}</tool_call>', [Err('a string "name"')]),
    ("arguments a list", '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
     [Err('"arguments" must be a JSON object', "f")]),
    ("unclosed", '<tool_call>{"name": "f", "arguments": {}}', [Err("never closed with </tool_call>")]),
    ("unclosed after a closed one", '<tool_call>{"name": "f"}</tool_call> <tool_call>{"name": "g"}',
     [("f", {}), Err("never closed")]),
    ("arguments under another key", '<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>',
     [Err("has key 'parameters'; this format writes its arguments under 'arguments'", "f")]),
    ("a key beside the arguments", '<tool_call>{"name": "f", "arguments": {}, "id": "c1"}</tool_call>',
     [Err("has key 'id' beside 'arguments'", "f")]),
]

STRING_PARAMS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "n": {"type": "integer"}, "s": {"type": "string"}, "b": {"type": "boolean"}, "x": {"type": "number"},
    "l": {"type": "array"}, "d": {"type": "object"}, "o": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}}}]


def xml(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


QWEN3_CODER = [
    ("single", xml("open", lock="1", code="7"), [("open", {"lock": 1, "code": 7})], None),
    ("compact", "<tool_call><function=open><parameter=lock>1</parameter></function></tool_call>",
     [("open", {"lock": 1})], None),
    ("several", xml("a") + "\n" + xml("b", x="1"), [("a", {}), ("b", {"x": 1})], None),
    ("values without a schema", xml("f", i="-3", x="2.5", b="true", n="null", l='[1, "a"]', d='{"k": {"j": []}}',
                                    s="plain words"),
     [("f", {"i": -3, "x": 2.5, "b": True, "n": None, "l": [1, "a"], "d": {"k": {"j": []}}, "s": "plain words"})],
     None),
    ("typed by the schema", xml("f", n="3", s="3", b="True", x="4", l="[1]", d='{"a": 1}', o="5"),
     [("f", {"n": 3, "s": "3", "b": True, "x": 4, "l": [1], "d": {"a": 1}, "o": 5})], STRING_PARAMS),
    ("left as text when it does not read as its type", xml("f", n="three", b="yes", l="[1,"),
     [("f", {"n": "three", "b": "yes", "l": "[1,"})], STRING_PARAMS),
    ("multi-line code keeps its indentation", xml("f", s="def g():\n    return 1\n"),
     [("f", {"s": "def g():\n    return 1\n"})], STRING_PARAMS),
    ("a missing </parameter>", "<tool_call>\n<function=f>\n<parameter=n>\n1\n<parameter=s>\nhi\n</function>\n"
     "</tool_call>", [("f", {"n": 1, "s": "hi"})], STRING_PARAMS),
    ("a missing </function>", "<tool_call>\n<function=f>\n<parameter=n>\n1\n</parameter>\n</tool_call>",
     [("f", {"n": 1})], None),
    ("text around", "I will open the first lock.\n\n" + xml("open", lock="1") + "\n", [("open", {"lock": 1})], None),
    ("JSON where XML belongs", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
     [Err("XML, not JSON")], None),
    ("no function", "<tool_call>\nopen lock 1\n</tool_call>", [Err("expected <function=NAME>")], None),
    ("an empty name", "<tool_call><function=><parameter=n>1</parameter></function></tool_call>",
     [Err("expected <function=NAME>")], None),
    ("a parameter twice", xml("f", n="1").replace("</function>", "<parameter=n>\n2\n</parameter>\n</function>"),
     [Err("given twice", "f")], None),
    ("unclosed", "<tool_call>\n<function=f>\n<parameter=n>\n1\n", [Err("never closed with </tool_call>")], None),
]

LLAMA3_JSON = [
    ("single", '{"name": "open", "parameters": {"lock": 1, "code": 7}}', [("open", {"lock": 1, "code": 7})]),
    ("python tag and eom", '<|python_tag|>{"name": "open", "parameters": {"lock": 1}}<|eom_id|>',
     [("open", {"lock": 1})]),
    ("arguments key", '{"name": "open", "arguments": {"lock": 1}}', [("open", {"lock": 1})]),
    ("type first", '{"type": "function", "name": "open", "parameters": {"lock": 1}}', [("open", {"lock": 1})]),
    ("several with ;", '{"name": "a", "parameters": {}};{"name": "b", "parameters": {"x": 1}}',
     [("a", {}), ("b", {"x": 1})]),
    ("several with ; and newlines", '{"name": "a", "parameters": {}} ;\n{"name": "b", "parameters": {}}<|eot_id|>',
     [("a", {}), ("b", {})]),
    ("values", '{"name": "f", "parameters": ' + json.dumps(VALUES) + "}", [("f", VALUES)]),
    ("parameters as a JSON string", '{"name": "f", "parameters": "{\\"x\\": 1}"}', [("f", {"x": 1})]),
    ("text before", 'Let me look that up.\n\n{"name": "search", "parameters": {"q": "a {b} c"}}',
     [("search", {"q": "a {b} c"})]),
    ("other braces are prose", 'the set {1, 2} and the object {"x": 1}', []),
    ("no parameters", '{"name": "now"}', [("now", {})]),
    ("unclosed", '{"name": "f", "parameters": {"x": 1}', [Err("never closed with }")]),
    ("bad JSON", '{"name": "f", "parameters": {"x": 01}}', [Err("not valid JSON")]),
    ("name not a string", '{"name": 1, "parameters": {}}', [Err('a string "name"')]),
    ("parameters a list", '{"name": "f", "parameters": [1]}', [Err('"parameters" must be a JSON object', "f")]),
    ("arguments a list", '{"name": "f", "arguments": [1]}', [Err('"arguments" must be a JSON object', "f")]),
    ("params", '{"name": "f", "params": {"x": 1}}', [Err("has key 'params'; this format writes its arguments "
                                                         "under 'parameters'", "f")]),
    ("both parameters and arguments", '{"name": "f", "parameters": {}, "arguments": {"x": 1}}',
     [Err("has key 'arguments' beside 'parameters'", "f")]),
]

MISTRAL = [
    ("v3 single with an id", '[TOOL_CALLS][{"name": "open", "arguments": {"lock": 1}, "id": "a1b2c3d4e"}]</s>',
     [("open", {"lock": 1})]),
    ("v3 with a space", '[TOOL_CALLS] [{"name": "open", "arguments": {"lock": 1}}]', [("open", {"lock": 1})]),
    ("v3 several", '[TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]',
     [("a", {}), ("b", {"x": 1})]),
    ("v3 values", '[TOOL_CALLS][{"name": "f", "arguments": ' + json.dumps(VALUES) + "}]", [("f", VALUES)]),
    ("v3 arguments as a JSON string", '[TOOL_CALLS][{"name": "f", "arguments": "{\\"x\\": 1}"}]', [("f", {"x": 1})]),
    ("v11 single", '[TOOL_CALLS]open[ARGS]{"lock": 1}', [("open", {"lock": 1})]),
    ("v11 several", '[TOOL_CALLS]a[ARGS]{}[TOOL_CALLS]b[ARGS]{"x": [1, {"y": null}]}',
     [("a", {}), ("b", {"x": [1, {"y": None}]})]),
    ("v13 call id", '[TOOL_CALLS]open[CALL_ID]a1b2c3d4e[ARGS]{"lock": 1}', [("open", {"lock": 1})]),
    ("v11 without [ARGS]", '[TOOL_CALLS]open{"lock": 1}', [("open", {"lock": 1})]),
    ("a lone object", '[TOOL_CALLS]{"name": "open", "arguments": {"lock": 1}}', [("open", {"lock": 1})]),
    ("text before", 'Opening the lock.[TOOL_CALLS]open[ARGS]{"lock": 1}</s>', [("open", {"lock": 1})]),
    ("no call", "The answer is [1, 2].", []),
    ("an empty list", "[TOOL_CALLS][]", [Err("non-empty JSON list")]),
    ("bad JSON", '[TOOL_CALLS][{"name": "f", "arguments": {"x": 01}}]', [Err("not valid JSON")]),
    ("unclosed", '[TOOL_CALLS][{"name": "f", "arguments": {]', [Err("never closed")]),
    ("v11 arguments not JSON", '[TOOL_CALLS]open[ARGS]lock=1', [Err("expected a JSON object", "open")]),
    ("an item not an object", '[TOOL_CALLS][{"name": "f", "arguments": {}}, 3]', [("f", {}), Err('a string "name"')]),
    ("v11 without arguments", "[TOOL_CALLS]open", [Err("[ARGS] and a JSON object", "open")]),
    ("v11 arguments a list", "[TOOL_CALLS]open[ARGS][1]", [Err("must be a JSON object", "open")]),
    ("v11 bad JSON", '[TOOL_CALLS]open[ARGS]{"lock": }[TOOL_CALLS]b[ARGS]{}', [Err("not valid JSON", "open"),
                                                                              ("b", {})]),
    ("nothing after the token", "[TOOL_CALLS]", [Err("the tool's name")]),
    ("v3 arguments under another key", '[TOOL_CALLS][{"name": "f", "parameters": {"x": 1}, "id": "a1b2c3d4e"}]',
     [Err("has key 'parameters'; this format writes its arguments under 'arguments'", "f")]),
    ("a lone object with another key", '[TOOL_CALLS]{"name": "f", "args": {"x": 1}}',
     [Err("has key 'args'", "f")]),
]

PYTHONIC = [
    ("single", '[get_weather(city="Paris", days=3)]', [("get_weather", {"city": "Paris", "days": 3})]),
    ("several", "[a(), b(x=1)]", [("a", {}), ("b", {"x": 1})]),
    ("values", "[f(i=-3, x=2.5, b=True, n=None, l=[1, 'a', False], d={'k': {'j': [], 'e': 1e-07}})]",
     [("f", VALUES)]),
    ("a tuple is a list", "[f(p=(1, 2))]", [("f", {"p": [1, 2]})]),
    ("JSON's true/false/null", "[f(a=true, b=false, c=null)]", [("f", {"a": True, "b": False, "c": None})]),
    ("brackets in strings", '[f(s="a ] ) [", t=\'"]\', u="""x\n]""")]',
     [("f", {"s": "a ] ) [", "t": '"]', "u": "x\n]"})]),
    ("spread over lines", "[\n  a(x=1),\n  b(y='z'),\n]", [("a", {"x": 1}), ("b", {"y": "z"})]),
    ("a dotted name", "[files.read(path='a.txt')]", [("files.read", {"path": "a.txt"})]),
    ("text around", "I'll check the weather. [get_weather(city='Oslo')] Then I'll answer.",
     [("get_weather", {"city": "Oslo"})]),
    ("Llama 4 python tokens", "<|python_start|>[f(x=1)]<|python_end|>", [("f", {"x": 1})]),
    ("Llama 3 python tag", "<|python_tag|>[f(x=1)]<|eom_id|>", [("f", {"x": 1})]),
    ("a Markdown link is prose", "see [the docs](https://example.com/f(x)) and [1, 2]", []),
    ("positional", "[f(1)]", [Err("must be named", "f")]),
    ("a name as a value", "[f(x=y)]", [Err("must be a literal value", "f")]),
    ("an expression", "[f(x=1 + 2)]", [Err("got '1 + 2'", "f")]),
    ("a call as a value", "[f(x=g())]", [Err("must be a literal value", "f")]),
    ("bytes", "[f(x=b'a')]", [Err("must be a literal value", "f")]),
    ("unpacked", "[f(**kw)]", [Err("unpacked with **", "f")]),
    ("an item not a call", "[f(x=1), 3]", [("f", {"x": 1}), Err("must be a call")]),
    ("unclosed", "[f(x=1)", [Err("never closed with ]")]),
    ("not Python", "[f(x=1,,)]", [Err("not valid Python")]),
    ("an argument twice", "[f(x=1, x=2)]", [Err("given twice", "f")]),
]

HARMONY_CALL = '<|channel|>commentary to=functions.open <|constrain|>json<|message|>{"lock": 1}<|call|>'
HARMONY = [
    ("as sampled", HARMONY_CALL, [("open", {"lock": 1})]),
    ("with its start", "<|start|>assistant" + HARMONY_CALL, [("open", {"lock": 1})]),
    ("after analysis", "<|channel|>analysis<|message|>The lock wants 7.<|end|><|start|>assistant" + HARMONY_CALL,
     [("open", {"lock": 1})]),
    ("recipient in the role", '<|start|>assistant to=functions.open<|channel|>commentary json<|message|>'
     '{"lock": 1}<|call|>', [("open", {"lock": 1})]),
    ("no constrain", '<|channel|>commentary to=functions.open<|message|>{"lock": 1}<|call|>', [("open", {"lock": 1})]),
    ("the stop token stripped", '<|channel|>commentary to=functions.open <|constrain|>json<|message|>{"lock": 1}',
     [("open", {"lock": 1})]),
    ("several", HARMONY_CALL + "<|start|>assistant" + HARMONY_CALL.replace("open", "read"),
     [("open", {"lock": 1}), ("read", {"lock": 1})]),
    ("values", '<|channel|>commentary to=functions.f <|constrain|>json<|message|>' + json.dumps(VALUES) + "<|call|>",
     [("f", VALUES)]),
    ("a final answer is not a call", "<|channel|>final<|message|>The answer is 4.<|return|>", []),
    ("bad JSON", '<|channel|>commentary to=functions.open <|constrain|>json<|message|>{"lock": }<|call|>',
     [Err("not valid JSON", "open")]),
    ("bad JSON, never ended", '<|channel|>commentary to=functions.open <|constrain|>json<|message|>{"lock": ',
     [Err("a call ends with <|call|>", "open")]),
    ("a built-in recipient", '<|channel|>commentary to=browser.search <|constrain|>json<|message|>{}<|call|>',
     [Err("to=functions.NAME")]),
    ("arguments a list", '<|channel|>commentary to=functions.open <|constrain|>json<|message|>[1]<|call|>',
     [Err("must be a JSON object", "open")]),
]

# DeepSeek's markers, spelled as its tokenizer spells them: fullwidth bars (U+FF5C) and U+2581 for spaces
DS_CALLS, DS_CALLS_END = "<\uff5ctool\u2581calls\u2581begin\uff5c>", "<\uff5ctool\u2581calls\u2581end\uff5c>"
DS_CALL, DS_CALL_END = "<\uff5ctool\u2581call\u2581begin\uff5c>", "<\uff5ctool\u2581call\u2581end\uff5c>"
DS_SEP = "<\uff5ctool\u2581sep\uff5c>"


def ds_v3(name: str, arguments: str) -> str:
    """A call as the V3 and R1 templates write it: its type, its name on its line, its JSON in a fence."""
    return f"{DS_CALL}function{DS_SEP}{name}\n```json\n{arguments}\n```{DS_CALL_END}"


def ds_v31(name: str, arguments: str) -> str:
    """A call as the V3.1 template writes it: the name, the separator, the JSON."""
    return f"{DS_CALL}{name}{DS_SEP}{arguments}{DS_CALL_END}"


DEEPSEEK = [
    ("V3 single", DS_CALLS + ds_v3("open", '{"lock": 1, "code": 7}') + DS_CALLS_END
     + "<\uff5cend\u2581of\u2581sentence\uff5c>", [("open", {"lock": 1, "code": 7})]),
    ("V3 several, a line between", DS_CALLS + ds_v3("a", "{}") + "\n" + ds_v3("b", '{"x": 1}') + DS_CALLS_END,
     [("a", {}), ("b", {"x": 1})]),
    ("V3 values", DS_CALLS + ds_v3("f", json.dumps(VALUES)) + DS_CALLS_END, [("f", VALUES)]),
    ("V3 without the fence", f'{DS_CALLS}{DS_CALL}function{DS_SEP}open\n{{"lock": 1}}{DS_CALL_END}{DS_CALLS_END}',
     [("open", {"lock": 1})]),
    ("R1 after its thinking", "<think>\nThe lock wants 7.\n</think>\n\n" + DS_CALLS + ds_v3("open", '{"lock": 1}')
     + DS_CALLS_END, [("open", {"lock": 1})]),
    ("V3.1 single", DS_CALLS + ds_v31("open", '{"lock": 1}') + DS_CALLS_END, [("open", {"lock": 1})]),
    ("V3.1 several", DS_CALLS + ds_v31("a", "{}") + ds_v31("b", '{"x": [1, {"y": null}]}') + DS_CALLS_END,
     [("a", {}), ("b", {"x": [1, {"y": None}]})]),
    ("V3.1 arguments as a JSON string", DS_CALLS + ds_v31("f", '"{\\"x\\": 1}"') + DS_CALLS_END, [("f", {"x": 1})]),
    ("text before", "Opening the lock." + DS_CALLS + ds_v31("open", '{"lock": 1}') + DS_CALLS_END,
     [("open", {"lock": 1})]),
    ("no call", "The answer is 42.", []),
    ("unclosed section", DS_CALLS + ds_v3("open", '{"lock": 1}'),
     [("open", {"lock": 1}), Err(f"never closed with {DS_CALLS_END}")]),
    ("unclosed call", f'{DS_CALLS}{DS_CALL}open{DS_SEP}{{"lock": 1}}{DS_CALLS_END}',
     [Err(f"never closed with {DS_CALL_END}")]),
    ("a call holding the next one's start", DS_CALLS + DS_CALL + "open" + ds_v31("b", "{}") + DS_CALLS_END,
     [Err(f"never closed with {DS_CALL_END}")]),
    ("an empty section", DS_CALLS + DS_CALLS_END, [Err("holds no call")]),
    ("bad JSON", DS_CALLS + ds_v3("open", '{"lock": }') + DS_CALLS_END, [Err("not valid JSON", "open")]),
    ("V3.1 bad JSON", DS_CALLS + ds_v31("open", "lock=1") + DS_CALLS_END, [Err("not valid JSON", "open")]),
    ("no separator", f'{DS_CALLS}{DS_CALL}open{{"lock": 1}}{DS_CALL_END}{DS_CALLS_END}', [Err(f"NAME{DS_SEP}")]),
    ("V3 without a name", DS_CALLS + ds_v3("", '{"lock": 1}') + DS_CALLS_END, [Err("the tool's name after function")]),
    ("V3.1 without a name", DS_CALLS + ds_v31("", '{"lock": 1}') + DS_CALLS_END, [Err("the tool's name before")]),
    ("arguments a list", DS_CALLS + ds_v31("open", "[1]") + DS_CALLS_END, [Err("must be a JSON object", "open")]),
]

KIMI_SECTION, KIMI_SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"


def kimi(call_id: str, arguments: str) -> str:
    return f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>"


KIMI_K2 = [
    ("single", KIMI_SECTION + kimi("functions.open:0", '{"lock": 1, "code": 7}') + KIMI_SECTION_END,
     [("open", {"lock": 1, "code": 7})]),
    ("several", KIMI_SECTION + kimi("functions.a:3", "{}") + kimi("functions.b:4", '{"x": 1}') + KIMI_SECTION_END,
     [("a", {}), ("b", {"x": 1})]),
    ("values", KIMI_SECTION + kimi("functions.f:0", json.dumps(VALUES)) + KIMI_SECTION_END, [("f", VALUES)]),
    ("text before", "I will open it." + KIMI_SECTION + kimi("functions.open:0", '{"lock": 1}') + KIMI_SECTION_END
     + "<|im_end|>", [("open", {"lock": 1})]),
    ("spaced", KIMI_SECTION + "\n" + kimi(" functions.open:0 ", ' {"lock": 1}\n') + "\n" + KIMI_SECTION_END,
     [("open", {"lock": 1})]),
    ("an id without its index", KIMI_SECTION + kimi("functions.open", '{"lock": 1}') + KIMI_SECTION_END,
     [("open", {"lock": 1})]),
    ("a dotted name", KIMI_SECTION + kimi("functions.files.read:0", '{"path": "a"}') + KIMI_SECTION_END,
     [("files.read", {"path": "a"})]),
    ("arguments as a JSON string", KIMI_SECTION + kimi("functions.f:0", '"{\\"x\\": 1}"') + KIMI_SECTION_END,
     [("f", {"x": 1})]),
    ("no call", "The answer is 42.", []),
    ("unclosed section", KIMI_SECTION + kimi("functions.open:0", '{"lock": 1}'),
     [("open", {"lock": 1}), Err(f"never closed with {KIMI_SECTION_END}")]),
    ("unclosed call", KIMI_SECTION + '<|tool_call_begin|>functions.open:0<|tool_call_argument_begin|>{"lock": 1}'
     + KIMI_SECTION_END, [Err("never closed with <|tool_call_end|>")]),
    ("an empty section", KIMI_SECTION + KIMI_SECTION_END, [Err("holds no call")]),
    ("bad JSON", KIMI_SECTION + kimi("functions.open:0", '{"lock": }') + KIMI_SECTION_END,
     [Err("not valid JSON", "open")]),
    ("no argument marker", KIMI_SECTION + '<|tool_call_begin|>functions.open:0{"lock": 1}<|tool_call_end|>'
     + KIMI_SECTION_END, [Err("functions.NAME:IDX<|tool_call_argument_begin|>")]),
    ("an id not under functions", KIMI_SECTION + kimi("open:0", "{}") + KIMI_SECTION_END,
     [Err("a call's id is functions.NAME:IDX, got 'open:0'")]),
    ("an id without a name", KIMI_SECTION + kimi("functions.:0", "{}") + KIMI_SECTION_END,
     [Err("a call's id is functions.NAME:IDX")]),
    ("arguments a list", KIMI_SECTION + kimi("functions.open:0", "[1]") + KIMI_SECTION_END,
     [Err("must be a JSON object", "open")]),
]


def glm(name: str, **arguments: str) -> str:
    body = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in arguments.items())
    return f"<tool_call>{name}\n{body}</tool_call>"


GLM_45 = [
    ("single", glm("open", lock="1", code="7"), [("open", {"lock": 1, "code": 7})], None),
    ("no arguments", glm("now"), [("now", {})], None),
    ("compact", "<tool_call>open<arg_key>lock</arg_key><arg_value>1</arg_value></tool_call>", [("open", {"lock": 1})],
     None),
    ("several", glm("a") + "\n" + glm("b", x="1"), [("a", {}), ("b", {"x": 1})], None),
    ("values without a schema", glm("f", i="-3", x="2.5", b="true", n="null", l='[1, "a"]', d='{"k": {"j": []}}',
                                    s="plain words"),
     [("f", {"i": -3, "x": 2.5, "b": True, "n": None, "l": [1, "a"], "d": {"k": {"j": []}}, "s": "plain words"})],
     None),
    ("typed by the schema", glm("f", n="3", s="3", b="true", x="4", l="[1]", d='{"a": 1}', o="5"),
     [("f", {"n": 3, "s": "3", "b": True, "x": 4, "l": [1], "d": {"a": 1}, "o": 5})], STRING_PARAMS),
    ("left as text when it does not read as its type", glm("f", n="three", b="yes", l="[1,"),
     [("f", {"n": "three", "b": "yes", "l": "[1,"})], STRING_PARAMS),
    ("a value keeps its text exactly", glm("f", s="\ndef g():\n    return 1\n"),
     [("f", {"s": "\ndef g():\n    return 1\n"})], STRING_PARAMS),
    ("text around", "<think>\nThe lock wants 7.\n</think>\n" + glm("open", lock="1") + "\n", [("open", {"lock": 1})],
     None),
    ("JSON where the arguments belong", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
     [Err("not JSON")], None),
    ("no name", "<tool_call>\n<arg_key>n</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
     [Err("the tool's name right after <tool_call>")], None),
    ("a key without its value", "<tool_call>f\n<arg_key>n</arg_key>\n</tool_call>", [Err("write <arg_value>", "f")],
     None),
    ("a key never closed", "<tool_call>f\n<arg_key>n\n<arg_value>1</arg_value>\n</tool_call>",
     [Err("never closed with </arg_key>", "f")], None),
    ("a value never closed", "<tool_call>f\n<arg_key>n</arg_key>\n<arg_value>1\n</tool_call>",
     [Err("never closed with </arg_value>", "f")], None),
    ("an argument twice", glm("f", n="1").replace("</tool_call>", "<arg_key>n</arg_key><arg_value>2</arg_value>"
                                                                   "</tool_call>"), [Err("given twice", "f")], None),
    ("text between arguments", glm("f", n="1").replace("</tool_call>", "m=2\n</tool_call>"),
     [Err("expected <arg_key> or </tool_call>", "f")], None),
    ("unclosed", "<tool_call>f\n<arg_key>n</arg_key>\n<arg_value>1</arg_value>\n",
     [Err("never closed with </tool_call>")], None),
]

TABLES = {"hermes": [(i, t, e, None) for i, t, e in HERMES], "qwen3-coder": QWEN3_CODER,
          "llama3-json": [(i, t, e, None) for i, t, e in LLAMA3_JSON],
          "mistral": [(i, t, e, None) for i, t, e in MISTRAL], "pythonic": [(i, t, e, None) for i, t, e in PYTHONIC],
          "harmony": [(i, t, e, None) for i, t, e in HARMONY],
          "deepseek-v3": [(i, t, e, None) for i, t, e in DEEPSEEK], "kimi-k2": [(i, t, e, None) for i, t, e in KIMI_K2],
          "glm-4.5": GLM_45}
TABLES["mistral-v11"] = TABLES["mistral"]  # the two read the same; they write differently
CASES = [pytest.param(name, text, expected, tools, id=f"{name}: {case}")
         for name, rows in TABLES.items() for case, text, expected, tools in rows]


@pytest.mark.parametrize("name, text, expected, tools", CASES)
def test_each_family_reads_what_its_models_write(name, text, expected, tools):
    check(get_format(name).parse(text, tools), expected)


def test_every_registered_family_has_a_table():
    assert set(TABLES) == set(FORMATS)


WRONG_KEYS = [
    ("hermes", '<tool_call>{"name": "get_weather", "parameters": {"city": "Paris"}}</tool_call>', "arguments",
     "parameters"),
    ("hermes", '<tool_call>[{"name": "now", "arguments": {}}, {"name": "get_weather", "input": {"city": "Paris"}}]'
     "</tool_call>", "arguments", "input"),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "parameters": {"city": "Paris"}}]', "arguments", "parameters"),
    ("mistral-v11", '[TOOL_CALLS]{"name": "get_weather", "args": {"city": "Paris"}}', "arguments", "args"),
    ("llama3-json", '{"name": "get_weather", "params": {"city": "Paris"}}', "parameters", "params"),
    ("llama3-json", '<|python_tag|>{"name": "get_weather", "args": {"city": "Paris"}}', "parameters", "args"),
    ("llama3-json", '{"type": "function", "name": "get_weather", "input": {"city": "Paris"}}', "parameters", "input"),
]


@pytest.mark.parametrize("name, text, expected_key, got_key", WRONG_KEYS,
                         ids=[f"{n}: {got}" for n, _, _, got in WRONG_KEYS])
def test_arguments_under_a_wrong_key_are_a_malformed_call_naming_the_key_expected(name, text, expected_key, got_key):
    # read as a call without arguments, the call would run, and the policy never learn where its arguments went
    bad = [c for c in get_format(name).parse(text) if c.error is not None]
    assert [(c.name, c.arguments) for c in bad] == [("get_weather", {})]
    assert bad[0].error == (f"call to 'get_weather' has key '{got_key}'; this format writes its arguments "
                            f"under '{expected_key}'")


def test_a_wrong_key_is_clipped_in_the_message():
    (call,) = get_format("hermes").parse('<tool_call>{"name": "f", "' + "k" * 10_000 + '": 1}</tool_call>')
    assert call.error is not None and "more characters" in call.error and len(call.error) < 300


def test_hermes_keeps_the_messages_agentrl_core_gives():
    hermes = get_format("hermes")
    assert hermes.parse('<tool_call>{"name": "f"</tool_call>')[0].error == (
        "the tool call is not valid JSON (Expecting ',' delimiter at char 12)")
    assert hermes.parse('<tool_call>{"name": "f"')[0].error == (
        "a <tool_call> was opened but never closed with </tool_call>")
    assert hermes.hint == 'Call a tool as <tool_call>{"name": ..., "arguments": {...}}</tool_call>'


# -- hostile input: never raises, answers briefly ---------------------------------------------------------

HOSTILE = {
    "nested 100,000 deep": "[" * 100_000 + "]" * 100_000,
    "nested, never closed": "{" * 50_000,
    "an int of 5,000 digits": "7" * 5_000,
    "a huge float": "1e999999",
    "a key of 10,000 characters": '{"' + "k" * 10_000 + '": 1}',
    "a NUL": "\x00",
    "a lone surrogate": "\ud800",
    "unicode": "é世🙂\u2028" * 500,
    "quotes and escapes": "\"'\\" * 1000,
}


@pytest.mark.parametrize("payload", HOSTILE.values(), ids=HOSTILE.keys())
@pytest.mark.parametrize("name", NAMES)
def test_hostile_values_inside_a_call_are_answered_not_raised(name, payload):
    fmt = get_format(name)
    text = fmt.render([("f", {"x": 1})]).replace("1", payload, 1)
    for tools in (None, STRING_PARAMS):
        calls = fmt.parse(text, tools)
        _well_formed(calls)
        assert all(len(c.error) < 1000 for c in calls if c.error)


# Long runs of one family's syntax, each ~200,000 characters: a parser that rescans the rest of the text at
# every broken call, or a regex that backtracks over a run from each of its positions, takes minutes on
# these; a linear one takes milliseconds.
RUNS = {"spaces": " " * 200_000, "tabs": "\t" * 200_000, "letters": "[" + "a" * 200_000, "quotes": '"' * 200_000,
        "braces": "{" * 200_000, "names": '{"name": ' * 20_000, "calls": '{"name": "f"}; ' * 20_000,
        "call lists": "[f(" * 50_000, "tags": "<tool_call>" * 20_000, "functions": "<tool_call><function=" * 10_000,
        "parameters": "<tool_call><function=f>" + "<parameter=" * 20_000, "tokens": "[TOOL_CALLS]" * 20_000,
        "arguments": "[TOOL_CALLS]f[ARGS]" * 20_000, "messages": "<|message|>" * 20_000,
        "recipients": "<|channel|>commentary to=" * 20_000, "python tag": "<|python_tag|>" + " " * 200_000,
        "sections": DS_CALLS * 20_000 + DS_CALLS_END, "section calls": DS_CALLS + DS_CALL * 20_000 + DS_CALL_END,
        "separators": DS_CALLS + (DS_CALL + "function" + DS_SEP) * 10_000,
        "kimi calls": KIMI_SECTION + "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{" * 5_000,
        "kimi ends": KIMI_SECTION + "<|tool_call_end|>" * 10_000 + KIMI_SECTION_END,
        "arg keys": "<tool_call>f" + "<arg_key>" * 20_000 + "</tool_call>",
        "arg values": "<tool_call>f" + "<arg_key>a</arg_key><arg_value>" * 10_000 + "</tool_call>"}


@pytest.mark.parametrize("name", NAMES)
def test_parsing_takes_time_linear_in_the_text(name):
    fmt = get_format(name)
    for run, text in RUNS.items():
        t0 = time.perf_counter()
        fmt.parse(text)
        assert time.perf_counter() - t0 < 3.0, run  # ~0.3 s at most on the 2-core CI machine


def _well_formed(calls: list[ToolCall]) -> None:
    assert isinstance(calls, list)
    for c in calls:
        assert isinstance(c, ToolCall) and isinstance(c.arguments, dict)
        assert c.name is None or isinstance(c.name, str)
        assert c.error is None or (isinstance(c.error, str) and c.error)
        assert c.error is not None or isinstance(c.name, str)


# Pieces of every family's syntax, so that random text often comes close to a call.
FRAGMENTS = ["<tool_call>", "</tool_call>", '{"name": ', '"f"', '"arguments"', '"parameters"', ": ", "{", "}", "[",
             "]", "(", ")", "=", ", ", ";", '"', "'", "\\", '"""', "<function=", "f>", "<parameter=", "x>",
             "</parameter>", "</function>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|python_tag|>", "<|channel|>",
             "commentary to=functions.f ", "<|constrain|>json", "<|message|>", "<|call|>", "<|start|>assistant",
             "<|end|>", "f(", "x=", "1", "-1e999", "7" * 4400, "true", "None", "\n", " ", "\x00", "🙂", DS_CALLS,
             DS_CALLS_END, DS_CALL, DS_CALL_END, DS_SEP, "function", "```json", "```", KIMI_SECTION, KIMI_SECTION_END,
             "<|tool_call_begin|>", "functions.f:0", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
             "<tool_call>f", "<arg_key>", "x</arg_key>", "<arg_value>", "</arg_value>"]
TEXT = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=6)), max_size=40).map("".join)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXT)
def test_no_text_makes_a_parser_raise(name, text):
    fmt = get_format(name)
    _well_formed(fmt.parse(text))
    _well_formed(fmt.parse(text, STRING_PARAMS))
    for src in (fmt, "hermes"):
        assert isinstance(convert(text, src, "hermes"), str)


# -- render and parse are inverse ------------------------------------------------------------------------

IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,11}", fullmatch=True).filter(lambda s: not keyword.iskeyword(s))
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
CALLS = st.lists(st.tuples(IDENT, st.dictionaries(IDENT, JSON_VALUES, max_size=4)), min_size=1, max_size=3)


def schemas_for(calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The schema a tool with these arguments would have (qwen3-coder types its text values by it)."""
    kinds = {str: "string", bool: "boolean", int: "integer", float: "number", list: "array", dict: "object",
             type(None): "null"}
    tools = []
    for name, args in calls:
        props = {k: {"type": kinds[type(v)]} for k, v in args.items()}
        tools.append({"type": "function", "function": {"name": name, "parameters": {"properties": props}}})
    return tools


def _render(fmt: ToolFormat, calls: list[tuple[str, dict[str, Any]]]) -> str:
    try:
        return fmt.render(calls)
    except ValueError:  # a value the family has no way to write (a closing tag inside a qwen3-coder value)
        assume(False)
        raise


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=50, deadline=None)
@given(calls=CALLS)
def test_parse_reads_back_what_render_writes(name, calls):
    fmt = get_format(name)
    if name in TEXT_VALUED:  # a call's tools have one schema per name
        assume(len({n for n, _ in calls}) == len(calls))
    check(fmt.parse(_render(fmt, calls), schemas_for(calls)), calls)


@pytest.mark.parametrize("name", TEXT_VALUED)
@settings(max_examples=50, deadline=None)
@given(calls=CALLS)
def test_text_valued_families_read_back_without_a_schema_when_no_string_reads_as_json(name, calls):
    fmt = get_format(name)
    for _, args in calls:
        for v in args.values():
            assume(not isinstance(v, str) or json_reads(v.strip()) is None)
    check(fmt.parse(_render(fmt, calls)), calls)


def json_reads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


@pytest.mark.parametrize("name", ["hermes", "qwen3-coder", "harmony", "deepseek-v3", "kimi-k2", "glm-4.5"])
def test_a_rendered_call_ends_at_the_familys_stop_string(name):
    fmt = get_format(name)
    text = fmt.render([("open", {"lock": 1})])
    assert text.endswith(fmt.stop_strings[0])


@pytest.mark.parametrize("name, value", [("hermes", "</tool_call>"), ("harmony", "<|call|><|end|><|start|>"),
                                         ("deepseek-v3", DS_CALL_END + DS_CALLS_END + DS_CALL),
                                         ("kimi-k2", "<|tool_call_end|><|tool_calls_section_end|>")])
def test_a_value_holding_the_familys_end_marker_is_written_so_it_cannot_end_the_call(name, value):
    fmt = get_format(name)
    check(fmt.parse(fmt.render([("say", {"text": value})])), [("say", {"text": value})])


@pytest.mark.parametrize("name, calls", [
    ("qwen3-coder", [("f", {"s": "a </parameter> b"})]),
    ("qwen3-coder", [("f", {"a>b": 1})]),
    ("pythonic", [("f", {"not-an-identifier": 1})]),
    ("pythonic", [("f", {"class": 1})]),
    ("pythonic", [("f", {"x": float("inf")})]),
    ("pythonic", [("tool name", {})]),
    ("mistral-v11", [("tool name", {})]),
    ("harmony", [("tool name", {})]),
    ("deepseek-v3", [("tool name", {})]),
    ("deepseek-v3", [("f`", {})]),
    ("kimi-k2", [("tool name", {})]),
    ("kimi-k2", [("", {})]),
    ("glm-4.5", [("tool name", {})]),
    ("glm-4.5", [("f", {"a<b": 1})]),
    ("glm-4.5", [("f", {"s": "a </arg_value> b"})]),
    ("glm-4.5", [("f", {"s": "a </tool_call> b"})]),
])
def test_render_refuses_a_call_the_family_cannot_write(name, calls):
    with pytest.raises(ValueError, match="cannot"):
        get_format(name).render(calls)


WRITTEN = {
    "deepseek-v3": (DS_CALLS + DS_CALL + "function" + DS_SEP + 'open\n```json\n{"lock": 1}\n```' + DS_CALL_END + "\n"
                    + DS_CALL + "function" + DS_SEP + 'say\n```json\n{"text": "hi"}\n```' + DS_CALL_END
                    + DS_CALLS_END),
    "kimi-k2": ('<|tool_calls_section_begin|><|tool_call_begin|>functions.open:0<|tool_call_argument_begin|>{"lock": 1}'
                '<|tool_call_end|><|tool_call_begin|>functions.say:1<|tool_call_argument_begin|>{"text": "hi"}'
                "<|tool_call_end|><|tool_calls_section_end|>"),
    "glm-4.5": ("<tool_call>open\n<arg_key>lock</arg_key>\n<arg_value>1</arg_value>\n</tool_call>\n"
                "<tool_call>say\n<arg_key>text</arg_key>\n<arg_value>hi</arg_value>\n</tool_call>"),
}


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_render_writes_the_templates_layout_and_parse_reads_it_back(name):
    calls = [("open", {"lock": 1}), ("say", {"text": "hi"})]
    fmt = get_format(name)
    assert fmt.render(calls) == WRITTEN[name]
    check(fmt.parse(WRITTEN[name]), calls)


# -- instructions and hints ----------------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": "open", "description": "Open a lock.", "parameters": {
        "type": "object", "properties": {"lock": {"type": "integer"}, "code": {"type": "integer"},
                                         "note": {"type": "string", "default": "-"}}, "required": ["lock", "code"]}}},
    {"type": "function", "function": {"name": "say", "description": "Say something.", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}},
]


@pytest.mark.parametrize("name", NAMES)
def test_instructions_list_the_tools_and_show_a_call_that_parses(name):
    fmt = get_format(name)
    text = fmt.instructions(TOOLS)
    for tool in TOOLS:
        assert json.dumps(tool) in text
    assert fmt.convention in text
    example = text.split("For example:\n", 1)[1]
    check(fmt.parse(example, TOOLS), [("open", {"lock": 1, "code": 1})])
    assert fmt.instructions([]) == ""


@pytest.mark.parametrize("name", NAMES)
def test_hint_is_one_line_naming_the_familys_syntax(name):
    fmt = get_format(name)
    assert fmt.hint and "\n" not in fmt.hint and not fmt.hint.endswith(".")


def test_example_arguments_take_defaults_and_enums_before_placeholders():
    params = {"properties": {"a": {"type": "string", "enum": ["x", "y"]}, "b": {"type": "integer", "default": 4},
                             "c": {"type": "boolean"}, "d": {}}}
    assert example_arguments(params) == {"a": "x", "b": 4, "c": True, "d": "..."}


# -- detection from a chat template ------------------------------------------------------------------------

# Template snippets written here in each family's style: what the template renders for an assistant's
# tool calls (and, for some, the instructions it prints), reduced to the markers detection reads.
TEMPLATES = {
    "hermes": ("{%- for tool in tools %}{{- '\\n' + tool | tojson }}{%- endfor %}"
               "{{- '<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>' }}"
               "{%- for tool_call in message.tool_calls %}{{- '<tool_call>\\n' }}{{ tool_call | tojson }}"
               "{{- '\\n</tool_call>' }}{%- endfor %}"),
    "qwen3-coder": ("{{- '<tools>' }}{%- for tool in tools %}<function><name>{{ tool.name }}</name>{% endfor %}"
                    "{%- for tool_call in message.tool_calls %}{{- '\\n<tool_call>\\n<function=' + tool_call.name "
                    "+ '>\\n' }}{%- for k, v in tool_call.arguments.items() %}{{- '<parameter=' + k + '>\\n' }}"
                    "{{ v }}{{- '\\n</parameter>\\n' }}{%- endfor %}{{- '</function>\\n</tool_call>' }}{% endfor %}"),
    "llama3-json": ("{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' }}"
                    "{{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument "
                    "name and its value}.' }}{%- if message.role == 'ipython' %}{{ message.content }}{% endif %}"
                    "{{- '<|eot_id|>' }}"),
    "mistral": ("{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
                "{%- if message.tool_calls %}{{- '[TOOL_CALLS] ' + message.tool_calls | tojson }}{{ eos_token }}"
                "{% endif %}"),
    "mistral-v11": ("{%- for tool_call in message.tool_calls %}{{- '[TOOL_CALLS]' + tool_call.name + '[ARGS]' "
                    "+ tool_call.arguments | tojson }}{%- endfor %}{{ eos_token }}"),
    "pythonic": ("{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}{%- if tools %}"
                 "{{- 'To call functions, reply with [func_name1(params_name1=params_value1, "
                 "params_name2=params_value2...), func_name2(params)]' }}{% endif %}{{- '<|eot_id|>' }}"
                 "{%- if message.role == 'ipython' %}{{- '<|start_header_id|>ipython<|end_header_id|>' }}{% endif %}"),
    "harmony": ("{{- '<|start|>assistant<|channel|>commentary to=functions.' + tool_call.name + ' <|constrain|>json"
                "<|message|>' + tool_call.arguments | tojson + '<|call|>' }}{%- if add_generation_prompt %}"
                "<|start|>assistant{% endif %}"),
    "deepseek-v3": ("{%- for tool in message['tool_calls'] %}{%- if loop.first %}{{- '<\uff5cAssistant\uff5c>"
                    + DS_CALLS + "' }}{%- else %}{{- '\\n' }}{%- endif %}{{- '" + DS_CALL + "' + tool['type'] + '"
                    + DS_SEP + "' + tool['function']['name'] + '\\n```json\\n' + tool['function']['arguments'] + "
                    "'\\n```" + DS_CALL_END + "' }}{%- endfor %}{{- '" + DS_CALLS_END + "' }}"),
    "kimi-k2": ("{%- if message['role'] == 'assistant' and message.get('tool_calls') -%}"
                "{{- '<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|>' }}"
                "{%- for tool_call in message['tool_calls'] -%}{{- '<|tool_call_begin|>' + tool_call['id'] + "
                "'<|tool_call_argument_begin|>' + tool_call['function']['arguments'] + '<|tool_call_end|>' }}"
                "{%- endfor -%}{{- '<|tool_calls_section_end|><|im_end|>' }}{%- endif -%}"),
    "glm-4.5": ("{{- '<tools>' }}{% for tool in tools %}{{ tool | tojson }}{% endfor %}{{- '</tools>' }}"
                "{%- for tc in message.tool_calls %}{{- '\\n<tool_call>' + tc.name + '\\n' }}"
                "{%- for k, v in tc.arguments.items() %}{{- '<arg_key>' + k + '</arg_key>\\n<arg_value>' }}"
                "{{- v if v is string else v | tojson }}{{- '</arg_value>\\n' }}{%- endfor %}{{- '</tool_call>' }}"
                "{%- endfor %}{{- '<|observation|>' }}"),
}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_a_template_is_recognised_by_the_markers_it_renders(name):
    assert detect_format(TEMPLATES[name]).name == name


def test_every_registered_family_is_detectable():
    assert set(TEMPLATES) == set(FORMATS)


def test_the_templates_are_templates():
    jinja2 = pytest.importorskip("jinja2")
    for source in TEMPLATES.values():
        jinja2.Environment().parse(source)


def test_a_template_without_markers_is_hermes_and_needs_the_instructions():
    smollm2 = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
               "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
               "{% endif %}")
    assert detect_format(smollm2).name == "hermes" and ignores_tools(smollm2)
    assert detect_format(None).name == "hermes" and ignores_tools(None)
    assert not ignores_tools(TEMPLATES["hermes"])


def test_detection_order_puts_the_specific_markers_first():
    # a qwen3-coder template also holds <tool_call>; a pythonic Llama template also holds Llama's headers
    assert get_format("hermes").matches(TEMPLATES["qwen3-coder"])
    assert get_format("llama3-json").matches(TEMPLATES["pythonic"])
    assert get_format("mistral").matches(TEMPLATES["mistral-v11"])
    assert get_format("hermes").matches(TEMPLATES["glm-4.5"])  # GLM's templates hold <tool_call> as well
    order = list(FORMATS)
    assert order.index("qwen3-coder") < order.index("hermes")
    assert order.index("pythonic") < order.index("llama3-json")
    assert order.index("mistral-v11") < order.index("mistral")
    assert order.index("glm-4.5") < order.index("hermes")


def test_the_repositorys_hermes_fixture_template_is_hermes():
    source = (Path(__file__).parent / "fixtures" / "hermes_tools.jinja").read_text()
    assert detect_format(source).name == "hermes" and not ignores_tools(source)


# Real templates, when a tokenizer is in the local Hugging Face cache (nothing is downloaded).
REAL = {"Qwen/Qwen2.5-0.5B-Instruct": "hermes", "Qwen/Qwen3-0.6B": "hermes",
        "Qwen/Qwen3-Coder-30B-A3B-Instruct": "qwen3-coder", "meta-llama/Llama-3.1-8B-Instruct": "llama3-json",
        "meta-llama/Llama-3.2-1B-Instruct": "llama3-json", "mistralai/Mistral-7B-Instruct-v0.3": "mistral",
        "openai/gpt-oss-20b": "harmony", "HuggingFaceTB/SmolLM2-135M-Instruct": "hermes",
        "deepseek-ai/DeepSeek-V3": "deepseek-v3", "deepseek-ai/DeepSeek-R1": "deepseek-v3",
        "deepseek-ai/DeepSeek-V3.1": "deepseek-v3", "moonshotai/Kimi-K2-Instruct": "kimi-k2",
        "moonshotai/Kimi-K2-Thinking": "kimi-k2", "zai-org/GLM-4.5": "glm-4.5", "zai-org/GLM-4.6": "glm-4.5"}


def _cached_template(repo: str) -> str | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for filename in ("chat_template.jinja", "tokenizer_config.json"):
        path = try_to_load_from_cache(repo, filename)
        if isinstance(path, str) and os.path.isfile(path):
            text = Path(path).read_text()
            if filename.endswith(".json"):
                template = json.loads(text).get("chat_template")
                if isinstance(template, list):  # named templates: the "tool_use" one, else the default
                    named = {t.get("name"): t.get("template") for t in template}
                    template = named.get("tool_use") or named.get("default")
                return template if isinstance(template, str) else None
            return text
    return None


@pytest.mark.realmodel  # from the local Hugging Face cache only: nothing is downloaded
@pytest.mark.parametrize("repo, family", REAL.items(), ids=REAL.keys())
def test_a_cached_real_template_is_detected(repo, family):
    template = _cached_template(repo)
    if template is None:
        pytest.skip(f"{repo}'s tokenizer is not in the local Hugging Face cache")
    assert detect_format(template).name == family


# -- convert: a scripted expert's Hermes calls in each family's own form -------------------------------------

EXPERT = [("open", {"lock": 1, "code": 7}), ("say", {"text": "done, 2 of 3 open\n  next: lock 2"})]
PREFIX, SUFFIX = "The second code is 7.\n", "\nThat should open it."


@pytest.mark.parametrize("name", NAMES)
def test_convert_rewrites_the_calls_and_keeps_the_text_around_them(name):
    hermes = get_format("hermes")
    text = PREFIX + hermes.render(EXPERT) + SUFFIX
    out = convert(text, "hermes", name)
    assert out == PREFIX + get_format(name).render(EXPERT) + SUFFIX
    check(get_format(name).parse(out, TOOLS), EXPERT)
    assert convert(out, name, "hermes", TOOLS) == text  # and back, to the letter


def test_convert_keeps_a_malformed_call_as_written():
    bad = '<tool_call>{"name": "open", "arguments": {"lock": }</tool_call>'
    assert convert(bad + ' <tool_call>{"name": "f"}</tool_call>', "hermes", "pythonic") == bad + " [f()]"


def test_convert_writes_calls_apart_when_text_stands_between_them():
    text = '<tool_call>{"name": "a"}</tool_call> then <tool_call>{"name": "b"}</tool_call>'
    assert convert(text, "hermes", "pythonic") == "[a()] then [b()]"
    assert convert(text, get_format("hermes"), get_format("mistral")) == (
        '[TOOL_CALLS][{"name": "a", "arguments": {}}] then [TOOL_CALLS][{"name": "b", "arguments": {}}]')


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=25, deadline=None)
@given(calls=CALLS)
def test_convert_from_hermes_gives_the_same_calls(name, calls):
    if name in TEXT_VALUED:
        assume(len({n for n, _ in calls}) == len(calls))
    _render(get_format(name), calls)  # skip calls the family cannot write
    out = convert(get_format("hermes").render(calls), "hermes", name)
    check(get_format(name).parse(out, schemas_for(calls)), calls)


# -- the registry ---------------------------------------------------------------------------------------------

def test_names_are_kebab_case_and_registered_under_themselves():
    for name, fmt in FORMATS.items():
        assert fmt.name == name and name == name.lower() and "_" not in name


def test_an_unknown_name_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="unknown tool format 'qwen'; known: .*hermes.*pythonic"):
        get_format("qwen")


def test_a_registered_family_is_found_and_detected_after_the_built_in_ones():
    class Shout(ToolFormat):
        name = "shout-test"
        hint = "Call a tool as CALL NAME"
        convention = "Write CALL and the tool's name."

        def blocks(self, text, tools=None):
            return []

        def render(self, calls):
            return " ".join(f"CALL {n}" for n, _ in calls)

        def matches(self, chat_template):
            return "CALL" in chat_template

    register_format(Shout())
    try:
        assert get_format("shout-test").name == "shout-test"
        assert detect_format("{{ 'CALL' }}").name == "shout-test"
        assert detect_format("CALL <tool_call>").name == "hermes"  # the built-in ones come first
        with pytest.raises(ValueError, match="already registered"):
            register_format(Shout())
    finally:
        del FORMATS["shout-test"]


def test_calls_module_imports_nothing_from_agentrl():
    import agentrl.chat.calls as calls

    tree = ast.parse(Path(calls.__file__).read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m.split(".")[0] == "agentrl"]


def test_matching_close_skips_brackets_in_strings_and_reports_an_unclosed_one():
    assert matching_close('{"a": "}"} x', 0) == 10
    assert matching_close("[f(s='''a]'''), g()]", 0, python=True) == 20
    assert matching_close('{"a": "}', 0) is None
    assert matching_close("[f(x='a\\']')]", 0, python=True) == 13


def test_hermes_reads_a_list_of_calls_in_one_block_each_judged_alone():
    from agentrl.chat import get_format

    calls = get_format("hermes").parse('<tool_call>[{"name": "f", "arguments": {"x": 1}}, {"arguments": {}}]'
                                       '</tool_call>')
    assert [(c.name, c.arguments, c.error is None) for c in calls] == [("f", {"x": 1}, True), (None, {}, False)]
    (empty,) = get_format("hermes").parse("<tool_call>[]</tool_call>")
    assert empty.error == "an empty list of tool calls"
