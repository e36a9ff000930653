"""VaultMemory-v0 needs memory across a context cut, shown without a model: a scripted reader that acts only on
the text its context holds (the codes it can see, the last "next:" it was told) passes with the whole context and
under summarize (its summary copies the codes it sees), and fails under every policy that loses them."""

from __future__ import annotations

import re

import pytest

from agentrl.config import TinyModelConfig
from agentrl.context import ContextConfig
from agentrl.engines.base import Generation
from agentrl.envs.vault_memory import VaultMemoryEnv, _call
from agentrl.policy import Policy, build_tiny_policy
from agentrl.registry import make
from agentrl.rollout import rollout
from agentrl.stages.sft import expert_summary_texts, expert_texts

MICRO = TinyModelConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=1, max_position_embeddings=1024, vocab_size=600)
KW = {"doors": 2, "patrols": 8, "log_lines": 6, "slack": 2}
INSTRUCTION = "Summarize your notes."


class Reader:
    """An engine whose every row reads its own context (the prompt, each observation, its own actions, a new
    segment's context from scratch) and answers from that text only."""

    def __init__(self, chat):
        self.chat = chat

    def open(self, prompts):
        return _ReaderSession(self.chat)


class _ReaderSession:
    turn_level = True

    def __init__(self, chat):
        self.chat, self.seen, self.started = chat, {}, []

    def add(self, rows, prompts):
        self.seen.update((r, list(p)) for r, p in zip(rows, prompts))

    def extend(self, chunks, rows=None):
        for r, c in zip(rows, chunks):
            self.seen[r] += list(c)

    def drop(self, rows):
        for r in rows:
            self.seen.pop(r, None)

    def keep(self, positions):
        pass

    def start(self, rows):
        self.started += list(rows)

    def collect(self):
        rows, self.started = self.started, []
        out = []
        for r in rows:
            ids = self.chat.action_ids(self.answer(self.chat.decode(self.seen[r])))
            self.seen[r] += ids
            out.append((r, Generation(ids, [0.0] * len(ids), "eos")))
        return out

    @staticmethod
    def answer(context: str) -> str:
        codes = dict(re.findall(r"door (\d) code (\d{3})", context))  # the last mention of each door wins
        step = re.findall(r"next: (note|patrol|open door) (\d+)", context)[-1]
        if context.rfind(INSTRUCTION) > context.rfind("</tool_response>"):  # asked for a summary after the last result
            return " ".join(f"door {d} code {c}." for d, c in sorted(codes.items())) + f" next: {' '.join(step)}."
        what, n = step[0], int(step[1])
        if what == "open door":
            return _call("open", door=n, code=int(codes.get(str(n), 100)))
        return _call(what, **{"door" if what == "note" else "step": n})


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    env = VaultMemoryEnv(**KW)
    folder = tmp_path_factory.mktemp("micro-reader")
    build_tiny_policy(expert_texts(env, range(40), 0.3) + expert_summary_texts(env, range(40, 60), 0.3, INSTRUCTION),
                      folder, MICRO, seed=0)
    return Policy.load(folder).chat


def play(chat, context):
    envs = [make("agentrl/VaultMemory-v0", **KW) for _ in range(4)]
    episodes, stats = rollout(envs, list(range(4)), Reader(chat), chat, max_context=1024, max_new_tokens=24,
                              context=context, workers="serial")
    return episodes, stats


def test_the_reader_passes_with_the_whole_context_and_under_summarize_only(chat):
    whole, _ = play(chat, None)
    assert all(e.passed for e in whole)
    tokens = min(len(e.token_ids()) for e in whole)
    budget = tokens // 2  # every policy must cut at least once
    results = {}
    for policy in ("summarize", "window", "drop-observations", "truncate"):
        episodes, stats = play(chat, ContextConfig(policy=policy, budget=budget, keep_turns=2, instruction=INSTRUCTION,
                                                   summary_max_tokens=24, stub="(removed)"))
        results[policy] = [e.passed for e in episodes]
        assert policy == "truncate" or stats.compactions >= len(episodes)
        if policy == "summarize":  # the env scores each summary: the reader's keep every code still needed
            assert stats.extra["context/facts_kept"] == 1.0 and stats.extra["context/summary_tokens"] > 0
    assert results == {"summarize": [True] * 4, "window": [False] * 4, "drop-observations": [False] * 4,
                       "truncate": [False] * 4}
