"""The training side: micro-batches of similar length add up to the minibatch's gradient, and LoRA
trains adapters only against the base model as its reference."""

from __future__ import annotations

import pytest
import torch
from test_e2e import small_config

from agentrl.policy import Policy, token_stats
from agentrl.store import make_batch
from agentrl.trainer import Trainer


def _episodes(trainer: Trainer):
    episodes, _ = trainer.collector.collect(1)
    return episodes


def test_micro_batches_group_similar_lengths_within_the_budget(tmp_path, vault_policy_dir):
    trainer = Trainer(small_config(tmp_path, vault_policy_dir))
    batch = make_batch(_episodes(trainer), trainer.policy.chat.pad_id)
    lengths = batch.attention_mask.sum(1)
    budget = int(lengths.max()) * 3
    groups = batch.micro_batches(budget)
    assert sorted(torch.cat(groups).tolist()) == list(range(batch.size))  # every row once
    for g in groups:
        assert len(g) * int(lengths[g].max()) <= budget or len(g) == 1
    assert [int(lengths[g[0]]) for g in groups] == sorted((int(lengths[g[0]]) for g in groups), reverse=True)
    trimmed = batch.select(groups[-1]).trim()
    assert trimmed.input_ids.shape[1] == int(lengths[groups[-1]].max())  # padded only to its own longest
    assert torch.equal(trimmed.input_ids, batch.select(groups[-1]).input_ids[:, : trimmed.input_ids.shape[1]])


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batched_gradient_equals_the_whole_minibatch(tmp_path, vault_policy_dir, agg):
    """The trainer's own optimize(): one micro-batch per episode vs one for all, same gradient."""
    grads = []
    for budget in (1_000_000, 1):
        trainer = Trainer(small_config(tmp_path / str(budget), vault_policy_dir, seed=3,
                                       loss={"agg": agg, "kl_coef": 0.1, "entropy_coef": 0.01},
                                       optim={"lr": 1e-2, "minibatches": 1, "micro_batch_tokens": budget}))
        batch = make_batch(_episodes(trainer), trainer.policy.chat.pad_id)
        batch = batch.with_(ref_logp=trainer.learner.reference_logp(batch))
        credit = trainer.assigner.assign(batch, trainer.assigner.fit(batch))
        seen: list[list[torch.Tensor]] = []
        # record, do not step
        trainer.learner.optimizer.step = lambda seen=seen, params=trainer.learner.trainable: seen.append(
            [p.grad.clone() for p in params])
        out = trainer.learner.optimize(batch, credit)
        grads.append(seen[0])
        if budget == 1:
            assert out["train/padding_frac"] == 0.0  # each episode alone: no padding at all
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_micro_batch_tokens_unset_follow_the_models_activation_budget(tmp_path, vault_policy_dir, monkeypatch):
    """optim.micro_batch_tokens None: 16384, or what the model's activations allow where that is fewer (SmolLM2:
    3006, pass_tokens by hand in tests/stages); a value set is kept, even above the budget."""
    from agentrl import learner

    tiny = Trainer(small_config(tmp_path / "tiny", vault_policy_dir))
    assert tiny.cfg.optim.micro_batch_tokens is None and tiny.learner.micro_tokens == 16384  # tiny: room for more
    monkeypatch.setattr(learner, "pass_tokens", lambda model: 3006)  # a model the size of SmolLM2-135M
    assert Trainer(small_config(tmp_path / "big", vault_policy_dir)).learner.micro_tokens == 3006
    kept = Trainer(small_config(tmp_path / "set", vault_policy_dir, optim={"micro_batch_tokens": 20000}))
    assert kept.learner.micro_tokens == 20000


def test_lora_trains_adapters_only_against_the_base_model(tmp_path, vault_policy_dir):
    cfg = small_config(tmp_path, vault_policy_dir, optim={"lr": 1e-2, "minibatches": 1, "lora": {"r": 4}})
    base = Policy.load(vault_policy_dir).model
    before = {k: v.clone() for k, v in base.state_dict().items()}
    trainer = Trainer(cfg)
    assert trainer.learner.reference is None  # no second copy of the weights
    adapters = {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in n for n in adapters)

    batch = make_batch(_episodes(trainer), trainer.policy.chat.pad_id)
    batch = batch.with_(ref_logp=trainer.learner.reference_logp(batch))
    trainer.learner.optimize(batch, trainer.assigner.assign(batch, trainer.assigner.fit(batch)))
    moved = [n for n, p in trainer.policy.model.named_parameters() if p.requires_grad
             and not torch.equal(p, adapters[n])]
    assert moved
    # after an update, the reference (adapters off) is still exactly the base model
    with torch.inference_mode():
        # the reference is read at actions only
        expect = token_stats(base, batch.input_ids, batch.attention_mask).logp * batch.action_mask
    torch.testing.assert_close(trainer.learner.reference_logp(batch), expect, rtol=0, atol=1e-5)
    trainer.train()

    ckpt = tmp_path / "run" / "checkpoint"
    assert (ckpt / "adapter" / "adapter_config.json").is_file()
    merged = Policy.load(ckpt).model.state_dict()
    changed = [k for k in before if not torch.equal(before[k], merged[k])]
    assert changed, "the merged checkpoint carries the adapters' update"
    # only adapted (linear) weights moved
    assert all(any(t in k for t in ("proj", "lm_head")) for k in changed), changed
    from peft import PeftModel

    reloaded = PeftModel.from_pretrained(Policy.load(vault_policy_dir).model, ckpt / "adapter")
    moved = [n for n, p in reloaded.named_parameters() if "lora_B" in n and p.abs().sum() > 0]
    assert moved, "lora_B starts at zero; a trained adapter has moved it"
    assert all(torch.equal(before[k], v) for k, v in reloaded.get_base_model().state_dict().items() if k in before)


@pytest.mark.parametrize("lora", [False, True])
def test_token_stats_at_action_positions_only_equal_the_full_forward(vault_policy, lora):
    """The output layer runs at the action positions only; their log-probs and entropies are those
    of the full forward, and every other position reads 0."""
    from agentrl.config import LoraSettings
    from agentrl.policy import add_lora

    model = add_lora(vault_policy.model, LoraSettings(r=2)) if lora else vault_policy.model
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (3, 20), generator=gen)
    attn = torch.ones_like(ids)
    attn[1, 14:] = 0  # right padding
    only = (torch.rand(ids.shape, generator=gen) < 0.4).float() * attn
    only[:, 0] = 0
    with torch.no_grad():
        full = token_stats(model, ids, attn, 0.7, entropy=True)
        part = token_stats(model, ids, attn, 0.7, entropy=True, only=only)
    assert part.logp.shape == full.logp.shape
    torch.testing.assert_close(part.logp, full.logp * only, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(part.entropy, full.entropy * only, rtol=1e-5, atol=1e-6)
