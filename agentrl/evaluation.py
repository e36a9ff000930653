"""Held-out evaluation, and the builders the loop and evaluation share: the device, the engine, the held-out
env's arguments, the gateway runner of a run with `--agent`.

Held-out seeds start at `eval.seed_offset`, which training's task stream never reaches; they are the same at
every evaluation, so evaluations compare. Evaluation samples at `eval.temperature`, whatever the run samples at
or an intervention chose.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agentrl.collector import agent_runner, raise_on_errors
from agentrl.config import SamplingConfig, TrainConfig
from agentrl.core import Episode
from agentrl.distributed import Ranks
from agentrl.engines import get_engine_spec
from agentrl.policy import Policy
from agentrl.registry import make
from agentrl.rollout import rollout
from agentrl.workers import make_pool


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
    """The training environment's arguments for held-out evaluation (`heldout_kwargs`)."""
    return heldout_kwargs(cfg.env.id, cfg.env.kwargs)


def heldout_kwargs(env_id: str, env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """An environment's arguments for held-out evaluation: an env with a `split` attribute (Code-v0, BFCL-v0, the
    reasoning-gym envs, TextWorld-v0) is built with split="eval", i.e. on tasks that training never sees, unless
    the arguments name one (docs/evaluation.md, "Splits that mean unseen")."""
    kwargs = dict(env_kwargs)
    if "split" not in kwargs and _has_split(env_id, json.dumps(kwargs, sort_keys=True, default=str)):
        kwargs["split"] = "eval"
    return kwargs


@functools.lru_cache(maxsize=32)
def _has_split(env_id: str, kwargs_json: str) -> bool:
    """Built once per env and arguments: building Code-v0 loads HumanEval, too slow for every evaluation."""
    return hasattr(make(env_id, **json.loads(kwargs_json)), "split")


def eval_sampling(cfg: TrainConfig) -> SamplingConfig:
    """Held-out sampling: the run's, at the fixed `eval.temperature`."""
    return cfg.rollout.sampling.model_copy(update={"temperature": cfg.eval.temperature})


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
                           on_episode=progress("held-out evaluation", say), context=cfg.rollout.context)[0]

    if ranks is None:
        episodes = roll()
    else:  # a failure on one rank is raised on all, or the others would wait in the gather
        episodes = ranks.gather_lists(ranks.together("held-out evaluation", roll))
    raise_on_errors(episodes, None)
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



__all__ = ["EvalResult", "eval_sampling", "evaluate", "heldout_env_kwargs", "heldout_kwargs", "make_engine",
           "progress", "resolve_device"]
