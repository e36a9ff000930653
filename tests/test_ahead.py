"""Rollouts that run ahead of training (issue 14, item 4): the bound, the versions, the decoupled loss."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from agentrl.ahead import RolloutAhead
from agentrl.config import LossConfig, TrainConfig
from agentrl.loss import policy_loss
from agentrl.trainer import Trainer


def _fake(bound: int, updates: int, train_s: float = 0.0):
    """A rollout thread over a fake collect that records which learner version each update was rolled out by."""
    seen: dict[int, int] = {}
    actor = torch.nn.Linear(1, 1)

    def collect(update, version):
        seen[update] = version
        return update

    return RolloutAhead(collect, actor, 1, updates, bound, version=0), seen, actor


@pytest.mark.parametrize("bound", [1, 2, 3])
def test_the_thread_never_runs_more_than_the_bound_ahead(bound):
    ahead, seen, actor = _fake(bound, 12)
    for update in range(1, 13):
        assert ahead.get(update) == update
        # learner version update-1 trains update `update`; its rollout must be at most `bound` versions older
        assert update - 1 - bound <= seen[update] <= update - 1
        ahead.publish(update, {"weight": torch.full((1, 1), float(update)), "bias": torch.zeros(1)})
    ahead.close()
    assert max(u - 1 - v for u, v in seen.items()) == bound  # it did run ahead as far as allowed
    assert float(actor.weight.detach()) >= 12 - bound - 1  # the actor was refreshed from the published weights


def test_a_raising_rollout_reaches_the_learner():
    def collect(update, version):
        if update == 2:
            raise ValueError("env exploded at update 2")
        return update

    ahead = RolloutAhead(collect, torch.nn.Linear(1, 1), 1, 5, 1, version=0)
    assert ahead.get(1) == 1
    with pytest.raises(ValueError, match="update 2"):
        ahead.get(2)
    ahead.close()


def test_close_stops_a_thread_waiting_for_weights():
    ahead, _, _ = _fake(1, 10)
    ahead.get(1)
    ahead.get(2)  # update 3 now waits for version 1, which never comes
    done = threading.Event()
    threading.Thread(target=lambda: (ahead.close(), done.set())).start()
    assert done.wait(5)


def test_decoupled_loss_weights_each_clipped_term_by_the_capped_ratio():
    # two tokens, A = 1; pi = pi_prox: ratio 1, no clipping, per-token loss -A * w
    logp = torch.log(torch.tensor([[0.5, 0.5]]))
    prox = logp.clone()
    one = torch.ones(1, 2)
    w = torch.tensor([[3.0, 0.5]]).clamp(max=2.0)  # pi_prox / mu = 3 and 0.5, capped at C = 2
    cfg = LossConfig(agg="token-mean")
    loss, _ = policy_loss(logp, prox, one, one, cfg, is_weight=w)
    assert loss.item() == pytest.approx(-(2.0 + 0.5) / 2)
    plain, _ = policy_loss(logp, prox, one, one, cfg)
    assert plain.item() == pytest.approx(-1.0)


def _cfg(tmp_path, policy_dir, staleness: int, **loss) -> TrainConfig:
    return TrainConfig(env={"id": "test_e2e:Babble"}, model=str(policy_dir), updates=5, out=str(tmp_path / "run"),
                       rollout={"groups": 2, "group_size": 4, "sampling": {"max_new_tokens": 8},
                                "max_staleness": staleness},
                       optim={"lr": 1e-2}, loss={"kl_coef": 0.01, **loss}, eval={"episodes": 2},
                       checkpoint={"every": 2})


@pytest.mark.parametrize("staleness,off_policy", [(1, "behaviour"), (2, "decoupled")])
def test_a_pipelined_run_logs_staleness_within_the_bound(tmp_path, vault_policy_dir, staleness, off_policy):
    summary = Trainer(_cfg(tmp_path, vault_policy_dir, staleness, off_policy=off_policy)).train()
    assert summary["updates_done"] == 5
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) > 0 and not r.get("final")]
    assert all(r["train/staleness_max"] <= staleness for r in steps)
    assert max(r["train/staleness_max"] for r in steps) >= 1  # the rollouts did run ahead
    assert steps[0]["train/staleness_max"] == 0  # update 1: from the starting weights, which it trains
    if off_policy == "decoupled":
        assert all(0 < r["train/is_weight_mean"] <= 2.0 and r["train/is_weight_max"] <= 2.0 for r in steps)


def test_episodes_record_the_version_that_generated_them(tmp_path, vault_policy_dir):
    from agentrl.store import TrajectoryStore

    Trainer(_cfg(tmp_path, vault_policy_dir, 1)).train()
    for f in sorted((tmp_path / "run" / "store").glob("update_*.parquet")):
        update = int(f.name.split("_")[1])
        versions = {e.policy_version for e in TrajectoryStore.load(f)}
        assert versions <= {update - 1, update - 2} and min(versions) >= 0
