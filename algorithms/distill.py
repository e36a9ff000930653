"""`distill`: on-policy distillation, credit from a frozen teacher's log-probs of the student's own tokens.

The student samples episodes as in RL; the trainer scores every action token under the teacher on the
context that token was sampled in (`TurnBatch.teacher_logp`, segments included), and each token's
advantage is the teacher's log-prob minus the student's sampling log-prob:

    A_t = log pi_T(a_t | c_t) - log mu(a_t | c_t)    (optionally clipped to +/- distill_clip)
        + reward_weight * A_grpo(episode)

Minimising the shared policy loss with this advantage descends the per-token reverse KL
KL(mu || pi_T): tokens the teacher would have written get pushed up, tokens it would not get pushed
down, whatever the verifier said. The signal is dense (one number per token, no group baseline
needed); `reward_weight` > 0 adds the verifier's outcome advantage on top. Related: GKD (Agarwal et
al. 2023, arXiv 2306.13649), MiniLLM (2306.08543), Thinking Machines' on-policy distillation (2025);
the same rule ships in verl, SkyRL, TRL and others.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.algorithms.configs import DistillConfig
from agentrl.credit import Credit, Fit, group_advantages, tokens_from_episodes
from agentrl.store import TurnBatch


def teacher_advantages(teacher_logp: torch.Tensor, student_logp: torch.Tensor, action_mask: torch.Tensor,
                       clip: float | None = None) -> torch.Tensor:
    """(B, T) per-token log pi_T - log mu on the action tokens, 0 elsewhere, clipped to +/- `clip` if given.

    >>> teacher_advantages(torch.tensor([[-1.0, -0.5, -4.0]]), torch.tensor([[-2.0, -0.5, -1.0]]),
    ...                    torch.tensor([[0.0, 1.0, 1.0]]), clip=2.0).tolist()
    [[0.0, 0.0, -2.0]]
    """
    adv = (teacher_logp - student_logp) * action_mask  # (B, T)
    return adv.clamp(-clip, clip) * action_mask if clip is not None else adv


class Distill:
    def __init__(self, config: DistillConfig | None = None, **_: object):
        self.cfg = config or DistillConfig()

    def fit(self, batch: TurnBatch) -> Fit:
        return Fit()  # the teacher is frozen: nothing to learn

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} has no state to load; got {sorted(state)}")

    def assign(self, batch: TurnBatch, fit: Fit) -> Credit:
        if batch.teacher_logp is None:
            raise ValueError("distill: the batch carries no teacher log-probs; train with --teacher MODEL (the trainer "
                             "scores the teacher for an assigner registered with reads_teacher)")
        mask = batch.action_mask
        log_ratio = (batch.teacher_logp - batch.behaviour_logp) * mask  # (B, T)
        adv = teacher_advantages(batch.teacher_logp, batch.behaviour_logp, mask, self.cfg.distill_clip)
        n = mask.sum().clamp(min=1)
        metrics = {
            # the sampled tokens' mean log mu - log pi_T: an unbiased estimate of the per-token reverse KL
            "teacher_kl": float(-log_ratio.sum() / n),
            "teacher_logp_mean": float((batch.teacher_logp * mask).sum() / n),
        }
        if self.cfg.distill_clip is not None:
            metrics["distill_clip_frac"] = float(((log_ratio.abs() > self.cfg.distill_clip) & (mask > 0)).sum() / n)
        if self.cfg.reward_weight:
            outcome, stats = group_advantages(batch.rewards, batch.group_ids)
            adv = adv + self.cfg.reward_weight * tokens_from_episodes(outcome, batch)
            metrics.update({k: float(v) for k, v in stats.items() if k != "zero_mask"})
        metrics["adv_abs_mean"] = float((adv.abs() * mask).sum() / n)
        return Credit(adv, torch.ones(batch.size), metrics)
