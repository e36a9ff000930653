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
