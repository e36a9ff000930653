"""The shared policy loss (docs/algorithms.md), as pure functions. It never knows which assigner ran.

    rho = exp(logp - logp_behaviour)                         per action token
    l   = -min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)
          dual clip, for A < 0: l = min(l, -c * A)
    L   = agg(l) + beta * agg(k3) - c_H * agg(entropy)
    k3  = exp(ref - logp) - (ref - logp) - 1                 >= 0

>>> import torch
>>> one = torch.ones(1, 2)
>>> loss, stats = policy_loss(torch.log(torch.tensor([[1.5, 0.5]])), torch.zeros(1, 2), one, one, LossConfig())
>>> round(loss.item(), 4), stats["clip_high_frac"]
(-0.85, 0.5)
"""

from __future__ import annotations

import torch

from agentrl.config import Aggregation, LossConfig


def aggregate(x: torch.Tensor, mask: torch.Tensor, mode: Aggregation, max_len: int = 512) -> torch.Tensor:
    """Reduce per-token values (B, T) over the mask; one row is one episode."""
    if mode == "token-mean":
        return (x * mask).sum() / mask.sum().clamp(min=1)
    per_seq = (x * mask).sum(1)  # (B,)
    rows = mask.sum(1) > 0
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / mask.sum(1).clamp(min=1)
    elif mode == "seq-mean-token-sum-norm":
        per_seq = per_seq / max_len
    else:
        raise ValueError(f"unknown aggregation {mode!r}")
    return per_seq[rows].mean() if rows.any() else per_seq.sum() * 0


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref), per token; clamped so it never overflows."""
    d = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1).clamp(min=0.0)


def _grouped_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, groups: torch.Tensor | None) -> torch.Tensor:
    """Mean log-ratio per episode (groups=None) or per (episode, turn), broadcast back to tokens."""
    if groups is None:
        mean = (log_ratio * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)  # (B, 1)
        return mean.expand_as(log_ratio)
    g = groups.clamp(min=0)  # (B, T) turn index
    K = int(g.max().item()) + 1
    sums = torch.zeros(log_ratio.shape[0], K, dtype=log_ratio.dtype).scatter_add(1, g, log_ratio * mask)
    counts = torch.zeros(log_ratio.shape[0], K, dtype=log_ratio.dtype).scatter_add(1, g, mask)
    return (sums / counts.clamp(min=1)).gather(1, g)


def policy_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    turn_index: torch.Tensor | None = None,
    is_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss and its statistics. All tensors (B, T); `mask` is 1 on trained action tokens.

    Decoupled PPO (episodes from older policies): pass the proximal policy's log-probs as
    `behaviour_logp` (the ratio is clipped against it) and the capped weights min(pi_prox / mu, C) as
    `is_weight`, which scale each token's clipped term (no gradient flows through them)."""
    mask = mask.float()
    log_ratio = logp - behaviour_logp  # (B, T)
    if cfg.ratio != "token":
        # GSPO: one ratio per sequence (or turn); its gradient reaches every token through the mean
        log_ratio = _grouped_log_ratio(log_ratio, mask, turn_index if cfg.ratio == "turn" else None)
    ratio = torch.exp(log_ratio.clamp(max=20.0))
    clipped = ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    per_token = -torch.min(ratio * advantages, clipped * advantages)  # (B, T)
    if cfg.dual_clip is not None:
        per_token = torch.where(advantages < 0, torch.min(per_token, -cfg.dual_clip * advantages), per_token)
    if is_weight is not None:
        per_token = per_token * is_weight.detach()
    pg = aggregate(per_token, mask, cfg.agg, cfg.max_len)
    loss = pg
    stats: dict[str, float] = {"pg_loss": pg.item()}
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        stats["clip_low_frac"] = float(((ratio < 1 - cfg.eps_low) & (advantages < 0)).float().mul(mask).sum() / n)
        stats["clip_high_frac"] = float(((ratio > 1 + cfg.eps_high) & (advantages > 0)).float().mul(mask).sum() / n)
        stats["approx_kl_behaviour"] = float(((ratio - 1) - log_ratio).mul(mask).sum() / n)
        stats["ratio_mean"] = float(ratio.mul(mask).sum() / n)
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp)
        kl_agg = aggregate(kl, mask, cfg.agg, cfg.max_len)
        stats["kl"] = float(kl.detach().mul(mask).sum() / mask.sum().clamp(min=1))
        if cfg.kl_coef > 0:
            loss = loss + cfg.kl_coef * kl_agg
    if entropy is not None:
        stats["entropy"] = float(entropy.detach().mul(mask).sum() / mask.sum().clamp(min=1))
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * aggregate(entropy, mask, cfg.agg, cfg.max_len)
    stats["loss"] = loss.item()
    return loss, stats
