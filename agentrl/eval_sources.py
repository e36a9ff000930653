"""Evaluation sources (`eval.sources`): other environments, other seeds of the training one, or agents behind the
gateway, each evaluated on its own held-out tasks with k samples per task, at its own cadence, scored by its own
checker (docs/evaluation.md).

For each task (a seed) a source rolls out k samples at its temperature and, with `greedy`, one more at
temperature 0. A sample's score is the env's own verdict (the episode's reward) or the source's `scorer`; it
succeeds at 1, as `Episode.passed` does. Over the tasks, with n = k samples and c successes on a task:

    pass@j  = mean over tasks of 1 - C(n - c, j) / C(n, j)    (the unbiased estimator, Chen et al. 2021)
    avg@k   = mean over tasks of c / n                          (the unbiased pass@1)
    greedy_pass@1 = the fraction of tasks whose greedy episode succeeds

pass@j is reported for j = 2, 4, 8, ... below k and for k itself (k = 1: pass@1). The starting model is
evaluated on every source at step 0 by this same code, then every `every` updates, then after the last.

>>> pass_at_k(n=4, c=1, k=2)
0.5
>>> avg_at_k([[True, False, False, False], [True, True, True, True]])
0.625
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentrl.collector import EpisodeErrors, raise_on_errors
from agentrl.config import EvalSource, TrainConfig
from agentrl.core import AgentEnv, Episode
from agentrl.distributed import Ranks
from agentrl.evaluation import heldout_kwargs, make_engine, progress
from agentrl.loading import IMPORT_HINT, import_from_cwd
from agentrl.policy import Policy
from agentrl.registry import make
from agentrl.rollout import rollout
from agentrl.workers import make_pool, parse_workers

Scorer = Callable[[Episode, AgentEnv], Any]


# -- the estimators ---------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of k samples drawn without replacement from n, c of which succeed,
    succeeds: 1 - C(n - c, k) / C(n, k), in exact integers until the last division.

    >>> pass_at_k(4, 0, 2), pass_at_k(4, 3, 2), pass_at_k(5, 2, 5)
    (0.0, 1.0, 1.0)
    """
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n successes, got c={c}, n={n}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def avg_at_k(successes: Sequence[Sequence[bool]]) -> float:
    """The mean success over each task's samples, averaged over the tasks."""
    if not successes or any(not s for s in successes):
        raise ValueError("avg@k needs at least one task, each with at least one sample")
    return sum(sum(s) / len(s) for s in successes) / len(successes)


def mean_pass_at_k(successes: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k per task (each task's own n samples), averaged over the tasks."""
    if not successes:
        raise ValueError("pass@k needs at least one task")
    return sum(pass_at_k(len(s), sum(s), k) for s in successes) / len(successes)


def reported_ks(k: int) -> list[int]:
    """The j of the pass@j a source reports: 2, 4, 8, ... below k, and k.

    >>> reported_ks(1), reported_ks(4), reported_ks(10)
    ([1], [2, 4], [2, 4, 8, 10])
    """
    return [j for j in (2 ** i for i in range(1, k.bit_length())) if j < k] + [k]


# -- a source's result --------------------------------------------------------------------------------


@dataclass
class SourceResult:
    """One evaluation of one source: pass@j for the reported j, avg@k, greedy pass@1 (None without `greedy`),
    the mean score (partial credit shows here, not in the pass rates), and how many tasks and samples."""

    name: str
    k: int
    tasks: int
    pass_at: dict[int, float]
    avg: float
    greedy: float | None
    score_mean: float
    temperature: float

    def metrics(self) -> dict[str, float]:
        """The metrics row's keys: eval/<name>/pass@j, avg@k, greedy_pass@1, score_mean, tasks, k."""
        p = f"eval/{self.name}/"
        out = {f"{p}pass@{j}": v for j, v in self.pass_at.items()}
        out[f"{p}avg@{self.k}"] = self.avg
        if self.greedy is not None:
            out[f"{p}greedy_pass@1"] = self.greedy
        out.update({f"{p}score_mean": self.score_mean, f"{p}tasks": float(self.tasks), f"{p}k": float(self.k)})
        return out

    def summary(self) -> dict[str, float]:
        """The metrics without their eval/<name>/ prefix (summary.json, checkpoints)."""
        return {key.removeprefix(f"eval/{self.name}/"): v for key, v in self.metrics().items()}

    def line(self, step: int) -> str:
        """The console's line for this evaluation."""
        passes = "  ".join(f"pass@{j} {v:.3f}" for j, v in self.pass_at.items())
        greedy = "" if self.greedy is None else f"  greedy pass@1 {self.greedy:.3f}"
        return (f"eval {self.name} @ step {step}: {passes}  avg@{self.k} {self.avg:.3f}{greedy}  ({self.tasks} tasks "
                f"x {self.k} at T={self.temperature:g})")


def result_of(name: str, k: int, scores: Sequence[Sequence[float]], greedy: Sequence[float] | None,
              temperature: float) -> SourceResult:
    """The metrics of `scores` (one list of k sample scores per task) and the greedy scores (one per task)."""
    successes = [[s >= 1.0 for s in task] for task in scores]
    flat = [s for task in scores for s in task]
    return SourceResult(
        name=name, k=k, tasks=len(scores),
        pass_at={j: mean_pass_at_k(successes, j) for j in reported_ks(k)},
        avg=avg_at_k(successes),
        greedy=None if greedy is None else sum(g >= 1.0 for g in greedy) / len(greedy),
        score_mean=sum(flat) / len(flat), temperature=temperature,
    )


# -- sources, resolved and checked before any work ------------------------------------------------


@dataclass
class Source:
    """A source as it runs: its config, where it sits in eval.sources, its env's id and held-out arguments, its
    seeds, its temperature and its scorer (None: the env's own verdict)."""

    cfg: EvalSource
    index: int
    env_id: str
    env_kwargs: dict[str, Any]
    seeds: list[int]
    temperature: float
    scorer: Scorer | None = field(default=None, repr=False)

    @property
    def where(self) -> str:
        return f"eval.sources[{self.index}] ({self.cfg.name})"

    def due(self, update: int, updates: int) -> bool:
        """Whether this source is evaluated after `update` (step 0 and the end are always; they are not asked)."""
        every = self.cfg.every
        return bool(every) and update % every == 0 and update != updates

    def score(self, episode: Episode, env: AgentEnv | None) -> float:
        """A sample's score: the scorer's (in [0, 1]), else the episode's reward (the env's own verifier). A scorer
        that raises or answers something else stops the evaluation, naming the source and the seed."""
        if self.scorer is None:  # the verifier's reward: a sample succeeds at 1, as Episode.passed says
            return float(episode.reward)
        try:
            value = self.scorer(episode, env)
        except Exception as e:
            raise RuntimeError(f"{self.where}: scorer {self.cfg.scorer} raised on seed {episode.seed}: "
                               f"{type(e).__name__}: {e}") from e
        if isinstance(value, (bool, np.bool_)):
            return float(value)
        if not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:  # NaN fails the range too
            raise ValueError(f"{self.where}: scorer {self.cfg.scorer} returned {value!r} on seed {episode.seed}; "
                             "expected a number in [0, 1] or a bool")
        return float(value)


def load_scorer(spec: str, where: str) -> Scorer:
    """`module:function` or `path/to/file.py:function`, imported; a module that cannot be imported or a name that
    is not a callable in it is a ValueError that says which and `where`."""
    module, _, name = spec.rpartition(":")
    try:
        loaded = import_from_cwd(module)
    except ModuleNotFoundError as e:
        raise ValueError(f"{where}: cannot import scorer {spec!r}: {e}; {IMPORT_HINT}") from None
    except Exception as e:  # a module that raises while it is imported: its own error, named
        raise ValueError(f"{where}: cannot import scorer {spec!r}: {type(e).__name__}: {e}") from None
    fn = getattr(loaded, name, None)
    if not callable(fn):
        raise ValueError(f"{where}: scorer {spec!r}: module {module} has no function {name!r}")
    return fn  # type: ignore[no-any-return]


def resolve_sources(cfg: TrainConfig) -> list[Source]:
    """`cfg.eval.sources` as they run, each env built once and each scorer imported, so that an unknown env, a bad
    argument or a scorer that cannot be imported fails before any work, naming the source."""
    out = []
    for i, s in enumerate(cfg.eval.sources):
        where = f"eval.sources[{i}] ({s.name})"
        offset = cfg.eval.seed_offset if s.seed_offset is None else s.seed_offset
        temperature = cfg.eval.temperature if s.temperature is None else s.temperature
        seeds = [offset + t for t in range(s.episodes)]
        if s.agent is not None:
            _check_agent(s, offset, where)
            out.append(Source(s, i, f"agent:{s.agent.entry}", {}, seeds, temperature))
            continue
        if s.env is None and cfg.agent is not None:
            raise ValueError(f"{where}: give the source an env (env: {{id: ...}}) or an agent; this run trains an "
                             "agent through the gateway, which has no env to default to")
        env = s.env or cfg.env
        try:  # built once here, with the arguments it will run with: a bad id or argument fails now
            kwargs = heldout_kwargs(env.id, env.kwargs)
            make(env.id, **kwargs).close()
        except Exception as e:  # make() says what is wrong with the env; this says which source asked for it
            raise ValueError(f"{where}: env {env.id}: {e}") from None
        scorer = load_scorer(s.scorer, where) if s.scorer is not None else None
        out.append(Source(s, i, env.id, kwargs, seeds, temperature, scorer))
    return out


def _agent(source: EvalSource, offset: int) -> Any:
    """The source's agent, its held-out tasks from `offset` on (agentrl.gateway.agent.TaskSource)."""
    from agentrl.gateway.agent import Agent

    return Agent(source.agent, heldout_count=source.episodes, seed_offset=offset)


def _check_agent(source: EvalSource, offset: int, where: str) -> None:
    """Load the agent, its tasks and hooks once (the gateway extra, a bad path or signature fail here)."""
    try:
        _agent(source, offset)
    except ImportError as e:
        raise ValueError(f"{where}: agent {source.agent.entry}: {e}") from None
    except Exception as e:  # AgentError, or the agent module's own error on import
        raise ValueError(f"{where}: agent {source.agent.entry}: {type(e).__name__}: {e}") from None


def overlaps_training(source: Source, cfg: TrainConfig) -> bool:
    """Whether `source` evaluates the training env on seeds training draws (below eval.seed_offset). A source that
    plays the eval split of an env that declares one, while training plays another, does not: there the split,
    not the seed, decides the task (docs/evaluation.md, "Splits that mean unseen")."""
    same_env = source.cfg.agent is None and (source.cfg.env is None or source.cfg.env == cfg.env)
    held_out = source.env_kwargs.get("split") == "eval" and cfg.env.kwargs.get("split", "train") != "eval"
    return cfg.agent is None and same_env and not held_out and source.seeds[0] < cfg.eval.seed_offset


# -- evaluating one source ----------------------------------------------------------------------------


def evaluate_source(cfg: TrainConfig, source: Source, policy: Policy, max_context: int, ranks: Ranks | None = None,
                    say: Callable[[str], None] | None = None) -> SourceResult:
    """k samples of every task at the source's temperature (and a greedy one with `greedy`), scored; with `ranks`
    each process rolls out its block of the rows and every rank returns the same result."""
    k, n = source.cfg.k, len(source.seeds)
    rows = [seed for seed in source.seeds for _ in range(k)]  # task-major: a task's k samples side by side
    groups = [t for t in range(n) for _ in range(k)]
    seed = cfg.seed + 12345 + 1000 * (source.index + 1)  # apart from the held-out evaluation's engine and each other
    sampled = _scores(cfg, source, policy, max_context, rows, groups, source.temperature, seed, ranks, say,
                      f"eval {source.cfg.name}")
    greedy = _scores(cfg, source, policy, max_context, source.seeds, list(range(n)), 0.0, seed, ranks, say,
                     f"eval {source.cfg.name} (greedy)") if source.cfg.greedy else None
    per_task = [sampled[t * k:(t + 1) * k] for t in range(n)]
    return result_of(source.cfg.name, k, per_task, greedy, source.temperature)


def _scores(cfg: TrainConfig, source: Source, policy: Policy, max_context: int, seeds: list[int], groups: list[int],
            temperature: float, engine_seed: int, ranks: Ranks | None, say: Callable[[str], None] | None,
            what: str) -> list[float]:
    """One episode per seed in `seeds`, scored, in order (gathered over the ranks)."""
    sampling = cfg.rollout.sampling.model_copy(update={"temperature": temperature})
    lo, hi = ranks.block(len(seeds)) if ranks is not None else (0, len(seeds))
    engine = make_engine(cfg, policy, sampling, seed=engine_seed)
    workers = cfg.rollout.env_workers
    if source.scorer is not None and parse_workers(workers)[0] in ("process", "ray"):
        workers = "thread:64"  # a scorer reads the env as its episode left it: the envs must be this process's own

    def roll_agent() -> list[float]:
        from agentrl.gateway.agent import AgentRunner

        with AgentRunner(_agent(source.cfg, source.seeds[0])) as runner:
            episodes = runner.rollout(engine, policy.chat, seeds[lo:hi], group_ids=groups[lo:hi],
                                      max_context=max_context, row_offset=lo, on_episode=progress(what, say))[0]
        _raise_on_errors(episodes, source)
        return [source.score(e, None) for e in episodes]

    def roll() -> list[float]:
        if source.cfg.agent is not None:
            return roll_agent()
        envs = [make(source.env_id, **source.env_kwargs) for _ in range(lo, hi)]
        with make_pool(workers, cfg.rollout.tool_timeout, cfg.rollout.tool_timeouts) as pool:
            episodes = rollout(envs, seeds[lo:hi], engine, policy.chat, group_ids=groups[lo:hi],
                               max_context=max_context, max_new_tokens=sampling.max_new_tokens, workers=pool,
                               max_batch_rows=cfg.rollout.max_batch_rows, schedule=cfg.rollout.schedule,
                               row_offset=lo, on_episode=progress(what, say), context=cfg.rollout.context)[0]
        _raise_on_errors(episodes, source)
        return [source.score(e, env) for e, env in zip(episodes, envs, strict=True)]

    if ranks is None:
        return roll()
    return ranks.gather_lists(ranks.together(what, roll))


def _raise_on_errors(episodes: list[Episode], source: Source) -> None:
    try:
        raise_on_errors(episodes, None)
    except EpisodeErrors as e:
        raise EpisodeErrors(f"{source.where}: {e}") from None


__all__ = ["Source", "SourceResult", "avg_at_k", "evaluate_source", "load_scorer", "mean_pass_at_k",
           "overlaps_training", "pass_at_k", "reported_ks", "resolve_sources", "result_of"]
