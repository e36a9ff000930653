"""What a checkpoint holds, written and read side by side: whatever the next update depends on, so that a run
killed at any moment and resumed continues bit for bit (docs/checkpoints.md).

    model.pt       the trainable weights (with LoRA the adapters; the base is rebuilt from its source)
    optimizer.pt   the optimizer's state
    assigner.pt    the assigner's own state (a critic, its optimizer, running statistics)
    rng.pt         the generators' tensors, and the engine's sampling state
    state.json     where the loop stands: the update, the task stream, the history the alarms read, the knobs
                   interventions turned, the held-out evaluations, what was decided, the monitor's position

The trainer is read and written through its attributes (`Trainer.checkpoint`, `Trainer._resume` call these).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from agentrl.checkpoint import CheckpointError, rng_state, set_rng_state
from agentrl.checkpoint import read as read_checkpoint
from agentrl.credit import assigner_state, load_assigner_state
from agentrl.evaluation import EvalResult
from agentrl.run_folder import distributed_kind, refuse_sharded


def checkpoint_files(trainer: Any) -> dict[str, Any]:
    """The files of a checkpoint after update `trainer.done`. Every rank calls it (gathering sharded weights is
    collective); the main process writes what it returns."""
    t = trainer
    weights = _weights(t)
    rng_json, rng_tensors = rng_state()
    # the stream as it stood when the next update's rollout began (agentrl.collector)
    stream = t.collector.stream_at(t.done + 1)
    engine = stream["engine"]
    state = {
        "update": t.done, "next_group": stream["next_group"], "task_rng": stream["task_rng"],
        "rng": rng_json, "history": t.history, "last_acted": t.last_acted,
        # the knobs interventions may have turned (the rest of the config is the run's config.yaml)
        "knobs": t.knobs.state(),
        "critic_only_updates": t.critic_only_updates, "said_policy_moves": t._said_policy_moves,
        "warm": None if t.warm is None else asdict(t.warm),
        "last_eval": None if t.last_eval is None else asdict(t.last_eval),
        "source_start": t.source_start, "source_last": t.source_last,
        "stopped": t.stopped, "decisions": t.decisions, "monitor": t.monitor.position(),
        "engine_state": engine is not None, "processes": t.ranks.world,
        "distributed_type": distributed_kind(t.accelerator.distributed_type),
    }
    return {"model.pt": weights, "optimizer.pt": t.learner.optimizer.state_dict(),
            "assigner.pt": assigner_state(t.assigner),
            "rng.pt": {**rng_tensors, **({"engine": engine} if engine is not None else {})}, "state.json": state}


def restore(trainer: Any, folder: Path) -> int:
    """Load the checkpoint in `folder` into `trainer` (verified by agentrl.checkpoint.latest); returns how many
    processes saved it."""
    t = trainer
    state = read_checkpoint(folder, "state.json")
    refuse_sharded(str(state.get("distributed_type", "NO")), t.out, saved=folder.name)
    lora = t.cfg.optim.lora.r
    model = t.accelerator.unwrap_model(t.learner.model)
    missing, unexpected = model.load_state_dict(read_checkpoint(folder, "model.pt"), strict=not lora)
    if unexpected or (not lora and missing):
        raise CheckpointError(f"{folder}: model.pt does not fit this policy (unexpected {unexpected[:3]}, missing "
                              f"{missing[:3]})")
    t.learner.optimizer.load_state_dict(read_checkpoint(folder, "optimizer.pt"))
    load_assigner_state(t.assigner, read_checkpoint(folder, "assigner.pt"))
    rng = read_checkpoint(folder, "rng.pt")
    if state["engine_state"]:
        t.engine.load_state_dict(rng.pop("engine"))
    set_rng_state(state["rng"], rng)
    t.collector.load_stream(state["task_rng"], state["next_group"])
    t.done = int(state["update"])
    t.history, t.last_acted = state["history"], state["last_acted"]
    t.knobs.load(state["knobs"])
    t.critic_only_updates, t._said_policy_moves = state["critic_only_updates"], state["said_policy_moves"]
    t.warm = None if state["warm"] is None else EvalResult(**state["warm"])
    t.last_eval = None if state["last_eval"] is None else EvalResult(**state["last_eval"])
    # a checkpoint written before eval.sources existed holds none
    t.source_start, t.source_last = state.get("source_start", {}), state.get("source_last", {})
    t.stopped, t.decisions = state["stopped"], state["decisions"]
    t.monitor.rewind(state["monitor"])
    return int(state.get("processes", 1))


def summary(trainer: Any, warm: EvalResult, final: EvalResult, checkpoint: Path, wall_s: float) -> dict[str, Any]:
    """summary.json: what the run was, how far it went and why it stopped, the held-out pass rates before and
    after, the alarms that fired and the interventions made, what was decided before it, where the model is."""
    t, cfg = trainer, trainer.cfg
    out = {
        "algo": cfg.algo,
        "env": t.source,
        "env_kwargs": {} if t.runner is not None else cfg.env.kwargs,
        "updates": cfg.updates,
        "updates_done": t.done,
        "stopped": t.stopped,
        "alarms": sorted({r.split(":", 1)[0] for row in t.history for r in row.get("health/reasons", []) if ":" in r}),
        "interventions": [a for row in t.history for a in row.get("health/actions", [])],
        "seed": cfg.seed,
        "warm_start_pass_rate": warm.pass_rate,
        "final_pass_rate": final.pass_rate,
        "improvement": final.pass_rate - warm.pass_rate,
        "eval_episodes": final.episodes,
        "eval_seeds": [cfg.eval.seed_offset, cfg.eval.seed_offset + cfg.eval.episodes - 1],
        "parameters": t.policy.num_parameters,
        "warm_start_dir": str(t.warm_start_dir) if t.warm_start_dir else None,
        "critic_only_updates": t.critic_only_updates,
        "decisions": t.decisions,
        "checkpoint": str(checkpoint),
        "wall_s": wall_s,
    }
    if t.sources:  # only where eval.sources is set: a run without keeps its summary as it was
        out["eval_sources"] = {s.cfg.name: source_summary(s, t.source_start.get(s.cfg.name),
                                                          t.source_last.get(s.cfg.name)) for s in t.sources}
    if t.ranks.world > 1:
        out["processes"] = t.ranks.world
    return out


def source_summary(source: Any, start: dict[str, float] | None, final: dict[str, float] | None) -> dict[str, Any]:
    """One evaluation source in summary.json: what it evaluated, how, and its metrics at step 0 and at the end."""
    return {"env": source.env_id, "env_kwargs": source.env_kwargs, "seeds": [source.seeds[0], source.seeds[-1]],
            "k": source.cfg.k, "temperature": source.temperature, "greedy": source.cfg.greedy,
            "scorer": source.cfg.scorer or "env", "start": start, "final": final}


def _weights(t: Any) -> dict[str, torch.Tensor]:
    """What a checkpoint keeps of the model: the adapters with LoRA (the base is rebuilt from its source as
    it was loaded), else every tensor (accelerate gathers them when a wrapper shards them)."""
    if t.cfg.optim.lora.r:
        model = t.accelerator.unwrap_model(t.learner.model)
        return {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}
    return {n: x.detach().cpu() for n, x in t.accelerator.get_state_dict(t.learner.model).items()}


__all__ = ["checkpoint_files", "restore", "summary"]
