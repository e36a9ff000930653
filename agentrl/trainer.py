"""The RL loop, top to bottom: roll out groups, store them, assign credit, update the policy, log.

    for each update (Trainer._updates):
        episodes = collector.collect(update)      # task seeds x G, one batched generate per turn; store <- episodes
        batch    = make_batch(episodes) + reference log-probs (learner.reference_logp)
        credit   = assigner.assign(batch, assigner.fit(batch))
        learner.optimize(batch, credit)           # policy_loss(logp, behaviour logp, advantages, mask, ...)
        evaluate when due; log, check health (alarms, interventions); checkpoint when due (folder)

Four rooms: `Collector` (agentrl.collector: where episodes come from), `Learner` (agentrl.learner: the PPO step
and the log-probs it is measured against), `RunFolder` (agentrl.run_folder: files, checkpoints, signals; what a
checkpoint holds is agentrl.run_state) and this wiring. The trainer never branches on the assigner: it looks it
up in `ASSIGNERS` and calls `fit` and `assign`. Held-out evaluation (agentrl.evaluation) uses seeds that
training never draws; the evaluation sources (`eval.sources`, agentrl.eval_sources) are evaluated beside it at
step 0, at their own cadence and at the end.

With `AGENTRL_PHASE_LOG=FILE` in the environment the main process appends one line to FILE as the loop
enters each phase, `<unix time> <phase> <update>`: start, warm-eval, rollout, update (reference
log-probs, credit, optimizer steps), eval, log (health checks, metrics row), checkpoint (gathering
the state and writing it), final-eval, save (the HF folder, summary.json), done. Each line is one
append write(), so a process killed at any moment leaves the phase it was in as the last line
(benchmarks/kill_resume.py records it per kill). With rollouts running ahead, `rollout` is the wait
for one. Unset (the default), nothing is opened or written.
"""

from __future__ import annotations

import copy
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl import run_state
from agentrl.ahead import RolloutAhead
from agentrl.algorithms import get_spec
from agentrl.collector import Collector, sources
from agentrl.config import TrainConfig
from agentrl.core import Episode
from agentrl.credit import Credit, set_options
from agentrl.distributed import Ranks
from agentrl.engines import get_engine_spec
from agentrl.eval_sources import Source, evaluate_source, overlaps_training, resolve_sources
from agentrl.evaluation import EvalResult, eval_sampling, evaluate, make_engine, resolve_device
from agentrl.health.alarms import check, stops
from agentrl.health.interventions import Action, Knobs, plan
from agentrl.health.warm_start import warm_start_advice
from agentrl.learner import Learner, is_weight, nothing_to_train
from agentrl.memory import MemoryWatch
from agentrl.monitor import Monitor
from agentrl.policy import Policy
from agentrl.run_folder import CHECKPOINTS, RunFolder, distributed_kind, read_json, refuse_sharded
from agentrl.store import TurnBatch, make_batch
from agentrl.teacher import token_level_teacher
from agentrl.workers import make_pool

PHASE_LOG = "AGENTRL_PHASE_LOG"  # env var: a file the loop appends its phases to (module docstring)


class _Phases:
    """The phase log (AGENTRL_PHASE_LOG, module docstring): one append write per phase, nothing when unset."""

    def __init__(self, enabled: bool):
        path = os.environ.get(PHASE_LOG) if enabled else None
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if path else None

    def __call__(self, phase: str, update: int) -> None:
        if self.fd is not None:
            os.write(self.fd, f"{time.time():.6f} {phase} {update}\n".encode())

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Trainer:
    """One RL run. `Trainer(cfg).train()` is what `agentrl train` calls. Three parts do the work: the
    `Collector` (episodes), the `Learner` (the step) and the `RunFolder` (files, checkpoints, signals); the
    trainer wires them and runs `_updates`, the loop."""

    def __init__(self, cfg: TrainConfig, monitor: Monitor | None = None, start: str | Path | None = None,
                 decisions: dict[str, Any] | None = None, resume: bool = False, overwrite: bool = False,
                 runner: Any = None):
        """`start`: the policy to begin from when `cfg.model` is None (the tiny policy's warm start, which
        `agentrl.stages.pipeline.train` builds first). `decisions`: what was decided before the run (`--algo auto`'s
        pick), written into config.yaml's header and summary.json. `resume` continues the run in `cfg.out` from its
        newest checkpoint that verifies; `overwrite` first removes a previous run's files (a folder holding a run is
        refused otherwise). `runner`: where episodes come from instead of the env (`serve-policy`'s
        `RemoteRunner`); with `cfg.agent`, the gateway's runner is built here."""
        from accelerate import Accelerator

        # the run's own copy, read and never written: the knobs interventions turn live in self.knobs
        cfg = cfg.model_copy(deep=True)
        self.cfg = cfg
        # each source's env built and scorer imported now: a bad source fails before the run folder is made
        self.sources: list[Source] = resolve_sources(cfg)
        self.decisions = dict(decisions or {})
        device = resolve_device(cfg.device)
        bf16 = cfg.optim.bf16 and device.type == "cuda" and torch.cuda.is_bf16_supported()
        # first: under a multi-process launch this joins the process group (agentrl.distributed)
        self.accelerator = Accelerator(cpu=device.type == "cpu", mixed_precision="bf16" if bf16 else "no")
        if resume:  # before any work: the policy, the run folder and its checkpoints are not touched
            refuse_sharded(distributed_kind(self.accelerator.distributed_type), cfg.out)
        self.ranks = ranks = Ranks()
        self.phase = _Phases(ranks.main)
        if cfg.rollout.groups < ranks.world:
            raise ValueError(f"rollout.groups is {cfg.rollout.groups} but the run has {ranks.world} processes: each "
                             "process rolls out whole groups, so give it at least one group per process")
        self.folder = RunFolder(cfg, ranks, self.decisions, resume, overwrite, monitor)
        self.out, self.monitor = self.folder.out, self.folder.monitor
        self.memory = MemoryWatch("optim.micro_batch_tokens (the learner's) or rollout.groups",
                                  say=lambda m: self.monitor.say(f"[yellow]warning[/yellow]: {m}"))
        self.monitor.say(f"run folder: {self.out}" + (f" ({ranks.world} processes)" if ranks.world > 1 else ""))
        for s in self.sources:
            if overlaps_training(s, cfg):
                self.monitor.say(f"[yellow]warning[/yellow]: {s.where} evaluates the training env on seeds from "
                                 f"{s.seeds[0]}, which training draws (below eval.seed_offset {cfg.eval.seed_offset}):"
                                 " its pass rates are not held out")
        found = self.folder.latest() if resume else None

        random.seed(cfg.seed)  # the same on every rank: the ranks' generators move in step (agentrl.distributed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)

        source = cfg.model if cfg.model is not None else start
        if source is None:
            raise ValueError("no policy to train: set model (a folder or hub id), or pass start= the warm start "
                             "that agentrl.stages.warm_start.warm_start builds (agentrl.stages.pipeline.train(cfg) "
                             "does both)")
        self.policy = Policy.load(source, device=device, tool_format=cfg.tool_format, history=cfg.rollout.history)
        self.warm_start_dir = Path(start) if cfg.model is None else None
        if self.warm_start_dir is not None and "warm_start" not in self.decisions:  # pipeline.train records it
            self.decisions["warm_start"] = {"dir": str(self.warm_start_dir),
                                            "sft": read_json(self.warm_start_dir / "warm_start.json")}
        self.max_context = cfg.rollout.max_context or getattr(self.policy.model.config, "max_position_embeddings", 2048)

        self.spec = get_spec(cfg.algo)
        self.runner, self.envs = sources(cfg, ranks, runner, self.monitor.say)
        # what interventions may turn, in one object: the loss, the engine, the assigner and the envs get its values
        self.knobs = Knobs(entropy_coef=cfg.loss.entropy_coef, kl_coef=cfg.loss.kl_coef,
                           temperature=cfg.rollout.sampling.temperature,
                           base_temperature=cfg.rollout.sampling.temperature,
                           dynamic_sampling=cfg.credit.dynamic_sampling if self.spec.resampling else None,
                           verifier_tests=getattr(self.envs[0], "hidden_per_episode", None) if self.envs else None)

        # distillation (agentrl.teacher): a frozen teacher on the student's tokenizer, for an assigner that reads one
        teacher = token_level_teacher(cfg.teacher, self.policy, str(source), device, cfg.algo) \
            if self.spec.reads_teacher else None
        # LoRA, reference, teacher, optimizer
        self.learner = Learner(cfg, self.policy, self.accelerator, ranks, self.knobs, teacher=teacher)
        self.assigner = self.spec.load()(cfg.credit, policy=self.policy, train_config=cfg)
        # rollouts that run ahead generate from a copy of the weights (the actor), refreshed after every update
        self.actor = None
        if cfg.rollout.max_staleness:
            if ranks.world > 1:
                raise ValueError("rollout.max_staleness > 0 runs in one process for now: its rollout thread and the "
                                 "ranks' exchanges would share one process group; use max_staleness 0 with several")
            self.actor = copy.deepcopy(self.accelerator.unwrap_model(self.learner.model)).eval().requires_grad_(False)
        generator = self.policy if self.actor is None else Policy(self.actor, self.policy.tokenizer,
                                                                  self.policy.chat.tool_format)
        # sampling settings of its own: a turned temperature reaches it as a new copy (Trainer._hand_out)
        self.engine = make_engine(cfg, generator, cfg.rollout.sampling.model_copy(), seed=cfg.seed,
                                  capture_hidden=self.spec.reads_hidden(cfg.credit))
        # vLLM, or the torch engine sampling from a bf16 copy: weights of its own, synced after every update
        self.syncs_weights = get_engine_spec(cfg.engine).syncs_weights or getattr(self.engine, "owns_weights", False)
        self.workers = make_pool(cfg.rollout.env_workers, cfg.rollout.tool_timeout, cfg.rollout.tool_timeouts)
        self.collector = Collector(cfg, ranks, self.engine, self.policy.chat, self.max_context, self.envs,
                                   self.runner, self.workers, self.knobs, self.folder.store, self.monitor.say)
        # held-out evaluation samples at its own fixed temperature, whatever the run samples at or an
        # intervention chose, so that evaluations of different runs compare
        self.eval_sampling = eval_sampling(cfg)
        self.history: list[dict[str, Any]] = []  # every logged row: what the alarms read
        self.last_acted: dict[str, float] = {}  # intervention -> step it last acted (cooldowns)
        # where the loop stands: the last update done, the held-out evaluations the summary reads, why it stopped
        self.done = 0
        self.warm: EvalResult | None = None
        self.last_eval: EvalResult | None = None
        # each source's step-0 and latest results (name -> its metrics without the eval/<name>/ prefix): summary.json
        self.source_start: dict[str, dict[str, float]] = {}
        self.source_last: dict[str, dict[str, float]] = {}
        self.stopped: str | None = None
        self.resumed_from: Path | None = None
        self.checkpoint_seconds: list[float] = []  # what each checkpoint of this process cost
        if resume:
            self._resume(found)
        ranks.barrier()  # the main process has cut a resumed run's store before any rank writes its shard

    @property
    def source(self) -> str:
        """Where episodes come from, as the console and summary.json name it."""
        if self.cfg.agent is not None:
            return f"agent:{self.cfg.agent.entry}"
        return getattr(self.runner, "name", None) or self.cfg.env.id

    def evaluate(self) -> EvalResult:
        """The held-out evaluation, split over the ranks."""
        return evaluate(self.cfg, self.policy, self.eval_sampling, self.max_context, self.ranks, runner=self.runner)

    def evaluate_sources(self, step: int, sources: list[Source]) -> dict[str, float]:
        """Evaluate `sources` after update `step` (0: the starting model), one console line each; returns their
        metrics (eval/<name>/...) for the row."""
        metrics: dict[str, float] = {}
        for source in sources:
            result = evaluate_source(self.cfg, source, self.policy, self.max_context, self.ranks, self.monitor.say)
            self.monitor.say(result.line(step))
            self.source_last[source.cfg.name] = result.summary()
            if step == 0:
                self.source_start[source.cfg.name] = result.summary()
            metrics.update(result.metrics())
        return metrics

    # -- the run ------------------------------------------------------------------------------------

    def train(self, warm: EvalResult | None = None) -> dict[str, Any]:
        """Run every update (from the checkpoint's on a resumed run); `warm` reuses a held-out evaluation
        of this same starting policy. SIGTERM / SIGINT finish the update, save a checkpoint and exit."""
        self.phase("start", self.done)
        try:
            with self.folder.catching_signals(threading.current_thread() is threading.main_thread()):
                return self._train(warm)
        finally:
            self.phase.close()
            if self.runner is not None:
                self.runner.close()

    def _train(self, warm: EvalResult | None) -> dict[str, Any]:
        cfg = self.cfg
        t_start = time.perf_counter()
        trained = sum(p.numel() for p in self.learner.trainable)
        self.monitor.say(f"policy: {self.policy.num_parameters:,} parameters ({trained:,} trained); assigner: "
                         f"{cfg.algo}; {cfg.updates} updates of {cfg.rollout.groups}x{cfg.rollout.group_size} episodes "
                         f"on {self.source}")
        if self.warm is None:  # a fresh run (a resumed one has it from its checkpoint)
            self.phase("warm-eval", 0)
            self.warm = warm or self.evaluate()
            self.last_eval = self.warm
            self.monitor.say(f"warm start: held-out pass rate {self.warm.pass_rate:.3f} over {self.warm.episodes} "
                             "episodes")
            self._check_warm_start()
            # the starting model on every source, by the same code as every later evaluation
            self.history.append({"step": 0, **self.warm.metrics(), **self.evaluate_sources(0, self.sources)})
            self.monitor.log(self.history[-1])
            self.folder.agree_on_signal()
            self.folder.exit_on_signal(self.done)  # nothing to save yet: a resumed run starts over
        saved = self.resumed_from is not None
        ahead = self._start_ahead()
        try:
            saved = self._updates(ahead, saved)
        except BaseException:
            if ahead is not None:
                ahead.close(wait=False)
            raise
        if ahead is not None:
            ahead.close()
        if not saved and self.done:  # the end, when the last update was not saved (a stop by an alarm is)
            self.phase("checkpoint", self.done)
            self.checkpoint()
        self.folder.exit_on_signal(self.done)
        return self._finish(t_start, self.warm)

    def _start_ahead(self) -> RolloutAhead | None:
        """With `rollout.max_staleness`: the rollout thread, generating from the actor (the learner's weights as
        they stand: a resumed run's, not the ones first loaded). Also brings an engine with weights of its own
        up to a resumed run's."""
        if self.actor is not None and self.done < self.cfg.updates:
            with torch.no_grad():
                self.actor.load_state_dict(self.accelerator.unwrap_model(self.learner.model).state_dict())
        if self.syncs_weights and self.resumed_from is not None:  # the engine's copy was made before the resume
            self.engine.sync_weights(self.actor if self.actor is not None else self.policy.model)
        if self.actor is None or self.done >= self.cfg.updates:
            return None
        self.learner.snapshots = {self.done: self.learner.trainable_copy()}
        return RolloutAhead(self.collector.collect, self.actor, self.done + 1, self.cfg.updates,
                            self.cfg.rollout.max_staleness, version=self.done,
                            on_new_weights=self.engine.sync_weights if self.syncs_weights else None)

    def _updates(self, ahead: RolloutAhead | None, saved: bool) -> bool:
        """The updates from the next to the last (or to a stop); returns whether the last one was saved.
        Each update is the same steps in order: roll out, score, assign credit, optimise, hand the new
        weights to the engine, evaluate when due, log and check health, checkpoint when due."""
        for update in range(self.done + 1, self.cfg.updates + 1):
            if self.stopped:
                break
            t0 = time.perf_counter()
            episodes, metrics = self._rollout_step(update, ahead)
            t_roll = time.perf_counter() - t0  # with rollouts ahead: only the wait for one not yet done
            self.phase("update", update)
            batch, owner = self._score_step(update, episodes, metrics)
            credit = self._credit_step(batch, metrics)
            metrics.update(self.knobs.metrics())  # the knobs this update ran with
            if batch.sampler_logp is None and nothing_to_train(credit):
                # the gap is measured on the first step's forwards, and this update takes none: one forward here,
                # so that a run at the floor (a real model before SFT) still logs its engine's mismatch
                scored = batch.with_(sampler_logp=self.learner.sampler_logp(batch, update, owner))
                metrics.update(self.learner.mismatch_metrics(scored, torch.ones(batch.size, dtype=torch.bool)))
            metrics.update(self.learner.optimize(batch, credit, owner))
            self._say_critic_only(update, metrics)
            self._sync_step(update, ahead)
            metrics["time/rollout_s"] = t_roll
            metrics["time/update_s"] = time.perf_counter() - t0
            metrics.update(self.memory())
            self._eval_step(update, metrics)
            saved = self._log_step(update, metrics)
            if saved:
                self._checkpoint_step(update)
            self.folder.exit_on_signal(self.done)
        return saved

    def _rollout_step(self, update: int, ahead: RolloutAhead | None) -> tuple[list[Episode], dict[str, float]]:
        """This update's episodes and their rollout metrics (from the thread running ahead, if there is one)."""
        self.phase("rollout", update)
        episodes, metrics = ahead.get(update) if ahead is not None else self.collector.collect(update)
        return episodes, {**metrics, **self._staleness(update, episodes)}

    def _score_step(self, update: int, episodes: list[Episode], metrics: dict[str, float],
                    ) -> tuple[TurnBatch, torch.Tensor | None]:
        """The batch with the log-probs the credit and the loss read: the reference's (once per batch: the
        KL and the implicit PRM), a teacher's (distillation), the proximal policy's (decoupled PPO), the sampler's
        (the engine gap).
        Several processes: also each row's owning rank."""
        cfg, learner = self.cfg, self.learner
        batch = make_batch(episodes, self.policy.chat.pad_id, mask_summary=self.cfg.rollout.context.mask_summary)
        owner = torch.tensor([self.collector.owner[e.group_id] for e in episodes]) if self.ranks.world > 1 else None
        batch = batch.with_(ref_logp=learner.reference_logp(batch, owner))
        if learner.teacher is not None:  # distillation: the teacher's log-probs of the same tokens, same micro-batches
            t0 = time.perf_counter()
            batch = batch.with_(teacher_logp=learner.teacher_logp(batch, owner))
            metrics["time/teacher_s"] = time.perf_counter() - t0
        if cfg.rollout.max_staleness and cfg.loss.off_policy == "decoupled":
            batch = batch.with_(prox_logp=learner.proximal_logp(batch))
            w = is_weight(batch, cfg.loss.is_cap)[batch.action_mask > 0]
            metrics.update({"train/is_weight_mean": float(w.mean()), "train/is_weight_max": float(w.max())})
        # a mismatch correction needs the sampler's log-probs, and rollouts ahead measure the gap on them; on-policy,
        # the first minibatch's own forwards measure it at no cost (Learner.optimize), on any number of processes
        if cfg.loss.mismatch != "none" or cfg.rollout.max_staleness > 0:
            batch = batch.with_(sampler_logp=learner.sampler_logp(batch, update, owner))
        return batch, owner

    def _credit_step(self, batch: TurnBatch, metrics: dict[str, float]) -> Credit:
        """The assigner's fit and its credit for the batch, with their metrics (and the engine gap over the
        rows that will train)."""
        fit = self.assigner.fit(batch)
        credit = self.assigner.assign(batch, fit)
        if batch.sampler_logp is not None:
            metrics.update(self.learner.mismatch_metrics(batch, credit.row_weight > 0))
        metrics.update({f"credit/{k}": v for k, v in {**fit.metrics, **credit.metrics}.items()})
        if metrics.get("credit/groups"):
            metrics["credit/all_pass_frac"] = metrics.get("credit/all_pass_groups", 0.0) / metrics["credit/groups"]
            metrics["credit/all_fail_frac"] = metrics.get("credit/all_fail_groups", 0.0) / metrics["credit/groups"]
        return credit

    def _sync_step(self, update: int, ahead: RolloutAhead | None) -> None:
        """The new weights to whoever samples next: the rollout thread's actor, or an engine with its own copy."""
        if ahead is not None:  # the rollout thread refreshes its actor from this copy before its next rollout
            weights = self.learner.trainable_copy()
            ahead.publish(update, weights)
            # episodes of version update - max_staleness onwards may still come; older ones never
            keep = update - self.cfg.rollout.max_staleness
            self.learner.snapshots = {v: w for v, w in self.learner.snapshots.items() if v >= keep}
            self.learner.snapshots[update] = weights
        elif self.syncs_weights:  # e.g. vLLM generates from its own copy of the weights
            self.engine.sync_weights(self.policy.model)

    def _eval_step(self, update: int, metrics: dict[str, float]) -> None:
        """The held-out evaluation every `eval.every` updates, and each source at its own `every` (the last
        update's are the final ones, after the loop)."""
        every = self.cfg.eval.every
        heldout = bool(every) and update % every == 0 and update != self.cfg.updates
        due = [s for s in self.sources if s.due(update, self.cfg.updates)]
        if heldout or due:
            self.phase("eval", update)
        if heldout:
            self.last_eval = self.evaluate()
            metrics.update(self.last_eval.metrics())
        metrics.update(self.evaluate_sources(update, due))

    def _log_step(self, update: int, metrics: dict[str, float]) -> bool:
        """Log the update, check health (which may stop the run), agree on a signal; returns whether to save."""
        self.phase("log", update)
        self.done = update
        # every rank logs, checks and acts on the main process's row (its timings), so all decide alike
        metrics = self.ranks.broadcast(metrics)
        self.stopped = self.check_health({"step": update, **metrics})
        self.folder.agree_on_signal()
        every = self.cfg.checkpoint.every
        return bool((every and update % every == 0) or update == self.cfg.updates or self.stopped
                    or self.folder.signal)

    def _checkpoint_step(self, update: int) -> None:
        self.phase("checkpoint", update)
        t0 = time.perf_counter()
        self.checkpoint()
        self.checkpoint_seconds.append(time.perf_counter() - t0)

    def _staleness(self, update: int, episodes: list[Episode]) -> dict[str, float]:
        """How many versions behind the learner (update - 1 updates applied) the batch is; over the bound: a bug."""
        stale = [update - 1 - e.policy_version for e in episodes]
        if max(stale) > self.cfg.rollout.max_staleness or min(stale) < 0:
            raise RuntimeError(f"update {update}: episodes {max(stale)} versions old (min {min(stale)}), outside "
                               f"rollout.max_staleness {self.cfg.rollout.max_staleness}: refusing to train on them")
        return {"train/staleness_mean": float(np.mean(stale)), "train/staleness_max": float(max(stale))}

    # -- health: the knobs interventions turn, and the parts that read them -------------------------

    def check_health(self, row: dict[str, Any]) -> str | None:
        """Alarm states into the row, interventions planned and applied, the row logged; returns why
        the run must stop (on_alarm=stop, or a non-finite loss/gradient), else None."""
        hc = self.cfg.health
        health = check(self.history + [row], hc)
        row.update(health.metrics())
        actions = plan(self.history + [row], health, self.knobs, hc, self.last_acted)
        self.history.append(row)
        if actions:
            row["health/actions"] = [str(a) for a in actions]
            for a in actions:
                self.apply(a)
        self.monitor.log(row)
        fatal = stops(health, hc)
        return f"step {row['step']}: {fatal[0].name}: {fatal[0].reason}" if fatal else None

    def apply(self, action: Action) -> None:
        """Turn one knob (`self.knobs`) and hand its new value to the part that reads it."""
        self._hand_out(self.knobs.turn(action))
        self.last_acted[action.intervention] = float(self.history[-1]["step"]) if self.history else 0.0

    def _hand_out(self, reader: str) -> None:
        """Give `reader` the knobs it reads. The loss reads them at every update (`Learner.loss_config`); the
        engine gets a new sampling config, read at its next generate (one it holds is never changed in place:
        `Engine` in agentrl.engines.base), the assigner its options through `set_options`, each env its attribute."""
        knobs = self.knobs.reads(reader)
        if reader == "sampling":
            self.engine.sampling = self.cfg.rollout.sampling.model_copy(update=knobs)
        elif reader == "credit" and knobs:
            set_options(self.assigner, self.cfg.credit.model_copy(update=knobs))
        elif reader == "env":
            for env in self.envs:
                for name, value in knobs.items():
                    setattr(env, name, value)

    critic_only_updates: int = 0  # updates whose credit trained only the assigner's critic (summary.json)
    _said_policy_moves: bool = False

    def _say_critic_only(self, update: int, metrics: dict[str, Any]) -> None:
        """Say when an update trains only the critic (an assigner's warm-up, e.g. turn-ppo's): the table's
        empty entropy and KL would not say why. Once when it starts, once when the policy starts to move."""
        if metrics.get("credit/critic_warmup", 0.0) >= 1.0:
            self.critic_only_updates += 1
            if self.critic_only_updates == 1:
                opts = self.cfg.credit
                until = ", ".join(f"{k} {getattr(opts, k)}" for k in ("warmup_ev", "warmup_updates")
                                  if hasattr(opts, k))
                self.monitor.say(f"update {update}: critic only -- {self.cfg.algo}'s critic warms up before the policy "
                                 f"moves (until {until or 'its critic is ready'}; critic EV now "
                                 f"{metrics.get('credit/critic_ev', float('nan')):.2f})")
        elif self.critic_only_updates and not self._said_policy_moves:
            self._said_policy_moves = True
            self.monitor.say(f"update {update}: the policy trains from here on ({self.critic_only_updates} critic-only "
                             f"update(s) before; critic EV {metrics.get('credit/critic_ev', float('nan')):.2f})")

    def _check_warm_start(self) -> None:
        """Warn before RL when the warm start is at the floor, at the ceiling, or far below its expert."""
        sft_record = (self.decisions.get("warm_start") or {}).get("sft") or {}
        advice = warm_start_advice(self.warm.pass_rate, self.warm.episodes, sft_record.get("demo_pass_rate"),
                                   tuple(self.cfg.sft.useful_band), self.cfg.rollout.group_size)
        if advice:
            self.decisions["warm_start_warning"] = advice
            self.monitor.say(f"warning: {advice}")

    # -- checkpoints and the end ----------------------------------------------------------------------

    def checkpoint(self) -> Path:
        """Save the run as it stands after update `self.done` (agentrl.run_state: what a checkpoint holds). The
        main process writes it (the ranks' states are the same: agentrl.distributed), the others wait until it
        has; every rank takes part in gathering sharded weights (FSDP, DeepSpeed)."""
        files = run_state.checkpoint_files(self)
        path = self.folder.save(self.done, files, self.cfg.checkpoint.keep) if self.ranks.main \
            else self.out / CHECKPOINTS
        self.ranks.barrier()
        return path

    def _resume(self, found: tuple[Path, dict[str, Any]] | None) -> None:
        """Continue from the checkpoint `found` (None: there is none yet, the run starts over), the store and
        metrics.jsonl cut back to its update."""
        if found is None:
            self.monitor.say(f"[yellow]warning[/yellow]: {self.out} has no checkpoint that verifies; the run starts "
                             "from the beginning")
            self.monitor.rewind({"bytes": 0, "alarms_on": []})
            self.decisions = {**self.folder.saved_decisions(), **self.decisions}  # --algo auto's pick stands
            self.folder.cut_store(0)
            return
        folder, _ = found
        saved_with = run_state.restore(self, folder)
        for reader in ("sampling", "credit", "env"):  # the loss reads them at every update
            self._hand_out(reader)
        self.folder.cut_store(self.done)
        self.resumed_from = folder
        with_ = "" if saved_with == self.ranks.world else f"; saved by {saved_with} process(es), resumed by " \
            f"{self.ranks.world}: the task stream and the sampling streams do not depend on the number"
        self.monitor.say(f"resumed from {folder} (update {self.done} of {self.cfg.updates}){with_}")

    def _finish(self, t_start: float, warm: EvalResult) -> dict[str, Any]:
        """The final held-out evaluation, the trained model as an HF folder, summary.json."""
        done = self.done
        self.phase("final-eval", done)
        final = self.evaluate() if done else self.last_eval
        # the sources after the last update (with none done, their step-0 results stand)
        sources = self.evaluate_sources(done, self.sources) if done else {
            f"eval/{name}/{k}": v for name, m in self.source_last.items() for k, v in m.items()}
        self.monitor.log({"step": done, **final.metrics(), **sources, "final": True})
        self.phase("save", done)
        ckpt = self.out / "checkpoint"
        model = self.accelerator.unwrap_model(self.learner.model)
        if self.ranks.main:
            if self.cfg.optim.lora.r:  # the adapters on their own, and the merged model as an ordinary HF folder
                model.save_pretrained(ckpt / "adapter")
                model = self.policy.model = model.merge_and_unload()
            model.save_pretrained(ckpt)
            self.policy.tokenizer.save_pretrained(ckpt)
        summary = run_state.summary(self, warm, final, ckpt, time.perf_counter() - t_start)
        self.folder.write_summary(summary)
        self.ranks.barrier()
        if self.checkpoint_seconds:
            self.monitor.say(f"checkpoints: {len(self.checkpoint_seconds)} written, "
                             f"{sum(self.checkpoint_seconds) / len(self.checkpoint_seconds):.2f}s each")
        self.monitor.close(summary)
        self.phase("done", done)
        return summary


__all__ = ["EvalResult", "Trainer", "evaluate"]
