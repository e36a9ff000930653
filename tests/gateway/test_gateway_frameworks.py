"""Agent frameworks from PyPI drive the gateway unchanged but for the base URL, the key and the model name.

Each agent of tests/gateway/framework_agents.py runs through `AgentRunner` against the scripted engine of
tests/gateway/test_gateway.py (the first call of a session is answered with an ``add`` call for 13 + 24, the next with
the answer), and what the framework did must reach the episode: one turn per call, the tool's result in the next
call's context, the sampled ids kept where the framework only appends to its history, and the reward that the
framework's own final answer earns (seed 24 asks 13 + 24 = 37, which the script answers; seed 0 asks 10 + 20).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the gateway needs starlette and uvicorn (pip install 'agentrl[gateway]')")
pytest.importorskip("openai", reason="the gateway's tests need the openai SDK (pip install 'agentrl[gateway]')")

from test_gateway import CALL, Scripted, policy_dir  # noqa: E402, F401  (the micro Llama, built once per module)

from agentrl.config import AgentConfig, GatewayConfig  # noqa: E402
from agentrl.gateway import Agent, AgentRunner  # noqa: E402
from agentrl.policy import Policy  # noqa: E402

AGENTS = str(Path(__file__).parent / "framework_agents.py")
SEEDS = [24, 0]
FINAL_ANSWER = '<tool_call>{"name": "final_answer", "arguments": {"answer": "37"}}</tool_call>'  # smolagents' way


@pytest.fixture(scope="module")
def chat(policy_dir):  # noqa: F811  (the fixture imported above)
    return Policy.load(policy_dir / "model").chat


def rollout(chat, entry, answer="37"):
    """Episodes of `entry` for SEEDS: the script calls ``add`` first, then says `answer`."""
    cfg = AgentConfig(entry=f"{AGENTS}:{entry}", gateway=GatewayConfig(batch_wait=0.0))
    engine = Scripted(chat, lambda row, k: CALL if k == 0 else answer)
    with AgentRunner(Agent(cfg)) as runner:  # smolagents' system prompt alone is ~2.8k ids of the micro tokenizer
        return runner.rollout(engine, chat, SEEDS, max_context=8192)


def context(ep, k):
    """The ids the model was given before action `k`."""
    turn = ep.turns[k]
    return turn.segment_context if turn.segment_context is not None else ep.token_ids()[:turn.context_len]


def assert_reached_the_episode(chat, eps, stats, answer="37"):
    """Two turns (the add call, then the answer), the tool's 37 in the second call's context only, the reward of
    the framework's final answer."""
    assert [e.error for e in eps] == [None, None]
    assert [e.num_turns for e in eps] == [2, 2] and stats.extra["gateway/calls_per_episode"] == 2
    for ep in eps:
        assert ep.turns[0].action == CALL and ep.turns[0].malformed == 0
        assert chat.decode(ep.turns[1].action_ids) == answer
        assert "37" not in chat.decode(context(ep, 0)) and "37" in chat.decode(context(ep, 1))
    assert [e.reward for e in eps] == [1.0, 0.0]


@pytest.mark.parametrize("entry, module, install", [
    ("solve_openai_agents", "agents", "pip install openai-agents (or 'agentrl[agents]')"),
    ("solve_langgraph", "langgraph", "pip install langgraph langchain-openai (or 'agentrl[agents]')"),
], ids=["openai-agents", "langgraph"])
def test_a_framework_that_appends_to_its_history_continues_the_sampled_sequence(chat, entry, module, install):
    pytest.importorskip(module, reason=install)
    if module == "langgraph":
        pytest.importorskip("langchain_openai", reason=install)
    eps, stats = rollout(chat, entry)
    assert_reached_the_episode(chat, eps, stats)
    assert stats.extra["gateway/prefix_break_rate"] == 0.0
    for ep in eps:  # the assistant message it sent back was matched by its call id to the exact text sampled
        assert ep.turns[1].segment_context is None
        assert context(ep, 1)[:ep.turns[0].context_len + len(ep.turns[0].action_ids)] == \
            ep.prompt_ids + ep.turns[0].action_ids


def test_smolagents_replays_its_memory_as_text_so_each_later_call_opens_a_segment(chat):
    """smolagents sends its history back as its own text, not as OpenAI tool calls: the call as an assistant message
    "Calling tools:\\n[{...}]" (a Python repr, no tool_calls, so no id to find the sampled text by) and the result as a
    user message "Observation:\\n37". The model never wrote that text, so the call is a new segment, trained on exactly
    the context it was given; it ends through its final_answer tool, not with plain text."""
    pytest.importorskip("smolagents", reason="pip install smolagents (or 'agentrl[agents]')")
    eps, stats = rollout(chat, "solve_smolagents", FINAL_ANSWER)
    assert_reached_the_episode(chat, eps, stats, FINAL_ANSWER)
    assert stats.extra["gateway/prefix_break_rate"] == 1.0
    for ep in eps:
        given = chat.decode(ep.turns[1].segment_context)
        assert "Calling tools:\n[{'id': " in given and "Observation:\n37" in given and CALL not in given
        assert len(ep.segments()) == 2
