"""The learner: the policy's trainable weights, the frozen reference, the optimizer, and the PPO step.

Following a rollout to the loss: `Trainer._updates` scores the batch (`reference_logp`, and where the run
needs them `teacher_logp`, `proximal_logp` and `sampler_logp`), the assigner turns it into `Credit`, and
`Learner.optimize` runs the step:

    for each of ppo_epochs:
        for each minibatch (the same rows on every rank):
            for each micro-batch of similar-length rows:
                logp, entropy = token_stats(model, rows)                 # (b, T) each
                loss = policy_loss(logp, behaviour logp, advantages, mask, ref_logp, entropy)
                backward(loss * the micro-batch's share of the minibatch)
            clip the gradient norm; step (skipped, and counted, when the loss or the gradient is not finite)

What several processes add (which rows are this rank's, zero-loss passes that keep every rank making the same
number of forwards, when DDP may all-reduce, averaging gradients by hand, agreeing on a NaN skip) lives in
`_Lockstep`, so the step above reads the same for one process and many.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from typing import Any

import torch

from agentrl.config import LossConfig, TrainConfig
from agentrl.credit import Credit
from agentrl.distributed import Ranks
from agentrl.health.interventions import Knobs
from agentrl.loss import policy_loss
from agentrl.mismatch import capped_ratio, correction, loss_terms
from agentrl.mismatch import stats as mismatch_stats
from agentrl.policy import MIN_SHARED_HEAD, Policy, adamw, add_lora, pass_tokens, shards_weights, token_stats
from agentrl.store import TurnBatch, segment_batch, to_episodes


class Learner:
    """What an update changes and what it is measured against. With LoRA only the adapters train and the KL
    reference is the same model with its adapters switched off; otherwise the reference is a frozen copy.
    `knobs` are the run's (interventions turn them): the loss's coefficients and the temperature the
    log-probs are taken at are read from them at every update."""

    def __init__(self, cfg: TrainConfig, policy: Policy, accelerator: Any, ranks: Ranks, knobs: Knobs,
                 teacher: Policy | None = None):
        self.cfg, self.policy, self.accelerator, self.ranks, self.knobs = cfg, policy, accelerator, ranks, knobs
        # distillation's teacher (agentrl.teacher: frozen, the student's tokenizer), scored like the reference
        self.teacher = teacher.model if teacher is not None else None
        # padded tokens a forward may take (optim.micro_batch_tokens); by the model's shape where not set
        self.micro_tokens = cfg.optim.micro_batch_tokens or min(16384, pass_tokens(policy.model))
        if cfg.optim.lora.r:
            policy.model = add_lora(policy.model, cfg.optim.lora)
            self.reference = None
        else:
            self.reference = copy.deepcopy(policy.model).eval().requires_grad_(False)
        self.trainable = [p for p in policy.model.parameters() if p.requires_grad]
        opt = adamw(self.trainable, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        self.model, self.optimizer = accelerator.prepare(policy.model, opt)
        # rollouts ahead: the trainable weights of each version episodes may still come from, so that the
        # engine's log-probs are compared with the trainer's under the weights that sampled (sampler_logp)
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self._past: torch.nn.Module | None = None  # the module a snapshot is loaded into for scoring

    def loss_config(self) -> LossConfig:
        """The loss's settings for the next update: the run's, with the knobs' coefficients."""
        return self.cfg.loss.model_copy(update=self.knobs.reads("loss"))

    @property
    def temperature(self) -> float:
        """The temperature log-probs are taken at: the one the engine samples at now."""
        return self.knobs.temperature or 1.0

    # -- the step -----------------------------------------------------------------------------------

    def optimize(self, batch: TurnBatch, credit: Credit, owner: torch.Tensor | None = None) -> dict[str, float]:
        """`ppo_epochs` passes of `minibatches` optimizer steps over the rows the credit keeps. Each minibatch
        runs as micro-batches of similar-length rows (`micro_tokens` padded tokens each), each loss
        weighted by its share of the minibatch's aggregate: the summed gradient is the minibatch's, and no row
        is padded to a longer one outside its micro-batch.

        Several processes: `owner` (B,) names the rank of each row. Every rank holds the whole batch and draws
        the same minibatches, and runs forward and backward on its own rows of each (`_Lockstep`); the step is
        the one-process step."""
        if nothing_to_train(credit):
            return {"train/skipped": 1.0, "train/trained_episodes": 0.0}
        cfg, loss_cfg = self.cfg.optim, self.loss_config()
        rows = (credit.row_weight > 0).nonzero(as_tuple=True)[0]
        batch = batch.select(rows).with_(advantages=credit.advantages[rows])  # travels with select() and trim()
        mine = torch.ones(batch.size, dtype=torch.bool) if owner is None else owner[rows] == self.ranks.rank
        batch = segment_batch(batch)  # each action on exactly its context, where a template rewrote the history
        mine = mine if batch.seg_row is None else mine[batch.seg_row]
        lockstep = _Lockstep(self)
        tally = _Tally()
        # not scored before (on-policy, no correction): the first minibatch's forwards, before any step, are the
        # trainer's log-probs under the weights that sampled, and the engine's gap is measured on them for free
        probe = _GapProbe(self.ranks) if batch.sampler_logp is None else None
        self.model.train()
        for _ in range(cfg.ppo_epochs):
            perm = self.ranks.broadcast(torch.randperm(batch.size))  # the same minibatches on every rank
            for chunk in torch.chunk(perm, min(cfg.minibatches, batch.size)):
                first = probe if tally.steps == 0 else None
                finite = self._minibatch(batch.select(chunk), mine[chunk].nonzero(as_tuple=True)[0], loss_cfg,
                                         lockstep, tally, first)
                self._step(lockstep.agree(finite), tally)
                if first is not None:
                    tally.measured = first.stats(batch.select(chunk), loss_cfg.mismatch_cap)
                tally.steps += 1
        self.model.eval()
        return tally.metrics(self.ranks, batch)

    def _minibatch(self, mb: TurnBatch, own_rows: torch.Tensor, loss_cfg: LossConfig, lockstep: _Lockstep,
                   tally: _Tally, probe: _GapProbe | None) -> bool:
        """Forward and backward over this rank's rows of one minibatch (`own_rows`, positions in `mb`), the
        gradients summed; returns whether every loss was finite."""
        own = mb.select(own_rows)
        _, _, mb_mask = loss_terms(mb.behaviour_logp, mb.sampler_logp, mb.prox_logp, mb.action_mask, loss_cfg)
        if probe is not None:
            probe.start(mb)
        self.optimizer.zero_grad(set_to_none=True)
        finite = True
        parts = lockstep.micro_batches(own)
        for j, idx in enumerate(parts):
            m = (own.select(idx) if idx is not None else mb.select([0])).trim().to(self.accelerator.device)
            with lockstep.backward_context(last=j == len(parts) - 1):
                with self.accelerator.autocast():  # bf16 on CUDA
                    ts = token_stats(lockstep.module, m.input_ids, m.attention_mask, self.temperature, entropy=True,
                                     only=m.action_mask, share_heads=self.share_heads)
                if probe is not None and idx is not None:
                    probe.record(own_rows[idx], ts.logp)
                # the ratio's baseline and weight: mu; decoupled PPO's pi_prox and min(pi_prox / mu, C); a
                # mismatch correction's pi_old and its weight (agentrl.mismatch.loss_terms)
                against, weight, mask = loss_terms(m.behaviour_logp, m.sampler_logp, m.prox_logp, m.action_mask,
                                                   loss_cfg)
                loss, s = policy_loss(ts.logp, against, m.advantages, mask, loss_cfg, ref_logp=m.ref_logp,
                                      entropy=ts.entropy, turn_index=m.turn_index, is_weight=weight)
                if idx is None or not torch.isfinite(loss):
                    finite = finite and idx is None
                    self.accelerator.backward(ts.logp.sum() * 0.0)  # the all-reduce, without a gradient
                    continue
                share = _share(mask, mb_mask, loss_cfg.agg)
                self.accelerator.backward(loss * (share * self.ranks.world))  # x world: undoes DDP's mean
            tally.add(s, share, m, ts.shared)
        return finite

    def _step(self, finite: bool, tally: _Tally) -> None:
        """Clip and step. A non-finite loss or gradient skips the step (the weights stay sound) and raises the
        NON-FINITE alarm, which ends the run after logging it."""
        gn = self.accelerator.clip_grad_norm_(self.trainable, self.cfg.optim.max_grad_norm) if finite \
            else float("nan")
        tally.grad_norms += float(gn)
        if math.isfinite(float(gn)):
            self.optimizer.step()
        else:
            tally.nonfinite += 1.0
        self.optimizer.zero_grad(set_to_none=True)

    # -- log-probs the batch is scored with before the step -------------------------------------------

    def reference_logp(self, batch: TurnBatch, owner: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) log-probs under the reference, once per batch: the frozen copy, or with LoRA the same
        model with its adapters switched off. With `owner` (several processes), each rank scores its own
        rows and the rows are exchanged."""
        off = self.policy.model.disable_adapter() if self.reference is None else contextlib.nullcontext()
        with off:
            return self.score(batch, self.reference if self.reference is not None else self.scorer(), owner)

    def teacher_logp(self, batch: TurnBatch, owner: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) log-probs under the frozen teacher (on-policy distillation), once per batch, in the reference's
        micro-batches and on each action's own context (segments included); with `owner`, as `reference_logp`."""
        if self.teacher is None:
            raise ValueError("teacher_logp: this learner holds no teacher (TrainConfig.teacher, for --algo distill)")
        return self.score(batch, self.teacher, owner)

    def proximal_logp(self, batch: TurnBatch) -> torch.Tensor:
        """(B, T) log-probs under the weights as they are before this update's first step: the proximal
        policy of decoupled PPO (one extra forward per batch)."""
        return self.score(batch, self.scorer(), None)

    def sampler_logp(self, batch: TurnBatch, update: int, owner: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) the trainer's log-probs of each episode under the weights that sampled it (its policy_version),
        to hold against the engine's (`behaviour_logp`). On-policy those are the learner's before this update's
        first step (the proximal policy's, reused when the batch has them); rollouts ahead score their older
        versions from the snapshots kept of each. One forward per batch in all. A version no longer kept (the
        first updates after a resume) is scored under the learner's weights: that gap holds one update's drift."""
        now = update - 1  # the learner's version: updates applied so far
        versions = [e.policy_version for e in batch.episodes]
        if all(v == now for v in versions):
            return batch.prox_logp if batch.prox_logp is not None else self.score(batch, self.scorer(), owner)
        out = batch.prox_logp.clone() if batch.prox_logp is not None else torch.zeros(batch.input_ids.shape)
        for v in sorted(set(versions)):
            if v == now and batch.prox_logp is not None:
                continue
            rows = torch.tensor([i for i, x in enumerate(versions) if x == v])
            out[rows] = self.score(batch.select(rows), self._version_model(v, now), None)
        return out

    def score(self, batch: TurnBatch, model: torch.nn.Module, owner: torch.Tensor | None) -> torch.Tensor:
        """(B, T) log-probs of the action tokens under `model`, in micro-batches; with `owner`, each rank
        scores its own rows and the rows are exchanged."""
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        rows = torch.arange(batch.size) if owner is None else (owner == self.ranks.rank).nonzero(as_tuple=True)[0]
        own = segment_batch(batch.select(rows))  # rows are segments where a template rewrote the history
        scored = out if own.seg_row is None else torch.zeros(own.input_ids.shape, dtype=torch.float32)
        parts: list[torch.Tensor | None] = \
            own.micro_batches(self.micro_tokens, self.share_heads > 0) if own.size else []
        if owner is not None and shards_weights(model):  # every forward gathers weights: as many on every rank
            parts += [None] * (max(self.ranks.gather(len(parts))) - len(parts))
        with torch.inference_mode(), self.accelerator.autocast():
            for idx in parts:
                m = (own.select(idx) if idx is not None else batch.select([0])).trim().to(self.accelerator.device)
                logp = token_stats(model, m.input_ids, m.attention_mask, self.temperature, only=m.action_mask,
                                   share_heads=self.share_heads).logp
                if idx is not None:
                    scored[rows[idx] if own.seg_row is None else idx, : m.input_ids.shape[1]] = logp.float().cpu()
        if own.seg_row is not None:
            out += to_episodes(scored, own, out.shape, rows)
        if owner is not None and self.ranks.world > 1:
            lengths = batch.attention_mask.sum(1)
            mine = {int(r): out[r, : int(lengths[r])].clone() for r in rows}
            for part in self.ranks.gather(mine):
                for r, logp in part.items():
                    out[r, : len(logp)] = logp
        return out

    def scorer(self) -> torch.nn.Module:
        """The module log-probs are taken with outside the step. Scoring never trains: the unwrapped module (no
        DDP forward, whose all-reduce would wait for a backward), unless the wrapper shards the weights (FSDP,
        DeepSpeed), whose own forward must gather them."""
        return self.model if shards_weights(self.model) else self.accelerator.unwrap_model(self.model)

    def _version_model(self, version: int, now: int) -> torch.nn.Module:
        """A module holding the weights of `version` (the learner itself for its own or an unkept version)."""
        if version == now or version not in self.snapshots:
            return self.scorer()
        if self._past is None:
            self._past = copy.deepcopy(self.accelerator.unwrap_model(self.model)).eval().requires_grad_(False)
        self._past.load_state_dict(self.snapshots[version], strict=False)
        return self._past

    def trainable_copy(self) -> dict[str, torch.Tensor]:
        """The trainable weights as they stand, detached (what an actor or a snapshot is loaded from)."""
        model = self.accelerator.unwrap_model(self.model)
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    def mismatch_metrics(self, batch: TurnBatch, trained: torch.Tensor) -> dict[str, float]:
        """`mismatch/*` over the action tokens of the `trained` (B,) rows (agentrl.mismatch.stats), what a
        correction keeps and weighs, and (decoupled PPO) the staleness ratio pi_prox / pi_old on its own."""
        cfg = self.cfg.loss
        mask = batch.action_mask * trained[:, None].float()
        log_ratio = batch.sampler_logp - batch.behaviour_logp
        out = {f"mismatch/{k}": v for k, v in mismatch_stats(log_ratio, mask, cfg.mismatch_cap).items()}
        n = float(mask.sum())
        if cfg.mismatch != "none" and n > 0:
            weight, keep = correction(log_ratio, mask, cfg)
            out["mismatch/kept_frac"] = float(keep.sum()) / n
            out["mismatch/weight_mean"] = float((weight * keep).sum() / keep.sum().clamp(min=1))
        if batch.prox_logp is not None and n > 0:  # the part of decoupled PPO's pi_prox / mu that is staleness
            stale = capped_ratio(batch.prox_logp - batch.sampler_logp, cfg.is_cap, mask)[mask > 0]
            drift = mismatch_stats(batch.prox_logp - batch.sampler_logp, mask, cfg.mismatch_cap)
            out.update({"train/staleness_weight_mean": float(stale.mean()), "train/staleness_weight_max":
                        float(stale.max()), "train/staleness_kl_k3": drift["kl_k3"]})
        return out

    @property
    def share_heads(self) -> int:
        """`token_stats(share_heads=...)`: what a shared prompt must save; 0 when `optim.share_prefix` is off."""
        return MIN_SHARED_HEAD if self.cfg.optim.share_prefix else 0


class _Lockstep:
    """The step's multi-process bookkeeping. One process: micro-batches as they come, every backward syncs
    (there is nothing to sync), no agreement needed. Several:
    - every rank makes as many forwards and backwards as the busiest (FSDP and ZeRO gather weights in each,
      ZeRO-2 reduces in each): a rank short of rows pads with zero-loss passes (`None` parts);
    - DDP all-reduces on a minibatch's last backward only (`no_sync` before it), and DeepSpeed is told which
      backward is last, or it steps its own optimizer on each;
    - under DDP with `optim.share_prefix` the forwards run on the unwrapped module, so that a group's prompt
      runs through the layers once on each rank as in one process (DDP's own forward must see the whole rows),
      every micro-batch outside DDP's sync, and the gradients are averaged after the last one in one
      all-reduce (`Ranks.mean_grads`): the same mean, and no rank pads with zero-loss passes;
    - a non-finite loss on one rank skips the step on all."""

    def __init__(self, learner: Learner):
        self.learner, self.ranks, self.accelerator = learner, learner.ranks, learner.accelerator
        self.by_hand = (self.ranks.world > 1 and learner.share_heads > 0
                        and isinstance(learner.model, torch.nn.parallel.DistributedDataParallel))
        self.module = learner.scorer() if self.by_hand else learner.model  # what the step's forwards run on

    def micro_batches(self, own: TurnBatch) -> list[torch.Tensor | None]:
        """This rank's micro-batches of its rows `own`, padded with `None` to the busiest rank's count."""
        parts: list[torch.Tensor | None] = \
            own.micro_batches(self.learner.micro_tokens, self.learner.share_heads > 0) \
            if own.size else []
        if self.ranks.world > 1 and not self.by_hand:
            parts += [None] * (max(self.ranks.gather(len(parts))) - len(parts))
        return parts or [None]

    def backward_context(self, last: bool) -> contextlib.AbstractContextManager:
        """Where one micro-batch's backward runs: DDP's sync on the minibatch's last only."""
        from accelerate.utils import DistributedType

        if self.accelerator.distributed_type == DistributedType.DEEPSPEED:
            self.accelerator.gradient_state._set_sync_gradients(last)
        if last and not self.by_hand:
            return contextlib.nullcontext()
        return self.accelerator.no_sync(self.learner.model)

    def agree(self, finite: bool) -> bool:
        """After a minibatch's backwards: the gradients averaged (by hand where DDP did not), and whether every
        rank's losses were finite."""
        if self.by_hand:
            self.ranks.mean_grads(self.learner.trainable)
        return not self.ranks.sum({"nonfinite": float(not finite)})["nonfinite"]


class _GapProbe:
    """The first minibatch's log-probs, each row filled by its own rank, put together after that minibatch:
    the engine's gap to the trainer (`mismatch/*`) at no extra forward."""

    def __init__(self, ranks: Ranks):
        self.ranks = ranks
        self.logp = torch.zeros(0)

    def start(self, mb: TurnBatch) -> None:
        self.logp = torch.zeros(mb.input_ids.shape)  # (b, T)

    def record(self, rows: torch.Tensor, logp: torch.Tensor) -> None:
        self.logp[rows, : logp.shape[1]] = logp.detach().float().cpu()

    def stats(self, mb: TurnBatch, cap: float) -> dict[str, float]:
        if self.ranks.world > 1:  # every row filled by its own rank alone, zeros elsewhere
            self.logp = torch.stack(self.ranks.gather(self.logp)).sum(0)
        return mismatch_stats(self.logp - mb.behaviour_logp, mb.action_mask, cap)


class _Tally:
    """What one `optimize` call logs: the loss's statistics weighted by each micro-batch's share, token counts,
    gradient norms, skipped steps."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.stats: dict[str, float] = {}  # this rank's part of each step's statistics: summed over ranks
        self.steps, self.tokens, self.padded, self.shared = 0, 0, 0, 0
        self.grad_norms, self.nonfinite = 0.0, 0.0
        self.measured: dict[str, float] = {}

    def add(self, s: dict[str, float], share: float, m: TurnBatch, shared: int) -> None:
        for k, v in s.items():
            self.stats[k] = self.stats.get(k, 0.0) + share * v
        self.tokens += int(m.attention_mask.sum())
        self.padded += m.input_ids.numel()
        self.shared += shared

    def metrics(self, ranks: Ranks, batch: TurnBatch) -> dict[str, float]:
        secs = time.perf_counter() - self.t0
        stats = ranks.sum({**self.stats, "__tokens": float(self.tokens), "__padded": float(self.padded),
                           "__shared": float(self.shared)})
        tokens, padded, shared = stats.pop("__tokens"), stats.pop("__padded"), stats.pop("__shared")
        secs = max(ranks.gather(secs))
        out = {f"train/{k}": v / self.steps for k, v in stats.items()}
        out["train/grad_norm"] = self.grad_norms / self.steps  # the same on every rank: norms of the mean gradient
        if self.nonfinite:
            out["train/nonfinite_steps"] = self.nonfinite / self.steps
        out["train/clip_frac"] = out.get("train/clip_low_frac", 0.0) + out.get("train/clip_high_frac", 0.0)
        out["train/trained_episodes"] = float(batch.size if batch.seg_row is None
                                              else len(set(batch.seg_row.tolist())))
        if batch.seg_row is not None:
            out["train/segments"] = float(batch.size)
        out["train/tokens_per_s"] = tokens / secs if secs > 0 else 0.0
        out["train/padding_frac"] = 1.0 - tokens / max(padded, 1)
        if shared:  # prompt tokens whose layers ran once for the rows sharing them (optim.share_prefix)
            out["train/prompt_tokens_shared"] = shared
        out.update({f"mismatch/{k}": v for k, v in self.measured.items()})
        return out


def nothing_to_train(credit: Credit) -> bool:
    """No episode kept, or every advantage zero: the update takes no optimizer step."""
    return not bool((credit.row_weight > 0).any()) or float(credit.advantages.abs().sum()) == 0.0


def _share(part: torch.Tensor, whole: torch.Tensor, agg: str) -> float:
    """A micro-batch's weight in its minibatch's loss: its share of the action tokens (token-mean)
    or of the episodes that have any (the per-sequence aggregations)."""
    if agg == "token-mean":
        return float(part.sum()) / max(float(whole.sum()), 1.0)
    return float((part.sum(1) > 0).sum()) / max(float((whole.sum(1) > 0).sum()), 1.0)


def is_weight(batch: TurnBatch, cap: float) -> torch.Tensor:
    """Decoupled PPO's per-token importance weight min(pi_prox / mu, cap), 0 off the action tokens."""
    return capped_ratio(batch.prox_logp - batch.behaviour_logp, cap, batch.action_mask)


__all__ = ["Learner", "is_weight", "nothing_to_train"]
