"""Oracle tests for the engine/trainer gap (agentrl.mismatch): its diagnostics and each correction, against
values computed by hand; and the loss they feed, with the three ratios (behaviour, proximal, current) apart."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.config import LossConfig
from agentrl.loss import policy_loss
from agentrl.mismatch import correction, loss_terms, sequence_log_ratio, stats


def lr(*rows):
    """Log-ratios log pi_old - log mu from ratios, one list per episode."""
    return torch.log(torch.tensor([list(r) for r in rows]))


def test_token_mask_keeps_only_the_ratios_inside_the_bounds():
    w, keep = correction(lr([0.4, 0.8, 6.0]), torch.ones(1, 3),
                         LossConfig(mismatch="token-mask", mismatch_low=0.5, mismatch_high=5.0))
    assert keep.tolist() == [[0.0, 1.0, 0.0]] and w.tolist() == [[1.0, 1.0, 1.0]]


def test_token_tis_caps_each_ratio_at_c():
    w, keep = correction(lr([0.4, 0.8, 6.0]), torch.ones(1, 3), LossConfig(mismatch="token-tis", mismatch_cap=2.0))
    assert w[0].tolist() == pytest.approx([0.4, 0.8, 2.0]) and keep.tolist() == [[1.0, 1.0, 1.0]]


def test_icepop_keeps_the_ratio_as_weight_inside_the_bounds_and_zero_outside():
    w, keep = correction(lr([0.4, 0.8, 6.0]), torch.ones(1, 3), LossConfig(mismatch="icepop"))
    assert w[0].tolist() == pytest.approx([0.0, 0.8, 0.0])
    assert keep.tolist() == [[1.0, 1.0, 1.0]]  # masked tokens stay in the denominator, as the paper writes it


def test_sequence_ratios_geometric_and_product():
    # episode 1: ratios 2, 2, 0.5 -> product 2, geometric mean 2^(1/3); episode 2: one token of 0.25
    log_ratio, mask = lr([2.0, 2.0, 0.5], [0.25, 1.0, 1.0]), torch.tensor([[1.0, 1, 1], [1, 0, 0]])
    assert torch.exp(sequence_log_ratio(log_ratio, mask, "product")).tolist() == pytest.approx([2.0, 0.25])
    assert torch.exp(sequence_log_ratio(log_ratio, mask, "geometric")).tolist() == pytest.approx([2 ** (1 / 3), 0.25])
    w, _ = correction(log_ratio, mask, LossConfig(mismatch="seq-tis", mismatch_seq="product", mismatch_cap=1.5))
    assert (w * mask).flatten().tolist() == pytest.approx([1.5, 1.5, 1.5, 0.25, 0.0, 0.0])  # 2 capped at 1.5
    w, _ = correction(log_ratio, mask, LossConfig(mismatch="seq-tis", mismatch_seq="geometric", mismatch_cap=1.5))
    assert (w * mask)[0].tolist() == pytest.approx([2 ** (1 / 3)] * 3)  # 1.26: under the cap


def test_seq_mask_drops_whole_episodes_outside_the_bounds():
    log_ratio, mask = lr([2.0, 2.0, 0.5], [0.25, 1.0, 1.0]), torch.tensor([[1.0, 1, 1], [1, 0, 0]])
    cfg = LossConfig(mismatch="seq-mask", mismatch_seq="product", mismatch_low=0.5, mismatch_high=5.0)
    _, keep = correction(log_ratio, mask, cfg)
    assert keep.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]  # product 2 kept, 0.25 dropped


def test_a_masked_token_leaves_the_denominator_and_the_kept_ones_keep_their_scale():
    # pi_theta = pi_old (ratio 1, no clip), A = 1: every kept token contributes -1, so the mean is -1 whatever
    # was dropped; ICE-POP keeps the denominator: (0 + 0.8 + 0) / 3
    behaviour = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    sampler = behaviour + lr([0.4, 0.8, 6.0])
    one = torch.ones(1, 3)
    for mode, want in (("token-mask", -1.0), ("icepop", -0.8 / 3), ("token-tis", -(0.4 + 0.8 + 2.0) / 3)):
        cfg = LossConfig(mismatch=mode)
        against, weight, mask = loss_terms(behaviour, sampler, None, one, cfg)
        assert torch.equal(against, sampler)  # the ratio is the trainer's own: pi_theta / pi_old
        loss, _ = policy_loss(sampler.clone(), against, one, mask, cfg, is_weight=weight)
        assert loss.item() == pytest.approx(want), mode


def test_no_correction_is_the_loss_as_it_was():
    behaviour, sampler, prox = torch.zeros(1, 2), torch.log(torch.tensor([[3.0, 0.5]])), torch.full((1, 2), -0.1)
    one = torch.ones(1, 2)
    against, weight, mask = loss_terms(behaviour, sampler, None, one, LossConfig())
    assert against is behaviour and weight is None and mask is one
    # decoupled without a correction: min(pi_prox / mu, is_cap), staleness and mismatch lumped together
    against, weight, _ = loss_terms(behaviour, sampler, prox, one, LossConfig(is_cap=2.0))
    assert against is prox and weight[0].tolist() == pytest.approx([math.exp(-0.1)] * 2)


def test_decoupled_composes_the_staleness_weight_with_the_mismatch_correction():
    # mu -> pi_old: ratios 3 and 0.5 (the engine); pi_old -> pi_prox: ratios 4 and 1 (the weights moved)
    behaviour = torch.zeros(1, 2)
    sampler = torch.log(torch.tensor([[3.0, 0.5]]))
    prox = sampler + torch.log(torch.tensor([[4.0, 1.0]]))
    one = torch.ones(1, 2)
    cfg = LossConfig(mismatch="token-tis", mismatch_cap=2.0, is_cap=2.5)
    against, weight, _ = loss_terms(behaviour, sampler, prox, one, cfg)
    assert torch.equal(against, prox)  # PPO clips pi_theta / pi_prox
    assert weight[0].tolist() == pytest.approx([2.0 * 2.5, 0.5 * 1.0])  # min(3, 2) * min(4, 2.5); 0.5 * 1


def test_stats_by_hand():
    # two episodes, ratios r = pi_old / mu: [2, 0.5] and [1, 1] (the last token is padding)
    log_ratio = lr([2.0, 0.5, 7.0], [1.0, 1.0, 7.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    s = stats(log_ratio, mask, cap=1.5)
    r = torch.tensor([2.0, 0.5, 1.0, 1.0], dtype=torch.float64)
    lg = torch.log(r)
    assert s["logp_diff_mean"] == pytest.approx(2 * math.log(2) / 4)
    assert s["logp_diff_max"] == pytest.approx(math.log(2))
    assert s["kl_k1"] == pytest.approx(float((-lg).mean())) and s["kl_k1"] == pytest.approx(0.0, abs=1e-12)
    assert s["kl_k3"] == pytest.approx(float((r - 1 - lg).mean()))  # (2 - 1 - ln2 + 0.5 - 1 + ln2) / 4 = 0.125
    assert s["kl_k3"] == pytest.approx(0.125)
    assert s["kl_rev_k1"] == pytest.approx((2 * math.log(2) - 0.5 * math.log(2)) / 4)
    assert s["kl_rev_k3"] == pytest.approx(float((1 - r + r * lg).mean()))
    assert s["chi2"] == pytest.approx((1 + 0.25) / 4)
    assert s["ess"] == pytest.approx(1.0)  # both episodes' products are 1
    assert s["token_out_frac"] == pytest.approx(0.5) and s["seq_out_frac"] == 0.0
    # one episode carries the batch: weights 4 and 1 -> ESS (5)^2 / (2 * 17)
    s = stats(lr([2.0, 2.0], [1.0, 1.0]), torch.ones(2, 2), cap=2.5)
    assert s["ess"] == pytest.approx(25 / 34, rel=1e-6) and s["seq_out_frac"] == 0.5 and s["token_out_frac"] == 0.0


def test_equal_log_probs_measure_exactly_zero():
    s = stats(torch.zeros(3, 4), torch.ones(3, 4), cap=2.0)
    assert all(s[k] == 0.0 for k in ("logp_diff_mean", "logp_diff_max", "kl_k1", "kl_k3", "kl_rev_k3", "chi2"))
    assert s["ess"] == 1.0


# -- the trainer: measured every update, on the micro model ------------------------------------------------


def _steps(out):
    import json

    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("step", 0) > 0 and not r.get("final")]


def test_an_fp32_engine_measures_no_gap_and_a_bf16_one_does(tmp_path, vault_policy_dir):
    from test_e2e import small_config

    from agentrl.trainer import Trainer

    for dtype in ("auto", "bf16"):
        Trainer(small_config(tmp_path / dtype, vault_policy_dir, rollout={"dtype": dtype})).train()
    fp32, bf16 = _steps(tmp_path / "auto" / "run"), _steps(tmp_path / "bf16" / "run")
    # the torch engine's fp32 log-probs are the trainer's up to the rounding of a differently batched sum (bit for
    # bit on some CPUs, 5e-7 on others: the CI machine's); bf16's are 1e-4 away, orders more
    assert fp32[0]["mismatch/ess"] > 1 - 1e-9
    assert all(r["mismatch/logp_diff_max"] < 1e-5 and r["mismatch/kl_k3"] < 1e-10 for r in fp32)
    assert all(r["mismatch/logp_diff_mean"] > 1e-5 and r["mismatch/chi2"] > 1e-10 for r in bf16)
    assert all(r["health/engine_mismatch"] == 0.0 for r in fp32 + bf16)  # a micro model's bf16 gap is small


def test_a_planted_gap_fires_engine_mismatch(tmp_path, vault_policy_dir, monkeypatch):
    from test_e2e import small_config

    import agentrl.trainer as trainer_module
    from agentrl.trainer import Trainer

    real = trainer_module.make_batch

    def planted(episodes, pad_id, **kw):  # the engine reports every action token 1 nat less likely than it was
        batch = real(episodes, pad_id, **kw)
        return batch.with_(behaviour_logp=batch.behaviour_logp - batch.action_mask)

    monkeypatch.setattr(trainer_module, "make_batch", planted)
    Trainer(small_config(tmp_path, vault_policy_dir, loss={"mismatch": "token-tis"})).train()
    steps = _steps(tmp_path / "run")
    # r = e on every token: k3 = e - 1 - 1, every token outside [1/2, 2], kept all, weight capped at 2
    assert all(r["mismatch/kl_k3"] == pytest.approx(math.e - 2, rel=1e-4) for r in steps)
    assert all(r["mismatch/token_out_frac"] == 1.0 and r["mismatch/weight_mean"] == pytest.approx(2.0) for r in steps)
    assert all(r["health/engine_mismatch"] == 1.0 for r in steps)
    assert any(x.startswith("ENGINE MISMATCH: KL(engine || trainer)") for x in steps[0]["health/reasons"])


def test_an_update_with_nothing_to_train_still_measures_the_engine_gap(tmp_path, vault_policy_dir, monkeypatch):
    from test_e2e import small_config

    from agentrl.credit import Credit
    from agentrl.learner import nothing_to_train
    from agentrl.trainer import Trainer

    trainer = Trainer(small_config(tmp_path, vault_policy_dir, rollout={"dtype": "bf16"}))
    real = trainer.assigner.assign

    def flat(batch, fit):  # every group all-pass or all-fail: a real model at the floor
        credit = real(batch, fit)
        return Credit(torch.zeros_like(credit.advantages), credit.row_weight, credit.metrics)

    monkeypatch.setattr(trainer.assigner, "assign", flat)
    assert nothing_to_train(Credit(torch.zeros(2, 3), torch.ones(2)))
    trainer.train()
    steps = _steps(tmp_path / "run")
    assert all(r["train/skipped"] == 1.0 for r in steps)
    assert all(r["mismatch/logp_diff_mean"] > 1e-5 and 0 < r["mismatch/ess"] <= 1 for r in steps)  # bf16's gap
