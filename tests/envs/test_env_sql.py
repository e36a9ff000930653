"""SQL-v0 specifics: query results truncated, writes refused. The shared contract: test_env_common.py."""

from __future__ import annotations

import pytest

import agentrl

ENV_ID = "agentrl/SQL-v0"


@pytest.fixture(scope="module")
def env():
    return agentrl.make(ENV_ID)


def test_query_tool_truncates_and_refuses_writes(env):
    env.reset(seed=0)
    obs = env.query("SELECT * FROM emp")
    assert "more rows not shown" in obs and len(obs) <= 300
    assert env.query("DELETE FROM emp").startswith("error: not authorized")
    assert env.query("SELECT COUNT(*) FROM emp").startswith("1 rows: 8")
