"""Training and scoring forwards that run a group's shared prompt once (`optim.share_prefix`): which rows share,
what they save (counted by hand), and log-probs, entropies, hidden states and gradients equal to the plain forward."""

from __future__ import annotations

import pytest
import torch
from test_e2e import small_config
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl.policy import SharedHeads, token_stats
from agentrl.store import make_batch
from agentrl.trainer import Trainer


def _rows(prompts: list[list[int]], actions: list[list[int]], which: list[int]):
    """Right-padded (ids, mask, action mask) of rows `prompts[which[i]] + actions[i]`."""
    seqs = [prompts[w] + a for w, a in zip(which, actions)]
    T = max(map(len, seqs))
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    only = torch.zeros(len(seqs), T)
    for i, (w, s) in enumerate(zip(which, seqs)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
        only[i, len(prompts[w]) : len(s)] = 1
    return ids, mask, only


def _model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).float()


PROMPTS = [list(range(3, 23)), list(range(30, 53))]  # 20 and 23 tokens
ACTIONS = [[5, 6, 7, 8, 9], [7] * 11, [40, 41, 42], [8, 9] * 6, [50] * 7, [4, 4, 5]]
WHICH = [0, 1, 0, 1, 0, 1]


def test_heads_are_the_prompt_less_its_last_token_and_the_saving_is_the_repeats():
    ids, mask, only = _rows(PROMPTS, ACTIONS, WHICH)
    heads = SharedHeads.find(ids, mask, only, min_saved=16)
    assert heads is not None
    assert heads.source.tolist() == [0, 1, 0, 1, 0, 1]
    # the last prompt token's output predicts the first action token, so it runs with the row's tail
    assert heads.length.tolist() == [19, 22, 19, 22, 19, 22]
    assert heads.saved == 2 * 19 + 2 * 22  # each prompt runs once instead of three times


def test_no_sharing_where_it_does_not_pay():
    ids, mask, only = _rows(PROMPTS, ACTIONS, WHICH)
    assert SharedHeads.find(ids, mask, only, min_saved=83) is None  # 82 tokens saved, 83 asked
    distinct = [list(range(3 + i, 23 + i)) for i in range(6)]
    ids, mask, only = _rows(distinct, ACTIONS, list(range(6)))
    assert SharedHeads.find(ids, mask, only, min_saved=1) is None  # six prompts, nothing repeated
    ids, mask, only = _rows(PROMPTS, ACTIONS, WHICH)
    only[2] = 0
    assert SharedHeads.find(ids, mask, only, min_saved=1) is None  # a row with nothing to score
    # two rows with long actions behind a 3-token prompt: the padded forward would not shrink by a tenth
    ids, mask, only = _rows([[3, 4, 5]], [[6] * 40, [7] * 40], [0, 0])
    assert SharedHeads.find(ids, mask, only, min_saved=1) is None


@pytest.mark.parametrize("lora", [False, True])
def test_shared_forward_equals_the_plain_one_values_and_gradients(lora):
    from agentrl.config import LoraSettings
    from agentrl.policy import add_lora

    model = _model()
    if lora:
        model = add_lora(model, LoraSettings(r=4))
        for n, p in model.named_parameters():  # lora_B starts at 0: move it so that the adapters matter
            if "lora_B" in n:
                p.data.normal_(0, 0.1)
    ids, mask, only = _rows(PROMPTS, ACTIONS, WHICH)
    runs = []
    for share in (0, 16):
        model.zero_grad()
        ts = token_stats(model, ids, mask, 0.8, entropy=True, hidden=True, only=only, share_heads=share)
        (ts.logp.sum() + 0.1 * ts.entropy.sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        runs.append((ts, grads))
    (plain, g_plain), (shared, g_shared) = runs
    assert plain.shared == 0 and shared.shared == 2 * 19 + 2 * 22
    torch.testing.assert_close(shared.logp, plain.logp, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shared.entropy, plain.entropy, rtol=1e-5, atol=1e-6)
    assert bool((shared.logp != 0).eq(only.bool()).all())  # scored exactly at the action tokens
    # hidden[:, t] is the state before token t: every real position's, heads included
    real = torch.nn.functional.pad(mask[:, :-1], (1, 0)).bool()
    torch.testing.assert_close(shared.hidden[real], plain.hidden[real], rtol=1e-5, atol=1e-5)
    assert g_plain.keys() == g_shared.keys()
    for n in g_plain:
        torch.testing.assert_close(g_shared[n], g_plain[n], rtol=1e-4, atol=1e-6, msg=n)


def test_micro_batches_by_prompt_keep_a_prompts_rows_together():
    from agentrl.store import TurnBatch

    ids, mask, only = _rows(PROMPTS, ACTIONS, WHICH)
    batch = TurnBatch.__new__(TurnBatch)
    object.__setattr__(batch, "input_ids", ids)
    object.__setattr__(batch, "attention_mask", mask)
    object.__setattr__(batch, "action_mask", only)
    budget = 3 * int(mask.sum(1).max())
    plain = [g.tolist() for g in batch.micro_batches(budget)]
    grouped = [g.tolist() for g in batch.micro_batches(budget, by_prompt=True)]
    assert plain == [[3, 1, 4], [5, 0, 2]]  # by length alone the prompts mix (rows 25 34 23 35 27 26 long)
    assert grouped == [[3, 1, 5], [4, 0, 2]]  # prompt 1 (its longest row 35) first, then prompt 0


def test_the_trainer_shares_prompts_and_trains_as_without(tmp_path, vault_policy_dir):
    """One update of the real trainer with optim.share_prefix on and off: the same gradient, and the metrics
    say how many prompt tokens ran once."""
    grads, outs = [], []
    for share in (False, True):
        trainer = Trainer(small_config(tmp_path / str(share), vault_policy_dir, seed=3,
                                       optim={"lr": 1e-2, "minibatches": 1, "share_prefix": share}))
        episodes, _ = trainer.collector.collect(1)
        batch = make_batch(episodes, trainer.policy.chat.pad_id)
        batch = batch.with_(ref_logp=trainer.learner.reference_logp(batch))
        credit = trainer.assigner.assign(batch, trainer.assigner.fit(batch))
        seen: list[list[torch.Tensor]] = []
        trainer.learner.optimizer.step = lambda seen=seen, params=trainer.learner.trainable: seen.append(
            [p.grad.clone() for p in params])
        outs.append(trainer.learner.optimize(batch, credit))
        grads.append(seen[0])
    # by hand: each distinct prompt of n rows and p tokens runs its first p - 1 tokens once instead of n times
    starts = batch.action_mask.float().argmax(1).tolist()
    prompts: dict[tuple[int, ...], int] = {}
    for i, p in enumerate(starts):
        key = tuple(batch.input_ids[i, :p].tolist())
        prompts[key] = prompts.get(key, 0) + 1
    assert sum(prompts.values()) == 8 and max(prompts.values()) > 1  # Babble: one task text for every group
    assert "train/prompt_tokens_shared" not in outs[0]
    assert outs[1]["train/prompt_tokens_shared"] == sum((n - 1) * (len(k) - 1) for k, n in prompts.items())
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
