"""The engine/trainer gap: how far the rollout engine's log-probs are from the trainer's under the same
weights, measured every update, and the corrections `loss.mismatch` chooses (docs/algorithms.md,
'Engine mismatch'). Pure functions over (B, T) tensors, like agentrl.loss.

Four log-probs of each sampled action token, three ratios:

    mu        the engine's, at sampling time                   batch.behaviour_logp
    pi_old    the trainer's, under the weights that sampled    batch.sampler_logp
    pi_prox   the trainer's weights at this update's start     batch.prox_logp (decoupled PPO only)
    pi_theta  the weights being trained

    pi_old / mu          the mismatch: 1 in exact arithmetic; an engine in bf16 or with other kernels moves it
    pi_prox / pi_old     staleness: how far the weights moved since sampling (rollout.max_staleness)
    pi_theta / pi_prox   PPO's ratio, the one that is clipped (pi_old when rollouts are on-policy)

Token weights [0.4, 0.8, 6.0] under bounds [0.5, 5] keep only 0.8:

>>> import torch
>>> from agentrl.config import LossConfig
>>> cfg = LossConfig(mismatch="token-mask")
>>> w, keep = correction(torch.log(torch.tensor([[0.4, 0.8, 6.0]])), torch.ones(1, 3), cfg)
>>> keep.tolist(), w.tolist()
([[0.0, 1.0, 0.0]], [[1.0, 1.0, 1.0]])
"""

from __future__ import annotations

import math

import torch

from agentrl.config import LossConfig

MAX_LOG = 20.0  # exp(20) ~ 5e8: a ratio past it is "huge" already, and exp never overflows


def sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """(B,) one log-ratio per episode: the sum over its action tokens (`product`: the exact sequence
    importance weight) or their mean (`geometric`)."""
    total = (log_ratio * mask).sum(1)  # (B,)
    return total if how == "product" else total / mask.sum(1).clamp(min=1)


def correction(log_ratio: torch.Tensor, mask: torch.Tensor, cfg: LossConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, keep), both (B, T), for log_ratio = log pi_old - log mu on the action tokens `mask`.

    `weight` multiplies each token's clipped term (no gradient flows through it); `keep` is the mask the
    loss averages over: the rejected tokens of token-mask and seq-mask leave the denominator as well,
    ICE-POP's masked tokens stay in it with weight 0 (as the paper writes its objective)."""
    mask = mask.float()
    log_ratio = log_ratio.clamp(-MAX_LOG, MAX_LOG) * mask  # padding's values never matter
    ones = torch.ones_like(mask)
    mode = cfg.mismatch
    lo, hi = math.log(cfg.mismatch_low), math.log(cfg.mismatch_high)
    if mode == "none":
        return ones, mask
    if mode == "token-tis":
        return torch.exp(log_ratio).clamp(max=cfg.mismatch_cap), mask
    seq = sequence_log_ratio(log_ratio, mask, cfg.mismatch_seq)[:, None].expand_as(mask)  # (B, T)
    if mode == "seq-tis":
        return torch.exp(seq).clamp(max=cfg.mismatch_cap), mask
    if mode == "seq-mask":
        return ones, mask * ((seq >= lo) & (seq <= hi)).float()
    inside = ((log_ratio >= lo) & (log_ratio <= hi)).float()  # (B, T)
    if mode == "token-mask":
        return ones, mask * inside
    if mode == "icepop":
        return torch.exp(log_ratio) * inside, mask
    raise ValueError(f"unknown loss.mismatch {mode!r}")


def capped_ratio(log_ratio: torch.Tensor, cap: float, mask: torch.Tensor) -> torch.Tensor:
    """min(exp(log_ratio), cap) on the mask, 0 elsewhere: decoupled PPO's staleness weight."""
    return torch.exp(log_ratio.clamp(max=MAX_LOG)).clamp(max=cap) * mask


def loss_terms(behaviour: torch.Tensor, sampler: torch.Tensor | None, prox: torch.Tensor | None,
               mask: torch.Tensor, cfg: LossConfig) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(what PPO's ratio is taken against, the per-token weight on its clipped term or None for 1, the
    mask the loss averages over), for the action tokens `mask`.

    With no mismatch correction the loss is what it always was: the ratio against mu, or (decoupled)
    against pi_prox with the weight min(pi_prox / mu, is_cap), which lumps staleness and mismatch
    together. With one, the two are kept apart: the ratio against pi_old (on-policy) or pi_prox
    (decoupled), and the weight is the correction's weight of pi_old / mu, times min(pi_prox / pi_old,
    is_cap) when decoupled; the mask is the correction's `keep`."""
    if cfg.mismatch == "none" or sampler is None:
        if prox is None:
            return behaviour, None, mask
        return prox, capped_ratio(prox - behaviour, cfg.is_cap, mask), mask
    weight, keep = correction(sampler - behaviour, mask, cfg)
    if prox is None:
        return sampler, weight, keep
    return prox, weight * capped_ratio(prox - sampler, cfg.is_cap, mask), keep


def stats(log_ratio: torch.Tensor, mask: torch.Tensor, cap: float) -> dict[str, float]:
    """The gap's diagnostics over the action tokens `mask`, for log_ratio = log pi_old - log mu, r its
    exp. The tokens were sampled from mu, so expectations under mu are plain means and those under
    pi_old carry the weight r:

        logp_diff_mean / _max   mean / max |log r|
        kl_k1, kl_k3            KL(mu || pi_old):  mean(-log r),   mean(r - 1 - log r)      (k3 >= 0)
        kl_rev_k1, kl_rev_k3    KL(pi_old || mu):  mean(r log r),  mean(1 - r + r log r)    (k3 >= 0)
        chi2                    chi^2(pi_old || mu) per token: mean((r - 1)^2)  (= E[r^2] - 1 as E_mu[r] = 1)
        ess                     (sum w)^2 / (n sum w^2) of the n episodes' weights w = prod_t r: 1 when all
                                are equal, 1/n when one carries the batch
        token_out_frac          share of tokens with r outside [1/cap, cap]
        seq_out_frac            share of episodes whose w is outside [1/cap, cap]

    >>> import torch
    >>> s = stats(torch.zeros(2, 3), torch.ones(2, 3), cap=2.0)
    >>> s["kl_k3"], s["ess"], s["token_out_frac"]
    (0.0, 1.0, 0.0)
    """
    m = mask > 0
    lr = log_ratio.double().clamp(-MAX_LOG, MAX_LOG)
    tok = lr[m]  # (N,)
    if tok.numel() == 0:
        return {}
    r = torch.exp(tok)
    rows = m.any(1)
    seq = (lr * m).sum(1)[rows]  # (n,) log of each episode's weight
    w = torch.exp(seq - seq.max())  # the scale cancels in the ESS
    band = math.log(cap)
    return {
        "logp_diff_mean": float(tok.abs().mean()),
        "logp_diff_max": float(tok.abs().max()),
        "kl_k1": float((-tok).mean()),
        "kl_k3": float((r - 1 - tok).mean()),
        "kl_rev_k1": float((r * tok).mean()),
        "kl_rev_k3": float((1 - r + r * tok).mean()),
        "chi2": float(((r - 1) ** 2).mean()),
        "ess": float(w.sum() ** 2 / (len(w) * (w**2).sum())),
        "token_out_frac": float((tok.abs() > band).double().mean()),
        "seq_out_frac": float((seq.abs() > band).double().mean()),
        "tokens": float(tok.numel()),
    }


__all__ = ["capped_ratio", "correction", "loss_terms", "sequence_log_ratio", "stats"]
