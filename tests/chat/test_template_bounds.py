"""A chat template is code that came with the model: it renders within bounds of time and size, a failure
is one line naming the template's line, and ordinary templates render exactly as transformers renders them.

The oracle for the ordinary templates is `tokenizer.apply_chat_template` itself. The adversarial templates
run with a lowered bound (1 Mi characters, a fraction of a second) wherever the bound is a parameter, so
that a check that failed would cost at most some hundred MB; the two that go through `ChatFormat` at its
real bounds run in a subprocess under a 4 GiB address-space limit and a timeout.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_chat_layout import HARMONY, LLAMA3, MISTRAL, NUMBERED, PYTHONIC, QWEN3_CODER, THINK_STRIPPING
from test_chat_template import TEMPLATE as HERMES_FIXTURE
from test_chat_template import build_tokenizer

import agentrl.chat.template as template_module
from agentrl.chat.layout import ChatFormat
from agentrl.chat.template import MAX_CHARS, ChatTemplate, TemplateError
from agentrl.policy import TINY_CHAT_TEMPLATE
from agentrl.registry import make

RUNAWAY = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
DOUBLING = "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
SMALL = 1 << 20  # the size bound the adversarial templates below run under


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def with_template(tok, source: str):
    tok.chat_template = source
    return tok


def test_a_runaway_loop_stops_at_its_deadline_with_one_line(tokenizer, monkeypatch):
    t0 = time.perf_counter()
    with pytest.raises(TemplateError) as e:
        ChatTemplate(RUNAWAY, max_seconds=0.3).render([{"role": "user", "content": "hi"}])
    assert 0.3 <= time.perf_counter() - t0 < 1.0
    assert str(e.value) == "chat template: rendering ran past 0.3 s (line 1)"
    # the same through ChatFormat, whose constructor renders probe conversations (at the module's bound)
    monkeypatch.setattr(template_module, "MAX_SECONDS", 0.3)
    t0 = time.perf_counter()
    with pytest.raises(TemplateError, match=r"^chat template: rendering ran past 0.3 s \(line 1\)$"):
        ChatFormat(with_template(tokenizer, RUNAWAY))
    assert time.perf_counter() - t0 < 2.0  # the tools probe may run out its 0.3 s too, then the layout probe


def _in_a_subprocess(code: str) -> subprocess.CompletedProcess:
    """`code` after a 4 GiB address-space limit: what transformers' own rendering would take, it cannot."""
    limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
    return subprocess.run([sys.executable, "-c", limit + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parent)


def test_a_doubling_template_is_refused_before_it_takes_the_memory():
    out = _in_a_subprocess(f"""
        import time
        from test_chat_template import build_tokenizer
        from agentrl.chat.layout import ChatFormat
        import transformers.utils.chat_template_utils  # imported before the clock starts
        tok = build_tokenizer()
        tok.chat_template = {DOUBLING!r}
        t0 = time.perf_counter()
        try:
            ChatFormat(tok)
        except ValueError as e:
            print(type(e).__name__, time.perf_counter() - t0, e)
    """)
    assert out.returncode == 0, out.stderr[-2000:]
    kind, seconds, message = out.stdout.strip().split(" ", 2)
    assert kind == "TemplateError" and float(seconds) < 2.0, seconds  # stopped by size, well before 5 s
    assert message == "chat template: a value of over 16 Mi characters (line 1)"


@pytest.mark.parametrize("source,problem", [
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
     "'+': a result of over 1 Mi characters"),
    ("{% macro d(s, n) %}{{ d(s ~ s, n - 1) if n else s }}{% endmacro %}{{ d('x', 40) }}",
     "a value of over 1 Mi characters"),
], ids=["+", "macro"])
def test_doubling_by_other_means_is_refused_at_the_bound(source, problem):
    with pytest.raises(TemplateError) as e:
        ChatTemplate(source, max_chars=SMALL).render([])
    assert str(e.value) == f"chat template: {problem} (line 1)"


# a billion laughs in a template: nine levels of ten references to the level below (10^9 ones as text)
LAUGHS = "{% set a = [1,1,1,1,1,1,1,1,1,1] %}" + "".join(
    "{% set " + n + " = [" + ",".join([p] * 10) + "] %}" for p, n in zip("abcdefgh", "bcdefghi"))
LAUGHS_MULTIPLIED = "{% set a = [1] * 10 %}" + "".join(
    "{% set " + n + " = [" + p + "] * 10 %}" for p, n in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize("source,problem", [
    ("{{ 'x' * 100000000 }}", "'*': a result"),
    ("{{ (range(1000)|list) * 100000 }}", "'*': a result"),
    ("{{ 'x'|center(100000000) }}", "center: a result"),  # folded at compile time: refused there too
    ("{{ ('x' * 100000).replace('x', 'y' * 1000) }}", "replace: a result"),
    ("{{ ('x' * 100000)|replace('x', 'y' * 1000) }}", "replace: a result"),
    ("{{ '%100000000s' % 'x' }}", "'%': a result"),
    ("{{ '{:>100000000}'.format('x') }}", "format: a result"),
    ("{{ ('\t' * 1000).expandtabs(100000) }}", "expandtabs: a result"),
    ("{{ lipsum(1000, max=1000) }}", "lipsum: a result"),
    ("{{ range(1000)|join('x' * 100000) }}", "join: a result"),
    ("{{ ('x\\n' * 100000)|indent(1000) }}", "indent: a result"),
    ("{{ range(1000)|list|tojson(indent=100000) }}", "tojson: a result"),
    ("{{ [1]|batch(100000000, 0)|list }}", "batch: a result"),
    (LAUGHS + "{{ i }}", "text"),
    (LAUGHS + "{{ i|tojson }}", "text"),
    (LAUGHS + "{{ '' ~ i }}", "text"),
    (LAUGHS.replace("[1,1,1,1,1,1,1,1,1,1]", "[1] * 10") + "{{ i|length }}", "text"),  # refused where it is made
    (LAUGHS_MULTIPLIED, "text"),
    ("{{ range(1000)|map('string')|join('x' * 10000) }}", "join: a result"),  # a generator: its items counted
    ("{{ range(1000)|map('string')|map('center', 100000)|join }}", "made over 16 Mi characters of text along the way"),
    ("{% set big = 'x' * 100000 %}{% set s %}{% for i in range(100000) %}{{ big }}{% endfor %}{% endset %}", "made"),
], ids=["str*", "list*", "center", "replace()", "|replace", "%", "format", "expandtabs", "lipsum", "join", "indent",
        "tojson", "batch", "laughs", "laughs|tojson", "laughs~", "laughs-made", "laughs*", "join-generator",
        "many-values", "set-block"])
def test_a_step_that_would_grow_past_the_bound_is_refused_before_it_runs(source, problem):
    t0 = time.perf_counter()
    with pytest.raises(TemplateError) as e:
        ChatTemplate(source, max_chars=SMALL).render([])
    assert time.perf_counter() - t0 < 1.0
    message = str(e.value)
    assert message.startswith(f"chat template: {problem}") and message.endswith("(line 1)"), message


def test_big_numbers_are_refused_before_they_are_computed():
    for source, problem in (("{{ 2 ** 100000000 }}", "a power of over 65,536 bits"),
                            ("{% set ns = namespace(n=3) %}{% for i in range(100) %}{% set ns.n = ns.n * ns.n %}"
                             "{% endfor %}", "a product of over 65,536 bits")):
        with pytest.raises(TemplateError, match=f"^chat template: {problem} \\(line 1\\)$"):
            ChatTemplate(source).render([])


def test_output_past_the_bound_is_refused():
    long = [{"role": "user", "content": "x" * (SMALL // 2 + 1)}]
    assert len(ChatTemplate("{{ messages[0].content }}", max_chars=SMALL).render(long)) == SMALL // 2 + 1
    with pytest.raises(TemplateError, match=r"^chat template: output of over 1 Mi characters$"):
        ChatTemplate("{{ messages[0].content }}{{ messages[0].content }}", max_chars=SMALL).render(long)


def test_a_template_that_raises_is_one_line_naming_its_line(tokenizer):
    cases = {
        "{{ raise_exception('no system message\nallowed') }}": "raised TemplateError: no system message allowed "
                                                                "(line 1)",
        "{%- for m in messages %}\n{{ m.content + 1 }}\n{% endfor %}": 'raised TypeError: can only concatenate str '
                                                                       '(not "int") to str (line 2)',
        "{{ messages[0].content.nope() }}": "raised UndefinedError: 'str object' has no attribute 'nope' (line 1)",
        "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}": "recursed too deep (line 1)",
        "{% for %}": "does not compile: Expected an expression, got 'end of statement block' (line 1)",
    }
    for source, problem in cases.items():
        with pytest.raises(TemplateError) as e:
            ChatFormat(with_template(tokenizer, source))
        assert str(e.value) == f"chat template: {problem}"
        assert e.value.__cause__ is None and e.value.__suppress_context__  # no chained traceback under it


def test_a_text_too_long_for_the_tokenizer_is_refused_before_encoding(tokenizer):
    chat = ChatFormat(with_template(tokenizer, TINY_CHAT_TEMPLATE))

    class Untouchable:  # the tokenizer must not see it at all
        def __call__(self, text, **kwargs):
            raise AssertionError(f"the tokenizer was handed {len(text):,} characters")

    chat.tokenizer = Untouchable()
    with pytest.raises(ValueError) as e:
        chat.encode("x" * (MAX_CHARS + 1))
    assert str(e.value) == (f"{MAX_CHARS + 1:,} characters to encode, over the bound of {MAX_CHARS:,} "
                            "(agentrl.chat.template.MAX_CHARS)")


# Ordinary templates, and one that uses what templates use (macros, namespaces, blocks, loop variables,
# filters, operators, loop controls, the generation tag), to show the checks change no text.
EVERYTHING = """
{%- macro show(m) -%}{{ m.role | upper }}: {{ m.content }}{%- endmacro -%}
{%- set ns = namespace(users=0, roles='') -%}
{%- for m in messages -%}
  {%- if m.role == 'user' %}{% set ns.users = ns.users + 1 %}{% endif -%}
  {%- set ns.roles = ns.roles ~ m.role[0] -%}
{%- endfor -%}
{%- set header -%}[{{ ns.users }} users of {{ messages | length }}: {{ ns.roles }}]{%- endset -%}
{{ header }}
{%- if tools %}
{{ tools | map(attribute='function') | map(attribute='name') | join(', ') }}
{{ tools[0] | tojson(indent=2) }}
{%- endif %}
{%- for m in messages %}
{{ loop.index }}/{{ loop.length }}{{ loop.cycle(' odd', ' even') }} {{ show(m) }}
{%- if m.tool_calls is defined %} calls={{ m.tool_calls | tojson }}{% endif %}
{%- if m.reasoning_content is defined %} thought={{ m.reasoning_content }}{% endif %}
{%- if loop.last %} (last){% endif %}
{%- endfor %}
{%- for m in messages | selectattr('role', 'equalto', 'tool') %}{% if loop.first %}
results: {% endif %}{{ m.content | replace('\n', ' ') | truncate(24) }}{{ ', ' if not loop.last }}
{%- if loop.index == 3 %}{% break %}{% endif %}{% endfor %}
{%- if add_generation_prompt %}
{% generation %}{{ '%s>' % 'assistant' }}{{ '{}!'.format(eos_token) }}{{ '-' * 3 }}{{ [1, 2] + [3] }}{{ 2 ** 5 }}
{{- 'abc'.center(9, '.') }}{{ (messages | map(attribute='role') | list)[-1] }}{% endgeneration %}
{%- endif %}"""
TEMPLATES = {"tiny": TINY_CHAT_TEMPLATE, "hermes-fixture": HERMES_FIXTURE, "llama3": LLAMA3, "mistral": MISTRAL,
             "qwen3-coder": QWEN3_CODER, "harmony": HARMONY, "pythonic": PYTHONIC, "numbered": NUMBERED,
             "think-stripping": THINK_STRIPPING, "everything": EVERYTHING}
TOOLS = make("agentrl/Vault-v0").tool_schemas()
CALL = {"type": "function", "function": {"name": "open", "arguments": {"lock": 1}}}
CONVERSATIONS = {
    "plain": [{"role": "user", "content": "Open the vault."}],
    "system": [{"role": "system", "content": "You open vaults."}, {"role": "user", "content": "Open it."}],
    "turns": [{"role": "system", "content": "S"}, {"role": "user", "content": "2 locks."},
              {"role": "assistant", "content": "<think>read first</think>Reading.", "reasoning_content": "read"},
              {"role": "tool", "content": "clue 1:\n3 + 4"}, {"role": "tool", "content": "clue 2: 5"},
              {"role": "assistant", "content": "", "tool_calls": [CALL]}, {"role": "tool", "content": "opened"},
              {"role": "assistant", "content": "Done.", "tool_calls": None}],  # None: dropped, as transformers does
}


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("name", list(TEMPLATES))
def test_ordinary_templates_render_exactly_as_transformers_renders_them(tokenizer, name, conversation):
    tok = with_template(tokenizer, TEMPLATES[name])
    ours = ChatTemplate(TEMPLATES[name])
    msgs = CONVERSATIONS[conversation]
    for tools in (TOOLS, None):
        theirs = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
        assert ours.render(msgs, tools, **tok.special_tokens_map) == theirs, (name, tools is None)


def test_chat_format_renders_what_apply_chat_template_renders(tokenizer):
    for name in ("tiny", "hermes-fixture", "everything"):
        chat = ChatFormat(with_template(tokenizer, TEMPLATES[name]))
        msgs = CONVERSATIONS["turns"][:-1]
        expected = tokenizer.apply_chat_template(msgs, tools=TOOLS if chat.template_renders_tools else None,
                                                 tokenize=False, add_generation_prompt=True)
        assert chat.render(msgs, TOOLS) == expected, name
