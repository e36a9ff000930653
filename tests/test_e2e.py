"""A tiny end-to-end run: micro model built in the test, real rollouts, GRPO, loss, update."""

from __future__ import annotations

import json

import pytest
import torch

from agentrl.collector import EpisodeErrors
from agentrl.config import TrainConfig
from agentrl.core import AgentEnv
from agentrl.policy import Policy
from agentrl.store import TrajectoryStore
from agentrl.trainer import Trainer


class Babble(AgentEnv):
    """Reward = whether the action's length is even: random models get varied rewards, so every
    group carries signal and the update is not skipped."""

    max_turns = 2

    def say(self, text: str) -> str:
        """Say something."""
        return "ok"

    tools = [say]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.last = ""
        return "Say something.", {}

    def step(self, action):
        self.last = action
        return super().step(action)

    def verify(self) -> float:
        return float(len(self.last) % 2 == 0)

    def state_key(self):
        return self.turn


class Jammed(Babble):
    def verify(self) -> float:
        raise RuntimeError("verifier lost its tests")


def small_config(tmp_path, policy_dir, env="test_e2e:Babble", **kw):
    """A two-update run on the micro model; `kw` overrides (nested dicts merge into the defaults)."""
    data = {
        "env": {"id": env},
        "model": str(policy_dir),
        "updates": 2,
        "out": str(tmp_path / "run"),
        "rollout": {"groups": 2, "group_size": 4, "sampling": {"max_new_tokens": 8}},
        "optim": {"lr": 1e-2, "minibatches": 1},
        "eval": {"episodes": 4, "every": 0},
        "loss": {"kl_coef": 0.01, "entropy_coef": 0.01},
    }
    for k, v in kw.items():
        data[k] = {**data[k], **v} if isinstance(v, dict) and isinstance(data.get(k), dict) else v
    return TrainConfig(**data)


def test_tiny_run_updates_every_parameter_and_writes_the_run_folder(tmp_path, vault_policy_dir):
    cfg = small_config(tmp_path, vault_policy_dir)
    before = {k: v.clone() for k, v in Policy.load(vault_policy_dir).model.state_dict().items()}
    trainer = Trainer(cfg)
    summary = trainer.train()
    after = trainer.policy.model.state_dict()
    unchanged = [k for k, p in trainer.policy.model.named_parameters() if p.requires_grad
                 and torch.equal(before[k], after[k])]
    assert unchanged == []

    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if r["step"] >= 1 and not r.get("final")]
    assert [r["step"] for r in updates] == [1, 2]
    for r in updates:
        for key in ("rollout/pass_rate", "train/entropy", "train/kl", "credit/zero_adv_frac", "train/loss",
                    "train/grad_norm"):
            assert key in r and r[key] == r[key], key  # present and not NaN
        assert torch.isfinite(torch.tensor(r["train/loss"]))
        assert r["sys/rss_peak_gb"] > 0.1  # the process's peak memory (agentrl.memory): torch alone is more
    assert {"warm_start_pass_rate", "final_pass_rate"} <= set(summary)
    assert json.loads((run / "summary.json").read_text())["final_pass_rate"] == summary["final_pass_rate"]
    assert (run / "config.yaml").is_file() and (run / "checkpoint" / "config.json").is_file()
    assert len(TrajectoryStore.load(run / "store")) == 2 * 8
    Policy.load(run / "checkpoint")  # the checkpoint is an ordinary HF folder


def test_raising_verifier_stops_the_run_with_where_and_keeps_the_batch(tmp_path, vault_policy_dir):
    trainer = Trainer(small_config(tmp_path, vault_policy_dir, env="test_e2e:Jammed"))
    with pytest.raises(EpisodeErrors, match=r"env Jammed, episode 0, turn \d: verify\(\) raised RuntimeError: verifier "
                       r"lost its tests"):
        trainer.train()  # the held-out evaluation before training meets it first
    with pytest.raises(EpisodeErrors, match=r"8 episode\(s\) errored \(the batch is saved in "
                       r".*update_00001_0.parquet\)"):
        trainer.collector.collect(1)
    saved = TrajectoryStore.load(tmp_path / "run" / "store")
    assert len(saved) == 8 and all("verifier lost its tests" in e.error for e in saved)


@pytest.mark.parametrize("algo", ["arpo", "steppo", "turn-ppo", "gigpo"])
def test_every_assigner_trains_end_to_end(tmp_path, vault_policy_dir, algo):
    credit = {"turn-ppo": {"warmup_updates": 1}, "steppo": {"prm": "learned"}}.get(algo, {})
    cfg = small_config(tmp_path, vault_policy_dir, algo=algo, credit=credit)
    trainer = Trainer(cfg)
    before = {k: v.clone() for k, v in trainer.policy.model.state_dict().items()}
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if r["step"] >= 1 and not r.get("final")]
    assert len(updates) == 2
    if algo in ("arpo", "turn-ppo"):
        assert all("credit/critic_ev" in r for r in updates)
    if algo == "turn-ppo":
        assert updates[0]["credit/critic_warmup"] == 1.0 and updates[1]["credit/critic_warmup"] == 0.0
    if algo == "steppo":
        assert all("credit/prm_outcome_corr" in r for r in updates)
    trained = [r for r in updates if "train/loss" in r]
    assert trained and all(torch.isfinite(torch.tensor(r["train/loss"])) for r in trained)
    after = trainer.policy.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
