"""A teacher scores each action on the context it was sampled from, segments included (`Learner.teacher_logp`, in
the reference's micro-batches)."""

from __future__ import annotations

import torch
from test_segments import trimming_config, trimming_model  # noqa: F401 (a fixture)


def test_the_teacher_scores_each_action_on_the_context_it_was_sampled_from(trimming_model, tmp_path):  # noqa: F811
    """A teacher with the student's weights, on a template that rewrites the history (segments): its log-probs of
    every action token are the engine's, which sampled each action on its segment's context."""
    from agentrl.trainer import Trainer

    trainer = Trainer(trimming_config(trimming_model, tmp_path / "run", algo="distill", teacher=str(trimming_model)))
    episodes, metrics = trainer.collector.collect(1)
    assert metrics["rollout/segmented_frac"] > 0.5
    batch, _ = trainer._score_step(1, episodes, metrics)
    mask = batch.action_mask > 0
    assert torch.allclose(batch.teacher_logp[mask], batch.behaviour_logp[mask], atol=1e-4)
    assert torch.equal(batch.teacher_logp, batch.ref_logp)  # the same micro-batches as the reference
    assert metrics["time/teacher_s"] > 0
