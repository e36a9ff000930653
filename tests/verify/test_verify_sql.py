from __future__ import annotations

import os

import pytest

from agentrl.verify import SQLTask, VerifierError, verify

SCHEMA = "CREATE TABLE t(x INT, y TEXT); INSERT INTO t VALUES (1, 'a'), (2, 'b'), (2, 'b'), (3, 'c');"


@pytest.mark.parametrize(
    "gold, answer, score",
    [
        ("SELECT x FROM t WHERE x > 1", "SELECT x FROM t WHERE x >= 2", 1.0),
        ("SELECT x FROM t WHERE x > 1", "SELECT x FROM t WHERE x >= 2 ORDER BY x DESC", 1.0),  # order ignored
        ("SELECT x FROM t ORDER BY x DESC", "SELECT x FROM t ORDER BY x", 0.0),  # order asked for
        ("SELECT x FROM t WHERE x > 1", "SELECT DISTINCT x FROM t WHERE x > 1", 0.0),  # duplicates count
        ("SELECT COUNT(*) FROM t", "SELECT CAST(COUNT(*) AS TEXT) FROM t", 0.0),  # '4' is not 4
        ("SELECT x, y FROM t", "SELECT y, x FROM t", 0.0),
        ("SELECT AVG(x) FROM t", "SELECT SUM(x) * 1.0 / COUNT(*) FROM t", 1.0),
        ("SELECT x FROM t", "SELECT x FROM t; DELETE FROM t", 0.0),
        ("SELECT x FROM t", "DELETE FROM t", 0.0),
        ("SELECT x FROM t", "PRAGMA table_info(t)", 0.0),
        ("SELECT x FROM t", "SELEC x FROM t", 0.0),
        ("SELECT x FROM t", "", 0.0),
    ],
)
def test_rows_compared(gold, answer, score):
    assert verify(SQLTask(SCHEMA, gold), answer).score == score


def test_distinct_option_compares_sets():
    assert verify(SQLTask(SCHEMA, "SELECT x FROM t", distinct=True), "SELECT DISTINCT x FROM t").score == 1.0


def test_attach_and_runaway_queries_are_stopped(tmp_path):
    target = tmp_path / "x.db"
    v = verify(SQLTask(SCHEMA, "SELECT 1"), f"ATTACH DATABASE '{target}' AS x")
    assert v.score == 0.0 and not os.path.exists(target)
    slow = "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) SELECT COUNT(*) FROM c"
    v = verify(SQLTask(SCHEMA, "SELECT 1"), slow)
    assert v.score == 0.0 and "too slow" in v.reason


def test_broken_gold_is_an_error():
    with pytest.raises(VerifierError, match="gold query failed"):
        verify(SQLTask(SCHEMA, "SELECT nope FROM t"), "SELECT 1")
