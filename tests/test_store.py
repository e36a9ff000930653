"""The trajectory store: Parquet round trip, clear errors for missing or corrupt stores."""

from __future__ import annotations

import pytest

from agentrl.core import Episode, Turn
from agentrl.store import StoreError, TrajectoryStore


def episodes():
    a = Episode([1, 2], [Turn(2, [3, 4], [-0.25, -0.5], [5], "act", "obs", 0.5, "(1, True)", 1), Turn(7, [6], [-1.0], [], "a2", "o2")],
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
