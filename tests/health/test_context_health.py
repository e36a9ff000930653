"""The context alarms: SUMMARY COLLAPSE and COMPACTION DRIFT fire on planted histories and stay quiet on
healthy ones (and on runs that log no context/ metrics at all)."""

from __future__ import annotations

from agentrl.health import COMPACTION_DRIFT, SUMMARY_COLLAPSE, HealthConfig, check


def history(summary_tokens=None, facts=None, compactions=None, steps=20):
    rows = []
    for s in range(1, steps + 1):
        row = {"step": s, "rollout/pass_rate": 0.5, "train/entropy": 1.0}
        for key, values in (("context/summary_tokens", summary_tokens), ("context/facts_kept", facts),
                            ("context/compactions_per_episode", compactions)):
            if values is not None:
                row[key] = values(s)
        rows.append(row)
    return rows


def healthy(s):
    return 120.0 + (7 if s % 2 else -7)  # summaries of a steady length, batch noise around it


def test_a_run_without_context_metrics_raises_neither():
    h = check(history())
    assert SUMMARY_COLLAPSE not in h.names and COMPACTION_DRIFT not in h.names


def test_steady_summaries_and_a_steady_rate_are_healthy():
    h = check(history(healthy, lambda s: 0.9 + 0.05 * (s % 2), lambda s: 3.0 + 0.3 * (s % 3 - 1)))
    assert h.names.isdisjoint({SUMMARY_COLLAPSE, COMPACTION_DRIFT}), h.alarms


def test_summaries_shrinking_toward_nothing_are_a_collapse():
    rows = history(lambda s: 120.0 if s <= 6 else max(120.0 - 15 * (s - 6), 4.0))
    h = check(rows)
    assert SUMMARY_COLLAPSE in h.names
    reason = next(a.reason for a in h.alarms if a.name == SUMMARY_COLLAPSE)
    assert "below 30% of the early 120" in reason
    assert SUMMARY_COLLAPSE not in check(rows[:8]).names  # not yet: still above the floor
    assert SUMMARY_COLLAPSE not in check(rows, HealthConfig(summary_floor_frac=0.01)).names


def test_summaries_that_lose_the_facts_are_a_collapse_even_at_full_length():
    h = check(history(healthy, lambda s: 0.95 if s <= 6 else 0.5))
    assert SUMMARY_COLLAPSE in h.names
    assert "facts the task needs" in next(a.reason for a in h.alarms if a.name == SUMMARY_COLLAPSE)
    assert check(history(healthy, lambda s: 0.95 if s <= 6 else 0.5)).metrics()["health/summary_collapse"] == 1.0


def test_a_compaction_rate_that_doubles_or_halves_drifts():
    assert COMPACTION_DRIFT in check(history(compactions=lambda s: 2.0 if s <= 6 else 5.0)).names
    assert COMPACTION_DRIFT in check(history(compactions=lambda s: 4.0 if s <= 6 else 1.5)).names
    assert COMPACTION_DRIFT not in check(history(compactions=lambda s: 2.0 if s <= 6 else 3.0)).names
    # too early to judge: the early level is still being set
    assert COMPACTION_DRIFT not in check(history(compactions=lambda s: 2.0 if s <= 2 else 8.0, steps=4)).names
