"""The examples run (shrunk), as the README promises."""

from __future__ import annotations

import doctest
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def test_custom_env_example_checks_and_trains(tmp_path, capsys):
    from examples import custom_env

    summary = custom_env.main(["--updates", "2", "--demos", "64", "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert "check_env: all checks pass" in out and "reward: 1.0" in out
    assert 0.0 <= summary["final_pass_rate"] <= 1.0 and (tmp_path / "run" / "summary.json").is_file()


def test_env_module_doctests():
    import agentrl.envs.vault

    assert doctest.testmod(agentrl.envs.vault).failed == 0
