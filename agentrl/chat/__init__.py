"""Tool-call formats of model families: how each writes a call, read and written, one module per family.

Choosing one is a lookup in `FORMATS` (``--tool-format NAME``), or `detect_format` from the
tokenizer's chat template: the first family, in `FORMATS` order, whose markers the template renders.
The order goes from the most specific markers to the least, because some templates hold several:

1. ``harmony``       ``<|channel|>``, ``<|call|>`` or ``<|start|>assistant`` (gpt-oss)
2. ``deepseek-v3``   ``tool▁calls▁begin`` (DeepSeek V3, V3.1, R1)
3. ``kimi-k2``       ``tool_calls_section_begin`` (Kimi K2)
4. ``qwen3-coder``   ``<function=`` and ``<parameter=`` (these templates also hold ``<tool_call>``)
5. ``glm-4.5``       ``<arg_key>`` (GLM-4.5, GLM-4.6; these templates also hold ``<tool_call>``)
6. ``hermes``        ``<tool_call>`` (Hermes, Qwen2.5, Qwen3)
7. ``mistral-v11``   ``[TOOL_CALLS]`` and ``[ARGS]`` (Mistral Small 3.1+, Devstral)
8. ``mistral``       ``[TOOL_CALLS]`` (Mistral 7B v0.3, Nemo)
9. ``pythonic``      a documented call list ``[func_name(arg=...)]`` (Llama 3.2 / 4 pythonic templates;
                     their Llama header tokens would otherwise read as llama3-json)
10. ``llama3-json``  ``<|python_tag|>``, the ``ipython`` role, or ``parameters`` beside Llama's header tokens

A template with none of them (SmolLM2 and many older models) gets ``hermes``; such a template usually
ignores ``tools=`` too (`ignores_tools`), so the format's `instructions` go into the system prompt.

>>> detect_format("{{ '<|im_start|>' + message.role }}...{{ '<tool_call>' }}").name
'hermes'
>>> convert('Opening. <tool_call>{"name": "open", "arguments": {"lock": 1}}</tool_call>', "hermes", "pythonic")
'Opening. [open(lock=1)]'
"""

from __future__ import annotations

import re

from agentrl.chat.calls import ToolCall
from agentrl.chat.deepseek_v3 import DeepSeekV3
from agentrl.chat.format import Block, Calls, ToolFormat, Tools
from agentrl.chat.glm45 import Glm45
from agentrl.chat.harmony import Harmony
from agentrl.chat.hermes import Hermes
from agentrl.chat.kimi_k2 import KimiK2
from agentrl.chat.llama3_json import Llama3Json
from agentrl.chat.mistral import Mistral, MistralV11
from agentrl.chat.pythonic import Pythonic
from agentrl.chat.qwen3_coder import Qwen3Coder
from agentrl.lookup import lookup, register

DEFAULT = "hermes"

# In detection order (the module docstring says why this one).
FORMATS: dict[str, ToolFormat] = {f.name: f for f in (
    Harmony(), DeepSeekV3(), KimiK2(), Qwen3Coder(), Glm45(), Hermes(), MistralV11(), Mistral(), Pythonic(),
    Llama3Json())}


def register_format(fmt: ToolFormat, *, replace: bool = False) -> ToolFormat:
    """Add a family; `get_format` and `--tool-format` see it from then on, and `detect_format` tries
    it after the built-in ones."""
    return register(FORMATS, fmt.name, fmt, what="tool format", replace=replace)


def get_format(name: str) -> ToolFormat:
    """The family registered under `name`."""
    return lookup(FORMATS, name, what="tool format")


def detect_format(chat_template: str | None) -> ToolFormat:
    """The family whose markers `chat_template` (a tokenizer's template source) renders; hermes if none."""
    for fmt in FORMATS.values():
        if chat_template and fmt.matches(chat_template):
            return fmt
    return FORMATS[DEFAULT]


def ignores_tools(chat_template: str | None) -> bool:
    """Whether a template never reads its ``tools`` variable: the tool schemas must then reach the model
    through the system prompt (`ToolFormat.instructions`)."""
    return not chat_template or re.search(r"\btools\b", chat_template) is None


def convert(text: str, src: str | ToolFormat, dst: str | ToolFormat, tools: Tools | None = None) -> str:
    """`text` with each of `src`'s call blocks replaced by `dst`'s rendering of its calls; the text around
    them is kept. Blocks with only whitespace between them are rendered together (a Mistral or pythonic
    list holds them all). A block holding a malformed call is kept as written: a mistake has no faithful
    form in another family. `tools` types the values of families that write them as text (qwen3-coder,
    glm-4.5).

    >>> convert('<tool_call>{"name": "f", "arguments": {}}</tool_call>\\n<tool_call>{"name": "g", "arguments": {}}'
    ...         '</tool_call>', "hermes", "mistral")
    '[TOOL_CALLS][{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]'
    """
    src = get_format(src) if isinstance(src, str) else src
    dst = get_format(dst) if isinstance(dst, str) else dst
    groups: list[list[Block]] = []
    for block in src.blocks(text, tools):
        prev = groups[-1][-1] if groups else None
        if prev is not None and _good(prev) and _good(block) and not text[prev.end:block.start].strip():
            groups[-1].append(block)
        else:
            groups.append([block])
    out, pos = [], 0
    for group in groups:
        first, last = group[0], group[-1]
        out.append(text[pos:first.start])
        if _good(first):
            out.append(dst.render([(c.name, c.arguments) for b in group for c in b.calls]))  # type: ignore[misc]
        else:
            out.append(text[first.start:last.end])
        pos = last.end
    out.append(text[pos:])
    return "".join(out)


def _good(block: Block) -> bool:
    return all(c.error is None for c in block.calls)


__all__ = ["DEFAULT", "FORMATS", "Block", "Calls", "ToolCall", "ToolFormat", "Tools", "DeepSeekV3", "Glm45",
           "Harmony", "Hermes", "KimiK2", "Llama3Json", "Mistral", "MistralV11", "Pythonic", "Qwen3Coder", "convert",
           "detect_format", "get_format", "ignores_tools", "register_format"]
