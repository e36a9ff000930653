"""Stage two: preference optimisation on multi-turn episodes: DPO, SimPO, IPO.

A sequence's log-probability is the sum over its *action* tokens only (observations and the
prompt are masked, as everywhere in agentrl). With s = log pi(y) and s_ref = log pi_ref(y):

    DPO   (Rafailov et al. 2023):  -log sigmoid(beta * [(s_c - s_ref,c) - (s_r - s_ref,r)])
    IPO   (Azar et al. 2023):      ([(s_c - s_ref,c) - (s_r - s_ref,r)] - 1 / (2 beta))^2
    SimPO (Meng et al. 2024):      -log sigmoid(beta * s_c / |y_c| - beta * s_r / |y_r| - gamma)
                                   (no reference; |y| = number of action tokens)

>>> import torch
>>> t = torch.tensor
>>> loss, m = preference_loss(t([-1.0]), t([-3.0]), t([-2.0]), t([-2.0]), "dpo", beta=0.5)
>>> round(loss.item(), 4), m["accuracy"]
(0.3133, 1.0)
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from agentrl.config import DPOConfig, PrefLoss
from agentrl.core import Episode
from agentrl.memory import MemoryWatch
from agentrl.policy import MIN_SHARED_HEAD, adamw, pass_tokens, token_stats
from agentrl.store import make_batch, segment_batch

LOG = logging.getLogger(__name__)


def sequence_logp(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) token log-probs -> (B,) sums over the action tokens."""
    return (logp * mask).sum(1)


def preference_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    ref_chosen: torch.Tensor | None,
    ref_rejected: torch.Tensor | None,
    kind: PrefLoss,
    beta: float,
    gamma: float = 0.5,
    len_chosen: torch.Tensor | None = None,
    len_rejected: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss over pairs (B,) of sequence log-probs, and its statistics (rewards, margins, accuracy)."""
    if kind == "simpo":
        if len_chosen is None or len_rejected is None:
            raise ValueError("simpo needs the action-token lengths of both sides")
        r_c = beta * chosen / len_chosen.clamp(min=1)
        r_r = beta * rejected / len_rejected.clamp(min=1)
        loss = -F.logsigmoid(r_c - r_r - gamma)
    else:
        if ref_chosen is None or ref_rejected is None:
            raise ValueError(f"{kind} needs reference log-probs")
        h = (chosen - ref_chosen) - (rejected - ref_rejected)
        r_c, r_r = beta * (chosen - ref_chosen), beta * (rejected - ref_rejected)
        loss = -F.logsigmoid(beta * h) if kind == "dpo" else (h - 1 / (2 * beta)) ** 2
    with torch.no_grad():
        stats = {
            "rewards_chosen": float(r_c.mean()),
            "rewards_rejected": float(r_r.mean()),
            "margin": float((r_c - r_r).mean()),
            "accuracy": float((r_c > r_r).float().mean()),
        }
    return loss.mean(), stats


def pairs_from_episodes(episodes: Sequence[Episode], max_per_group: int = 4,
                        seed: int = 0) -> tuple[list[tuple[Episode, Episode]], dict[str, int]]:
    """Within each group (one task, one initial state), a passing episode against a failing one."""
    rng = random.Random(seed)
    groups: dict[int, list[Episode]] = {}
    for e in episodes:
        groups.setdefault(e.group_id, []).append(e)
    pairs, counts = [], {"groups": len(groups), "groups_without_pair": 0, "identical": 0}
    for eps in groups.values():
        good = [e for e in eps if e.passed and not e.error]
        bad = [e for e in eps if not e.passed and not e.error]
        cands = [(g, b) for g in good for b in bad]
        rng.shuffle(cands)
        kept = 0
        for g, b in cands:
            if g.token_ids() == b.token_ids():
                counts["identical"] += 1
                continue
            pairs.append((g, b))
            kept += 1
            if kept >= max_per_group:
                break
        counts["groups_without_pair"] += int(kept == 0)
    return pairs, counts


def _seq_logps(model: torch.nn.Module, episodes: list[Episode], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each episode's summed action log-prob and its action tokens, in one forward. The output layer runs at the
    action positions only (on SmolLM2 the vocabulary's logits at every position cost more memory than a token's
    layers), and episodes that begin alike run their common head once: a pair's two sides are the same task's."""
    batch = segment_batch(make_batch(episodes, pad_id))  # segments: summed back into their episode below
    device = next(model.parameters()).device
    mask = batch.action_mask.to(device)
    lp = token_stats(model, batch.input_ids.to(device), batch.attention_mask.to(device), only=mask,
                     share_heads=MIN_SHARED_HEAD).logp
    logp, tokens = sequence_logp(lp, mask), mask.sum(1)
    if batch.seg_row is None:
        return logp, tokens
    rows = batch.seg_row.to(device)
    return (torch.zeros(len(episodes), device=device, dtype=logp.dtype).index_add(0, rows, logp),
            torch.zeros(len(episodes), device=device, dtype=tokens.dtype).index_add(0, rows, tokens))


def micro_pairs(chunk: Sequence[tuple[Episode, Episode]], max_tokens: int) -> list[list[tuple[Episode, Episode]]]:
    """`chunk`'s pairs, in order, as runs whose forward fits `max_tokens` padded tokens: k pairs are one batch of
    2k episodes padded to the longest (`_pairs_loss`), so they cost 2k times it. A pair longer than the cap runs
    alone.

    >>> ep = lambda n: Episode(list(range(n)), [])
    >>> [len(run) for run in micro_pairs([(ep(100), ep(60))] * 3 + [(ep(300), ep(10))], 400)]
    [2, 1, 1]
    """
    runs: list[list[tuple[Episode, Episode]]] = []
    longest = 0
    for pair in chunk:
        length = max(len(pair[0].token_ids()), len(pair[1].token_ids()))
        if runs and 2 * (len(runs[-1]) + 1) * max(longest, length) <= max_tokens:
            runs[-1].append(pair)
            longest = max(longest, length)
        else:
            runs.append([pair])
            longest = length
    return runs


def train_preferences(
    model: torch.nn.Module,
    reference: torch.nn.Module | None,
    pairs: Sequence[tuple[Episode, Episode]],
    pad_id: int,
    cfg: DPOConfig,
    seed: int = 0,
    log: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, float]:
    """Optimise `model` on preference pairs; `reference` is frozen (unused by SimPO).

    A step's `cfg.batch_pairs` pairs run as micro-batches of whole pairs (`micro_pairs`, at most
    `cfg.max_batch_tokens` padded tokens; None: `pass_tokens(model)`). Each pair's loss depends on its own two
    episodes only, so a micro-batch's mean loss weighted by its share of the batch's pairs gives the batch's
    mean, and the gradients add up to the whole batch's."""
    if not pairs:
        raise ValueError("no preference pairs to train on")
    if cfg.loss != "simpo" and reference is None:
        raise ValueError(f"{cfg.loss} needs a frozen reference model")
    max_tokens = cfg.max_batch_tokens or pass_tokens(model)
    opt = adamw(model.parameters(), lr=cfg.lr)
    rng = random.Random(seed)
    order = list(range(len(pairs)))
    model.train()
    t0, step, agg = time.perf_counter(), 0, {}
    memory = MemoryWatch("dpo.max_batch_tokens", say=LOG.warning)
    for epoch in range(cfg.epochs):
        rng.shuffle(order)
        for i in range(0, len(order), cfg.batch_pairs):
            chunk = [pairs[j] for j in order[i : i + cfg.batch_pairs]]
            opt.zero_grad(set_to_none=True)
            stats: dict[str, float] = {}
            for run in micro_pairs(chunk, max_tokens):
                share = len(run) / len(chunk)
                loss, part = _pairs_loss(model, reference, run, pad_id, cfg)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"non-finite {cfg.loss} loss at step {step}: {part}")
                (loss * share).backward()
                for k, v in {"loss": loss.item(), **part}.items():
                    stats[k] = stats.get(k, 0.0) + v * share
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            agg = stats
            memory()
            if log is not None:
                log({"dpo/step": step, "dpo/epoch": epoch, **{f"dpo/{k}": v for k, v in stats.items()}})
        # one line an epoch, with the time left: a stage that runs a minute must not run silently
        spent = time.perf_counter() - t0
        LOG.info("%s epoch %d/%d: loss %.4f, margin %.3f, accuracy %.2f (%.0f s, about %.0f s left)", cfg.loss,
                 epoch + 1, cfg.epochs, agg.get("loss", float("nan")), agg.get("margin", float("nan")),
                 agg.get("accuracy", float("nan")), spent, spent / (epoch + 1) * (cfg.epochs - epoch - 1))
    model.eval()
    return {**{f"dpo/{k}": v for k, v in agg.items()}, "dpo/steps": step, "dpo/pairs": len(pairs),
            "dpo/seconds": time.perf_counter() - t0}


def _pairs_loss(model: torch.nn.Module, reference: torch.nn.Module | None, run: list[tuple[Episode, Episode]],
                pad_id: int, cfg: DPOConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """The mean preference loss over `run`'s pairs (with RPO's NLL term), and its statistics."""
    k, both = len(run), [c for c, _ in run] + [r for _, r in run]  # one forward: the sides share their prompts
    s, n = _seq_logps(model, both, pad_id)
    (s_c, s_r), (n_c, n_r) = s.split(k), n.split(k)
    ref_c = ref_r = None
    if cfg.loss != "simpo":
        with torch.inference_mode():
            ref, _ = _seq_logps(reference, both, pad_id)
        ref_c, ref_r = ref.clone().split(k)
    loss, stats = preference_loss(s_c, s_r, ref_c, ref_r, cfg.loss, cfg.resolved_beta, cfg.simpo_gamma, n_c, n_r)
    if cfg.nll_weight > 0:
        nll = (-s_c / n_c.clamp(min=1)).mean()
        loss = loss + cfg.nll_weight * nll
        stats["nll_chosen"] = nll.item()
    return loss, stats
