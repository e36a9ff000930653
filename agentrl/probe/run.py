"""Running the probe: on episodes, on a saved store (no environment, no model), or on a short
rollout of the current policy (`probe_env`, what `agentrl train --algo auto` does first).

>>> import tempfile, os
>>> from agentrl.core import Turn
>>> eps = [Episode([0], [Turn(1, [5], [-0.5], [6])], reward=float(i % 2), group_id=i // 4) for i in range(8)]
>>> path = TrajectoryStore(eps).save(os.path.join(tempfile.mkdtemp(), "s.parquet"))
>>> r = probe_store(path, ProbeThresholds(min_episodes=4))
>>> r.stats.turns_median, r.recommendation.algo, r.recommendation.rule
(1.0, 'grpo', 'short-horizon')
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.core import Episode
from agentrl.probe.calibration import thresholds_from_sweep
from agentrl.probe.family import family_distance
from agentrl.probe.measure import measure
from agentrl.probe.result import ProbeResult
from agentrl.probe.rules import recommend
from agentrl.probe.thresholds import ProbeThresholds, default_thresholds
from agentrl.store import StoreError, TrajectoryStore


def probe_episodes(
    episodes: Sequence[Episode],
    thresholds: ProbeThresholds | None = None,
    *,
    source: str = "episodes",
    budget_episodes: int | None = None,
    env: dict[str, Any] | None = None,
) -> ProbeResult:
    """Measure `episodes` and recommend an assigner."""
    th = thresholds or default_thresholds()
    stats, curves = measure(episodes, th)
    rec, outcomes = recommend(stats, th, budget_episodes)
    return ProbeResult(
        source=source,
        stats=stats,
        curves=curves,
        thresholds=th,
        budget_episodes=budget_episodes,
        rules=outcomes,
        recommendation=rec,
        env=env,
        family=family_distance(stats),
    )


def load_store(path: str | Path) -> TrajectoryStore:
    """A saved store: a Parquet file, a folder of them, or a run folder (its `store/`)."""
    p = Path(path)
    if p.is_dir() and not any(p.glob("*.parquet")) and (p / "store").is_dir():
        p = p / "store"
    store = TrajectoryStore.load(p)
    if not len(store):
        raise StoreError(f"{p}: the store holds no episodes")
    return store


def probe_store(
    store: TrajectoryStore | str | Path, thresholds: ProbeThresholds | None = None, budget_episodes: int | None = None
) -> ProbeResult:
    """Probe a saved store (no environment, no model needed): a Parquet file, a folder of them, or a run folder."""
    source = "store"
    if not isinstance(store, TrajectoryStore):
        source = str(store)
        store = load_store(store)
    return probe_episodes(store.episodes, thresholds, source=source, budget_episodes=budget_episodes)


def collect(
    train_config: Any, groups: int = 8, group_size: int | None = None, policy: Any = None, seed: int | None = None
) -> list[Episode]:
    """A short rollout with the current policy: `groups` tasks x `group_size` episodes, training seeds
    (below the held-out offset), hidden states captured for the value probe. Without `policy`, the
    policy is built as `Trainer` builds it: `--model`, else the cached SFT warm start."""
    from agentrl.evaluation import make_engine, resolve_device
    from agentrl.policy import Policy
    from agentrl.registry import make
    from agentrl.rollout import rollout

    cfg = train_config
    G = group_size or cfg.rollout.group_size
    if policy is None:
        if cfg.model is None and cfg.agent is not None:  # an agent's warm start: its own demonstrations
            from agentrl.stages.warm_start import warm_start_from_data

            if cfg.agent.demos is None:
                raise ValueError("probing an agent with no model needs its demonstrations (--agent.demos) or --model")
            policy = Policy.load(warm_start_from_data(cfg.agent.demos, cfg.tiny, cfg.sft, cfg.seed),
                                 device=resolve_device(cfg.device))
        elif cfg.model is None:
            from agentrl.stages.warm_start import warm_start

            policy = Policy.load(
                warm_start(cfg.env.id, cfg.env.kwargs, cfg.tiny, cfg.sft, cfg.seed), device=resolve_device(cfg.device)
            )
        else:
            policy = Policy.load(cfg.model, device=resolve_device(cfg.device))
    max_context = cfg.rollout.max_context or getattr(policy.model.config, "max_position_embeddings", 2048)
    rng = np.random.default_rng(cfg.seed if seed is None else seed)
    task_seeds = rng.integers(0, cfg.eval.seed_offset, size=groups).tolist()
    seeds = [s for s in task_seeds for _ in range(G)]
    engine = make_engine(cfg, policy, cfg.rollout.sampling, seed=cfg.seed, capture_hidden=True)
    if cfg.agent is not None:  # the agent's episodes through the gateway: measured like an env's
        from agentrl.collector import agent_runner

        with agent_runner(cfg) as runner:
            episodes, _ = runner.rollout(engine, policy.chat, seeds, group_ids=[i // G for i in range(len(seeds))],
                                         max_context=max_context)
        errored = [e for e in episodes if e.error]
        if errored:
            raise ValueError(f"{len(errored)} probed episode(s) errored; first: {errored[0].error}")
        return episodes
    envs = [make(cfg.env.id, **cfg.env.kwargs) for _ in seeds]
    episodes, _ = rollout(
        envs,
        seeds,
        engine,
        policy.chat,
        group_ids=[i // G for i in range(len(seeds))],
        max_context=max_context,
        max_new_tokens=cfg.rollout.sampling.max_new_tokens,
    )
    return episodes


def planned_episodes(train_config: Any) -> int:
    """The training budget of a config: updates x groups x group size."""
    return int(train_config.updates * train_config.rollout.groups * train_config.rollout.group_size)


def probe_env(
    train_config: Any,
    groups: int = 8,
    group_size: int | None = None,
    policy: Any = None,
    thresholds: ProbeThresholds | None = None,
    store_out: str | Path | None = None,
    budget_episodes: int | None = None,
) -> ProbeResult:
    """Roll out the current policy on the config's environment (see `collect`) and probe it; the
    recommendation weighs `budget_episodes`, by default the config's training budget
    (`planned_episodes`). `store_out` saves the probed episodes."""
    episodes = collect(train_config, groups, group_size, policy)
    if store_out is not None:
        TrajectoryStore(episodes).save(store_out)
    agent = train_config.agent
    env = {
        "id": f"agent:{agent.entry}" if agent else train_config.env.id,
        "kwargs": {} if agent else train_config.env.kwargs,
        "model": train_config.model or "warm start (tiny policy, SFT)",
    }
    return probe_episodes(
        episodes,
        thresholds,
        source=f"gateway rollout of agent {agent.entry}" if agent
        else f"rollout on {train_config.env.id} {train_config.env.kwargs}",
        budget_episodes=budget_episodes if budget_episodes is not None else planned_episodes(train_config),
        env=env,
    )


def probe_thresholds(sweep: str | Path | None = None, overrides: dict[str, Any] | None = None) -> ProbeThresholds:
    """The thresholds a probe applies: fitted to a horizon sweep's JSON file when `sweep` is given, else
    the calibration that ships with agentrl (`default_thresholds`), with `overrides` (field: value) on top.
    A sweep that is not JSON raises `json.JSONDecodeError`; an override out of range, pydantic's
    `ValidationError` (both are ValueErrors).

    >>> probe_thresholds(overrides={"horizon_cutoff": 12}).horizon_cutoff
    12.0
    """
    if sweep is not None:
        th = thresholds_from_sweep(json.loads(Path(sweep).read_text()), source=str(Path(sweep)))
    else:
        th = default_thresholds()
    if overrides:
        th = ProbeThresholds(**{**th.model_dump(), **overrides})
    return th


def recommend_for_config(train_config: Any, groups: int = 8) -> tuple[str, str]:
    """(algo, reason) for `agentrl train --algo auto`: probe the config's environment with its
    policy, using the default (sweep-derived) thresholds."""
    r = probe_env(train_config, groups=groups)
    return r.recommendation.algo, r.recommendation.reason
