"""A warm start under a context policy: the expert's demonstrations are played through the same rollout, so under
summarize the expert's summaries are turns of their own (trained as actions, `kind="summary"`), and the warm
start's cache key changes with a policy that compacts and with nothing else."""

from __future__ import annotations

import pytest

from agentrl.config import SFTConfig, TinyModelConfig
from agentrl.context import ContextConfig
from agentrl.core import AgentEnv
from agentrl.envs.vault_memory import VaultMemoryEnv
from agentrl.policy import Policy, build_tiny_policy
from agentrl.registry import make
from agentrl.stages.sft import NoExpertError, collect_demos, expert_summary_texts, expert_texts
from agentrl.stages.warm_start import warm_start_parts

MICRO = TinyModelConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=1, max_position_embeddings=1024, vocab_size=600)
KW = {"doors": 2, "patrols": 8, "log_lines": 6}
SUMMARIZE = ContextConfig(policy="summarize", budget=200, summary_max_tokens=24, instruction="Summarize your notes.")


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    """A micro policy's chat whose tokenizer learnt the expert's text, summaries and instruction included."""
    env = VaultMemoryEnv(**KW)
    folder = tmp_path_factory.mktemp("micro-memory")
    corpus = expert_texts(env, range(40), 0.3) + expert_summary_texts(env, range(40, 60), 0.3, SUMMARIZE.instruction)
    build_tiny_policy(corpus, folder, MICRO, seed=0)
    return Policy.load(folder).chat


def demos(chat, context, seeds=range(6), noise=0.0):
    return collect_demos(lambda: make("agentrl/VaultMemory-v0", **KW), chat, list(seeds), noise, context=context,
                         max_context=1024, max_new_tokens=24)


def test_the_expert_answers_each_request_for_a_summary_with_its_own(chat):
    episodes = demos(chat, SUMMARIZE)
    env = VaultMemoryEnv(**KW)
    for ep in episodes:
        assert ep.passed and ep.segmented
        summaries = [t for t in ep.turns if t.kind == "summary"]
        env.reset(seed=ep.seed)
        assert summaries and all(f"door 2 code {env.codes[1]}. next: " in t.action for t in summaries)
        assert f"door 1 code {env.codes[0]}." in summaries[0].action  # every code its door still needs
        after = ep.turns[ep.turns.index(summaries[0]) + 1]
        assert after.segment_context is not None and summaries[0].action in chat.decode(after.segment_context)
        assert all(len(ids) <= SUMMARIZE.budget for ids, _ in ep.segments())


def test_window_demonstrations_have_no_summary_turns_and_truncate_lays_them_out_as_before(chat):
    window = demos(chat, ContextConfig(policy="window", budget=200, keep_turns=2), seeds=range(2))
    assert all(ep.segmented and all(t.kind == "action" for t in ep.turns) for ep in window)
    plain, truncate = demos(chat, None, seeds=range(2)), demos(chat, ContextConfig(), seeds=range(2))
    assert [e.token_ids() for e in plain] == [e.token_ids() for e in truncate]


def test_an_expert_that_writes_no_summary_is_told_so(chat):
    class Mute(VaultMemoryEnv):
        expert_summary = AgentEnv.expert_summary

    with pytest.raises(NoExpertError, match="expert_summary"):
        collect_demos(lambda: Mute(**KW), chat, [0], 0.0, context=SUMMARIZE, max_context=1024, max_new_tokens=24)


def test_the_warm_start_key_changes_with_a_policy_that_compacts_only():
    env = make("agentrl/VaultMemory-v0", **KW)

    def parts(context=None, max_new_tokens=0):
        return warm_start_parts(env, "agentrl/VaultMemory-v0", KW, MICRO, SFTConfig(noise=0.3), 0, context,
                                max_new_tokens)

    assert "context" not in parts() and "context" not in parts(None, 24)
    summarize = parts(SUMMARIZE, 24)["context"]
    assert summarize["policy"] == "summarize" and summarize["max_new_tokens"] == 24 and "summaries" in summarize
    assert "summaries" not in parts(ContextConfig(policy="window", budget=200), 24)["context"]
