"""Each intervention acts on its trigger and not otherwise; the trainer applies and logs them."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from agentrl.health import (
    ENTROPY_COLLAPSE,
    INTERVENTIONS,
    STALLED,
    VERIFIER_OVERFIT,
    Action,
    Alarm,
    Health,
    HealthConfig,
    InterventionSpec,
    Knobs,
    Situation,
    plan,
    register_intervention,
)
from agentrl.health.config import (
    AdaptiveEntropy,
    AdaptiveKL,
    DynamicSampling,
    EntropyBonus,
    RaiseTemperature,
    VerifierRotation,
)
from agentrl.health.interventions import (
    adaptive_entropy,
    adaptive_kl,
    dynamic_sampling,
    entropy_bonus,
    raise_temperature,
    verifier_rotation,
)


def knobs(**kw) -> Knobs:
    base = dict(entropy_coef=0.0, kl_coef=0.0, temperature=1.0, base_temperature=1.0, dynamic_sampling="off",
                verifier_tests=3)
    return Knobs(**{**base, **kw})


def health(*names: str, reason: str = "why", floor: float | None = 0.3, step: float = 10) -> Health:
    return Health(step=step, alarms=[Alarm(n, reason) for n in names], entropy_floor=floor)


def entropy_rows(*values: float) -> list[dict]:
    return [{"step": i + 1, "train/entropy": v} for i, v in enumerate(values)]


def seen(h: Health | None = None, rows: list[dict] = (), **kw) -> Situation:
    """What an intervention reads: `rows` of history, the alarm states `h`, the knobs `knobs(**kw)`."""
    return Situation(list(rows), h or health(), knobs(**kw))


def test_entropy_bonus_switches_on_at_collapse_only():
    a = entropy_bonus(seen(health(ENTROPY_COLLAPSE)), EntropyBonus())
    assert (a.knob, a.old, a.new) == ("entropy_coef", 0.0, 0.01)
    assert entropy_bonus(seen(health()), EntropyBonus()) is None
    assert entropy_bonus(seen(health(STALLED)), EntropyBonus()) is None
    # already at least that
    assert entropy_bonus(seen(health(ENTROPY_COLLAPSE), entropy_coef=0.02), EntropyBonus()) is None


def test_adaptive_entropy_steps_toward_the_target_and_rests_inside_the_band():
    c = AdaptiveEntropy(enabled=True, target=0.5)
    assert adaptive_entropy(seen(rows=entropy_rows(0.3)), c).new == 0.005  # below: +0.005
    assert adaptive_entropy(seen(rows=entropy_rows(0.3), entropy_coef=0.01), c).new == 0.015
    assert adaptive_entropy(seen(rows=entropy_rows(0.9), entropy_coef=0.01), c).new == 0.005  # above: -0.005
    assert adaptive_entropy(seen(rows=entropy_rows(0.9)), c) is None  # above, nothing to take back
    assert adaptive_entropy(seen(rows=entropy_rows(0.52), entropy_coef=0.01), c) is None  # inside +/-10%
    assert adaptive_entropy(seen(rows=entropy_rows(0.3), entropy_coef=0.05), c) is None  # at the cap
    # default target: half the early-run entropy (first 5 updates: mean 1.0 -> target 0.5)
    assert adaptive_entropy(seen(rows=entropy_rows(1, 1, 1, 1, 1, 1, 0.4)), AdaptiveEntropy(enabled=True)).new == 0.005


def test_temperature_rises_below_the_floor_and_returns_once_entropy_recovers():
    c = RaiseTemperature()
    assert raise_temperature(seen(health(floor=0.3), entropy_rows(0.2)), c).new == 1.1
    assert raise_temperature(seen(health(floor=0.3), entropy_rows(0.35)), c) is None  # above floor, at base
    # in the hysteresis band
    assert raise_temperature(seen(health(floor=0.3), entropy_rows(0.35), temperature=1.2), c) is None
    # recovered: back down
    assert raise_temperature(seen(health(floor=0.3), entropy_rows(0.5), temperature=1.2), c).new == 1.1
    assert raise_temperature(seen(health(floor=0.3), entropy_rows(0.2), temperature=1.5), c) is None  # at the cap
    assert raise_temperature(seen(health(floor=None), entropy_rows(0.2)), c) is None  # no floor known yet


def test_adaptive_kl_is_proportional_clipped_and_still_at_the_target():
    c = AdaptiveKL(enabled=True, target=0.05)
    kl = lambda v: [{"step": 1, "train/kl": v}]  # noqa: E731
    assert adaptive_kl(seen(rows=kl(0.05), kl_coef=0.01), c) is None
    assert adaptive_kl(seen(rows=kl(0.055), kl_coef=0.01), c).new == pytest.approx(0.011)
    assert adaptive_kl(seen(rows=kl(1.0), kl_coef=0.01), c).new == pytest.approx(0.012)  # clipped at +20%
    assert adaptive_kl(seen(rows=kl(0.0), kl_coef=0.01), c).new == pytest.approx(0.008)  # clipped at -20%
    assert adaptive_kl(seen(rows=kl(0.1)), c).new == pytest.approx(0.0012)  # starts from init_coef
    assert adaptive_kl(seen(rows=kl(0.01)), c) is None  # below target with no KL term


def test_dynamic_sampling_on_zero_advantage_stalls_only():
    zero = health(STALLED, reason="90% of groups carry zero advantage (>= 75%)")
    assert dynamic_sampling(seen(zero), DynamicSampling()).new == "resample"
    assert dynamic_sampling(seen(health(STALLED, reason="pass rate 0.55 gained +0.00 over 24 steps")),
                            DynamicSampling()) is None
    assert dynamic_sampling(seen(zero, dynamic_sampling="resample"), DynamicSampling()) is None
    # the assigner has no such option
    assert dynamic_sampling(seen(zero, dynamic_sampling=None), DynamicSampling()) is None


def test_verifier_rotation_on_overfit_when_the_env_rotates():
    a = verifier_rotation(seen(health(VERIFIER_OVERFIT)), VerifierRotation())
    assert (a.knob, a.old, a.new) == ("verifier_tests", 3, 5)
    assert verifier_rotation(seen(health()), VerifierRotation()) is None
    assert verifier_rotation(seen(health(VERIFIER_OVERFIT), verifier_tests=None), VerifierRotation()) is None
    assert verifier_rotation(seen(health(VERIFIER_OVERFIT), verifier_tests=12), VerifierRotation()) is None


def test_code_env_draws_more_hidden_tests_when_rotation_turns_its_knob():
    from agentrl.registry import make

    env = make("agentrl/Code-v0")
    before = env.reset(seed=1)[1]["hidden_tests"]
    env.hidden_per_episode = 12
    after = env.reset(seed=1)[1]["hidden_tests"]
    assert after > before


def test_plan_acts_on_alarms_only_with_intervene_and_respects_the_cooldown():
    h = health(ENTROPY_COLLAPSE, floor=0.3)
    rows = entropy_rows(1.0, 0.2)
    assert plan(rows, h, knobs(), HealthConfig(on_alarm="warn")) == []
    acted = plan(rows, h, knobs(), HealthConfig(on_alarm="intervene"))
    assert {a.intervention for a in acted} == {"entropy_bonus", "temperature"}
    assert plan(rows, h, knobs(), HealthConfig(on_alarm="intervene"),
                last_acted={"entropy_bonus": 8, "temperature": 8}) == []
    # a controller acts whatever on_alarm says, when it is enabled
    ctl = HealthConfig(on_alarm="warn", interventions={"adaptive_kl": {"enabled": True}})
    acted = plan([{"step": 1, "train/kl": 0.2}], health(), knobs(kl_coef=0.01), ctl)
    assert [a.intervention for a in acted] == ["adaptive_kl"]


# -- in the trainer ---------------------------------------------------------------------------------


def _run(tmp_path, policy_dir, **kw):
    from test_e2e import small_config

    from agentrl.trainer import Trainer

    cfg = small_config(tmp_path, policy_dir, **kw)
    cfg.updates = 3
    summary = Trainer(cfg).train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return summary, rows


def test_trainer_applies_and_logs_an_intervention(tmp_path, vault_policy_dir):
    hc = {"interventions": {"adaptive_kl": {"enabled": True, "target": 1e-6}}}  # any KL is above this target
    summary, rows = _run(tmp_path, vault_policy_dir, health=hc)
    updates = [r for r in rows if r["step"] >= 1 and not r.get("final")]
    assert all(any("adaptive_kl" in a for a in r["health/actions"]) for r in updates)
    betas = [r["train/kl_coef"] for r in updates]
    assert betas[0] == 0.01
    for before, row, after in zip(betas, updates, betas[1:]):  # the next update ran with the controller's beta
        err = min(max(row["train/kl"] / 1e-6 - 1, -0.2), 0.2)  # KL is 0 at update 1 (the policy has not moved yet)
        assert after == pytest.approx(before * (1 + err))
    assert betas[1] != betas[0]
    assert all("health/status" in r and "health/kl_drift" in r for r in updates)
    assert len(summary["interventions"]) == 3
    # on_alarm=warn (the default): the run goes on whatever it logs
    assert summary["updates_done"] == 3 and summary["stopped"] is None


def test_on_alarm_stop_ends_the_run_at_the_first_alarm(tmp_path, vault_policy_dir):
    # Babble's 8-token cap truncates every episode: TRUNCATION BLOW-UP from update 1 with an absolute limit
    summary, rows = _run(tmp_path, vault_policy_dir, health={"on_alarm": "stop", "trunc_max": 0.5})
    assert (summary["updates_done"] == 1
            and summary["stopped"].startswith("step 1: TRUNCATION BLOW-UP: 100% of episodes"))
    assert [r["step"] for r in rows if r.get("final")] == [1]
    assert rows[1]["health/truncation"] == 1.0 and rows[1]["health/level"] == "alarm"


class On(BaseModel):
    enabled: bool = True


@pytest.fixture
def test_controllers():
    """Two controllers that act at every update (one sampling knob, one assigner option), registered the one way
    there is and removed after the test."""
    def hotter(s: Situation, c: On) -> Action:
        return Action("hotter", "temperature", s.knobs.temperature, round(s.knobs.temperature + 0.1, 4), "a test")

    def resample(s: Situation, c: On) -> Action | None:
        k = s.knobs.dynamic_sampling
        return Action("resample", "dynamic_sampling", k, "resample", "a test") if k != "resample" else None

    specs = [register_intervention(InterventionSpec(name, act, "controller", cooldown=False, settings=On()))
             for name, act in (("hotter", hotter), ("resample", resample))]
    yield specs
    for spec in specs:
        del INTERVENTIONS[spec.name]


def test_interventions_turn_the_trainers_knobs_never_its_config_and_a_checkpoint_keeps_them(
        tmp_path, vault_policy_dir, test_controllers):
    from test_e2e import small_config

    from agentrl.checkpoint import latest, read
    from agentrl.run_folder import CHECKPOINTS
    from agentrl.trainer import Trainer

    hc = {"interventions": {"adaptive_entropy": {"enabled": True, "target": 100.0},  # entropy is always below
                            "adaptive_kl": {"enabled": True, "target": 1e-6}}}  # KL is always above (0 at update 1)
    cfg = small_config(tmp_path, vault_policy_dir, health=hc, updates=3)
    trainer = Trainer(cfg)
    config = trainer.cfg.model_dump()
    trainer.train()
    assert trainer.cfg.model_dump() == config  # read, never written
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if r["step"] >= 1 and not r.get("final")]
    assert [r["rollout/temperature"] for r in updates] == [1.0, 1.1, 1.2]  # what each update ran with
    assert [r["train/entropy_coef"] for r in updates] == [0.01, 0.015, 0.02]
    k = trainer.knobs
    assert (k.temperature, k.entropy_coef, k.dynamic_sampling) == (1.3, 0.025, "resample")
    assert k.kl_coef != 0.01 and k.base_temperature == 1.0
    # each part that reads a knob got it: the engine a copy of its own, the assigner its options, the loss a copy
    assert trainer.engine.sampling.temperature == 1.3 and trainer.engine.sampling is not trainer.cfg.rollout.sampling
    assert trainer.assigner.cfg.dynamic_sampling == "resample"
    loss = trainer.learner.loss_config()
    assert (loss.entropy_coef, loss.kl_coef) == (k.entropy_coef, k.kl_coef)

    folder, _ = latest(tmp_path / "run" / CHECKPOINTS)
    assert read(folder, "state.json")["knobs"] == k.state()
    resumed = Trainer(cfg, resume=True)  # the run is done: loading its last checkpoint is all this does
    assert resumed.knobs == k and resumed.cfg.model_dump() == config
    assert resumed.engine.sampling.temperature == 1.3 and resumed.assigner.cfg.dynamic_sampling == "resample"


def test_knobs_load_a_checkpoint_written_before_they_were_one_object():
    old = {"entropy_coef": 0.02, "kl_coef": 0.012, "temperature": 1.1, "dynamic_sampling": "off",
           "verifier_tests": None}  # dynamic_sampling was the config's value even where the assigner has none
    k = knobs(dynamic_sampling=None, verifier_tests=None).load(old)
    assert (k.entropy_coef, k.kl_coef, k.temperature, k.base_temperature) == (0.02, 0.012, 1.1, 1.0)
    assert k.dynamic_sampling is None and k.verifier_tests is None  # knobs this run does not have stay off
    assert knobs().load(old).dynamic_sampling == "off"
    with pytest.raises(ValueError, match="a knob this run does not have: 'verifier_tests'"):
        knobs(verifier_tests=None).turn(Action("verifier_rotation", "verifier_tests", None, 5, "VERIFIER OVERFIT"))
