"""Env calls in a worker pool: the pool changes timing, never content; a hung tool times out and the
episode goes on; a raising tool still names env, episode and turn; `async def` tools run on the
event loop; a bounded batch refilled as episodes end gives the same episodes as the unbounded one."""

from __future__ import annotations

import json
import time

import pytest
from envs_for_workers import BrokenVault, SlowEnv

from agentrl.core import Tool
from agentrl.engines import SamplingConfig, ScriptedEngine, TorchEngine
from agentrl.envs.vault import VaultEnv
from agentrl.registry import make
from agentrl.rollout import rollout
from agentrl.workers import ToolRunner, make_pool, parse_workers

POOLS = ["serial", "thread:1", "thread:8", "process:2"]


def hang_then_ping(chat) -> ScriptedEngine:
    """Row 0 calls a tool that sleeps 300 s, then pings and waits briefly; the other rows ping."""
    script = [call("wait", seconds=300.0), call("ping"), call("wait", seconds=0.01)]
    turns: dict[int, int] = {}

    def act(row):
        k = turns.get(row, 0)
        turns[row] = k + 1
        return chat.action_ids(script[k] if row == 0 else call("ping"))

    return ScriptedEngine(act, chat.eos_id)


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def summary(episodes):
    """Everything an episode records, except timing."""
    return [(e.group_id, e.seed, e.token_ids(), e.reward, e.terminated, e.truncated, e.error,
             [(t.context_len, t.action, t.observation, t.step_reward, t.state_key, t.malformed) for t in e.turns])
            for e in episodes]


def vault_envs(n):
    return [make("agentrl/Vault-v0", locks=1 + i % 3, slack=1) for i in range(n)]


def scripted(chat):
    """Row r reads lock 1's clue, then guesses a code from r; the script reads no env state, so it
    plays the same in every pool (a remote pool's envs are copies)."""
    turns: dict[int, int] = {}

    def act(row):
        k = turns.get(row, 0)
        turns[row] = k + 1
        text = call("clue", lock=1) if k % 2 == 0 else call("open", lock=1 + k // 2, code=2 + (row + k) % 7)
        return chat.action_ids(text if row % 5 else "no call")

    return ScriptedEngine(act, chat.eos_id)


@pytest.mark.parametrize("workers", POOLS[1:])
def test_scripted_episodes_are_identical_in_every_pool(vault_policy, workers):
    chat = vault_policy.chat
    seeds = [s for s in range(5) for _ in range(3)]
    gids = [i // 3 for i in range(15)]
    serial, _ = rollout(vault_envs(15), seeds, scripted(chat), chat, group_ids=gids, workers="serial")
    pooled, _ = rollout(vault_envs(15), seeds, scripted(chat), chat, group_ids=gids, workers=workers)
    assert summary(pooled) == summary(serial)
    assert len({e.reward for e in serial}) > 1 and len({e.num_turns for e in serial}) > 1  # a varied batch


def greedy_engine(policy, temperature=0.0):
    chat = policy.chat
    return TorchEngine(policy.model, SamplingConfig(temperature=temperature, max_new_tokens=12), chat.stop_ids,
                       chat.eos_id, chat.pad_id, seed=3)


def test_tiny_policy_greedy_episodes_are_identical_in_every_pool_and_batch_bound(vault_policy):
    """The real engine, greedy: per-row readiness and refilled rows change which rows share a
    forward, never an episode; episodes come back in input order with their group ids."""
    chat = vault_policy.chat
    seeds = [s for s in range(3) for _ in range(3)]
    gids = [10 + i // 3 for i in range(9)]
    runs = {}
    for workers, rows in [("serial", None), ("thread:4", None), ("process:2", None), ("thread:4", 3)]:
        episodes, stats = rollout(vault_envs(9), seeds, greedy_engine(vault_policy), chat, group_ids=gids,
                                  workers=workers, max_batch_rows=rows)
        runs[workers, rows] = summary(episodes)
    reference = runs["serial", None]
    assert [s[0] for s in reference] == gids
    for key, run in runs.items():
        assert run == reference, key
    assert len({len(s[2]) for s in reference}) > 1  # rows of different lengths left at different times


def test_sampled_tokens_do_not_depend_on_the_batch(vault_policy):
    """Each row samples from its own stream: at T=1 a bounded, refilled batch draws the same tokens."""
    chat = vault_policy.chat
    runs = []
    for rows in (None, 3):
        episodes, _ = rollout(vault_envs(6), list(range(6)), greedy_engine(vault_policy, temperature=1.0), chat,
                              max_batch_rows=rows, workers="thread:4")
        runs.append([e.token_ids() for e in episodes])
    assert runs[0] == runs[1]


class JitteryVault(VaultEnv):
    """Vault whose steps take a seeded-random 0-80 ms (more than a micro-model generation): under `arrival` the rows
    that share a forward
    then depend on the thread pool's timing; under `lockstep` they must not."""

    def step(self, action):
        time.sleep(self._jitter.uniform(0.0, 0.08))
        return super().step(action)

    def reset(self, *, seed=None, options=None):
        import random

        self._jitter = random.Random(seed)
        return super().reset(seed=seed, options=options)


def test_lockstep_threads_are_bit_identical_to_the_serial_loop(vault_policy):
    """Sampled at T=1: tokens, behaviour log-probs (every bit) and rewards equal the serial loop's."""
    chat = vault_policy.chat
    runs = []
    for workers, schedule in [("serial", "arrival"), ("thread:8", "lockstep"), ("thread:8", "lockstep")]:
        envs = [JitteryVault(locks=2, slack=2) for _ in range(8)]
        episodes, _ = rollout(envs, list(range(8)), greedy_engine(vault_policy, temperature=1.0), chat,
                              workers=workers, schedule=schedule)
        runs.append([(e.token_ids(), [lp for t in e.turns for lp in t.logprobs], e.reward) for e in episodes])
    assert runs[1] == runs[0] and runs[2] == runs[0]
    with pytest.raises(ValueError, match="schedule must be arrival or lockstep"):
        rollout(vault_envs(1), [0], greedy_engine(vault_policy), chat, schedule="whenever")


def test_refill_keeps_the_batch_bounded_and_groups_whole(vault_policy, monkeypatch):
    """With a bound of 4 rows, no forward ever holds more than 4 rows, and all 12 episodes (4
    groups of 3) come back whole, in order."""
    from agentrl.engines.torch import TorchSession

    widths = []
    forward = TorchSession._forward

    def spy(self, ids, chunk_mask, *args, **kwargs):
        widths.append(len(self.rows))
        return forward(self, ids, chunk_mask, *args, **kwargs)

    monkeypatch.setattr(TorchSession, "_forward", spy)
    chat = vault_policy.chat
    gids = [i // 3 for i in range(12)]
    episodes, _ = rollout(vault_envs(12), [g for g in gids], greedy_engine(vault_policy), chat, group_ids=gids,
                          max_batch_rows=4)
    assert max(widths) == 4 and len(episodes) == 12
    assert [e.group_id for e in episodes] == gids and [e.seed for e in episodes] == gids
    assert all(e.num_turns >= 1 and (e.terminated or e.truncated) for e in episodes)


def test_async_tool_is_awaited_on_the_event_loop():
    env = SlowEnv()
    env.reset(seed=0)
    env.tool_runner = ToolRunner(default=5.0)
    assert env._tools["await_"].is_async and not env._tools["wait"].is_async
    obs, *_ = env.step(call("await_", seconds=0.01))
    assert obs == "awaited on agentrl-tools-loop"
    env.tool_runner = None  # without a runner (a plain env.step), the coroutine is run to its end here
    obs, *_ = env.step(call("await_", seconds=0.01))
    assert obs.startswith("awaited on ")


@pytest.mark.parametrize("workers", ["thread:4", "process:2"])
def test_hanging_tool_times_out_and_the_episode_goes_on(vault_policy, workers):
    chat = vault_policy.chat
    t0 = time.perf_counter()
    with make_pool(workers, tool_timeout=0.3) as pool:
        episodes, stats = rollout([SlowEnv() for _ in range(3)], [0, 1, 2], hang_then_ping(chat), chat,
                                  workers=pool)
    assert time.perf_counter() - t0 < 60  # not the 300 s the tool asked for (a process pool's start included)
    hung = episodes[0]
    assert hung.tool_timeouts == 1 and stats.tool_timeouts == 1 and hung.error is None
    assert hung.turns[0].observation == ("error: tool 'wait' ran past its 0.3 s limit; its call was abandoned, "
                                         "try another way")
    assert [t.observation for t in hung.turns[1:]] == ["pong", "waited 0.01"]  # the episode went on
    assert hung.truncated and hung.num_turns == 3
    assert all(e.tool_timeouts == 0 for e in episodes[1:])


def test_async_tool_past_its_limit_is_cancelled():
    SlowEnv.cancelled = 0
    env = SlowEnv()
    env.reset(seed=0)
    env.tool_runner = ToolRunner(default=60.0, overrides={"await_": 0.1})
    t0 = time.perf_counter()
    obs, _, _, _, info = env.step(call("await_", seconds=30.0))
    assert time.perf_counter() - t0 < 5 and info["tool_timeouts"] == 1
    assert obs.startswith("error: tool 'await_' ran past its 0.1 s limit")
    for _ in range(50):
        if SlowEnv.cancelled:
            break
        time.sleep(0.02)
    assert SlowEnv.cancelled == 1  # the coroutine was cancelled, not left running


def test_per_tool_override_beats_the_tools_own_limit_and_the_default():
    runner = ToolRunner(default=60.0, overrides={"wait": 0.5})
    env = SlowEnv()
    tools = env._tools
    assert runner.limit(tools["wait"]) == 0.5 and runner.limit(tools["ping"]) == 60.0
    own = Tool("ping", "", tools["ping"].params, tools["ping"].fn, timeout=2.0)
    assert runner.limit(own) == 2.0 and ToolRunner(None).limit(tools["ping"]) is None


@pytest.mark.parametrize("workers", ["thread:4", "process:2"])
def test_raising_tool_still_names_env_episode_and_turn(vault_policy, workers):
    chat = vault_policy.chat

    envs = [make("agentrl/Vault-v0", locks=2), BrokenVault(locks=2)]
    eng = ScriptedEngine(lambda row: chat.action_ids(call("clue", lock=1) if row == 0
                                                     else call("open", lock=1, code=3)), chat.eos_id)
    (ok, bad), _ = rollout(envs, [1, 1], eng, chat, workers=workers)
    assert ok.error is None and bad.error == ("env BrokenVault, episode 0, turn 1: tool 'open' raised RuntimeError: "
                                              "lock mechanism jammed")
    assert bad.num_turns == 0


def test_workers_spec_is_checked():
    assert parse_workers(" thread:64 ") == ("thread", 64) and parse_workers("serial") == ("serial", 1)
    for bad in ["thread", "thread:0", "threads:4", "process:-1", "ray:x", ""]:
        with pytest.raises(ValueError, match="thread:N, process:N, ray:N"):
            parse_workers(bad)

