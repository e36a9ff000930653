"""`agentrl sft --data`'s format: a system message, the env's prompt and tools as defaults, clear errors."""

from __future__ import annotations

import json

import pytest

from agentrl.registry import make
from agentrl.stages.data import DataError, load_conversations, load_demos

TOOLS = [{"type": "function",
          "function": {"name": "answer", "description": "Submit.", "parameters": {"properties": {}}}}]


def msgs(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


def write(tmp_path, *records):
    f = tmp_path / "demos.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return f


def test_a_leading_system_message_is_the_system_prompt(tmp_path):
    f = write(tmp_path, {"messages": msgs(("system", "Be brief."), ("user", "task"), ("assistant", "a"))})
    ((n, conv),) = load_conversations(f)
    assert n == 1 and conv.system == "Be brief." and [m.role for m in conv.messages] == ["user", "assistant"]


def test_system_given_twice_or_late_is_refused_with_the_line(tmp_path):
    ok = {"messages": msgs(("user", "t"), ("assistant", "a"))}
    twice = {"system": "x", "messages": msgs(("system", "y"), ("user", "t"), ("assistant", "a"))}
    with pytest.raises(DataError, match=r"demos.jsonl:2: .*system prompt is given twice"):
        load_conversations(write(tmp_path, ok, twice))
    late = {"messages": msgs(("user", "t"), ("system", "y"), ("assistant", "a"))}
    with pytest.raises(DataError, match=r"demos.jsonl:1: .*a system message may only come first"):
        load_conversations(write(tmp_path, late))


def test_missing_system_and_tools_are_the_envs_and_given_ones_are_kept(tmp_path):
    bare = {"messages": msgs(("user", "t"), ("assistant", "a"))}
    explicit = {"system": "", "tools": [], "messages": msgs(("user", "t"), ("assistant", "a"))}
    (_, a), (_, b) = load_conversations(write(tmp_path, bare, explicit), system="Env prompt.", tools=TOOLS)
    assert a.system == "Env prompt." and a.tools == TOOLS
    assert b.system == "" and b.tools == []  # given, even empty: used as it is


def test_the_demonstrations_prompt_is_the_one_the_envs_rollouts_see(tmp_path, vault_policy):
    env = make("agentrl/Vault-v0", locks=2)
    obs, _ = env.reset(seed=3)
    chat = vault_policy.chat
    f = write(tmp_path, {"messages": msgs(("user", obs), ("assistant", "x"))})
    (ep,) = load_demos(f, chat, env.system_prompt, env.tool_schemas())
    # what rollout.py builds for the first turn of this episode
    assert ep.prompt_ids == chat.prompt_ids(obs, env.tool_schemas(), env.system_prompt)
    (bare,) = load_demos(f, chat)  # without the env's defaults, no tools are listed
    assert len(bare.prompt_ids) < len(ep.prompt_ids)
