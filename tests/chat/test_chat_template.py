"""`ChatFormat` against a second chat template: a Hermes/Qwen2.5-style tool-calling template
(tests/chat/fixtures/hermes_tools.jinja) on a byte-level BPE tokenizer built here, with a GPT-2-style
regex split and the tool tags as added (non-special) tokens, as Qwen2.5's tokenizer has them.

ChatFormat lays a conversation out turn by turn (the prompt once, then each action's and each
observation's tokens); the oracle is `tokenizer.apply_chat_template` on the whole conversation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.chat.layout import ChatFormat
from agentrl.core import ToolCall, parse_tool_calls
from agentrl.engines import ScriptedEngine
from agentrl.policy import SPECIAL_TOKENS, TOOL_TOKENS
from agentrl.registry import make
from agentrl.rollout import rollout
from agentrl.stages.sft import expert_texts

TEMPLATE = (Path(__file__).parent / "fixtures" / "hermes_tools.jinja").read_text()
# GPT-2's split with single digits: words, numbers, punctuation runs and whitespace are pre-tokens,
# so merges never cross a word boundary (unlike the built-in tokenizer's, which merges freely)
SPLIT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def build_tokenizer(eos: str = "<|im_end|>"):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    env = make("agentrl/Vault-v0", locks=2)
    corpus = expert_texts(env, range(40), noise=0.3) + [json.dumps(t) for t in env.tool_schemas()] + [TEMPLATE]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token="<|endoftext|>")
    hf.chat_template = TEMPLATE
    return hf


# eos <|im_end|> as Qwen2.5-Instruct's tokenizer has it; <|endoftext|> as its base models have it, with
# the same template: the template's end of message must end an action either way
@pytest.fixture(scope="module", params=["<|im_end|>", "<|endoftext|>"], ids=["eos=im_end", "eos=endoftext"])
def tokenizer(request):
    return build_tokenizer(eos=request.param)


@pytest.fixture(scope="module")
def chat(tokenizer):
    return ChatFormat(tokenizer)


def template_ids(tokenizer, messages, tools=None, add_generation_prompt=True) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                              tokenize=True,
                                              return_dict=False))


VAULT_TOOLS = make("agentrl/Vault-v0").tool_schemas()


@pytest.mark.parametrize("system", ["Open the vault.", None])
@pytest.mark.parametrize("tools", [VAULT_TOOLS, []])
def test_prompt_ids_equal_the_template(tokenizer, chat, system, tools):
    obs = "2 locks. Read each clue, then open the lock with the sum."
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": obs}]
    ids = chat.prompt_ids(obs, tools, system)
    assert ids == template_ids(tokenizer, msgs, tools or None)
    text = chat.decode(ids)
    assert text.endswith(f"<|im_start|>user\n{obs}<|im_end|>\n<|im_start|>assistant\n")
    # the template under test is the Hermes one: every tool as a JSON line inside <tools></tools>
    assert ("<tools>\n" + "\n".join(json.dumps(t) for t in tools) + "\n</tools>" in text) == bool(tools)
    if tools and system is None:
        # the template's default system
        assert text.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools")
    if not tools and system is None:
        assert "<|im_start|>system" not in text


def test_observation_wrapper_and_end_of_message_are_derived_from_the_template(chat, tokenizer):
    assert chat.obs_prefix == "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
    assert chat.obs_suffix == "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert (chat.eos_id, chat.eos_text) == (end, "<|im_end|>")  # an action's end of message is the template's
    assert set(chat.stop_ids) == {end, tokenizer.convert_tokens_to_ids("</tool_call>"), tokenizer.eos_token_id}


HERMES_CALL = '<tool_call>\n{"name": "clue", "arguments": {"lock": 1}}\n</tool_call>'


def test_a_tool_call_as_the_template_renders_it_round_trips(tokenizer, chat):
    """What a model trained on this template writes for a tool call (the template's own rendering of
    a structured call) is parsed by agentrl, ends at the </tool_call> stop token, decodes back to
    itself, and with the tool's result laid out as ChatFormat does gives the template's tokens."""
    call = {"type": "function", "function": {"name": "clue", "arguments": {"lock": 1}}}
    msgs = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    text = tokenizer.apply_chat_template(msgs, tokenize=False)
    written = text.split("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")
    assert written == HERMES_CALL
    assert parse_tool_calls(written) == [ToolCall("clue", {"lock": 1})]
    action = chat.action_ids(written)
    assert action[-1] == tokenizer.convert_tokens_to_ids("</tool_call>")  # a stop token: no end-of-message appended
    assert chat.decode(action) == written
    result = "lock 1: 2+3"
    ids = chat.prompt_ids("go", []) + action + chat.observation_ids(result, ended_with_eos=False)
    assert ids == template_ids(tokenizer, msgs + [{"role": "tool", "content": result}])


def test_scripted_episodes_are_the_template_turn_by_turn(tokenizer, chat):
    """Three scripted policies on Vault: the expert (compact tool calls that stop at </tool_call>),
    Hermes-style calls on several lines, and plain text that ends its message (<|im_end|>). Each
    episode's tokens, with the last observation, are the template's rendering of the whole
    conversation up to the next generation prompt."""
    envs = [make("agentrl/Vault-v0", locks=2, slack=1) for _ in range(3)]
    script = {0: lambda: envs[0].expert_action(), 1: lambda: HERMES_CALL, 2: lambda: "I am not sure, é → ?"}
    engine = ScriptedEngine(lambda row: chat.action_ids(script[row]()), chat.eos_id)
    episodes, _ = rollout(envs, [3, 3, 4], engine, chat)
    assert episodes[0].reward == 1.0 and episodes[1].turns[0].malformed == 0
    assert episodes[2].malformed_calls == episodes[2].num_turns
    for env, ep in zip(envs, episodes):
        obs0 = env.reset(seed=ep.seed)[0]
        msgs = [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": obs0}]
        for t in ep.turns:
            msgs += [{"role": "assistant", "content": t.action}, {"role": "tool", "content": t.observation}]
        assert ep.token_ids() + ep.turns[-1].obs_ids == template_ids(tokenizer, msgs, env.tool_schemas())
        for t in ep.turns:
            assert chat.decode(t.action_ids) == t.action
            want_tail = f"<tool_response>\n{t.observation}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
            assert chat.decode(t.obs_ids).endswith(want_tail)
