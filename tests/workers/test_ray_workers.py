"""Environments as Ray actors (`rollout.env_workers: ray:N`): on a local Ray with 2 CPUs, the same
episodes as the thread pool; tool timeouts, a raising env's message, an actor that dies and its
replacement, and a clean close. One Ray for the whole module: starting one costs seconds."""

from __future__ import annotations

import os
import time

import pytest
from envs_for_workers import BrokenVault, CrashingVault, SlowEnv
from test_workers import call, greedy_engine, hang_then_ping, scripted, summary, vault_envs

from agentrl.engines import ScriptedEngine
from agentrl.registry import make
from agentrl.rollout import rollout
from agentrl.workers import RayPool, make_pool

ray = pytest.importorskip("ray", reason="ray is not installed (the optional [ray] extra: pip install 'agentrl[ray]')")

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """A fresh local Ray of 2 CPUs (address="local": never a cluster this machine may belong to).
    The actors import tests/workers/envs_for_workers.py, so its folder goes on the path that Ray's workers
    inherit (through the environment rather than a runtime_env, which would keep them from reusing
    the workers Ray starts ahead)."""
    if ray.is_initialized():
        ray.shutdown()
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [TESTS, before] if p)
    try:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 object_store_memory=100 * 2**20)
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def pool():
    """One pool for the tests that leave its actors alive, as the trainer keeps one for a run
    (each actor costs a worker process's start). 1 s limit: a hung tool times out quickly, and no
    Vault tool comes near it."""
    with make_pool("ray:2", tool_timeout=1.0) as shared:
        yield shared


def test_scripted_episodes_are_the_thread_pools(vault_policy, pool):
    """Same episodes, tokens, rewards, turn records and group order as threads (and the serial loop)."""
    chat = vault_policy.chat
    seeds = [s for s in range(5) for _ in range(3)]
    gids = [i // 3 for i in range(15)]
    runs = {w: rollout(vault_envs(15), seeds, scripted(chat), chat, group_ids=gids, workers=w)[0]
            for w in ["serial", "thread:8", pool]}
    reference = summary(runs["serial"])
    assert summary(runs["thread:8"]) == reference and summary(runs[pool]) == reference
    assert [s[0] for s in reference] == gids
    assert len({s[3] for s in reference}) > 1 and len({len(s[7]) for s in reference}) > 1  # a varied batch


def test_tiny_policy_greedy_episodes_are_the_thread_pools(vault_policy, pool):
    """The real engine, greedy, with a refilled batch of 3 rows: the actors change timing only."""
    chat = vault_policy.chat
    seeds = [s for s in range(3) for _ in range(3)]
    gids = [10 + i // 3 for i in range(9)]
    runs = {}
    for workers, rows in [("thread:4", None), (pool, None), (pool, 3)]:
        episodes, _ = rollout(vault_envs(9), seeds, greedy_engine(vault_policy), chat, group_ids=gids,
                              workers=workers, max_batch_rows=rows)
        runs[workers, rows] = summary(episodes)
    reference = runs["thread:4", None]
    assert [s[0] for s in reference] == gids
    assert runs[pool, None] == reference and runs[pool, 3] == reference
    assert len({len(s[2]) for s in reference}) > 1


def test_one_pool_serves_many_rollouts(vault_policy, pool):
    """The trainer keeps one pool for the whole run: every rollout resends its envs at reset."""
    chat = vault_policy.chat
    for n in (6, 4):
        pooled, _ = rollout(vault_envs(n), list(range(n)), scripted(chat), chat, workers=pool)
        serial, _ = rollout(vault_envs(n), list(range(n)), scripted(chat), chat, workers="serial")
        assert summary(pooled) == summary(serial)


def test_hanging_tool_times_out_in_an_actor_and_the_episode_goes_on(vault_policy, pool):
    chat = vault_policy.chat
    t0 = time.perf_counter()
    given_up = ray.get(pool.actors[0].abandoned.remote())
    episodes, stats = rollout([SlowEnv() for _ in range(3)], [0, 1, 2], hang_then_ping(chat), chat, workers=pool)
    assert time.perf_counter() - t0 < 30
    assert ray.get(pool.actors[0].abandoned.remote()) == given_up + 1  # the actor hosting slot 0 gave the call up
    hung = episodes[0]
    assert hung.tool_timeouts == 1 and stats.tool_timeouts == 1 and hung.error is None
    assert hung.turns[0].observation == ("error: tool 'wait' ran past its 1 s limit; its call was abandoned, "
                                         "try another way")
    assert [t.observation for t in hung.turns[1:]] == ["pong", "waited 0.01"]
    assert all(e.tool_timeouts == 0 for e in episodes[1:])


def test_raising_tool_names_env_episode_and_turn_not_rays_traceback(vault_policy, pool):
    chat = vault_policy.chat
    envs = [make("agentrl/Vault-v0", locks=2), BrokenVault(locks=2)]
    eng = ScriptedEngine(lambda row: chat.action_ids(call("clue", lock=1) if row == 0
                                                     else call("open", lock=1, code=3)), chat.eos_id)
    (ok, bad), _ = rollout(envs, [1, 1], eng, chat, workers=pool)
    assert ok.error is None and bad.error == ("env BrokenVault, episode 0, turn 1: tool 'open' raised RuntimeError: "
                                              "lock mechanism jammed")


def test_a_dead_actor_fails_the_rollout_by_name_and_is_replaced_at_the_next_reset(vault_policy):
    chat = vault_policy.chat
    opener = ScriptedEngine(lambda row: chat.action_ids(call("open", lock=1, code=3)), chat.eos_id)
    with make_pool("ray:2") as own:
        with pytest.raises(RuntimeError, match=r"Ray env actor 1 died during step of slot 1"):
            rollout([make("agentrl/Vault-v0", locks=1), CrashingVault(locks=1)], [0, 0], opener, chat, workers=own)
        assert own.actors[1] is None and own.replaced == 0
        step = own.submit(1, None, "step", "x")  # no reset yet: the slot's env died with its actor
        with pytest.raises(RuntimeError, match="slot 1 has no env until its next reset"):
            step.result(10)
        pooled, _ = rollout(vault_envs(4), list(range(4)), scripted(chat), chat, workers=own)
        assert own.replaced == 1 and own.actors[1] is not None
    serial, _ = rollout(vault_envs(4), list(range(4)), scripted(chat), chat, workers="serial")
    assert summary(pooled) == summary(serial)


def test_close_kills_the_actors_and_leaves_ray_running():
    pool = make_pool("ray:2")
    actors = list(pool.actors)
    assert ray.get(actors[0].abandoned.remote()) == 0
    pool.close()
    # ray.kill is asynchronous: a call sent at once may still be served; the actor must be gone within 30 s
    deadline = time.monotonic() + 30
    with pytest.raises(ray.exceptions.RayActorError):
        while time.monotonic() < deadline:
            ray.get(actors[0].abandoned.remote(), timeout=30)
            time.sleep(0.1)
    with pytest.raises(RuntimeError, match="submit after close"):
        pool.submit(0, None, "step", "x")
    assert ray.is_initialized()  # the next pool (an evaluation's) reuses it
    pool.close()  # twice is harmless
    with make_pool("ray:1") as again:
        assert isinstance(again, RayPool) and ray.get(again.actors[0].abandoned.remote()) == 0


CONNECT = """
import ray
from agentrl.registry import make
from agentrl.workers import make_pool
with make_pool("ray:1") as pool:
    obs, _ = pool.submit(0, make("agentrl/Vault-v0", locks=1), "reset", 0).result(60)
    print(ray.get_runtime_context().gcs_address, obs == make("agentrl/Vault-v0", locks=1).reset(seed=0)[0])
"""


def test_a_second_process_joins_the_ray_named_by_RAY_ADDRESS():
    """What a cluster run does (RAY_ADDRESS=auto, or set by `ray job submit`): this process's Ray
    stands in for the cluster, and a fresh process with RAY_ADDRESS set to it puts its actors there."""
    import subprocess
    import sys

    address = ray.get_runtime_context().gcs_address
    env = {**os.environ, "RAY_ADDRESS": address, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", CONNECT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == [address, "True"]
