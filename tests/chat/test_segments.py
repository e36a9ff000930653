"""Episodes trained as segments: where the chat template rewrites the history, each action is trained on
exactly the context it was sampled from (`Episode.segments`, `agentrl.store.segment_batch`), in SFT, in the
trainer's scoring and in its loss.

The layouts are checked by hand on a small episode; the end-to-end test trains a small random model whose
template trims every earlier assistant turn, so that nearly every turn opens a segment: the engine's log-probs
(sampled on the segment contexts) must equal the trainer's, which they cannot if the trainer scored the appended
layout.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_chat_layout import family_tokenizer

from agentrl.config import TrainConfig
from agentrl.core import Episode, Turn
from agentrl.credit import Credit
from agentrl.store import TrajectoryStore, make_batch, segment_batch, to_episodes

# planted: an earlier assistant turn is shown as its last 12 characters (a summarising template)
TRIMMING = (
    "{%- for m in messages -%}{%- set c = m.content -%}"
    "{%- if m.role == 'assistant' and not loop.last -%}{%- set c = c[-12:] -%}{%- endif -%}"
    "{%- if m.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + c + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>' + m.role + '\\n' + c + '<|im_end|>\\n' -}}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def three_turns() -> Episode:
    """prompt [1, 2]; a1 = [3, 4], o1 = [5]; a2 = [6] given the rewritten context [1, 2, 9]; o2 = [7]; a3 = [8]."""
    return Episode([1, 2], [Turn(2, [3, 4], [-0.3, -0.4], [5]),
                            Turn(5, [6], [-0.6], [7], segment_context=[1, 2, 9]),
                            Turn(7, [8], [-0.8], [0])], reward=1.0, group_id=3)


def test_segments_are_the_contexts_the_model_was_given():
    ep = three_turns()
    assert ep.token_ids() == [1, 2, 3, 4, 5, 6, 7, 8]  # the appended layout, which credit reads
    # segment 1: the prompt and a1; segment 2: the rewritten context, a2, o2, a3 (a3 followed a2 directly)
    assert ep.segments() == [([1, 2, 3, 4], [-1, -1, 2, 3]), ([1, 2, 9, 6, 7, 8], [-1, -1, -1, 5, -1, 7])]


def test_segment_batch_carries_every_action_token_and_to_episodes_brings_it_back():
    plain = Episode([1], [Turn(1, [2], [-0.2], [0])], reward=0.0, group_id=4)
    batch = make_batch([three_turns(), plain], pad_id=0)
    adv = torch.arange(16, dtype=torch.float32).reshape(2, 8) * batch.action_mask  # a distinct value per token
    seg = segment_batch(batch.with_(advantages=adv))
    assert seg.seg_row.tolist() == [0, 0, 1]
    assert seg.input_ids.tolist() == [[1, 2, 3, 4, 0, 0], [1, 2, 9, 6, 7, 8], [1, 2, 0, 0, 0, 0]]
    assert seg.action_mask.tolist() == [[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 0, 1], [0, 1, 0, 0, 0, 0]]
    # row 0's action tokens sit at 2, 3, 5, 7 of the appended layout (advantages 2, 3, 5, 7); row 1's at 1 (9)
    assert seg.advantages.tolist() == [[0, 0, 2, 3, 0, 0], [0, 0, 0, 5, 0, 7], [0, 9, 0, 0, 0, 0]]
    assert seg.behaviour_logp[1].tolist() == pytest.approx([0, 0, 0, -0.6, 0, -0.8])
    assert seg.turn_index.tolist() == [[-1, -1, 0, 0, -1, -1], [-1, -1, -1, 1, -1, 2], [-1, 0, -1, -1, -1, -1]]
    assert seg.rewards.tolist() == [1.0, 1.0, 0.0] and seg.group_ids.tolist() == [3, 3, 4]
    assert torch.equal(to_episodes(seg.advantages, seg, batch.input_ids.shape), adv)
    # a batch without a segmented episode is the batch itself
    unsegmented = make_batch([plain], pad_id=0)
    assert segment_batch(unsegmented) is unsegmented


def test_a_segment_context_survives_the_parquet_store(tmp_path):
    path = TrajectoryStore([three_turns()]).save(tmp_path / "s.parquet")
    (ep,) = TrajectoryStore.load(path).episodes
    assert [t.segment_context for t in ep.turns] == [None, [1, 2, 9], None]
    assert ep.segments() == three_turns().segments()


@pytest.fixture(scope="module")
def trimming_model(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = family_tokenizer(TRIMMING, "<|im_end|>", [])
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=4096, tie_word_embeddings=True))
    folder = tmp_path_factory.mktemp("trimming")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def trimming_config(folder, out, **kw) -> TrainConfig:
    data = {"model": str(folder), "env": {"id": "examples/custom_env.py:Arithmetic"}, "algo": "grpo", "updates": 1,
            "out": str(out), "rollout": {"groups": 2, "group_size": 2, "env_workers": "serial",
                                         "sampling": {"max_new_tokens": 10}},
            "optim": {"lr": 1e-3, "minibatches": 1}, "eval": {"episodes": 2, "every": 0},
            "checkpoint": {"every": 0}, **kw}
    return TrainConfig(**data)


def test_the_trainer_scores_each_action_on_the_context_it_was_sampled_from(trimming_model, tmp_path):
    from agentrl.trainer import Trainer

    trainer = Trainer(trimming_config(trimming_model, tmp_path / "run"))
    assert trainer.policy.chat.history == "template"  # chosen by the probe conversation, not by a flag
    episodes, metrics = trainer.collector.collect(1)
    assert metrics["rollout/segmented_frac"] > 0.5, [e.num_turns for e in episodes]
    batch = make_batch(episodes, trainer.policy.chat.pad_id)
    scored = trainer.learner.score(batch, trainer.learner.scorer(), None)
    mask = batch.action_mask > 0
    # the engine sampled each action on its segment's context: its log-probs are the trainer's
    assert torch.allclose(scored[mask], batch.behaviour_logp[mask], atol=1e-4)
    # the oracle by hand: a forward over each segment, the log-softmax at each action token
    model = trainer.learner.scorer()
    for ep_row, ep in enumerate(batch.episodes):
        for ids, src in ep.segments():
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0].float()
            for t, pos in enumerate(src):
                if pos >= 0:
                    want = torch.log_softmax(logits[t - 1], -1)[ids[t]]
                    assert float(scored[ep_row, pos]) == pytest.approx(float(want), abs=1e-4)
    # scoring the appended layout instead gives other numbers: the check above can fail
    appended = batch.with_(episodes=[Episode(e.prompt_ids, [Turn(**{**t.__dict__, "segment_context": None})
                                                            for t in e.turns]) for e in batch.episodes])
    wrong = trainer.learner.score(appended, trainer.learner.scorer(), None)
    assert not torch.allclose(wrong[mask], batch.behaviour_logp[mask], atol=1e-3)
    # and the loss trains on the segments: one row per segment, a finite step
    credit = Credit(advantages=batch.action_mask * torch.linspace(-1, 1, batch.size)[:, None],
                    row_weight=torch.ones(batch.size))
    out = trainer.learner.optimize(batch.with_(ref_logp=scored), credit)
    assert out["train/trained_episodes"] == batch.size
    assert out["train/segments"] == sum(len(e.segments()) for e in episodes) > batch.size
    assert torch.isfinite(torch.tensor(out["train/grad_norm"]))


def test_a_run_whose_template_rewrites_history_trains_and_says_so(trimming_model, tmp_path, capsys):
    from agentrl.stages.pipeline import train

    out = tmp_path / "run"
    train(trimming_config(trimming_model, out))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if r.get("step") == 1)
    assert step["rollout/segmented_frac"] > 0
    assert "rewrites the history" in capsys.readouterr().out
    (store,) = sorted((out / "store").glob("*.parquet"))
    assert any(e.segmented for e in TrajectoryStore.load(store).episodes)  # kept, so a reload trains the same
