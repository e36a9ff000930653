"""Adding an assigner is one module and one registry entry: the CLI trains it and the probe can pick it."""

from __future__ import annotations

import json
import textwrap

import yaml

from agentrl.algorithms import ASSIGNERS, AssignerSpec, register
from agentrl.cli import main

TOY = '''
"""A toy turn-level assigner: the group advantage, scaled per turn by `scale` (its only option)."""
from typing import Literal

from pydantic import Field

from agentrl.algorithms.configs import CreditConfig
from agentrl.algorithms.grpo import GRPO
from agentrl.credit import Credit, Fit, tokens_from_turns


class ToyConfig(CreditConfig):
    algo: Literal["toy-turn"] = "toy-turn"
    scale: float = Field(0.5, gt=0, description="What every turn's advantage is multiplied by.")


class Toy(GRPO):
    def __init__(self, config=None, **_):
        self.cfg = config or ToyConfig()

    def episode_advantages(self, batch):
        from agentrl.credit import group_advantages
        import torch
        A, stats = group_advantages(batch.rewards, batch.group_ids)
        return A, torch.ones(batch.size), {"zero_adv_groups": float(stats["zero_adv_groups"])}

    def assign(self, batch, fit: Fit) -> Credit:
        A, weight, metrics = self.episode_advantages(batch)
        turns = A[:, None] * self.cfg.scale * batch.turn_mask
        metrics["toy_scale"] = self.cfg.scale
        return Credit(tokens_from_turns(turns, batch), weight, metrics)
'''


def test_a_registered_toy_assigner_trains_through_the_cli_and_the_probe_can_pick_it(tmp_path, monkeypatch,
                                                                                      vault_policy_dir, capsys):
    (tmp_path / "toy_assigner.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path))
    import toy_assigner

    import agentrl.algorithms as algorithms

    monkeypatch.setattr(algorithms, "ASSIGNERS", dict(ASSIGNERS))  # the registration ends with the test

    register(AssignerSpec("toy-turn", toy_assigner.ToyConfig, toy_assigner.Toy, turn_level=True,
                          description="a toy: the group advantage times scale on every turn"))
    assert "toy-turn" in algorithms.ASSIGNERS

    out = tmp_path / "run"
    argv = ["train", "--algo", "toy-turn", "--credit.scale", "0.25", "--model", str(vault_policy_dir), "--device",
            "cpu", "--updates", "2", "--env-kw", "locks=1", "--rollout.groups", "2", "--rollout.group-size", "2",
            "--rollout.sampling.max-new-tokens", "8", "--eval.episodes", "2", "--out", str(out)]
    assert main(argv) == 0
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["algo"] == "toy-turn" and cfg["credit"] == {"algo": "toy-turn", "scale": 0.25}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["credit/toy_scale"] for r in rows if "credit/toy_scale" in r] == [0.25, 0.25]

    # the probe: nothing in it names the toy; a sweep where it wins at the long horizon makes it the pick
    from agentrl.probe import ProbeStats, recommend, thresholds_from_sweep

    def runs(per):
        return {f"{a}/{s}": {"algo": a, "seed": s, "final_pass_rate": p, "curve": []} for a, ps in per.items()
                for s, p in enumerate(ps)}

    sweep = {"started": "2026-12-01 00:00", "args": {"locks": [1, 8], "updates": 20, "groups": 4, "group_size": 8},
             "horizons": {"1": {"locks": 1, "max_turns": 3, "warm_start_pass_rate": 0.4,
                                "runs": runs({"grpo": [0.8, 0.9], "toy-turn": [0.8, 0.85]})},
                          "8": {"locks": 8, "max_turns": 17, "warm_start_pass_rate": 0.4,
                                "runs": runs({"grpo": [0.3, 0.4], "toy-turn": [0.6, 0.7]})}}}
    th = thresholds_from_sweep(sweep)
    stats = ProbeStats(episodes=64, groups=8, pass_rate=0.5, reward_mean=0.5, truncated_frac=0.3, turns_median=17,
                       turns_p90=17, turns_mean=17, action_tokens_mean=100, context_tokens_mean=300,
                       step_reward_density=0.0, zero_adv_frac=0.1, all_pass_frac=0.05, all_fail_frac=0.05,
                       reward_std_in_group=0.4, state_recurrence=0.0, value_r2=0.5, value_features="x",
                       value_change_concentration=0.08, uniform_share=0.05, post_obs_entropy=1.0)
    rec, _ = recommend(stats, th, 640)
    assert (th.long_horizon_algo, rec.algo, rec.rule) == ("toy-turn", "toy-turn", "long-horizon")


def docs_blocks(heading: str) -> list[str]:
    """The python code blocks of docs/extending.md's section `heading`, as the docs print them."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "extending.md").read_text()
    start = text.index(f"## {heading}")
    end = text.find("\n## ", start + 1)
    import re

    return re.findall(r"```python\n(.*?)```", text[start:end if end > 0 else None], flags=re.S)


def test_the_docs_sign_assigner_trains_checkpoints_every_update_and_resumes(tmp_path, monkeypatch, vault_policy_dir):
    """docs/extending.md's `Sign` example, as printed there (it defines no state_dict): a run that checkpoints
    after every update, killed after the first, resumes to the end."""
    sign_module, launcher = docs_blocks("A credit assigner")[:2]
    assert "class Sign" in sign_module and "state_dict" not in sign_module  # the example as a user copies it
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "my_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_pkg" / "sign.py").write_text(sign_module)
    monkeypatch.syspath_prepend(str(tmp_path))
    import agentrl.algorithms as algorithms

    monkeypatch.setattr(algorithms, "ASSIGNERS", dict(ASSIGNERS))  # the registration ends with the test
    assert "import my_pkg.sign" in launcher and 'main(["train", "--algo", "sign"' in launcher
    import my_pkg.sign  # noqa: F401  (the launcher's first line)

    out = tmp_path / "run"
    common = ["--model", str(vault_policy_dir), "--device", "cpu", "--env-kw", "locks=1", "--rollout.groups", "2",
              "--rollout.group-size", "2", "--rollout.sampling.max-new-tokens", "8", "--eval.episodes", "2",
              "--checkpoint.every", "1"]
    assert main(["train", "--algo", "sign", "--credit.scale", "0.5", "--updates", "2", "--out", str(out), *common]) == 0
    # as a run killed after update 1's checkpoint leaves it: the newer checkpoint gone
    import shutil

    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["update_00001", "update_00002"]
    shutil.rmtree(out / "checkpoints" / "update_00002")
    assert main(["train", "--resume", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("step", 0) > 0 and not r.get("final")] == [1, 2]  # update 2 again, once
    assert all(abs(r["credit/adv_mean"]) <= 0.5 for r in rows if "credit/adv_mean" in r)


def test_an_assigner_without_state_refuses_a_checkpoint_that_holds_some():
    import pytest

    from agentrl.credit import assigner_state, load_assigner_state, set_options

    class Bare:
        cfg = "old"

    bare = Bare()
    assert assigner_state(bare) == {}
    load_assigner_state(bare, {})  # nothing saved, nothing to take
    with pytest.raises(ValueError, match="no load_state_dict"):
        load_assigner_state(bare, {"critic": 1})
    set_options(bare, "new")
    assert bare.cfg == "new"


def test_the_docs_alarm_and_intervention_work_as_printed():
    """docs/extending.md's MALFORMED CALLS alarm and KL brake, as printed there: the alarm fires on its history,
    and the brake answers KL DRIFT only under intervene, yielding to the adaptive KL controller."""
    from agentrl.health import ALARMS, INTERVENTIONS, KL_DRIFT, Alarm, Health, HealthConfig, Knobs, check, plan

    (alarm,), (brake,) = docs_blocks("An alarm"), docs_blocks("An intervention")
    names: dict = {}
    try:
        exec(compile(alarm, "docs/extending.md (An alarm)", "exec"), names)
        exec(compile(brake, "docs/extending.md (An intervention)", "exec"), names)
        rows = [{"step": t, "rollout/malformed_per_episode": 0.1 if t < 3 else 2.0} for t in range(1, 6)]
        assert check(rows).names == {"MALFORMED CALLS"} and ALARMS["MALFORMED CALLS"].colour == "#e377c2"

        drift = Health(step=5, alarms=[Alarm(KL_DRIFT, "KL 0.6 per token is above the ceiling 0.5")])
        knobs = Knobs(0.0, 0.01, 1.0, 1.0, None, None)
        acted = plan(rows, drift, knobs, HealthConfig(on_alarm="intervene"))
        assert [(a.intervention, a.knob, a.old, a.new) for a in acted] == [("kl_brake", "kl_coef", 0.01, 0.02)]
        assert plan(rows, drift, knobs, HealthConfig()) == []  # warn: an alarm's answer waits for intervene
        assert plan(rows, drift, knobs, HealthConfig(on_alarm="intervene"), last_acted={"kl_brake": 3}) == []
        controlled = HealthConfig(on_alarm="intervene", interventions={"adaptive_kl": {"enabled": True}})
        assert [a.intervention for a in plan(rows, drift, knobs, controlled)] == []  # no KL logged: nothing to steer
    finally:
        ALARMS.pop("MALFORMED CALLS", None)
        INTERVENTIONS.pop("kl_brake", None)


def test_the_docs_engine_registers_and_plays_its_one_call(tmp_path, monkeypatch, vault_policy):
    import importlib
    import sys

    import agentrl.engines as engines
    from agentrl.engines import SamplingConfig, get_engine_spec
    from agentrl.registry import make
    from agentrl.rollout import rollout

    (block,) = docs_blocks("A generation engine")
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "my_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_pkg" / "constant_engine.py").write_text(block)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(engines, "ENGINES", dict(engines.ENGINES))  # the registration ends with the test
    for name in [m for m in sys.modules if m == "my_pkg" or m.startswith("my_pkg.")]:  # another test's my_pkg
        monkeypatch.delitem(sys.modules, name)
    importlib.invalidate_caches()
    try:
        importlib.import_module("my_pkg.constant_engine")
        engine = get_engine_spec("constant").load()(vault_policy, SamplingConfig(max_new_tokens=64), seed=0)
        envs = [make("examples/custom_env.py:Arithmetic") for _ in range(2)]
        episodes, _ = rollout(envs, [0, 1], engine, vault_policy.chat)
    finally:
        for name in ("my_pkg.constant_engine", "my_pkg"):
            sys.modules.pop(name, None)
    # every row answers 0 at once: the episode ends after one turn, and 0 is never (a * b) + c with a, b, c >= 2
    assert [(e.num_turns, e.terminated, e.reward) for e in episodes] == [(1, True, 0.0), (1, True, 0.0)]


def test_the_docs_registration_of_a_built_in_env_gives_the_bare_env():
    import gymnasium

    registration, _mcp_env = docs_blocks("An environment")
    try:
        exec(registration, {})
        spec = gymnasium.spec("agentrl/Name-v0")
        assert spec.entry_point == "agentrl.envs.name:NameEnv" and spec.disable_env_checker and not spec.order_enforce
    finally:
        gymnasium.registry.pop("agentrl/Name-v0", None)
