"""The RL loop, top to bottom: roll out groups, store them, assign credit, update the policy, log.

    for each update:
        episodes = rollout(envs, task seeds x G, engine)          # one batched generate per turn
        store   <- episodes (Parquet, one file per update)
        fit = assigner.fit(batch); credit = assigner.assign(batch, fit)
        loss    = policy_loss(logp, behaviour logp, credit.advantages, action mask, ...)
        optimizer step (through accelerate), metrics.jsonl, console

The trainer never branches on the assigner: it looks it up in `ASSIGNERS` and calls `fit` and
`assign`. Held-out evaluation uses seeds that training never draws.

With `AGENTRL_PHASE_LOG=FILE` in the environment the main process appends one line to FILE as the loop
enters each phase, `<unix time> <phase> <update>`: start, warm-eval, rollout, update (reference
log-probs, credit, optimizer steps), eval, log (health checks, metrics row), checkpoint (gathering
the state and writing it), final-eval, save (the HF folder, summary.json), done. Each line is one
append write(), so a process killed at any moment leaves the phase it was in as the last line
(benchmarks/kill_resume.py records it per kill). With rollouts running ahead, `rollout` is the wait
for one. Unset (the default), nothing is opened or written.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import math
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.ahead import RolloutAhead
from agentrl.algorithms import get_spec
from agentrl.checkpoint import CheckpointError, clear_run, latest, rng_state, set_rng_state
from agentrl.checkpoint import read as read_checkpoint
from agentrl.checkpoint import write as write_checkpoint
from agentrl.config import LossConfig, SamplingConfig, TrainConfig
from agentrl.core import Episode
from agentrl.credit import Credit, assigner_state, load_assigner_state, set_options
from agentrl.distributed import Ranks
from agentrl.engines import get_engine_spec
from agentrl.health import Action, Knobs, check, plan, stops, warm_start_advice
from agentrl.loss import policy_loss
from agentrl.mismatch import capped_ratio, correction, loss_terms
from agentrl.mismatch import stats as mismatch_stats
from agentrl.monitor import Monitor, SilentMonitor
from agentrl.policy import MIN_SHARED_HEAD, Policy, adamw, add_lora, shards_weights, token_stats
from agentrl.registry import make
from agentrl.rollout import rollout
from agentrl.store import TrajectoryStore, TurnBatch, make_batch, segment_batch, to_episodes, truncate_store
from agentrl.teacher import token_level_teacher
from agentrl.verify.sandbox import isolation_of
from agentrl.workers import make_pool

CHECKPOINTS = "checkpoints"  # <run>/checkpoints/update_XXXXX: what --resume continues from
DECISIONS = "decisions.json"  # <run>/decisions.json: what was decided before the run (e.g. --algo auto's pick)
PHASE_LOG = "AGENTRL_PHASE_LOG"  # env var: a file the loop appends its phases to (module docstring)
SHARDED = ("FSDP", "DEEPSPEED")  # accelerate's distributed types whose optimizer state is sharded over the ranks


class ResumeUnsupported(ValueError):
    """This run cannot be resumed here (its optimizer state is sharded over the ranks: FSDP, DeepSpeed ZeRO)."""


def _refuse_sharded(kind: str, out: Any, saved: str | None = None) -> None:
    """Refuse a resume under FSDP / DeepSpeed (`kind`, accelerate's distributed type), or of a checkpoint
    (`saved`, its folder's name) that was written under one."""
    if kind not in SHARDED:
        return
    what = f"its checkpoint {saved} was saved under {kind}" if saved else f"this launch trains under {kind}"
    raise ResumeUnsupported(
        f"--resume {out}: {what}, and resuming a sharded run is not supported: the optimizer's state is sharded over "
        "the ranks and a checkpoint holds only the main process's share, so the resumed run would not continue the "
        "one saved (docs/distributed.md, 'Checkpoints'). Start a new run; runs trained with DDP (no FSDP or "
        "DeepSpeed config) resume")


def _kind(distributed_type: Any) -> str:
    return str(getattr(distributed_type, "value", distributed_type)).upper()


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


class EpisodeErrors(RuntimeError):
    """An environment raised during a rollout; the batch was saved before stopping."""


@dataclass
class EvalResult:
    pass_rate: float
    reward_mean: float
    turns_mean: float
    episodes: int

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        return {f"{prefix}/pass_rate": self.pass_rate, f"{prefix}/reward_mean": self.reward_mean,
                f"{prefix}/turns_mean": self.turns_mean,
                f"{prefix}/episodes": float(self.episodes)}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def make_engine(cfg: TrainConfig, policy: Policy, sampling: SamplingConfig, seed: int,
                capture_hidden: bool = False) -> Any:
    """The configured engine (a lookup in agentrl.engines.ENGINES), generating from `policy`, in `rollout.dtype`
    (an engine registered without a `dtype` argument is built as before while it is auto). An engine with a
    `share_prefill` switch (torch) gets `rollout.share_prefill`."""
    precision = {} if cfg.rollout.dtype == "auto" else {"dtype": cfg.rollout.dtype}
    engine = get_engine_spec(cfg.engine).load()(policy, sampling, seed=seed, capture_hidden=capture_hidden, **precision)
    if hasattr(engine, "share_prefill"):
        engine.share_prefill = cfg.rollout.share_prefill
    return engine


def heldout_env_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    """The environment's arguments for held-out evaluation: an env with a `split` attribute (Code-v0)
    is built with split="eval", i.e. on tasks and verifier tests that training never sees."""
    kwargs = dict(cfg.env.kwargs)
    if "split" not in kwargs and _has_split(cfg.env.id, json.dumps(kwargs, sort_keys=True, default=str)):
        kwargs["split"] = "eval"
    return kwargs


@functools.lru_cache(maxsize=32)
def _has_split(env_id: str, kwargs_json: str) -> bool:
    """Built once per env and arguments: building Code-v0 loads HumanEval, too slow for every evaluation."""
    return hasattr(make(env_id, **json.loads(kwargs_json)), "split")


def eval_sampling(cfg: TrainConfig) -> SamplingConfig:
    """Held-out sampling: the run's, at the fixed `eval.temperature`."""
    return cfg.rollout.sampling.model_copy(update={"temperature": cfg.eval.temperature})


def agent_runner(cfg: TrainConfig) -> Any:
    """The gateway and the user's agent for a run with `cfg.agent` (agentrl.gateway.agent); close it after."""
    from agentrl.gateway.agent import Agent, AgentRunner

    return AgentRunner(Agent(cfg.agent, heldout_count=cfg.eval.episodes, seed_offset=cfg.eval.seed_offset))


def evaluate(cfg: TrainConfig, policy: Policy, sampling: SamplingConfig | None, max_context: int,
             ranks: Ranks | None = None, say: Callable[[str], None] | None = None, runner: Any = None) -> EvalResult:
    """Pass rate on the held-out seeds (the same seeds every time, so evaluations compare), sampled
    with `sampling` (None: `eval_sampling(cfg)`). With `ranks`, each process rolls out its block of
    the seeds and the episodes are gathered: every rank returns the same result. An evaluation that
    runs longer than a few seconds (a real model on a CPU) says its progress and ETA through `say`
    (default: the agentrl logger)."""
    sampling = sampling or eval_sampling(cfg)
    n = cfg.eval.episodes
    lo, hi = ranks.block(n) if ranks is not None else (0, n)
    seeds = [cfg.eval.seed_offset + i for i in range(lo, hi)]
    engine = make_engine(cfg, policy, sampling, seed=cfg.seed + 12345)

    def roll() -> list[Episode]:
        if cfg.agent is not None or runner is not None:  # held-out tasks through the gateway (an own one if none)
            own = runner or agent_runner(cfg)
            try:
                return own.rollout(engine, policy.chat, seeds, max_context=max_context, row_offset=lo,
                                   on_episode=progress("held-out evaluation", say))[0]
            finally:
                if own is not runner:
                    own.close()
        envs = [make(cfg.env.id, **heldout_env_kwargs(cfg)) for _ in range(lo, hi)]
        with make_pool(cfg.rollout.env_workers, cfg.rollout.tool_timeout, cfg.rollout.tool_timeouts) as pool:
            return rollout(envs, seeds, engine, policy.chat, max_context=max_context,
                           max_new_tokens=sampling.max_new_tokens, workers=pool,
                           max_batch_rows=cfg.rollout.max_batch_rows, schedule=cfg.rollout.schedule, row_offset=lo,
                           on_episode=progress("held-out evaluation", say))[0]

    if ranks is None:
        episodes = roll()
    else:  # a failure on one rank is raised on all, or the others would wait in the gather
        episodes = ranks.gather_lists(ranks.together("held-out evaluation", roll))
    _raise_on_errors(episodes, None)
    return EvalResult(
        pass_rate=float(np.mean([e.passed for e in episodes])),
        reward_mean=float(np.mean([e.reward for e in episodes])),
        turns_mean=float(np.mean([e.num_turns for e in episodes])),
        episodes=n,
    )


def progress(what: str, say: Callable[[str], None] | None = None, after: float = 5.0,
             every: float = 10.0) -> Callable[[int, int], None]:
    """An `on_episode(done, total)` callback that says `what`'s progress and ETA, once the work has
    run `after` seconds and then at most every `every` seconds (quiet for the tiny policy's
    sub-second evaluations)."""
    say = say or logging.getLogger(__name__).info
    t0 = time.monotonic()
    last = [t0]

    def tick(done: int, total: int) -> None:
        now = time.monotonic()
        if now - t0 < after or (now - last[0] < every and done < total):
            return
        last[0] = now
        eta = (now - t0) / done * (total - done)
        say(f"  {what}: {done}/{total} episodes, {now - t0:.0f}s, ETA {eta:.0f}s")

    return tick


def _raise_on_errors(episodes: list[Episode], saved: Path | None) -> None:
    errored = [e for e in episodes if e.error]
    if errored:
        where = f" (the batch is saved in {saved})" if saved else ""
        raise EpisodeErrors(f"{len(errored)} episode(s) errored{where}; first: {errored[0].error}")


def rollout_metrics(episodes: list[Episode], seconds: float) -> dict[str, float]:
    tokens = sum(e.num_action_tokens for e in episodes)
    segmented = [e.segmented for e in episodes]
    return {
        **({"rollout/segmented_frac": float(np.mean(segmented))} if any(segmented) else {}),
        "rollout/pass_rate": float(np.mean([e.passed for e in episodes])),
        "rollout/reward_mean": float(np.mean([e.reward for e in episodes])),
        "rollout/turns_mean": float(np.mean([e.num_turns for e in episodes])),
        "rollout/action_tokens_mean": tokens / len(episodes),
        "rollout/episode_tokens_mean": float(np.mean([len(e.token_ids()) for e in episodes])),
        "rollout/truncated_frac": float(np.mean([e.truncated for e in episodes])),
        "rollout/malformed_per_episode": float(np.mean([e.malformed_calls for e in episodes])),
        "rollout/tool_timeouts": float(sum(e.tool_timeouts for e in episodes)),
        "rollout/episodes": float(len(episodes)),
        "rollout/tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
    }


class Trainer:
    """One RL run. `Trainer(cfg).train()` is what `agentrl train` calls."""

    def __init__(self, cfg: TrainConfig, monitor: Monitor | None = None, start: str | Path | None = None,
                 decisions: dict[str, Any] | None = None, resume: bool = False, overwrite: bool = False,
                 runner: Any = None):
        """`start` is the policy to begin from when `cfg.model` is None: the tiny policy's warm start,
        built by stage one (`agentrl.stages.warm_start.warm_start`) before the loop, as
        `agentrl.stages.pipeline.train` does.
        `decisions` is what was decided before the run (e.g. `--algo auto`'s pick, rule and statistics):
        written into config.yaml's header and summary.json. `resume` continues the run in `cfg.out` from
        its newest checkpoint that verifies (`cfg` must be the run's own config); `overwrite` first
        removes a previous run's files from `cfg.out`. A folder that holds a run is refused otherwise. `runner`: where
        episodes come from instead of the env (`serve-policy`'s `agentrl.gateway.remote.RemoteRunner`); with
        `cfg.agent`, the gateway's in-process runner is built here."""
        from accelerate import Accelerator

        # the run's own copy, read and never written: the knobs interventions turn live in self.knobs
        cfg = cfg.model_copy(deep=True)
        self.cfg = cfg
        self.decisions = dict(decisions or {})
        device = resolve_device(cfg.device)
        bf16 = cfg.optim.bf16 and device.type == "cuda" and torch.cuda.is_bf16_supported()
        # first: under a multi-process launch this joins the process group (agentrl.distributed)
        self.accelerator = Accelerator(cpu=device.type == "cpu", mixed_precision="bf16" if bf16 else "no")
        if resume:  # before any work: the policy, the run folder and its checkpoints are not touched
            _refuse_sharded(_kind(self.accelerator.distributed_type), cfg.out)
        self.ranks = ranks = Ranks()
        self.phase = _Phases(ranks.main)
        if cfg.rollout.groups < ranks.world:
            raise ValueError(f"rollout.groups is {cfg.rollout.groups} but the run has {ranks.world} processes: each "
                             "process rolls out whole groups, so give it at least one group per process")
        # one folder name for every rank: the main process's clock decides it
        self.out = Path(ranks.broadcast(cfg.out or f"runs/{cfg.algo}-{time.strftime('%Y%m%d-%H%M%S')}"))
        ranks.together(f"opening the run folder {self.out}",
                       lambda: self._open_folder(resume, overwrite) if ranks.main else None)
        if ranks.main:
            self.monitor = monitor or Monitor(self.out, total=cfg.updates, tensorboard=cfg.log.tensorboard,
                                              wandb=cfg.log.wandb, wandb_project=cfg.log.wandb_project,
                                              config=cfg.model_dump(mode="json"))
        else:
            self.monitor = SilentMonitor(self.out, cfg.updates)
        self.monitor.say(f"run folder: {self.out}" + (f" ({ranks.world} processes)" if ranks.world > 1 else ""))
        found = None
        if resume and ranks.main:
            found = latest(self.out / CHECKPOINTS, warn=lambda m: self.monitor.say(f"[yellow]warning[/yellow]: {m}"))
        found = ranks.broadcast(found)

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
                                            "sft": _read_json(self.warm_start_dir / "warm_start.json")}
        self.max_context = cfg.rollout.max_context or getattr(self.policy.model.config, "max_position_embeddings", 2048)

        lora = cfg.optim.lora
        if lora.r:
            # adapters only; the KL reference is this same model with its adapters switched off
            self.policy.model = add_lora(self.policy.model, lora)
            self.reference = None
        else:  # the reference for KL: a frozen copy
            self.reference = copy.deepcopy(self.policy.model).eval().requires_grad_(False)
        self.trainable = [p for p in self.policy.model.parameters() if p.requires_grad]
        self.spec = get_spec(cfg.algo)
        self.assigner = self.spec.load()(cfg.credit, policy=self.policy, train_config=cfg)
        # distillation (agentrl.teacher): a frozen teacher, scored beside the reference, for an assigner that reads one
        self.teacher = token_level_teacher(cfg.teacher, self.policy, str(source), device, cfg.algo).model \
            if self.spec.reads_teacher else None
        opt = adamw(self.trainable, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        self.model, self.optimizer = self.accelerator.prepare(self.policy.model, opt)
        lo, hi = ranks.block(cfg.rollout.groups)  # this rank's groups of every update
        # where episodes come from: the env's copies, one per row, or an agent of the user's own through the gateway
        self.runner = runner or (agent_runner(cfg) if cfg.agent else None)
        self.envs = [] if self.runner is not None else [make(cfg.env.id, **cfg.env.kwargs)
                                                        for _ in range((hi - lo) * cfg.rollout.group_size)]
        if self.runner is not None:
            self.monitor.say(f"{self.source}: calls the policy through the gateway at {self.runner.base_url} "
                             "(docs/gateway.md)")
        elif (iso := isolation_of(self.envs[0])) is not None:  # policy-written code runs: say how it is held
            self.monitor.say(iso.summary() + "".join(f"\n  {r}" for r in iso.reasons))
        self.owner: dict[int, int] = {}  # group id -> the rank that rolled it out (its rows' gradient is that rank's)
        # rollouts that run ahead generate from a copy of the weights (the actor), refreshed after every update
        self.actor = None
        if cfg.rollout.max_staleness:
            if ranks.world > 1:
                raise ValueError("rollout.max_staleness > 0 runs in one process for now: its rollout thread and the "
                                 "ranks' exchanges would share one process group; use max_staleness 0 with several")
            self.actor = copy.deepcopy(self.accelerator.unwrap_model(self.model)).eval().requires_grad_(False)
        generator = self.policy if self.actor is None else Policy(self.actor, self.policy.tokenizer,
                                                                        self.policy.chat.tool_format)
        # sampling settings of its own: a turned temperature reaches it as a new copy (Trainer._hand_out)
        self.engine = make_engine(cfg, generator, cfg.rollout.sampling.model_copy(), seed=cfg.seed,
                                  capture_hidden=self.spec.reads_hidden(cfg.credit))
        self.rollout_starts: dict[int, dict[str, Any]] = {}  # update -> the stream's state when its rollout began
        self.workers = make_pool(cfg.rollout.env_workers, cfg.rollout.tool_timeout, cfg.rollout.tool_timeouts)
        # vLLM, or the torch engine sampling from a bf16 copy: weights of its own, synced after every update
        self.syncs_weights = get_engine_spec(cfg.engine).syncs_weights or getattr(self.engine, "owns_weights", False)
        # rollouts ahead: the trainable weights of each version episodes may still come from, so that the
        # engine's log-probs are compared with the trainer's under the weights that sampled (sampler_logp)
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self._past: torch.nn.Module | None = None  # the module a snapshot is loaded into for scoring
        self.task_rng = np.random.default_rng(cfg.seed)
        self.next_group = 0
        # held-out evaluation samples at its own fixed temperature, whatever the run samples at or an
        # intervention chose, so that evaluations of different runs compare
        self.eval_sampling = eval_sampling(cfg)
        # what interventions may turn, in one object: the loss, the engine, the assigner and the envs get its values
        self.knobs = Knobs(entropy_coef=cfg.loss.entropy_coef, kl_coef=cfg.loss.kl_coef,
                           temperature=cfg.rollout.sampling.temperature,
                           base_temperature=cfg.rollout.sampling.temperature,
                           dynamic_sampling=cfg.credit.dynamic_sampling if self.spec.resampling else None,
                           verifier_tests=getattr(self.envs[0], "hidden_per_episode", None) if self.envs else None)
        self.history: list[dict[str, Any]] = []  # every logged row: what the alarms read
        self.last_acted: dict[str, float] = {}  # intervention -> step it last acted (cooldowns)
        # where the loop stands: the last update done, the held-out evaluations the summary reads, why it stopped
        self.done = 0
        self.warm: EvalResult | None = None
        self.last_eval: EvalResult | None = None
        self.stopped: str | None = None
        self.resumed_from: Path | None = None
        self._signal: int | None = None
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

    def _open_folder(self, resume: bool, overwrite: bool) -> None:
        """(The main process) make the run folder and write config.yaml, refusing a folder with another run."""
        if overwrite:
            clear_run(self.out)
        elif not resume and _holds_run(self.out):
            raise FileExistsError(f"{self.out} holds a run already (metrics.jsonl); resume it (agentrl train --resume "
                                  f"{self.out}), overwrite it (--overwrite), or choose another --out")
        self.out.mkdir(parents=True, exist_ok=True)
        if not resume or not (self.out / "config.yaml").exists():  # a resumed run keeps its own (and its header)
            (self.out / "config.yaml").write_text(_decisions_header(self.decisions) + self.cfg.to_yaml())
            if self.decisions:  # and, read back exactly, for a run resumed before its first checkpoint
                tmp = self.out / f"{DECISIONS}.tmp"
                tmp.write_text(json.dumps(self.decisions, indent=1))
                tmp.replace(self.out / DECISIONS)

    # -- checkpoints: everything the next update depends on ----------------------------------------

    def checkpoint(self) -> Path:
        """Save the run as it stands after update `self.done` (agentrl.checkpoint; atomic, checksummed). The main
        process writes it (the ranks' states are the same: agentrl.distributed), the others wait until it has."""
        # every rank: gathering sharded weights (FSDP, DeepSpeed) is collective; the main process writes
        weights = self._weights()
        path = self._write_checkpoint(weights) if self.ranks.main else self.out / CHECKPOINTS
        self.ranks.barrier()
        return path

    def _stream_state(self) -> dict[str, Any]:
        """Where the task stream and the sampler stand (what a resumed run's next rollout starts from)."""
        return {"task_rng": copy.deepcopy(self.task_rng.bit_generator.state), "next_group": self.next_group,
                "engine": self.engine.state_dict() if hasattr(self.engine, "state_dict") else None}

    def _weights(self) -> dict[str, torch.Tensor]:
        """What a checkpoint keeps of the model: the adapters with LoRA (the base is rebuilt from its source as
        it was loaded), else every tensor (accelerate gathers them when a wrapper shards them)."""
        if self.cfg.optim.lora.r:
            model = self.accelerator.unwrap_model(self.model)
            return {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}
        return {n: t.detach().cpu() for n, t in self.accelerator.get_state_dict(self.model).items()}

    def _write_checkpoint(self, weights: dict[str, torch.Tensor]) -> Path:
        rng_json, rng_tensors = rng_state()
        # the stream as it stood when the next update's rollout began: with rollouts running ahead, the rollout
        # thread has drawn past it, and a resumed run rolls that update out again
        stream = self.rollout_starts.get(self.done + 1) or self._stream_state()
        engine = stream["engine"]
        state = {
            "update": self.done, "next_group": stream["next_group"], "task_rng": stream["task_rng"],
            "rng": rng_json, "history": self.history, "last_acted": self.last_acted,
            # the knobs interventions may have turned (the rest of the config is the run's config.yaml)
            "knobs": self.knobs.state(),
            "critic_only_updates": self.critic_only_updates, "said_policy_moves": self._said_policy_moves,
            "warm": None if self.warm is None else asdict(self.warm),
            "last_eval": None if self.last_eval is None else asdict(self.last_eval),
            "stopped": self.stopped, "decisions": self.decisions, "monitor": self.monitor.position(),
            "engine_state": engine is not None, "processes": self.ranks.world,
            "distributed_type": _kind(self.accelerator.distributed_type),
        }
        files = {"model.pt": weights, "optimizer.pt": self.optimizer.state_dict(),
                 "assigner.pt": assigner_state(self.assigner),
                 "rng.pt": {**rng_tensors, **({"engine": engine} if engine is not None else {})}, "state.json": state}
        return write_checkpoint(self.out / CHECKPOINTS, self.done, files, keep=self.cfg.checkpoint.keep)

    def _resume(self, found: tuple[Path, dict[str, Any]] | None) -> None:
        """Load the checkpoint `found` (None: there is none yet, the run starts over), and cut
        metrics.jsonl and the store back to its update."""
        if found is None:
            self.monitor.say(f"[yellow]warning[/yellow]: {self.out} has no checkpoint that verifies; the run starts "
                             "from the beginning")
            self.monitor.rewind({"bytes": 0, "alarms_on": []})
            decided = self.out / DECISIONS  # what the first start decided (--algo auto's pick): the run's still
            if decided.is_file():
                self.decisions = {**json.loads(decided.read_text()), **self.decisions}
            if self.ranks.main:
                truncate_store(self.out / "store", 0)
            return
        folder, _ = found
        state = read_checkpoint(folder, "state.json")
        _refuse_sharded(str(state.get("distributed_type", "NO")), self.out, saved=folder.name)
        model = self.accelerator.unwrap_model(self.model)
        weights = read_checkpoint(folder, "model.pt")
        missing, unexpected = model.load_state_dict(weights, strict=not self.cfg.optim.lora.r)
        if unexpected or (not self.cfg.optim.lora.r and missing):
            raise CheckpointError(f"{folder}: model.pt does not fit this policy (unexpected {unexpected[:3]}, missing "
                                  f"{missing[:3]})")
        self.optimizer.load_state_dict(read_checkpoint(folder, "optimizer.pt"))
        load_assigner_state(self.assigner, read_checkpoint(folder, "assigner.pt"))
        rng = read_checkpoint(folder, "rng.pt")
        if state["engine_state"]:
            self.engine.load_state_dict(rng.pop("engine"))
        set_rng_state(state["rng"], rng)
        self.task_rng.bit_generator.state = state["task_rng"]
        self.next_group, self.done = int(state["next_group"]), int(state["update"])
        self.history, self.last_acted = state["history"], state["last_acted"]
        self.knobs.load(state["knobs"])
        for reader in ("sampling", "credit", "env"):  # the loss reads them at every update
            self._hand_out(reader)
        self.critic_only_updates, self._said_policy_moves = state["critic_only_updates"], state["said_policy_moves"]
        self.warm = None if state["warm"] is None else EvalResult(**state["warm"])
        self.last_eval = None if state["last_eval"] is None else EvalResult(**state["last_eval"])
        self.stopped, self.decisions = state["stopped"], state["decisions"]
        self.monitor.rewind(state["monitor"])
        if self.ranks.main:
            truncate_store(self.out / "store", self.done)
        self.resumed_from = folder
        saved_with = int(state.get("processes", 1))
        with_ = "" if saved_with == self.ranks.world else f"; saved by {saved_with} process(es), resumed by " \
            f"{self.ranks.world}: the task stream and the sampling streams do not depend on the number"
        self.monitor.say(f"resumed from {folder} (update {self.done} of {self.cfg.updates}){with_}")

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self._signal is not None:  # a second Ctrl-C: stop now, without the checkpoint
            raise KeyboardInterrupt
        self._signal = signum
        self.monitor.say(f"[yellow]{signal.Signals(signum).name}[/yellow]: finishing this update, then saving a "
                         "checkpoint (again to stop at once)")

    def _agree_on_signal(self) -> None:
        """A signal that reached one rank stops every rank after this update (they save one checkpoint)."""
        if self.ranks.world > 1:
            self._signal = max(self.ranks.gather(self._signal or 0)) or None

    def _exit_on_signal(self) -> None:
        """After a signal: the checkpoint is saved; say how to go on and exit as the signal would (128 + its number)."""
        if self._signal is None:
            return
        name = signal.Signals(self._signal).name
        self.monitor.say(f"{name} at update {self.done}: checkpoint saved; resume with: agentrl train --resume "
                         f"{self.out}")
        self.monitor.close()
        raise SystemExit(128 + self._signal)

    def evaluate(self) -> EvalResult:
        """The held-out evaluation, split over the ranks."""
        return evaluate(self.cfg, self.policy, self.eval_sampling, self.max_context, self.ranks, runner=self.runner)

    # -- health: the knobs interventions turn, and the parts that read them -------------------------

    def loss_config(self) -> LossConfig:
        """The loss's settings for the next update: the run's, with the knobs' coefficients."""
        return self.cfg.loss.model_copy(update=self.knobs.reads("loss"))

    def apply(self, action: Action) -> None:
        """Turn one knob (`self.knobs`) and hand its new value to the part that reads it."""
        self._hand_out(self.knobs.turn(action))
        self.last_acted[action.intervention] = float(self.history[-1]["step"]) if self.history else 0.0

    def _hand_out(self, reader: str) -> None:
        """Give `reader` the knobs it reads. The loss reads them at every update (`loss_config`); the engine gets a
        new sampling config, read at its next generate (one it holds is never changed in place: `Engine` in
        agentrl.engines.base), the assigner its options through `set_options`, each env its attribute."""
        knobs = self.knobs.reads(reader)
        if reader == "sampling":
            self.engine.sampling = self.cfg.rollout.sampling.model_copy(update=knobs)
        elif reader == "credit" and knobs:
            set_options(self.assigner, self.cfg.credit.model_copy(update=knobs))
        elif reader == "env":
            for env in self.envs:
                for name, value in knobs.items():
                    setattr(env, name, value)

    # -- one update, in order ---------------------------------------------------------------------

    def _report_layout(self, stats: Any) -> None:
        """Say once if the rollout's ids part from the chat template's own rendering (agentrl.chat.layout),
        and once if the template rewrote episodes' history (they train as segments)."""
        if stats.segmented and not getattr(self, "_segments_said", False):
            self._segments_said = True
            self.monitor.say(f"the chat template rewrites the history: {stats.segmented} of {stats.episodes} episodes "
                             f"are trained as {stats.segments} segments, each action on the context it was given "
                             "(rollout.history template; docs/models.md)")
        if stats.layout_drift and not getattr(self, "_layout_warned", False):
            self._layout_warned = True
            self.monitor.say(f"[yellow]warning[/yellow]: {stats.layout_drift} of {stats.layout_checked} episodes "
                             f"checked are laid out otherwise than the chat template renders them "
                             f"({stats.layout_example}); the model is trained on the rollout's layout, which its "
                             "template would not give it at inference (docs/models.md)")

    def collect(self, update: int, version: int | None = None) -> tuple[list[Episode], dict[str, float]]:
        """Roll out `groups` tasks x `group_size` episodes; with dynamic sampling 'resample', roll
        out extra batches until enough groups carry signal (or the extra-batch cap is hit). `version`:
        the number of updates applied to the weights that generate (default: on-policy, update - 1)."""
        cfg = self.cfg
        version = update - 1 if version is None else version
        for old in [u for u in self.rollout_starts if u < update - cfg.rollout.max_staleness - 1]:
            del self.rollout_starts[old]
        self.rollout_starts[update] = self._stream_state()
        G = cfg.rollout.group_size
        kept: list[Episode] = []
        t0 = time.perf_counter()
        all_eps: list[Episode] = []
        resample = self.knobs.dynamic_sampling == "resample"  # None: the assigner has no dynamic sampling
        extra = cfg.credit.max_resample_batches if resample else 0
        lo, hi = self.ranks.block(cfg.rollout.groups)
        self.owner = {}
        prefill = [0, 0]  # prompt tokens the engine ran, and skipped by sharing them (this rank's, every attempt)
        attended = [0, 0]  # cache positions the engine's forwards attended over, and of them padding
        own: dict[str, float] = {}  # the source's own metrics (gateway/...), of the last attempt
        for attempt in range(1 + extra):
            # every rank draws the whole update's task seeds and rolls out its own block of the groups
            task_seeds = self.task_rng.integers(0, cfg.eval.seed_offset, size=cfg.rollout.groups).tolist()
            seeds = [s for s in task_seeds[lo:hi] for _ in range(G)]
            gids = [self.next_group + lo + i // G for i in range(len(seeds))]
            self.owner.update({self.next_group + g: r for r in range(self.ranks.world)
                               for g in range(*self.ranks.block(cfg.rollout.groups, r))})
            self.next_group += cfg.rollout.groups
            # a failure on one rank is raised on all, or the others would wait in the gather below
            if self.runner is not None:
                roll = functools.partial(self.runner.rollout, self.engine, self.policy.chat, seeds, group_ids=gids,
                                         max_context=self.max_context, policy_version=version, row_offset=lo * G)
            else:
                roll = functools.partial(
                    rollout, self.envs, seeds, self.engine, self.policy.chat, group_ids=gids,
                    max_context=self.max_context, max_new_tokens=cfg.rollout.sampling.max_new_tokens,
                    workers=self.workers, max_batch_rows=cfg.rollout.max_batch_rows, policy_version=version,
                    schedule=cfg.rollout.schedule, row_offset=lo * G)
            episodes, rstats = self.ranks.together(f"update {update}: rollout", roll)
            name = f"update_{update:05d}_{attempt}" + (f".rank{self.ranks.rank}" if self.ranks.world > 1 else "")
            path = TrajectoryStore(episodes).save(self.out / "store" / f"{name}.parquet")  # this rank's shard
            episodes = self.ranks.gather_lists(episodes)  # the whole update, in group order
            _raise_on_errors(episodes, path.parent if self.ranks.world > 1 else path)
            all_eps += episodes
            self._report_layout(rstats)
            own.update(rstats.extra)
            prefill[0] += rstats.prefill_tokens
            prefill[1] += rstats.prefill_tokens_saved
            attended[0] += rstats.positions_attended
            attended[1] += rstats.positions_padding
            if not resample:
                kept = episodes
                break
            kept += [e for grp in _groups(episodes) if len({x.reward for x in grp}) > 1 for e in grp]
            if len(kept) >= cfg.rollout.groups * G:
                break
        metrics = {**rollout_metrics(all_eps, time.perf_counter() - t0), **own}
        if any(prefill):
            metrics["rollout/prefill_tokens"], metrics["rollout/prefill_tokens_saved"] = map(float, prefill)
        if attended[0]:  # the share of attention spent on cache holes and padding (torch engine)
            metrics["rollout/cache_padding_frac"] = attended[1] / attended[0]
        if resample:
            metrics["rollout/resample_batches"] = float(attempt)
            kept = kept[: cfg.rollout.groups * G] or all_eps  # no signal at all: train on nothing useful, but log it
        return kept, metrics

    def optimize(self, batch: TurnBatch, credit: Credit, owner: torch.Tensor | None = None) -> dict[str, float]:
        """`ppo_epochs` passes of `minibatches` optimizer steps. Each minibatch is run as micro-batches
        of similar-length episodes (`micro_batch_tokens` padded tokens each); their losses are
        weighted by their share of the minibatch's aggregate, so the summed gradient is the
        minibatch's, and no episode is padded to a longer one outside its micro-batch.

        Several processes: `owner` (B,) names the rank of each row. Every rank holds the whole batch and
        draws the same minibatches, runs forward and backward on its own rows of each (weighted by their
        share of the whole minibatch), and DDP averages the ranks' gradients on the last micro-batch; so
        the step is the one-process step (the loss is scaled by the number of ranks to undo DDP's mean).

        Under DDP with `optim.share_prefix` the forwards run on the unwrapped module instead, so that a group's
        prompt runs through the layers once on each rank as in one process (DDP's own forward must see the whole
        rows), every micro-batch outside DDP's sync, and the ranks' gradients are averaged after the last one
        in a single all-reduce (`Ranks.mean_grads`): the same mean, and no rank pads with zero-loss passes."""
        cfg, ranks = self.cfg, self.ranks
        by_hand = self._grads_by_hand()
        learner = self._learner() if by_hand else self.model  # DDP: the unwrapped module
        loss_cfg = self.loss_config()  # the knobs' coefficients
        if _nothing_to_train(credit):
            return {"train/skipped": 1.0, "train/trained_episodes": 0.0}
        rows = (credit.row_weight > 0).nonzero(as_tuple=True)[0]
        device = self.accelerator.device
        batch = batch.select(rows).with_(advantages=credit.advantages[rows])  # travels with select() and trim() below
        mine = torch.ones(batch.size, dtype=torch.bool) if owner is None else owner[rows] == ranks.rank
        batch = segment_batch(batch)  # each action on exactly its context, where a template rewrote the history
        mine = mine if batch.seg_row is None else mine[batch.seg_row]
        stats: dict[str, float] = {}  # this rank's part of each step's statistics: summed over ranks below
        steps, t0, tokens, padded, shared, grad_norms, nonfinite = 0, time.perf_counter(), 0, 0, 0, 0.0, 0.0
        # not scored before (on-policy, no correction): the first minibatch's forwards, before any step, are the
        # trainer's log-probs under the weights that sampled; the gap is measured on them for free (several
        # processes: each rank fills its own rows, and the ranks' rows are put together after that minibatch)
        probe = torch.zeros(0) if batch.sampler_logp is None else None
        measured: dict[str, float] = {}
        self.model.train()
        for _ in range(cfg.optim.ppo_epochs):
            perm = ranks.broadcast(torch.randperm(batch.size))  # the same minibatches on every rank
            for chunk in torch.chunk(perm, min(cfg.optim.minibatches, batch.size)):
                mb = batch.select(chunk)
                own_rows = mine[chunk].nonzero(as_tuple=True)[0]  # this rank's rows, as positions in mb
                own = mb.select(own_rows)
                _, _, mb_mask = loss_terms(mb.behaviour_logp, mb.sampler_logp, mb.prox_logp, mb.action_mask, loss_cfg)
                if probe is not None and steps == 0:
                    probe = torch.zeros(mb.input_ids.shape)  # (b, T): the first minibatch's log-probs
                self.optimizer.zero_grad(set_to_none=True)
                # every rank makes as many forwards and backwards as the busiest (FSDP and ZeRO gather weights in
                # each, ZeRO-2 reduces in each): a rank short of rows pads with zero-loss passes
                parts: list[torch.Tensor | None] = \
                    own.micro_batches(cfg.optim.micro_batch_tokens, self._share_heads > 0) if own.size else []
                parts += [None] * (max(ranks.gather(len(parts))) - len(parts) if ranks.world > 1 and not by_hand else 0)
                parts = parts or [None]
                finite = True
                for j, idx in enumerate(parts):
                    last = j == len(parts) - 1  # DDP all-reduces the gradients on this backward only
                    m = (own.select(idx) if idx is not None else mb.select([0])).trim().to(device)
                    self._step_on_backward(last)
                    sync = contextlib.nullcontext() if last and not by_hand else self.accelerator.no_sync(self.model)
                    with sync:
                        with self.accelerator.autocast():  # bf16 on CUDA
                            ts = token_stats(learner, m.input_ids, m.attention_mask,
                                             self.knobs.temperature or 1.0, entropy=True, only=m.action_mask,
                                             share_heads=self._share_heads)
                        if probe is not None and steps == 0 and idx is not None:
                            probe[own_rows[idx], : ts.logp.shape[1]] = ts.logp.detach().float().cpu()
                        # the ratio's baseline and weight: mu; decoupled PPO's pi_prox and min(pi_prox / mu, C);
                        # a mismatch correction's pi_old and its weight (agentrl.mismatch.loss_terms)
                        against, weight, mask = loss_terms(m.behaviour_logp, m.sampler_logp, m.prox_logp,
                                                           m.action_mask, loss_cfg)
                        loss, s = policy_loss(ts.logp, against, m.advantages, mask, loss_cfg,
                                              ref_logp=m.ref_logp, entropy=ts.entropy, turn_index=m.turn_index,
                                              is_weight=weight)
                        if idx is None or not torch.isfinite(loss):
                            finite = finite and idx is None
                            self.accelerator.backward(ts.logp.sum() * 0.0)  # the all-reduce, without a gradient
                            continue
                        share = _share(mask, mb_mask, loss_cfg.agg)
                        self.accelerator.backward(loss * (share * ranks.world))
                    for k, v in s.items():
                        stats[k] = stats.get(k, 0.0) + share * v
                    tokens += int(m.attention_mask.sum())
                    padded += m.input_ids.numel()
                    shared += ts.shared
                if by_hand:
                    ranks.mean_grads(self.trainable)
                finite = not ranks.sum({"nonfinite": float(not finite)})["nonfinite"]  # one rank's NaN skips all
                gn = self.accelerator.clip_grad_norm_(self.trainable, cfg.optim.max_grad_norm) if finite \
                    else float("nan")
                grad_norms += float(gn)
                # a non-finite loss or gradient skips the step (the weights stay sound) and raises the
                # NON-FINITE alarm, which ends the run after logging it
                if math.isfinite(float(gn)):
                    self.optimizer.step()
                else:
                    nonfinite += 1.0
                self.optimizer.zero_grad(set_to_none=True)
                if probe is not None and steps == 0:
                    if ranks.world > 1:  # every row filled by its own rank alone, zeros elsewhere
                        probe = torch.stack(ranks.gather(probe)).sum(0)
                    measured = mismatch_stats(probe - mb.behaviour_logp, mb.action_mask, loss_cfg.mismatch_cap)
                steps += 1
        self.model.eval()
        secs = time.perf_counter() - t0
        stats = ranks.sum({**stats, "__tokens": float(tokens), "__padded": float(padded), "__shared": float(shared)})
        tokens, padded, shared = stats.pop("__tokens"), stats.pop("__padded"), stats.pop("__shared")
        secs = max(ranks.gather(secs))
        out = {f"train/{k}": v / steps for k, v in stats.items()}
        out["train/grad_norm"] = grad_norms / steps  # the same on every rank: norms of the averaged gradients
        if nonfinite:
            out["train/nonfinite_steps"] = nonfinite / steps
        out["train/clip_frac"] = out.get("train/clip_low_frac", 0.0) + out.get("train/clip_high_frac", 0.0)
        out["train/trained_episodes"] = float(batch.size if batch.seg_row is None else len(set(batch.seg_row.tolist())))
        if batch.seg_row is not None:
            out["train/segments"] = float(batch.size)
        out["train/tokens_per_s"] = tokens / secs if secs > 0 else 0.0
        out["train/padding_frac"] = 1.0 - tokens / max(padded, 1)
        if shared:  # prompt tokens whose layers ran once for the rows sharing them (optim.share_prefix)
            out["train/prompt_tokens_shared"] = shared
        out.update({f"mismatch/{k}": v for k, v in measured.items()})
        return out

    def _step_on_backward(self, last: bool) -> None:
        """DeepSpeed's backward also steps its optimizer unless told this is not a minibatch's last micro-batch
        (accelerate's `no_sync` does not tell it)."""
        from accelerate.utils import DistributedType

        if self.accelerator.distributed_type == DistributedType.DEEPSPEED:
            self.accelerator.gradient_state._set_sync_gradients(last)

    def reference_logp(self, batch: TurnBatch, owner: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) log-probs under the reference, once per batch: the frozen copy, or with LoRA the same
        model with its adapters switched off. With `owner` (several processes), each rank scores its own
        rows and the rows are exchanged."""
        off = self.policy.model.disable_adapter() if self.reference is None else contextlib.nullcontext()
        with off:
            return self._score(batch, self.reference if self.reference is not None else self._learner(), owner)

    def proximal_logp(self, batch: TurnBatch) -> torch.Tensor:
        """(B, T) log-probs under the weights as they are before this update's first step: the proximal
        policy of decoupled PPO (one extra forward per batch)."""
        return self._score(batch, self._learner(), None)

    @property
    def _scores_sampler(self) -> bool:
        """Whether each batch is scored under the weights that sampled it (`sampler_logp`): a mismatch correction
        needs it, and rollouts ahead measure the gap on it; on-policy, the first minibatch's own forwards measure
        it at no cost (`optimize`), on any number of processes."""
        return self.cfg.loss.mismatch != "none" or self.cfg.rollout.max_staleness > 0

    def sampler_logp(self, batch: TurnBatch, update: int, owner: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) the trainer's log-probs of each episode under the weights that sampled it (its policy_version),
        to hold against the engine's (`behaviour_logp`). On-policy those are the learner's before this update's
        first step (the proximal policy's, reused when the batch has them); rollouts ahead score their older
        versions from the snapshots kept of each. One forward per batch in all. A version no longer kept (the
        first updates after a resume) is scored under the learner's weights: that gap holds one update's drift."""
        now = update - 1  # the learner's version: updates applied so far
        versions = [e.policy_version for e in batch.episodes]
        if all(v == now for v in versions):
            return batch.prox_logp if batch.prox_logp is not None else self._score(batch, self._learner(), owner)
        out = batch.prox_logp.clone() if batch.prox_logp is not None else torch.zeros(batch.input_ids.shape)
        for v in sorted(set(versions)):
            if v == now and batch.prox_logp is not None:
                continue
            rows = torch.tensor([i for i, x in enumerate(versions) if x == v])
            out[rows] = self._score(batch.select(rows), self._version_model(v, now), None)
        return out

    def _version_model(self, version: int, now: int) -> torch.nn.Module:
        """A module holding the weights of `version` (the learner itself for its own or an unkept version)."""
        if version == now or version not in self.snapshots:
            return self._learner()
        if self._past is None:
            self._past = copy.deepcopy(self.accelerator.unwrap_model(self.model)).eval().requires_grad_(False)
        self._past.load_state_dict(self.snapshots[version], strict=False)
        return self._past

    def _trainable_copy(self) -> dict[str, torch.Tensor]:
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

    def _grads_by_hand(self) -> bool:
        """Train on the unwrapped module and average the gradients ourselves (`optimize`): DDP (not a wrapper that
        shards the weights, whose forward must gather them) with prompt sharing on."""
        return (self.ranks.world > 1 and self._share_heads > 0
                and isinstance(self.model, torch.nn.parallel.DistributedDataParallel))

    @property
    def _share_heads(self) -> int:
        """`token_stats(share_heads=...)`: what a shared prompt must save; 0 when `optim.share_prefix` is off."""
        return MIN_SHARED_HEAD if self.cfg.optim.share_prefix else 0

    def _learner(self) -> torch.nn.Module:
        # scoring never trains: the unwrapped module (no DDP forward, whose all-reduce would wait for a backward),
        # unless the wrapper shards the weights (FSDP, DeepSpeed), whose own forward must gather them
        return self.model if shards_weights(self.model) else self.accelerator.unwrap_model(self.model)

    def _score(self, batch: TurnBatch, model: torch.nn.Module, owner: torch.Tensor | None) -> torch.Tensor:
        """(B, T) log-probs of the action tokens under `model`, in micro-batches; with `owner`, each rank
        scores its own rows and the rows are exchanged."""
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        rows = torch.arange(batch.size) if owner is None else (owner == self.ranks.rank).nonzero(as_tuple=True)[0]
        own = segment_batch(batch.select(rows))  # rows are segments where a template rewrote the history
        scored = out if own.seg_row is None else torch.zeros(own.input_ids.shape, dtype=torch.float32)
        temp = self.knobs.temperature or 1.0
        parts: list[torch.Tensor | None] = \
            own.micro_batches(self.cfg.optim.micro_batch_tokens, self._share_heads > 0) if own.size else []
        if owner is not None and shards_weights(model):  # every forward gathers weights: as many on every rank
            parts += [None] * (max(self.ranks.gather(len(parts))) - len(parts))
        with torch.inference_mode(), self.accelerator.autocast():
            for idx in parts:
                m = (own.select(idx) if idx is not None else batch.select([0])).trim().to(self.accelerator.device)
                logp = token_stats(model, m.input_ids, m.attention_mask, temp, only=m.action_mask,
                                   share_heads=self._share_heads).logp
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

    critic_only_updates: int = 0  # updates whose credit trained only the assigner's critic (summary.json)
    _said_policy_moves: bool = False

    def _say_critic_only(self, update: int, metrics: dict[str, Any]) -> None:
        """Say when an update trains only the critic (an assigner's warm-up, e.g. turn-ppo's): the table's
        empty entropy and KL would not say why. Once when it starts, once when the policy starts to move."""
        warming = metrics.get("credit/critic_warmup", 0.0) >= 1.0
        if warming:
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

    # -- the run ------------------------------------------------------------------------------------

    def _check_warm_start(self) -> None:
        """Warn before RL when the warm start is at the floor, at the ceiling, or far below its expert."""
        sft_record = (self.decisions.get("warm_start") or {}).get("sft") or {}
        advice = warm_start_advice(self.warm.pass_rate, self.warm.episodes, sft_record.get("demo_pass_rate"),
                                   tuple(self.cfg.sft.useful_band), self.cfg.rollout.group_size)
        if advice:
            self.decisions["warm_start_warning"] = advice
            self.monitor.say(f"warning: {advice}")

    def train(self, warm: EvalResult | None = None) -> dict[str, Any]:
        """Run every update (from the checkpoint's on a resumed run); `warm` reuses a held-out evaluation
        of this same starting policy. SIGTERM / SIGINT finish the update, save a checkpoint and exit."""
        handlers = {}
        if threading.current_thread() is threading.main_thread():
            handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        self.phase("start", self.done)
        try:
            return self._train(warm)
        finally:
            self.phase.close()
            if self.runner is not None:
                self.runner.close()
            for s, h in handlers.items():
                signal.signal(s, h)

    def _train(self, warm: EvalResult | None) -> dict[str, Any]:
        cfg = self.cfg
        t_start = time.perf_counter()
        trained = sum(p.numel() for p in self.trainable)
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
            self.history.append({"step": 0, **self.warm.metrics()})
            self.monitor.log(self.history[-1])
            self._agree_on_signal()
            self._exit_on_signal()  # nothing to save yet: a resumed run starts over
        warm = self.warm
        saved = self.resumed_from is not None
        ahead = None
        if self.actor is not None and self.done < cfg.updates:
            with torch.no_grad():  # the learner's weights as they stand (a resumed run's, not the ones first loaded)
                self.actor.load_state_dict(self.accelerator.unwrap_model(self.model).state_dict())
        if self.syncs_weights and self.resumed_from is not None:  # the engine's copy was made before the resume
            self.engine.sync_weights(self.actor if self.actor is not None else self.policy.model)
        if self.actor is not None and self.done < cfg.updates:
            self.snapshots = {self.done: self._trainable_copy()}
            ahead = RolloutAhead(self.collect, self.actor, self.done + 1, cfg.updates, cfg.rollout.max_staleness,
                                 version=self.done, on_new_weights=self.engine.sync_weights if self.syncs_weights
                                 else None)
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
        self._exit_on_signal()
        return self._finish(t_start, warm)

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
            if batch.sampler_logp is None and _nothing_to_train(credit):
                # the gap is measured on the first step's forwards, and this update takes none: one forward here,
                # so that a run at the floor (a real model before SFT) still logs its engine's mismatch
                scored = batch.with_(sampler_logp=self.sampler_logp(batch, update, owner))
                metrics.update(self.mismatch_metrics(scored, torch.ones(batch.size, dtype=torch.bool)))
            metrics.update(self.optimize(batch, credit, owner))
            self._say_critic_only(update, metrics)
            self._sync_step(update, ahead)
            metrics["time/rollout_s"] = t_roll
            metrics["time/update_s"] = time.perf_counter() - t0
            self._eval_step(update, metrics)
            saved = self._log_step(update, metrics)
            if saved:
                self._checkpoint_step(update)
            self._exit_on_signal()
        return saved

    def _rollout_step(self, update: int, ahead: RolloutAhead | None) -> tuple[list[Episode], dict[str, float]]:
        """This update's episodes and their rollout metrics (from the thread running ahead, if there is one)."""
        self.phase("rollout", update)
        episodes, metrics = ahead.get(update) if ahead is not None else self.collect(update)
        return episodes, {**metrics, **self._staleness(update, episodes)}

    def _score_step(self, update: int, episodes: list[Episode], metrics: dict[str, float],
                    ) -> tuple[TurnBatch, torch.Tensor | None]:
        """The batch with the log-probs the credit and the loss read: the reference's (once per batch: the
        KL and the implicit PRM), a teacher's (distillation), the proximal policy's (decoupled PPO), the sampler's
        (the engine gap).
        Several processes: also each row's owning rank."""
        cfg = self.cfg
        batch = make_batch(episodes, self.policy.chat.pad_id)
        owner = torch.tensor([self.owner[e.group_id] for e in episodes]) if self.ranks.world > 1 else None
        batch = batch.with_(ref_logp=self.reference_logp(batch, owner))
        if self.teacher is not None:  # distillation: the teacher's log-probs of the same tokens, same micro-batches
            t0 = time.perf_counter()
            batch = batch.with_(teacher_logp=self._score(batch, self.teacher, owner))
            metrics["time/teacher_s"] = time.perf_counter() - t0
        if cfg.rollout.max_staleness and cfg.loss.off_policy == "decoupled":
            batch = batch.with_(prox_logp=self.proximal_logp(batch))
            w = _is_weight(batch, cfg.loss.is_cap)[batch.action_mask > 0]
            metrics.update({"train/is_weight_mean": float(w.mean()), "train/is_weight_max": float(w.max())})
        if self._scores_sampler:
            batch = batch.with_(sampler_logp=self.sampler_logp(batch, update, owner))
        return batch, owner

    def _credit_step(self, batch: TurnBatch, metrics: dict[str, float]) -> Credit:
        """The assigner's fit and its credit for the batch, with their metrics (and the engine gap over the
        rows that will train)."""
        fit = self.assigner.fit(batch)
        credit = self.assigner.assign(batch, fit)
        if batch.sampler_logp is not None:
            metrics.update(self.mismatch_metrics(batch, credit.row_weight > 0))
        metrics.update({f"credit/{k}": v for k, v in {**fit.metrics, **credit.metrics}.items()})
        if metrics.get("credit/groups"):
            metrics["credit/all_pass_frac"] = metrics.get("credit/all_pass_groups", 0.0) / metrics["credit/groups"]
            metrics["credit/all_fail_frac"] = metrics.get("credit/all_fail_groups", 0.0) / metrics["credit/groups"]
        return credit

    def _sync_step(self, update: int, ahead: RolloutAhead | None) -> None:
        """The new weights to whoever samples next: the rollout thread's actor, or an engine with its own copy."""
        if ahead is not None:  # the rollout thread refreshes its actor from this copy before its next rollout
            weights = self._trainable_copy()
            ahead.publish(update, weights)
            # episodes of version update - max_staleness onwards may still come; older ones never
            keep = update - self.cfg.rollout.max_staleness
            self.snapshots = {v: w for v, w in self.snapshots.items() if v >= keep}
            self.snapshots[update] = weights
        elif self.syncs_weights:  # e.g. vLLM generates from its own copy of the weights
            self.engine.sync_weights(self.policy.model)

    def _eval_step(self, update: int, metrics: dict[str, float]) -> None:
        """The held-out evaluation every `eval.every` updates (the last update's is the final one, after the loop)."""
        every = self.cfg.eval.every
        if every and update % every == 0 and update != self.cfg.updates:
            self.phase("eval", update)
            self.last_eval = self.evaluate()
            metrics.update(self.last_eval.metrics())

    def _log_step(self, update: int, metrics: dict[str, float]) -> bool:
        """Log the update, check health (which may stop the run), agree on a signal; returns whether to save."""
        self.phase("log", update)
        self.done = update
        # every rank logs, checks and acts on the main process's row (its timings), so all decide alike
        metrics = self.ranks.broadcast(metrics)
        self.stopped = self.check_health({"step": update, **metrics})
        self._agree_on_signal()
        every = self.cfg.checkpoint.every
        return bool((every and update % every == 0) or update == self.cfg.updates or self.stopped or self._signal)

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

    def _finish(self, t_start: float, warm: EvalResult) -> dict[str, Any]:
        """The final held-out evaluation, the trained model as an HF folder, summary.json."""
        cfg = self.cfg
        done, stopped, last_eval = self.done, self.stopped, self.last_eval
        self.phase("final-eval", done)
        final = self.evaluate() if done else last_eval
        self.monitor.log({"step": done, **final.metrics(), "final": True})
        self.phase("save", done)
        ckpt = self.out / "checkpoint"
        model = self.accelerator.unwrap_model(self.model)
        if self.ranks.main:
            if cfg.optim.lora.r:  # the adapters on their own, and the merged model as an ordinary HF folder
                model.save_pretrained(ckpt / "adapter")
                model = self.policy.model = model.merge_and_unload()
            model.save_pretrained(ckpt)
            self.policy.tokenizer.save_pretrained(ckpt)
        summary = {
            "algo": cfg.algo,
            "env": self.source,
            "env_kwargs": {} if self.runner is not None else cfg.env.kwargs,
            "updates": cfg.updates,
            "updates_done": done,
            "stopped": stopped,
            "alarms": sorted({r.split(":", 1)[0] for row in self.history for r in row.get("health/reasons", [])
                              if ":" in r}),
            "interventions": [a for row in self.history for a in row.get("health/actions", [])],
            "seed": cfg.seed,
            "warm_start_pass_rate": warm.pass_rate,
            "final_pass_rate": final.pass_rate,
            "improvement": final.pass_rate - warm.pass_rate,
            "eval_episodes": final.episodes,
            "eval_seeds": [cfg.eval.seed_offset, cfg.eval.seed_offset + cfg.eval.episodes - 1],
            "parameters": self.policy.num_parameters,
            "warm_start_dir": str(self.warm_start_dir) if self.warm_start_dir else None,
            "critic_only_updates": self.critic_only_updates,
            "decisions": self.decisions,
            "checkpoint": str(ckpt),
            "wall_s": time.perf_counter() - t_start,
        }
        if self.ranks.world > 1:
            summary["processes"] = self.ranks.world
        if self.ranks.main:
            tmp = self.out / "summary.json.tmp"  # atomically: a kill leaves the old file or the new, never half
            tmp.write_text(json.dumps(summary, indent=2))
            tmp.replace(self.out / "summary.json")
        self.ranks.barrier()
        if self.checkpoint_seconds:
            self.monitor.say(f"checkpoints: {len(self.checkpoint_seconds)} written, "
                             f"{sum(self.checkpoint_seconds) / len(self.checkpoint_seconds):.2f}s each")
        self.monitor.close(summary)
        self.phase("done", done)
        return summary


def _read_json(path: Path) -> Any:
    """A JSON file's content, or None where there is none (or it does not parse)."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _nothing_to_train(credit: Credit) -> bool:
    """No episode kept, or every advantage zero: the update takes no optimizer step."""
    return not bool((credit.row_weight > 0).any()) or float(credit.advantages.abs().sum()) == 0.0


def _is_weight(batch: TurnBatch, cap: float) -> torch.Tensor:
    """Decoupled PPO's per-token importance weight min(pi_prox / mu, cap), 0 off the action tokens."""
    return capped_ratio(batch.prox_logp - batch.behaviour_logp, cap, batch.action_mask)


def _share(part: torch.Tensor, whole: torch.Tensor, agg: str) -> float:
    """A micro-batch's weight in its minibatch's loss: its share of the action tokens (token-mean)
    or of the episodes that have any (the per-sequence aggregations)."""
    if agg == "token-mean":
        return float(part.sum()) / max(float(whole.sum()), 1.0)
    return float((part.sum(1) > 0).sum()) / max(float((whole.sum(1) > 0).sum()), 1.0)


def _groups(episodes: list[Episode]) -> list[list[Episode]]:
    out: dict[int, list[Episode]] = {}
    for e in episodes:
        out.setdefault(e.group_id, []).append(e)
    return list(out.values())


def _holds_run(out: Path) -> bool:
    """Whether `out` holds (part of) a run: a second run's rows appended to its metrics.jsonl would mix two runs."""
    metrics = out / "metrics.jsonl"  # empty: a Monitor opened for this run by the caller, no rows yet
    return (metrics.exists() and metrics.stat().st_size > 0) or (out / CHECKPOINTS).exists() \
        or (out / "summary.json").exists()


def _decisions_header(decisions: dict[str, Any]) -> str:
    """YAML comments (the file stays a loadable config) that say what the run decided before it began."""
    auto = decisions.get("algo_auto")
    if not auto:
        return ""
    stats = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in auto["statistics"].items())
    return (f"# algo: {auto['algo']}, picked by --algo auto (the horizon probe), rule {auto['rule']}: "
            f"{auto['reason']}\n# probe statistics: {stats}\n# thresholds: {auto['thresholds']}\n")


__all__ = ["CHECKPOINTS", "EpisodeErrors", "EvalResult", "Trainer", "evaluate"]
