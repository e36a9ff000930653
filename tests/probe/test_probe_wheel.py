"""The probe recommends the same from a wheel install as from the checkout.

The calibrated thresholds once lived only in `benchmarks/results/horizon_sweep.json`, which no wheel
ships: on one store the checkout recommended steppo and a wheel grpo. They are package data now
(`agentrl/probe/thresholds.json`, written by `python -m agentrl.probe calibrate`). This builds a wheel
from a copy of the working tree, installs it into a fresh venv (the running interpreter's
site-packages for the dependencies, no downloads: tests/venvs.py) and probes the same store in both.
The store sits between the packaged horizon cut-off (5 turns) and the literature's (30), where the
two sources of thresholds disagree.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from venvs import make_venv

from agentrl.core import Episode, Turn
from agentrl.probe import probe_store
from agentrl.probe.calibration import calibration_record
from agentrl.probe.thresholds import ProbeThresholds, packaged_thresholds
from agentrl.store import TrajectoryStore

ROOT = Path(__file__).resolve().parents[2]

# Run in the venv, from a folder outside the checkout: prints where each agentrl module it imported came
# from (a subpackage the wheel lacks would come from an editable install the venv also sees) and its pick.
PROBE = """
import json, sys
import agentrl.probe
r = agentrl.probe.probe_store(sys.argv[1])
mods = [m for n, m in list(sys.modules.items()) if n.split(".")[0] == "agentrl"]
files = sorted(m.__file__ for m in mods if getattr(m, "__file__", None))
print(json.dumps({"files": files, "algo": r.recommendation.algo, "rule": r.recommendation.rule}))
"""


def ten_turn_store(path: Path) -> Path:
    """8 groups x 4 episodes of 10 turns, half passing; the hidden state tells a passing episode from
    a failing one, so the value probe's R² is high; no step scores and no state keys."""
    eps = []
    for g in range(8):
        for i in range(4):
            passed = (i + g) % 2 == 0
            turns = [
                Turn(2 + 3 * k, [10 + k], [-0.5], [7, 8], hidden=[1.0 if passed else 0.0, float(k)]) for k in range(10)
            ]
            eps.append(Episode(prompt_ids=[1, 2], turns=turns, reward=1.0 if passed else 0.0, group_id=g))
    return TrajectoryStore(eps).save(path)


def install_wheel(tmp: Path) -> Path:
    """Build a wheel from a copy of the working tree (so no build/ lands in the checkout) and install
    it into a fresh venv; returns the venv's python."""
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist")
    for name in ("agentrl", "envs", "algorithms"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    run = lambda *cmd: subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300)  # noqa: E731
    built = run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        str(src),
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(tmp / "wheels"),
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp / "wheels").glob("agentrl-*.whl")
    python = make_venv(tmp / "venv")
    # the outer pip (the system site's, or the venv's that pytest runs in) installs into the venv it is run from
    installed = run(str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel))
    assert installed.returncode == 0, installed.stderr[-2000:]
    return python


@pytest.fixture(scope="module")
def wheel_python(tmp_path_factory) -> Path:
    return install_wheel(tmp_path_factory.mktemp("wheel"))


def test_wheel_recommends_what_the_checkout_recommends(wheel_python, tmp_path):
    store = ten_turn_store(tmp_path / "store.parquet")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [str(wheel_python), "-c", PROBE, str(store)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    wheel = json.loads(out.stdout.strip().splitlines()[-1])
    venv = wheel_python.parent.parent
    outside = [f for f in wheel["files"] if not Path(f).resolve().is_relative_to(venv.resolve())]
    assert wheel["files"] and not outside, f"the venv imported these from outside its wheel: {outside}"

    here = probe_store(store)
    import agentrl.probe

    assert Path(agentrl.probe.__file__).resolve().is_relative_to(ROOT)
    assert (wheel["algo"], wheel["rule"]) == (here.recommendation.algo, here.recommendation.rule)
    # and the store sits where the two sources of thresholds disagree: the literature's 30 turns stop it at
    # short-horizon; the packaged calibration takes it past its cut-off (4 turns) to a turn-level rule, whose
    # pick the four families' sweeps do not back, and steppo (the one they do) is not free here: the store
    # has no step scores, so it would need a PRM; hence grpo, by the gate
    literature = probe_store(store, thresholds=ProbeThresholds())
    assert literature.recommendation.rule == "short-horizon"
    assert here.stats.step_reward_density == 0
    assert (here.recommendation.algo, here.recommendation.rule) == ("grpo", "no-reliable-difference")


# The committed sweeps the package is calibrated on, one per task family (docs/benchmarks.md, "The horizon probe")
SWEEPS = [f"benchmarks/results/horizon_sweep{s}.json" for s in ("", "_hanoi_varied", "_textworld", "_frozenlake")]


def test_packaged_thresholds_are_the_committed_sweeps_calibration():
    """thresholds.json must be regenerated when the committed sweeps (or the calibration) change."""
    record = calibration_record([ROOT / s for s in SWEEPS], name=SWEEPS)
    shipped = json.loads((ROOT / "agentrl" / "probe" / "thresholds.json").read_text())
    fresh, packaged = record["thresholds"], shipped["thresholds"]
    fresh.pop("sweep_commit"), packaged.pop("sweep_commit")  # which commit holds the file says nothing of its content
    assert packaged == fresh, (
        f"agentrl/probe/thresholds.json is stale: run python -m agentrl.probe calibrate {' '.join(SWEEPS)}"
    )
    t = packaged_thresholds()
    # four families: the crossover is Hanoi's 5 turns (steppo +0.07 beyond the 0.05 spread) over 3-turn horizons
    # that showed no lead, so the cut-off is (3 + 5) / 2
    assert (t.horizon_cutoff, t.long_horizon_algo, t.min_budget_episodes) == (4.0, "steppo", 384)
    assert t.evidence["steppo"].reliable and not t.evidence["gigpo"].reliable
    assert t.source == "packaged agentrl/probe/thresholds.json, calibrated on " + " + ".join(SWEEPS)
    assert "--out" not in t.sweep_command  # a developer's output folder is no part of what the sweep measured
