"""`ChatTemplate`: a model's chat template rendered as transformers renders it, within bounds of time and size.

A chat template is code that comes with the model. transformers runs it in jinja's immutable sandbox,
which refuses escapes (no private attributes, no changing what it is given) but bounds no work: two
nested ``range(100000)`` loops run until the process is killed, a string doubled forty times takes the
memory, and a template that raises prints a long traceback. Here the template is compiled in a sandbox
of our own that copies transformers' environment (its options, filters, globals and extensions, so the
text is the same) and adds:

- **a deadline** (`MAX_SECONDS`). Work repeats only in loops and calls (macros recurse), so the clock is
  read at each loop item, call and filter: the render stops at the step that runs over, not after.
- **a bound on size** (`MAX_CHARS`), on the output and on any one value. The steps that can make a value
  far larger than their inputs are measured from their inputs before they run: ``*``, ``+``, ``**``,
  ``%``, the growing filters and ``str`` methods (``join``, ``replace``, ``center``, ``indent``,
  ``format``, ...). A list or dict the template makes (a literal, an operator's, a call's or a filter's
  result) is measured as text where it is made, since it may hold one big value, or another list, many
  times: ten levels of ten references are 10^10 values to print, compare or sort. What a macro or a
  ``{% set %}`` block joins is summed before it is joined, and the text made along the way (results of
  operators, calls and filters, output) is counted up to 16 times the bound, so that many values each
  within it cannot add up to the memory.
- **one line** for whatever goes wrong: `TemplateError`, ``chat template: <what> (line N)``.

The same character bound guards the tokenizer: `ChatFormat.encode` refuses longer text rather than
handing it over (text of about 100 MB aborts the process inside the tokenizer).

>>> t = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
>>> t.render([{"role": "user", "content": "hi"}])
'<user>hi'
>>> ChatTemplate("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
...              max_seconds=0.05).render([])
Traceback (most recent call last):
agentrl.chat.template.TemplateError: chat template: rendering ran past 0.05 s (line 1)
"""

from __future__ import annotations

import contextvars
import re
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.runtime import Context, EvalContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import generate_lorem_ipsum
from jinja2.visitor import NodeTransformer

MAX_SECONDS = 5.0
# 16 Mi characters: some 4M tokens, many times the longest context a model takes today, and well short
# of the ~100 MB at which the tokenizer aborts the process
MAX_CHARS = 16 << 20
# Python will not even print an int past 4,300 digits (about 14,300 bits), and powers and products of
# bigger ones take seconds: ``**`` and ``*`` stop here
MAX_INT_BITS = 1 << 16


class TemplateError(ValueError):
    """A chat template that did not render, in one line: ``chat template: <what went wrong> (line N)``."""


class _OverBound(Exception):
    """A bound reached inside a render (becomes a `TemplateError` with the template's line)."""


class _Budget:
    """One render's deadline, the text it has made, and the shapes of the lists and dicts it has measured."""

    def __init__(self, max_seconds: float, max_chars: int):
        self.max_seconds, self.max_chars = max_seconds, max_chars
        self.deadline = time.perf_counter() + max_seconds
        self.made, self.max_made = 0, 16 * max_chars
        self.shapes: dict[int, tuple[Any, tuple[int, int, int]]] = {}

    def tick(self) -> None:
        if time.perf_counter() > self.deadline:
            raise _OverBound(f"rendering ran past {self.max_seconds:g} s")

    def fits(self, size: int, what: str = "a value") -> None:
        if size > self.max_chars:
            raise _OverBound(f"{what} of over {_amount(self.max_chars)}")

    def make(self, value: Any) -> Any:
        """`value`, just made by a step of the template: new text measured and counted, a new list or dict
        measured as text (what it holds was counted when that was made)."""
        if isinstance(value, (str, bytes)):
            self.count(len(value))
        elif isinstance(value, (list, tuple, dict, set, frozenset)):
            self.text_size(value)
        return value

    def count(self, size: int) -> None:
        self.made += size
        if size > self.max_chars or self.made > self.max_made:
            self.fits(size)
            raise _OverBound(f"made over {_amount(self.max_made)} of text along the way")

    def shape(self, value: Any) -> tuple[int, int, int]:
        """`value` as text: (characters, items, depth), with a part held many times counted each time (the
        text repeats it) but walked once (remembered by id, the object held with it); refused past the bound."""
        if isinstance(value, (str, bytes)):
            return len(value), 0, 0
        if not isinstance(value, (list, tuple, dict, set, frozenset)):
            return 8, 0, 0  # a number, None, a bool, an object: a few characters
        known = self.shapes.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        chars, items, depth = 2, 0, 0
        for item in (x for kv in value.items() for x in kv) if isinstance(value, dict) else value:
            if type(item) is str:  # most of what a conversation holds: no call
                chars += len(item) + 2
                items += 1
            else:
                c, n, d = self.shape(item)
                chars, items, depth = chars + c + 2, items + n + 1, max(depth, d)
            if chars > self.max_chars:
                self.fits(chars, "text")
        self.shapes[id(value)] = (value, (chars, items, depth + 1))
        return chars, items, depth + 1

    def text_size(self, value: Any) -> int:
        return self.shape(value)[0]


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("agentrl_chat_template", default=None)


@contextmanager
def _within(budget: _Budget) -> Iterator[_Budget]:
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


def _amount(chars: int) -> str:
    return f"{chars / (1 << 20):g} Mi characters" if chars >= 1 << 20 else f"{chars:,} characters"


def _count(items: Any) -> int:
    return len(items) if hasattr(items, "__len__") else 0


def _numbers(fmt: Any) -> int:
    """The widths and precisions a format string may ask for (every number in it: an overestimate)."""
    return sum(int(n) for n in re.findall(r"\d+", fmt)) if isinstance(fmt, str) else 0


def _width(width: Any) -> int:
    return width if isinstance(width, int) else len(width) if isinstance(width, str) else 0


def _replaced_size(s: Any, old: Any, new: Any) -> int:
    s, old, new = str(s), str(old), str(new)  # as jinja's filter takes them
    return len(s) + s.count(old) * max(len(new) - len(old), 0)


def _json_size(b: _Budget, value: Any, indent: Any = None, separators: Any = None) -> int:
    chars, items, depth = b.shape(value)
    between = sum(map(_width, separators)) if isinstance(separators, (list, tuple)) else 0
    return chars + items * (1 + depth * _width(indent) + between)  # an item a line, indented per level


# How long the result of a step that can grow its input will be, from its inputs (`b`: the render's budget).
# The parameters are the filter's, or the str method's, own.
_FILTER_SIZE = {
    "center": lambda b, value, width=80: max(b.text_size(value), _width(width)),
    "indent": lambda b, s, width=4, first=False, blank=False: len(s) + (s.count("\n") + 1) * _width(width),
    "join": lambda b, value, d="", attribute=None: b.text_size(value) + len(str(d)) * _count(value),
    "replace": lambda b, s, old, new, count=None: _replaced_size(s, old, new),
    "format": lambda b, value, *args, **kwargs: len(value) + _numbers(value) + b.text_size([args, kwargs]),
    "batch": lambda b, value, linecount, fill_with=None: _count(value) + _width(linecount),
    "slice": lambda b, value, slices, fill_with=None: _count(value) + _width(slices),
    "wordwrap": lambda b, s, width=79, break_long_words=True, wrapstring=None, break_on_hyphens=True:
        len(s) + (len(s) // max(_width(width), 1) + s.count("\n") + 1) * len(wrapstring or "\n"),
    "tojson": lambda b, x, ensure_ascii=False, indent=None, separators=None, *args, **kwargs:
        _json_size(b, x, indent, separators),
    "pprint": lambda b, value: _json_size(b, value, 1),
}
_STR_METHOD_SIZE = {
    "center": lambda b, s, width, *args: max(len(s), width),
    "ljust": lambda b, s, width, *args: max(len(s), width),
    "rjust": lambda b, s, width, *args: max(len(s), width),
    "zfill": lambda b, s, width: max(len(s), width),
    "expandtabs": lambda b, s, tabsize=8: len(s) + s.count("\t") * tabsize,
    "join": lambda b, s, items: b.text_size(items) + len(s) * _count(items),
    "replace": lambda b, s, old, new, count=-1: _replaced_size(s, old, new),
    "format": lambda b, s, *args, **kwargs: len(s) + _numbers(s) + b.text_size([args, kwargs]),
    "format_map": lambda b, s, mapping: len(s) + _numbers(s) + b.text_size(mapping),
    "translate": lambda b, s, table: len(s) * max([len(v) for v in getattr(table, "values", list)()
                                                   if isinstance(v, str)] + [1]),
}
_LIPSUM_SIZE = {"lipsum": lambda b, n=5, html=True, min=20, max=100: _width(n) * _width(max) * 16}


def _foretell(table: dict[Any, Any], key: Any, budget: _Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a growing step whose result would be over the bound, before it runs."""
    size_of = table.get(key)
    if size_of is None:
        return
    try:
        size = size_of(budget, *args, **kwargs)
    except (TypeError, AttributeError, ValueError):  # arguments the step itself will refuse, in its own words
        return
    budget.fits(size, f"{key}: a result")


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox with the checks of the module's docstring. Attribute and item reads are left
    alone: they neither repeat nor grow anything."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def _generate(self, source: nodes.Template, name: str | None, filename: str | None,
                  defer_init: bool = False) -> str:
        return super()._generate(_Checks().visit(source), name, filename, defer_init)

    def text(self, value: Any) -> Any:
        """`value` about to become text ({{ output }}, each part of a ``~``), measured and counted first."""
        if (budget := _BUDGET.get()) is not None:
            budget.count(len(value) if type(value) is str else budget.text_size(value))
        return value

    def concat(self, parts: Iterable[str]) -> str:  # type: ignore[override]
        """What a macro, a ``{% set %}`` block or a filter block joins, summed before it is joined."""
        budget = _BUDGET.get()
        if budget is None:
            return "".join(parts)
        parts = list(parts)
        budget.fits(sum(map(len, parts)), "a block's text")
        return budget.make("".join(parts))

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        budget = _BUDGET.get()
        if budget is None:
            return super().call(context, obj, *args, **kwargs)
        budget.tick()
        target = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
        owner = getattr(target, "__self__", None)
        if isinstance(owner, str):
            name = getattr(target, "__name__", "")
            if name == "join" and args:  # a generator read first: its items counted
                args = (_listed(args[0]), *args[1:])
            _foretell(_STR_METHOD_SIZE, name, budget, (owner, *args), kwargs)
        elif target is generate_lorem_ipsum:
            _foretell(_LIPSUM_SIZE, "lipsum", budget, args, kwargs)
        return budget.make(super().call(context, obj, *args, **kwargs))

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        budget = _BUDGET.get()
        if budget is None:
            return self.binop_table[operator](left, right)
        if operator == "+" and type(left) is str and type(right) is str:  # most of a template's work, kept short
            size = len(left) + len(right)
            if size > budget.max_chars:
                budget.fits(size, "'+': a result")
            budget.made += size
            if budget.made > budget.max_made:
                budget.count(0)
            return left + right
        _foresee_binop(budget, operator, left, right)
        return budget.make(self.binop_table[operator](left, right))


_ITER, _TEXT, _SHAPE = "agentrl_bounded_iter", "agentrl_bounded_text", "agentrl_bounded_shape"


class _Checks(NodeTransformer):
    """The checks the compiled template cannot do without: each loop iterates through a check per item, each
    part of a ``~`` is measured before ``str()`` of it, each list, tuple or dict literal is measured where it
    is made. Through filters, which compile to direct calls (none of the sandbox's call on the way)."""

    def visit_For(self, node: nodes.For) -> nodes.For:
        node = self.generic_visit(node)
        node.iter = _through(_ITER, node.iter)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Concat:
        node = self.generic_visit(node)
        node.nodes = [_through(_TEXT, part) for part in node.nodes]
        return node

    def visit_List(self, node: nodes.Expr) -> nodes.Expr:
        return _through(_SHAPE, self.generic_visit(node))

    visit_Dict = visit_List

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Expr:
        node = self.generic_visit(node)
        return _through(_SHAPE, node) if node.ctx == "load" else node  # not a target: {% for a, b in ... %}


def _through(check: str, node: nodes.Expr) -> nodes.Expr:
    return nodes.Filter(node, check, [], [], None, None).set_lineno(node.lineno)


def _measured(value: Any) -> Any:
    if (budget := _BUDGET.get()) is not None:
        budget.text_size(value)
    return value


def _bounded_iter(iterable: Any) -> Iterator[Any]:
    items = iter(iterable)  # not iterable: the loop fails here, as it would have
    budget = _BUDGET.get()
    return items if budget is None else _ticking(items, budget)


def _ticking(items: Iterator[Any], budget: _Budget) -> Iterator[Any]:
    for item in items:
        budget.tick()
        yield item


def _foresee_binop(budget: _Budget, operator: str, left: Any, right: Any) -> None:
    sized = (str, bytes, list, tuple)
    if operator == "+" and isinstance(left, sized) and isinstance(right, sized):
        budget.fits(len(left) + len(right), "'+': a result")
    elif operator == "*" and isinstance(left, int) and isinstance(right, int):
        if left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise _OverBound(f"a product of over {MAX_INT_BITS:,} bits")
    elif operator == "*" and isinstance(left, sized) and isinstance(right, int):
        budget.fits(len(left) * right, "'*': a result")
    elif operator == "*" and isinstance(right, sized) and isinstance(left, int):
        budget.fits(len(right) * left, "'*': a result")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
        if left.bit_length() * right > MAX_INT_BITS:
            raise _OverBound(f"a power of over {MAX_INT_BITS:,} bits")
    elif operator == "%" and isinstance(left, str):
        budget.fits(len(left) + _numbers(left) + budget.text_size(right), "'%': a result")


def _listed(items: Any) -> Any:
    return items if hasattr(items, "__len__") or not hasattr(items, "__iter__") else list(items)


def _bounded_filter(name: str, func: Any) -> Any:
    """`func` as a filter that checks the deadline, measures its inputs and its result, and refuses a
    growing filter's result over the bound before it is made. The pass_context/pass_eval_context marks
    travel with the wrapper (jinja reads them from its attributes)."""

    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget = _BUDGET.get()
        if budget is None:
            return func(*args, **kwargs)
        budget.tick()
        first = 1 if args and isinstance(args[0], (Context, EvalContext, jinja2.Environment)) else 0
        if name == "join" and len(args) > first:  # a generator (from map, select) read first: its items counted
            args = (*args[:first], _listed(args[first]), *args[first + 1:])
        data = args[first:]
        for value in (*data, *kwargs.values()):
            budget.text_size(value)
        _foretell(_FILTER_SIZE, name, budget, data, kwargs)
        return budget.make(func(*args, **kwargs))

    bounded.__dict__.update(getattr(func, "__dict__", {}))  # builtins (len, sum, ...) have none
    bounded.__name__ = bounded.__qualname__ = getattr(func, "__name__", name)
    return bounded


def _environment(like: jinja2.Environment) -> _BoundedSandbox:
    """A bounded sandbox with `like`'s options, extensions, filters, tests and globals (transformers')."""
    env = _BoundedSandbox(trim_blocks=like.trim_blocks, lstrip_blocks=like.lstrip_blocks,
                          keep_trailing_newline=like.keep_trailing_newline, autoescape=like.autoescape,
                          extensions=[type(ext) for ext in like.extensions.values()])
    env.finalize = env.text  # every {{ output }} is measured before it becomes text
    env.tests.update(like.tests)
    env.globals.update(like.globals)
    env.filters.update({name: _bounded_filter(name, f) for name, f in like.filters.items()})
    env.filters.update({_ITER: _bounded_iter, _TEXT: env.text, _SHAPE: _measured})
    return env


def _transformers() -> Any:
    """transformers' chat-template module: its environment is copied, and the inputs are prepared with its
    own helpers where it has them, so that the text is the one `apply_chat_template` renders."""
    from transformers.utils import chat_template_utils

    return chat_template_utils


class ChatTemplate:
    """A chat template compiled once and rendered within `max_seconds` and `max_chars`.

    `render` takes what `tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
    add_generation_prompt=True)` takes and returns the same text, or raises `TemplateError`.
    """

    def __init__(self, source: str, max_seconds: float | None = None, max_chars: int | None = None):
        self.max_seconds = MAX_SECONDS if max_seconds is None else max_seconds  # read now: a test may lower them
        self.max_chars = MAX_CHARS if max_chars is None else max_chars
        if len(source) > self.max_chars:
            raise TemplateError(f"chat template: its source is over {_amount(self.max_chars)}")
        hf = _transformers()
        hf_environment = hf._compile_jinja_template("").environment  # not the source: compiling folds constants
        self._prepare = getattr(hf, "_plain_template_data", lambda value: value)
        self._normalize = getattr(hf, "_normalize_chat_messages", list)
        self._alias = getattr(hf, "_alias_reasoning_fields", lambda chat: chat)
        # constant parts are folded at compile time, through the same checks
        with _within(_Budget(self.max_seconds, self.max_chars)), _one_line():
            self._template = _environment(hf_environment).from_string(source)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True, **variables: Any) -> str:
        """`messages` through the template; `variables` are what else it sees (the tokenizer's special
        tokens: ``bos_token``, ``eos_token``, ...)."""
        chat = self._alias(self._prepare(self._normalize(messages)))
        context = {"messages": chat, "tools": self._prepare(tools), "documents": None,
                   "add_generation_prompt": add_generation_prompt, **self._prepare(variables)}
        with _within(_Budget(self.max_seconds, self.max_chars)) as budget, _one_line():
            out, size = [], 0
            for piece in self._template.generate(context):
                size += len(piece)
                if size > self.max_chars:
                    budget.fits(size, "output")
                out.append(piece)
            return "".join(out)


@contextmanager
def _one_line() -> Iterator[None]:
    """Whatever goes wrong in compiling or rendering, as one `TemplateError` line naming the template's line."""
    try:
        yield
    except _OverBound as e:
        raise TemplateError(f"chat template: {e}{_line(e)}") from None
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"chat template: does not compile: {_flat(e.message or '')} (line {e.lineno})") from None
    except RecursionError as e:
        raise TemplateError(f"chat template: recursed too deep{_line(e)}") from None
    except MemoryError as e:
        raise TemplateError(f"chat template: ran out of memory{_line(e)}") from None
    except Exception as e:
        raise TemplateError(f"chat template: raised {type(e).__name__}: {_flat(str(e))}{_line(e)}") from None


def _flat(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _line(e: BaseException) -> str:
    """`` (line N)``: the template line the error was raised at (jinja rewrites the traceback's frames to the
    template's lines), or nothing."""
    tb, line = e.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" (line {line})" if line is not None else ""
