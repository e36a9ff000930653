"""Rollouts: turn segmentation and loss masks with a scripted policy (no model), then the KV-cached
torch engine against a full recomputation with a real (micro) transformers model."""

from __future__ import annotations

import json

import pytest
import torch

from agentrl.engines import SamplingConfig, ScriptedEngine, TorchEngine
from agentrl.engines.torch import sample_tokens
from agentrl.policy import token_stats
from agentrl.registry import make
from agentrl.rollout import rollout
from agentrl.store import make_batch


def clue(lock):
    return f"<tool_call>{json.dumps({'name': 'clue', 'arguments': {'lock': lock}})}</tool_call>"


def test_scripted_rollout_pins_turn_segmentation_and_loss_mask(vault_policy):
    chat = vault_policy.chat
    envs = [make("agentrl/Vault-v0", locks=2, slack=0) for _ in range(3)]
    # row 0 plays the expert; row 1 writes garbage (truncated after 4 turns); row 2 reads a clue forever
    script = {0: lambda: envs[0].expert_action(), 1: lambda: "hello", 2: lambda: clue(1)}
    engine = ScriptedEngine(lambda row: chat.action_ids(script[row]()), chat.eos_id)
    episodes, stats = rollout(envs, [5, 5, 6], engine, chat, group_ids=[0, 0, 1])

    expert, garbage, looping = episodes
    assert (expert.num_turns, expert.reward, expert.terminated, expert.truncated) == (4, 1.0, True, False)
    assert (garbage.num_turns, garbage.reward, garbage.terminated, garbage.truncated) == (4, 0.0, False, True)
    assert garbage.malformed_calls == 4 and "no tool call found" in garbage.turns[0].observation
    assert [t.state_key for t in expert.turns] == ["(0, True)", "(1, False)", "(1, True)", "(2, False)"]
    assert [t.step_reward for t in expert.turns] == [0.0, 0.5, 0.0, 0.5]
    assert stats.episodes == 3 and stats.turns == 12

    for ep in episodes:
        ids, mask = ep.token_ids(), ep.action_mask()
        assert len(ids) == len(mask)
        pos = len(ep.prompt_ids)
        for k, turn in enumerate(ep.turns):
            assert turn.context_len == pos  # the action starts right after everything before it
            assert ids[pos : pos + len(turn.action_ids)] == turn.action_ids
            assert all(mask[pos : pos + len(turn.action_ids)])
            pos += len(turn.action_ids)
            if k < ep.num_turns - 1:  # observation tokens follow, masked out
                assert ids[pos : pos + len(turn.obs_ids)] == turn.obs_ids
                assert not any(mask[pos : pos + len(turn.obs_ids)])
                pos += len(turn.obs_ids)
        assert pos == len(ids)  # the last observation is not part of the sequence
        # the observation is wrapped as the chat template wraps a tool result
        text = chat.decode(ep.turns[0].obs_ids)
        assert ep.turns[0].observation in text and "<tool_response>" in text and text.endswith("assistant\n")
        assert chat.decode(ep.turns[0].action_ids) == ep.turns[0].action

    batch = make_batch(episodes, chat.pad_id)
    for b, ep in enumerate(episodes):
        n = len(ep.token_ids())
        assert batch.action_mask[b, :n].tolist() == [float(m) for m in ep.action_mask()]
        assert batch.action_mask[b, n:].sum() == 0 and batch.attention_mask[b].sum() == n
        assert batch.num_turns[b] == ep.num_turns
        for k, turn in enumerate(ep.turns):
            s = turn.context_len
            assert (batch.turn_index[b, s : s + len(turn.action_ids)] == k).all()
            assert batch.turn_pos[b, k] == s - 1


def test_kv_cached_rollout_logprobs_match_full_recompute(vault_policy):
    """Rows of different lengths, masked holes from padding, rows leaving the batch: the behaviour
    log-probs sampled turn by turn must equal one forward over the finished episodes."""
    torch.manual_seed(0)
    chat = vault_policy.chat
    # slack 0, 1, 2: turn budgets 4, 5, 6, so rows leave the batch after different turns
    envs = [make("agentrl/Vault-v0", locks=2, slack=s) for s in (0, 1, 2, 0, 1, 2)]
    engine = TorchEngine(vault_policy.model, SamplingConfig(max_new_tokens=12), chat.stop_ids, chat.eos_id, chat.pad_id,
                         seed=1)
    episodes, _ = rollout(envs, list(range(6)), engine, chat)
    assert len({e.num_turns for e in episodes}) > 1 and all(e.num_turns >= 1 for e in episodes)
    # ragged rows
    assert len({len(e.prompt_ids) + len(e.turns[0].action_ids) + len(e.turns[0].obs_ids) for e in episodes}) > 1
    # a row stopped early: a masked hole in the cache
    assert any(len(t.action_ids) < 12 for e in episodes for t in e.turns)
    batch = make_batch(episodes, chat.pad_id)
    with torch.no_grad():
        logp = token_stats(vault_policy.model, batch.input_ids, batch.attention_mask).logp
    m = batch.action_mask.bool()
    assert torch.allclose(logp[m], batch.behaviour_logp[m], atol=1e-4), (logp[m] - batch.behaviour_logp[m]).abs().max()


def test_context_limit_truncates_and_judges(vault_policy):
    chat = vault_policy.chat
    envs = [make("agentrl/Vault-v0", locks=4)]
    engine = ScriptedEngine(lambda row: chat.action_ids(envs[0].expert_action()), chat.eos_id)
    full, _ = rollout(envs, [0], engine, chat)
    limit = full[0].turns[3].context_len  # room for three turns only
    (ep,), _ = rollout(envs, [0], engine, chat, max_context=limit, max_new_tokens=1)
    assert ep.truncated and not ep.terminated and ep.reward == 0.0 and ep.num_turns == 3


def test_raising_env_marks_the_episode_and_others_go_on(vault_policy):
    chat = vault_policy.chat
    envs = [make("agentrl/Vault-v0", locks=2) for _ in range(2)]

    def broken_open(lock: int, code: int) -> str:
        raise RuntimeError("lock mechanism jammed")

    from agentrl.core import Tool

    envs[1]._tools["open"] = Tool.from_callable(broken_open, name="open")
    engine = ScriptedEngine(lambda row: chat.action_ids(envs[row].expert_action()), chat.eos_id)
    (ok, bad), _ = rollout(envs, [1, 1], engine, chat)
    assert ok.error is None and ok.reward == 1.0
    assert bad.error == ("env agentrl/Vault-v0, episode 0, turn 2: tool 'open' raised RuntimeError: "
                         "lock mechanism jammed")


@pytest.mark.parametrize("top_k, top_p", [(2, 1.0), (0, 0.5)])
def test_sampling_truncation_keeps_untruncated_logprob(top_k, top_p):
    logits = torch.tensor([[3.0, 2.0, 1.0, -5.0]]).repeat(200, 1)
    tok, lp = sample_tokens(logits, SamplingConfig(top_k=top_k, top_p=top_p), torch.Generator().manual_seed(0))
    allowed = {0, 1} if top_k == 2 else {0}
    assert set(tok.tolist()) <= allowed
    assert torch.allclose(lp, torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1))


def test_an_episode_is_named_by_the_envs_task_id_where_reset_gives_one(vault_policy):
    chat = vault_policy.chat
    envs = [make("agentrl/Math-v0"), make("agentrl/Vault-v0", locks=1)]  # Math names its task; Vault does not
    engine = ScriptedEngine(lambda row: chat.action_ids(envs[row].expert_action()), chat.eos_id)
    math_ep, vault_ep = rollout(envs, [7, 8], engine, chat)[0]
    _, info = make("agentrl/Math-v0").reset(seed=7)
    assert math_ep.task_id == f"agentrl/Math-v0:{info['task_id']}" and info["task_id"].endswith("-7")
    assert vault_ep.task_id == "agentrl/Vault-v0:8"
