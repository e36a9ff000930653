"""benchmarks/context.py builds a valid run for every arm, at its full and its quick size, without running one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import context as bench  # noqa: E402

from agentrl.context import CONTEXT_POLICIES  # noqa: E402


@pytest.mark.parametrize("argv", [[], ["--quick"]], ids=["full", "quick"])
def test_every_arm_is_a_valid_run_at_the_budget(argv, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["context.py", *argv])
    args = bench.build_parser().parse_args(argv)
    bench.sized(args)
    for arm in bench.ARMS:
        cfg = bench.config(args, arm, seed=1)
        c = cfg.rollout.context
        assert c.budget == args.budget and c.policy == bench.ARMS[arm]["policy"] and cfg.seed == 1
        assert c.mask_summary == (arm == "summarize-masked")
        assert cfg.env.kwargs["patrols"] == args.patrols
    # every built-in policy but the env's own hook is an arm (VaultMemory has no compact hook)
    assert {a["policy"] for a in bench.ARMS.values()} == set(CONTEXT_POLICIES) - {"env"}


def test_quarters_are_the_means_of_the_first_and_last_quarter_of_a_run():
    # quarters of two values: (1 + 3) / 2 and (13 + 15) / 2
    assert bench.quarters([1.0, 3.0, 5.0, 7.0, 9.0, 11.0, 13.0, 15.0]) == [2.0, 14.0]
    assert bench.quarters([4.0, 8.0]) == [4.0, 8.0]  # under four values a quarter is one value
    assert bench.quarters([]) is None


def test_the_derived_figures_of_a_finished_run(tmp_path, monkeypatch, capsys):
    """Hand-made arms: summarize 0.9, masked 0.6, window 0.3, truncate 0.0 -> best other window, ratio 0.9 / 0.3 = 3,
    trained over masked 0.9 / 0.6 = 1.5; with every other arm at 0 the ratio is None, not a division by zero."""
    monkeypatch.setattr(bench, "report", lambda name, results, quick, summary, path=None: print(summary))

    def run(means):
        before = {"pass_rate": 0.5, "compactions_per_episode": 1.0, "peak_kv_cache_mb": 1.0,
                  "seconds_per_turn_first_quarter": 0.1, "seconds_per_turn_last_quarter": 0.1}
        arms = {a: {"before": before, "runs": [{"facts_kept": None}], "final_mean": m, "final_std": 0.0}
                for a, m in means.items()}
        results = {"arms": arms, "budget_share": 0.25, "args": {"budget": 256, "seeds": [0], "updates": 1,
                                                                 "quick": False}}
        bench.finish(results, None)
        return results

    r = run({"summarize": 0.9, "summarize-masked": 0.6, "window": 0.3, "truncate": 0.0})
    assert (r["best_other"], r["ratio"], r["trained_over_masked"]) == ("window", 3.0, 1.5)
    r = run({"summarize": 0.9, "summarize-masked": 0.6, "window": 0.0, "truncate": 0.0})
    assert r["ratio"] is None and r["best_other"] is None and r["trained_over_masked"] == 1.5
