"""Sampling: one token per row from its logits, and the random numbers that make a row's sample its own.

A row's uniforms come from a counter-based generator keyed by its stream (the session's key and the caller's row
index) and its count of draws, so that a row's tokens do not depend on which rows share its batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from agentrl.config import SamplingConfig


def sample_tokens(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None = None,
                  uniforms: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return it and its log-prob under the temperature-scaled policy.

    The log-prob is taken before top-k/top-p truncation (as vLLM reports it), so that it matches
    what the learner recomputes from the same logits. With `uniforms` (B,) in [0, 1), row b takes
    the token where its cumulative distribution passes uniforms[b] (inverse-CDF sampling), so a
    row's sample depends on its own number only, not on the rows batched with it.
    """
    logits = logits.float()  # (B, V)
    if cfg.temperature == 0:
        tok = logits.argmax(-1)
        return tok, F.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)
    logits = logits / cfg.temperature
    logp = F.log_softmax(logits, -1)  # (B, V)
    masked = logits
    if cfg.top_k > 0 and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[:, -1:]
        masked = masked.masked_fill(masked < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(masked, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) > cfg.top_p  # keep the smallest set reaching top_p
        masked = masked.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = masked.softmax(-1)  # (B, V)
    if uniforms is None:
        tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)
    else:
        cdf = probs.cumsum(-1)  # (B, V)
        # right=True: the first token whose cdf exceeds u, never a zero-probability one
        target = (uniforms.to(cdf.dtype) * cdf[:, -1])[:, None]  # (B, 1)
        tok = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN, _MIX1, _MIX2 = _signed(0x9E3779B97F4A7C15), _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    return (x >> k) & ((1 << (64 - k)) - 1)  # logical shift of int64 (torch's >> keeps the sign)


def _splitmix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 on int64 tensors (products wrap modulo 2^64): a counter-based random number."""
    z = x + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def row_uniforms(stream: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """Uniforms in [0, 1), one per row, from each row's stream and draw counter (int64, (B,))."""
    return _shr(_splitmix(_splitmix(stream) + counter), 11).double() / float(1 << 53)
