"""The examples run (shrunk), as the README promises."""

from __future__ import annotations

import doctest
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def test_custom_env_example_checks_and_runs_its_training_loop(tmp_path, capsys):
    """Shrunk, the example's warm start (64 demonstrations) rarely passes, so GRPO may find no group
    with signal; what it must do is run both updates on fresh episodes and say what each did."""
    from examples import custom_env

    summary = custom_env.main(["--updates", "2", "--demos", "64", "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert "check_env: all checks pass" in out and "reward: 1.0" in out
    assert summary == json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["env"] == "examples.custom_env:Arithmetic" and summary["updates_done"] == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if "rollout/episodes" in r]
    assert [r["step"] for r in updates] == [1, 2] and all(r["rollout/episodes"] == 64 for r in updates)  # 8 x 8
    for r in updates:
        assert all(math.isfinite(v) for k, v in r.items() if k.startswith("train/"))
        if r.get("train/skipped"):  # skipped only when no group had signal, and counted as such
            assert r["credit/zero_adv_frac"] == 1.0 and r["train/trained_episodes"] == 0
        else:
            assert r["train/trained_episodes"] > 0
    final = rows[-1]
    assert final["final"] and final["eval/episodes"] == 64 and final["eval/pass_rate"] == summary["final_pass_rate"]
    assert (Path(summary["checkpoint"]) / "config.json").is_file()


def test_env_module_doctests():
    import agentrl.envs.vault

    assert doctest.testmod(agentrl.envs.vault).failed == 0
