"""Stages one and two: SFT and preference losses (oracles), masks, bad data, the pipeline."""

from __future__ import annotations

import json
import math

import pytest
import torch

from agentrl.config import DPOConfig
from agentrl.core import Episode, Turn
from agentrl.stages.data import DataError, load_demos, load_pairs
from agentrl.stages.dpo import pairs_from_episodes, preference_loss, sequence_logp, train_preferences
from agentrl.stages.sft import sft_loss
from agentrl.store import make_batch


def softplus(x):
    return math.log1p(math.exp(x))


def test_dpo_ipo_simpo_by_hand():
    c, r = torch.tensor([-1.0, -4.0]), torch.tensor([-3.0, -2.0])
    rc, rr = torch.tensor([-2.0, -3.0]), torch.tensor([-2.0, -3.0])
    h = [(-1 + 2) - (-3 + 2), (-4 + 3) - (-2 + 3)]  # [2, -2]
    loss, m = preference_loss(c, r, rc, rr, "dpo", beta=0.5)
    assert loss.item() == pytest.approx((softplus(-0.5 * h[0]) + softplus(-0.5 * h[1])) / 2)
    assert m["accuracy"] == 0.5 and m["margin"] == pytest.approx(0.5 * (h[0] + h[1]) / 2)
    loss, _ = preference_loss(c, r, rc, rr, "ipo", beta=0.5)
    assert loss.item() == pytest.approx(((h[0] - 1) ** 2 + (h[1] - 1) ** 2) / 2)
    lc, lr = torch.tensor([2.0, 4.0]), torch.tensor([3.0, 1.0])
    loss, m = preference_loss(c, r, None, None, "simpo", beta=2.0, gamma=0.5, len_chosen=lc, len_rejected=lr)
    x = [2 * -1 / 2 - 2 * -3 / 3 - 0.5, 2 * -4 / 4 - 2 * -2 / 1 - 0.5]
    assert loss.item() == pytest.approx((softplus(-x[0]) + softplus(-x[1])) / 2)
    with pytest.raises(ValueError, match="needs reference"):
        preference_loss(c, r, None, None, "dpo", beta=0.1)


def _ep(reward, group, acts=(2, 2)):
    e = Episode([1], reward=reward, group_id=group)
    ctx = 1
    for n in acts:
        e.turns.append(Turn(ctx, [5 + group + int(reward)] * n, [0.0] * n, [7, 8]))
        ctx += n + 2
    return e


def test_observation_tokens_never_contribute_to_sft_or_preference_losses():
    batch = make_batch([_ep(1.0, 0)], pad_id=0)
    obs = (batch.action_mask == 0) & (batch.attention_mask == 1)
    logp = torch.randn(1, batch.input_ids.shape[1], requires_grad=True)
    sft_loss(logp, batch.action_mask).backward()
    assert logp.grad[obs].abs().sum() == 0 and logp.grad[batch.action_mask == 1].abs().sum() > 0
    logp = torch.randn(1, batch.input_ids.shape[1], requires_grad=True)
    sequence_logp(logp, batch.action_mask).sum().backward()
    assert logp.grad[obs].abs().sum() == 0 and logp.grad[batch.action_mask == 1].abs().sum() > 0


def test_sft_loss_is_the_cross_entropy_of_the_action_tokens_with_the_prompt_run_once():
    """SFT's step scores only the action tokens and runs a prompt the demos share once (`token_stats` with
    `share_heads`): its loss and gradient are the plain full-vocabulary cross-entropy's, computed here token by
    token from the model's full logits."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentrl.policy import MIN_SHARED_HEAD, SharedHeads, token_stats

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).float()
    prompt = list(range(2, 22))  # 20 tokens, the same in every demo
    eps = []
    for k, acts in enumerate([(3, 2), (1, 4), (2, 2)]):
        e = Episode(list(prompt), reward=1.0, group_id=0)
        ctx = len(prompt)
        for n in acts:
            e.turns.append(Turn(ctx, [22 + k + i for i in range(n)], [0.0] * n, [30, 31, 32]))
            ctx += n + 3
        eps.append(e)
    b = make_batch(eps, pad_id=0)
    assert SharedHeads.find(b.input_ids, b.attention_mask, b.action_mask, MIN_SHARED_HEAD) is not None
    ts = token_stats(model, b.input_ids, b.attention_mask, only=b.action_mask, share_heads=MIN_SHARED_HEAD)
    assert ts.shared == 2 * (len(prompt) - 1)  # two demos' heads not run again (a head: the prompt less its last token)
    loss = sft_loss(ts.logp, b.action_mask)
    grad = torch.autograd.grad(loss, model.model.layers[0].mlp.up_proj.weight)[0]

    terms = []
    for e in eps:  # each demo alone, unpadded: every action token's cross-entropy from full logits
        ids = torch.tensor([e.token_ids()])
        logits = model(input_ids=ids).logits[0]
        for t, is_action in enumerate(e.action_mask()):
            if is_action:
                terms.append(torch.nn.functional.cross_entropy(logits[t - 1 : t], ids[0, t : t + 1]))
    want = torch.stack(terms).mean()
    assert len(terms) == sum(sum(acts) for acts in [(3, 2), (1, 4), (2, 2)])
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    want_grad = torch.autograd.grad(want, model.model.layers[0].mlp.up_proj.weight)[0]
    torch.testing.assert_close(grad, want_grad, rtol=1e-4, atol=1e-6)


def test_pairs_from_groups_pass_against_fail():
    eps = [_ep(1.0, 0), _ep(0.0, 0), _ep(0.0, 0), _ep(1.0, 1), _ep(1.0, 1), _ep(0.0, 2)]
    pairs, counts = pairs_from_episodes(eps, max_per_group=4)
    assert len(pairs) == 2 and all(c.passed and not r.passed and c.group_id == r.group_id for c, r in pairs)
    assert counts["groups_without_pair"] == 2


def conv(action, reward=1.0):
    return {"messages": [{"role": "user", "content": "task"}, {"role": "assistant", "content": action},
                         {"role": "tool", "content": "ok"}, {"role": "assistant", "content": "done"}], "reward": reward}


def test_bad_preference_data_gives_clear_errors_or_counted_skips(tmp_path, vault_policy):
    chat = vault_policy.chat
    f = tmp_path / "pairs.jsonl"
    f.write_text(json.dumps({"chosen": conv("a")}) + "\n")
    with pytest.raises(DataError, match=r"pairs.jsonl:1: rejected: "):
        load_pairs(f, chat)
    f.write_text("")
    with pytest.raises(DataError, match="holds no records"):
        load_pairs(f, chat)
    f.write_text("{not json\n")
    with pytest.raises(DataError, match=r":1: not valid JSON"):
        load_pairs(f, chat)
    f.write_text(json.dumps({"chosen": conv("a"), "rejected": conv("a")}) + "\n"
                 + json.dumps({"chosen": conv("a"), "rejected": conv("b")}) + "\n")
    pairs, skipped = load_pairs(f, chat)
    assert len(pairs) == 1 and skipped == {"identical": 1}
    f.write_text(json.dumps({"chosen": conv("a"), "rejected": conv("a")}) + "\n")
    with pytest.raises(DataError, match="no usable pairs"):
        load_pairs(f, chat)
    bad = {"messages": [{"role": "user", "content": "t"}, {"role": "tool", "content": "x"}]}
    f.write_text(json.dumps(bad) + "\n")
    with pytest.raises(DataError, match=r"messages\[1\] is 'tool', expected 'assistant'"):
        load_demos(f, chat)


def test_demos_from_jsonl_are_laid_out_like_rollouts(tmp_path, vault_policy):
    chat = vault_policy.chat
    f = tmp_path / "demos.jsonl"
    f.write_text(json.dumps(conv('<tool_call>{"name": "clue", "arguments": {"lock": 1}}</tool_call>')) + "\n")
    (ep,) = load_demos(f, chat)
    assert ep.num_turns == 2 and chat.decode(ep.turns[0].action_ids).startswith("<tool_call>")
    assert "ok" in chat.decode(ep.turns[0].obs_ids) and ep.turns[1].obs_ids == []
    assert len(ep.token_ids()) == len(ep.action_mask())


def test_dpo_training_raises_chosen_over_rejected(vault_policy):
    torch.manual_seed(0)
    chat = vault_policy.chat
    prompt = chat.encode("x")

    def one_turn(text, reward):
        ids = chat.action_ids(text)
        return Episode(list(prompt), [Turn(len(prompt), ids, [0.0] * len(ids), [])], reward=reward)

    good, bad = one_turn("<tool_call>yes</tool_call>", 1.0), one_turn("<tool_call>no</tool_call>", 0.0)
    import copy

    ref = copy.deepcopy(vault_policy.model).eval()
    m = train_preferences(vault_policy.model, ref, [(good, bad)] * 8, chat.pad_id,
                          DPOConfig(epochs=5, lr=1e-2, batch_pairs=8))
    assert m["dpo/accuracy"] == 1.0 and m["dpo/margin"] > 0


def test_pipeline_runs_every_stage(tmp_path):
    from agentrl.config import TrainConfig
    from agentrl.stages.pipeline import run_pipeline

    cfg = TrainConfig(env={"kwargs": {"locks": 1}}, updates=1,
                      tiny={"hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2,
                            "num_key_value_heads": 1, "max_position_embeddings": 256},
                      sft={"episodes": 64, "epochs": 1}, rollout={"groups": 2, "group_size": 4}, eval={"episodes": 8})
    result = run_pipeline(cfg, DPOConfig(groups=4, group_size=4, epochs=1), tmp_path / "p", say=lambda s: None)
    names = [s["stage"] for s in result["stages"]]
    # a micro model passes nothing, so there is no preference pair: the stage is skipped, and says so
    assert names == ["sft", "dpo (skipped: no pairs)", "rl (grpo)"]
    for name in ("sft", "rl/checkpoint"):
        assert (tmp_path / "p" / name / "config.json").is_file()
    assert not (tmp_path / "p" / "dpo").exists()
    table = json.loads((tmp_path / "p" / "pipeline.json").read_text())["stages"]
    rl_summary = json.loads((tmp_path / "p" / "rl" / "summary.json").read_text())
    assert table[2]["held_out_pass_rate"] == rl_summary["final_pass_rate"] and rl_summary["updates_done"] == 1
    assert rl_summary["warm_start_pass_rate"] == table[1]["held_out_pass_rate"] == table[0]["held_out_pass_rate"]


def scripted_groups(cfg, policy, groups, group_size, seed):
    """Stand-in for the pipeline's collect_groups: in each group two expert episodes pass and two that
    write "hello" fail (a micro model passes nothing, so its own groups would give no pair)."""
    from agentrl.engines import ScriptedEngine
    from agentrl.registry import make
    from agentrl.rollout import rollout

    envs = [make(cfg.env.id, **cfg.env.kwargs) for _ in range(groups * group_size)]
    chat = policy.chat
    engine = ScriptedEngine(lambda row: chat.action_ids(envs[row].expert_action() if row % 2 == 0 else "hello"),
                            chat.eos_id)
    gids = [i // group_size for i in range(len(envs))]
    return rollout(envs, [100 + g for g in gids], engine, chat, group_ids=gids)[0]


def _pipeline_cfg():
    from agentrl.config import TrainConfig

    return TrainConfig(env={"kwargs": {"locks": 1}}, updates=1,
                       tiny={"hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2,
                             "num_key_value_heads": 1, "max_position_embeddings": 256},
                       sft={"episodes": 64, "epochs": 1}, eval={"episodes": 8},
                       rollout={"groups": 2, "group_size": 4, "sampling": {"max_new_tokens": 16}})  # short evaluations


PIPELINE_CFG = _pipeline_cfg()


def test_pipeline_dpo_stage_trains_on_pairs_and_rl_starts_from_it(tmp_path, monkeypatch):
    """The DPO stage for real: pairs from the policy's groups (here scripted, since a micro model
    passes nothing: in each group of 4, two expert episodes pass and two that write "hello" fail, so
    2 x 2 = 4 pairs a group, 16 in all), DPO on them, its checkpoint, and RL started from it."""
    from agentrl.policy import Policy
    from agentrl.stages import pipeline

    monkeypatch.setattr(pipeline, "collect_groups", scripted_groups)
    cfg = PIPELINE_CFG
    out = tmp_path / "p"
    result = pipeline.run_pipeline(cfg, DPOConfig(groups=4, group_size=4, epochs=3, lr=5e-3, batch_pairs=8), out,
                                   say=lambda s: None)
    assert [s["stage"] for s in result["stages"]] == ["sft", "dpo", "rl (grpo)"]
    assert result["stages"][1]["pairs"] == 16 and json.loads((out / "dpo" / "dpo.json").read_text())["dpo/pairs"] == 16

    log = [json.loads(line) for line in (out / "dpo_metrics.jsonl").read_text().splitlines()]
    assert [m["dpo/step"] for m in log] == list(range(1, 7))  # 16 pairs in batches of 8, 3 epochs
    assert log[0]["dpo/margin"] == pytest.approx(0.0, abs=1e-6)  # the first step: the policy is the reference
    assert log[-1]["dpo/margin"] > 0 and log[-1]["dpo/accuracy"] == 1.0

    # the saved DPO policy prefers the chosen episode over the rejected one more than the SFT policy does
    sft, dpo = Policy.load(out / "sft"), Policy.load(out / "dpo")
    chosen, rejected = scripted_groups(cfg, sft, 1, 2, 0)
    assert chosen.passed and not rejected.passed

    def margin(policy):
        batch = make_batch([chosen, rejected], policy.chat.pad_id)
        with torch.no_grad():
            from agentrl.policy import token_stats

            s = sequence_logp(token_stats(policy.model, batch.input_ids, batch.attention_mask).logp, batch.action_mask)
        return float(s[0] - s[1])

    assert margin(dpo) > margin(sft)
    assert any(not torch.equal(a, b) for a, b in zip(sft.model.parameters(), dpo.model.parameters()))
    # RL went on from the DPO checkpoint, not from the SFT one
    assert (out / "rl" / "config.yaml").read_text().count(str(out / "dpo")) == 1


def test_a_killed_pipeline_resumes_at_the_stage_that_did_not_finish(tmp_path, monkeypatch):
    """Killed in RL: --resume runs neither SFT nor DPO again, and RL once; stage two's options are kept."""
    from agentrl import trainer
    from agentrl.stages import pipeline

    monkeypatch.setattr(pipeline, "collect_groups", scripted_groups)
    dcfg = DPOConfig(groups=4, group_size=4, epochs=1, batch_pairs=8)
    out = tmp_path / "p"
    real_train = trainer.Trainer.train

    def killed(self, warm=None):
        raise KeyboardInterrupt  # as if the machine went away during RL, before any checkpoint

    monkeypatch.setattr(trainer.Trainer, "train", killed)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_pipeline(PIPELINE_CFG, dcfg, out, say=lambda s: None)
    before = json.loads((out / "pipeline.json").read_text())
    assert [s["stage"] for s in before["stages"]] == ["sft", "dpo"]

    def must_not_run(*a, **k):
        raise AssertionError("a finished stage ran again")

    monkeypatch.setattr(trainer.Trainer, "train", real_train)
    monkeypatch.setattr(pipeline, "warm_start", must_not_run)
    monkeypatch.setattr(pipeline, "train_preferences", must_not_run)
    with pytest.raises(ValueError, match="stage two's options differ"):
        pipeline.run_pipeline(PIPELINE_CFG, dcfg.model_copy(update={"epochs": 2}), out, say=lambda s: None, resume=True)
    result = pipeline.run_pipeline(PIPELINE_CFG, dcfg, out, say=lambda s: None, resume=True)
    assert [s["stage"] for s in result["stages"]] == ["sft", "dpo", "rl (grpo)"]
    assert result["stages"][:2] == before["stages"]  # the recorded stages are kept as they were
    rl = json.loads((out / "rl" / "summary.json").read_text())
    assert rl["updates_done"] == 1 and rl["warm_start_pass_rate"] == before["stages"][1]["held_out_pass_rate"]


def test_sft_killed_midway_resumes_after_its_last_epoch_to_the_same_weights(tmp_path, vault_policy_dir):
    from agentrl.policy import Policy
    from agentrl.registry import make
    from agentrl.stages.sft import collect_demos, sft

    def fresh():
        return Policy.load(vault_policy_dir)

    demos = collect_demos(lambda: make("agentrl/Vault-v0", locks=1), fresh().chat, list(range(24)), 0.3)
    kw = dict(epochs=3, lr=3e-3, batch_size=8, seed=5)
    alone = fresh()
    sft(alone.model, demos, alone.chat.pad_id, **kw)

    class Killed(Exception):
        pass

    def kill_in_epoch_2(m):
        if m["sft/epoch"] == 2:
            raise Killed

    state = tmp_path / "sft.pt"
    first = fresh()
    with pytest.raises(Killed):
        sft(first.model, demos, first.chat.pad_id, log=kill_in_epoch_2, resume_file=state, **kw)
    assert state.is_file()  # epochs 0 and 1 finished: the state after epoch 1 is there
    again = fresh()  # a new process: the weights come from the file, not from `first`
    steps = []
    sft(again.model, demos, again.chat.pad_id, resume_file=state, log=lambda m: steps.append(m["sft/step"]), **kw)
    assert steps == [7, 8, 9]  # only epoch 2 ran again (24 demonstrations / 8 = 3 steps an epoch)
    for (name, a), b in zip(alone.model.state_dict().items(), again.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert not state.exists()  # done: nothing left to resume


def test_sft_in_micro_batches_takes_the_same_steps_as_whole_batches(vault_policy_dir):
    """A batch split into micro-batches of one demonstration each (the smallest cap) trains to the weights the
    whole batch gives, up to float summation order: the micro-batches' losses are weighted by their share of
    the batch's action tokens, so their gradients add up to the batch's token mean."""
    from agentrl.policy import Policy
    from agentrl.registry import make
    from agentrl.stages.sft import collect_demos, sft

    whole, split = Policy.load(vault_policy_dir), Policy.load(vault_policy_dir)
    demos = collect_demos(lambda: make("agentrl/Vault-v0", locks=2), whole.chat, list(range(12)), 0.3)
    lengths = {len(d.token_ids()) for d in demos}
    assert len(lengths) > 1  # rows of different lengths and action counts: a plain mean of parts would differ
    kw = dict(epochs=2, lr=3e-3, batch_size=6, seed=1)
    a = sft(whole.model, demos, whole.chat.pad_id, max_tokens=10**6, **kw)
    b = sft(split.model, demos, split.chat.pad_id, max_tokens=256, **kw)  # 256 < every demo: one row a pass
    assert 6 * max(lengths) > 256  # so the cap splits every batch
    assert a["sft/steps"] == b["sft/steps"] == 4
    assert a["sft/loss"] == pytest.approx(b["sft/loss"], rel=1e-5)
    for (name, x), y in zip(whole.model.state_dict().items(), split.model.state_dict().values()):
        assert torch.allclose(x, y, atol=1e-5, rtol=1e-4), name


def test_dpo_in_micro_batches_takes_the_same_steps_as_whole_batches(vault_policy_dir, monkeypatch):
    """A step's pairs split into micro-batches (here one pair each) train to the weights the whole batch gives, up to
    float summation order: each micro-batch's mean loss is weighted by its share of the step's pairs. Plain SGD and
    no clip, so that the gradient's scale shows in the weights (Adam or a clip would hide a micro-batch's loss
    summed, not averaged)."""
    import copy

    from agentrl.policy import Policy
    from agentrl.stages import dpo
    from agentrl.stages.dpo import micro_pairs, pairs_from_episodes, train_preferences

    monkeypatch.setattr(dpo, "adamw", lambda params, lr: torch.optim.SGD(params, lr=lr))
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, norm: None)  # a clip would hide it too

    whole, split = Policy.load(vault_policy_dir), Policy.load(vault_policy_dir)
    pairs, _ = pairs_from_episodes(scripted_groups(PIPELINE_CFG, whole, 2, 4, 0), 4, 0)
    assert len(pairs) == 8
    reference = copy.deepcopy(whole.model).eval().requires_grad_(False)
    kw = dict(epochs=2, lr=0.05, batch_pairs=6)  # steps of 6 and 2 pairs: unequal shares
    cap = 2 * max(len(e.token_ids()) for pair in pairs for e in pair)  # a pair is 2 rows of its longer side
    assert [len(run) for run in micro_pairs(pairs[:6], cap)] == [1] * 6  # two pairs never fit: one pair a pass
    a = train_preferences(whole.model, reference, pairs, whole.chat.pad_id,
                          DPOConfig(max_batch_tokens=10**6, **kw), seed=1)
    b = train_preferences(split.model, reference, pairs, split.chat.pad_id, DPOConfig(max_batch_tokens=cap, **kw),
                          seed=1)
    assert a["dpo/steps"] == b["dpo/steps"] == 4
    for key in ("dpo/loss", "dpo/margin", "dpo/accuracy", "dpo/nll_chosen"):
        assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    for (name, x), y in zip(whole.model.state_dict().items(), split.model.state_dict().values()):
        assert torch.allclose(x, y, atol=1e-5, rtol=1e-4), name


def test_dpo_sequence_logps_are_the_plain_forwards(vault_policy_dir):
    """_seq_logps runs the output layer at the action tokens only and a pair's shared prompt once; each episode's
    sum must still be the plain forward's: the whole model's logits, log-softmax, the log-prob of each action token
    summed here, one episode at a time (no padding, no sharing)."""
    from agentrl.policy import MIN_SHARED_HEAD, Policy, SharedHeads
    from agentrl.stages.dpo import _seq_logps, pairs_from_episodes

    policy = Policy.load(vault_policy_dir)
    pairs, _ = pairs_from_episodes(scripted_groups(PIPELINE_CFG, policy, 2, 4, 0), 4, 0)
    both = [c for c, _ in pairs[:3]] + [r for _, r in pairs[:3]]
    b = make_batch(both, policy.chat.pad_id)
    assert SharedHeads.find(b.input_ids, b.attention_mask, b.action_mask, MIN_SHARED_HEAD) is not None  # shared
    got, tokens = _seq_logps(policy.model, both, policy.chat.pad_id)
    for i, e in enumerate(both):
        ids, acted = torch.tensor([e.token_ids()]), e.action_mask()
        with torch.no_grad():
            logp = torch.log_softmax(policy.model(input_ids=ids).logits[0].float(), -1)
        by_hand = sum(logp[t - 1, ids[0, t]].item() for t in range(1, ids.shape[1]) if acted[t])
        assert got[i].item() == pytest.approx(by_hand, rel=1e-5, abs=1e-4), i
        assert tokens[i].item() == sum(acted)


def test_pass_tokens_by_hand():
    from types import SimpleNamespace

    from agentrl.policy import pass_tokens

    smollm2 = SimpleNamespace(config=SimpleNamespace(num_hidden_layers=30, hidden_size=576, intermediate_size=1536))
    # 30 layers x (10 x 576 + 4 x 1536) x 4 bytes = 30 x 11,904 x 4 = 1,428,480 bytes a token; 4 GiB / that = 3006.6
    assert pass_tokens(smollm2) == 3006
    tiny = SimpleNamespace(config=SimpleNamespace(num_hidden_layers=2, hidden_size=64, intermediate_size=None))
    # no intermediate size: 4 x 64 = 256; 2 x (640 + 1024) x 4 = 13,312 bytes; 4 GiB / that = 322,638.8
    assert pass_tokens(tiny) == 322638
    assert pass_tokens(torch.nn.Linear(2, 2)) == 16384  # no config: the learner's default
