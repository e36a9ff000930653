"""The trajectory store: Parquet round trip, clear errors for missing or corrupt stores."""

from __future__ import annotations

import pytest

from agentrl.core import Episode, Turn
from agentrl.store import StoreError, TrajectoryStore, make_batch


def episodes():
    a = Episode([1, 2], [Turn(2, [3, 4], [-0.25, -0.5], [5], "act", "obs", 0.5, "(1, True)", 1),
                         Turn(7, [6], [-1.0], [], "a2", "o2")],
                reward=1.0, terminated=True, env_id="agentrl/Vault-v0", task_id="t:1", group_id=3, seed=11)
    b = Episode([1], [], reward=0.0, truncated=True, group_id=3, seed=None, error="env X, episode 0, turn 1: boom")
    return [a, b]


def test_parquet_round_trip(tmp_path):
    store = TrajectoryStore(episodes())
    path = store.save(tmp_path / "s.parquet")
    back = TrajectoryStore.load(path)
    assert back.episodes == store.episodes
    assert list(back.groups()) == [3] and len(back.groups()[3]) == 2


def test_load_folder_in_name_order(tmp_path):
    TrajectoryStore(episodes()[:1]).save(tmp_path / "update_00002.parquet")
    TrajectoryStore(episodes()[1:]).save(tmp_path / "update_00001.parquet")
    assert [e.seed for e in TrajectoryStore.load(tmp_path)] == [None, 11]


def test_missing_and_corrupt_stores_give_clear_errors(tmp_path):
    with pytest.raises(StoreError, match="no store at"):
        TrajectoryStore.load(tmp_path / "nope.parquet")
    with pytest.raises(StoreError, match="holds no .parquet files"):
        TrajectoryStore.load(tmp_path)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(StoreError, match="not a readable Parquet file"):
        TrajectoryStore.load(bad)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1]}), tmp_path / "other.parquet")
    with pytest.raises(StoreError, match="missing columns"):
        TrajectoryStore.load(tmp_path / "other.parquet")


def test_a_batch_never_changes_once_built():
    import dataclasses

    batch = make_batch([_episode_for_immutability()], 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.ref_logp = batch.behaviour_logp  # the trainer attaches columns with with_(), getting a new batch
    more = batch.with_(ref_logp=batch.behaviour_logp * 0)
    assert batch.ref_logp is None and more.ref_logp is not None and more.input_ids is batch.input_ids


def _episode_for_immutability():
    ep = Episode(prompt_ids=[1, 2], env_id="t", task_id="t:0", group_id=0, seed=0)
    ep.turns.append(Turn(context_len=2, action_ids=[3, 4], logprobs=[-0.1, -0.2], obs_ids=[5]))
    ep.reward, ep.terminated = 1.0, True
    return ep
