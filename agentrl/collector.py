"""Where each update's episodes come from: the task stream, the env copies (or a gateway runner), the
engine, and the store every rollout is written to before it trains.

The task stream (`task_rng`, `next_group`) is part of a checkpoint: a resumed run draws the same tasks. With
rollouts running ahead of the learner, `stream_at(update)` is the stream as it stood when that update's
rollout began, which is what a checkpoint after the update before it must hold.
"""

from __future__ import annotations

import copy
import functools
import time
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.config import TrainConfig
from agentrl.core import Episode
from agentrl.distributed import Ranks
from agentrl.health.interventions import Knobs
from agentrl.rollout import rollout
from agentrl.store import TrajectoryStore


class EpisodeErrors(RuntimeError):
    """An environment raised during a rollout; the batch was saved before stopping."""


class Collector:
    """Rolls out `rollout.groups` tasks x `group_size` episodes per update, this rank's block of the groups,
    from `envs` (one per row) or `runner` (the gateway's, or `serve-policy`'s remote runner)."""

    def __init__(self, cfg: TrainConfig, ranks: Ranks, engine: Any, chat: Any, max_context: int, envs: list[Any],
                 runner: Any, workers: Any, knobs: Knobs, store: Path, say: Any):
        self.cfg, self.ranks, self.engine, self.chat, self.max_context = cfg, ranks, engine, chat, max_context
        self.envs, self.runner, self.workers, self.knobs, self.store, self.say = \
            envs, runner, workers, knobs, store, say
        self.task_rng = np.random.default_rng(cfg.seed)
        self.next_group = 0
        self.owner: dict[int, int] = {}  # group id -> the rank that rolled it out (its rows' gradient is that rank's)
        self.starts: dict[int, dict[str, Any]] = {}  # update -> the stream's state when its rollout began
        self._said: set[str] = set()

    # -- the task stream ----------------------------------------------------------------------------

    def stream(self) -> dict[str, Any]:
        """Where the task stream and the sampler stand (what a resumed run's next rollout starts from)."""
        return {"task_rng": copy.deepcopy(self.task_rng.bit_generator.state), "next_group": self.next_group,
                "engine": self.engine.state_dict() if hasattr(self.engine, "state_dict") else None}

    def stream_at(self, update: int) -> dict[str, Any]:
        """The stream as it stood when `update`'s rollout began (as it stands now if that has not begun): with
        rollouts running ahead, the rollout thread has drawn past it, and a resumed run rolls that update out
        again."""
        return self.starts.get(update) or self.stream()

    def load_stream(self, task_rng: dict[str, Any], next_group: int) -> None:
        self.task_rng.bit_generator.state = task_rng
        self.next_group = int(next_group)

    # -- one update's episodes ----------------------------------------------------------------------

    def collect(self, update: int, version: int | None = None) -> tuple[list[Episode], dict[str, float]]:
        """Roll out `groups` tasks x `group_size` episodes; with dynamic sampling 'resample', roll
        out extra batches until enough groups carry signal (or the extra-batch cap is hit). `version`:
        the number of updates applied to the weights that generate (default: on-policy, update - 1)."""
        cfg = self.cfg
        version = update - 1 if version is None else version
        for old in [u for u in self.starts if u < update - cfg.rollout.max_staleness - 1]:
            del self.starts[old]
        self.starts[update] = self.stream()
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
            episodes, rstats = self.ranks.together(f"update {update}: rollout", self._roll(seeds, gids, version, lo))
            name = f"update_{update:05d}_{attempt}" + (f".rank{self.ranks.rank}" if self.ranks.world > 1 else "")
            path = TrajectoryStore(episodes).save(self.store / f"{name}.parquet")  # this rank's shard
            episodes = self.ranks.gather_lists(episodes)  # the whole update, in group order
            raise_on_errors(episodes, path.parent if self.ranks.world > 1 else path)
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

    def _roll(self, seeds: list[int], gids: list[int], version: int, lo: int) -> Any:
        """The rollout of this rank's rows, as a call for `Ranks.together`."""
        cfg, G = self.cfg, self.cfg.rollout.group_size
        if self.runner is not None:
            return functools.partial(self.runner.rollout, self.engine, self.chat, seeds, group_ids=gids,
                                     max_context=self.max_context, policy_version=version, row_offset=lo * G)
        return functools.partial(
            rollout, self.envs, seeds, self.engine, self.chat, group_ids=gids, max_context=self.max_context,
            max_new_tokens=cfg.rollout.sampling.max_new_tokens, workers=self.workers,
            max_batch_rows=cfg.rollout.max_batch_rows, policy_version=version, schedule=cfg.rollout.schedule,
            row_offset=lo * G)

    def _report_layout(self, stats: Any) -> None:
        """Say once if the rollout's ids part from the chat template's own rendering (agentrl.chat.layout),
        and once if the template rewrote episodes' history (they train as segments)."""
        if stats.segmented and "segments" not in self._said:
            self._said.add("segments")
            self.say(f"the chat template rewrites the history: {stats.segmented} of {stats.episodes} episodes "
                     f"are trained as {stats.segments} segments, each action on the context it was given "
                     "(rollout.history template; docs/models.md)")
        if stats.layout_drift and "layout" not in self._said:
            self._said.add("layout")
            self.say(f"[yellow]warning[/yellow]: {stats.layout_drift} of {stats.layout_checked} episodes "
                     f"checked are laid out otherwise than the chat template renders them "
                     f"({stats.layout_example}); the model is trained on the rollout's layout, which its "
                     "template would not give it at inference (docs/models.md)")


def agent_runner(cfg: TrainConfig) -> Any:
    """The gateway and the user's agent for a run with `cfg.agent` (agentrl.gateway.agent); close it after."""
    from agentrl.gateway.agent import Agent, AgentRunner

    return AgentRunner(Agent(cfg.agent, heldout_count=cfg.eval.episodes, seed_offset=cfg.eval.seed_offset))


def sources(cfg: TrainConfig, ranks: Ranks, runner: Any, say: Any) -> tuple[Any, list[Any]]:
    """Where this rank's episodes come from: `runner` if given, the gateway and the user's agent with `cfg.agent`,
    else copies of the env, one per row of this rank's groups. Says which, and how policy-written code is held."""
    from agentrl.registry import make
    from agentrl.verify.sandbox import isolation_of

    runner = runner or (agent_runner(cfg) if cfg.agent else None)
    if runner is not None:
        name = f"agent:{cfg.agent.entry}" if cfg.agent is not None else getattr(runner, "name", None) or cfg.env.id
        say(f"{name}: calls the policy through the gateway at {runner.base_url} (docs/gateway.md)")
        return runner, []
    lo, hi = ranks.block(cfg.rollout.groups)  # this rank's groups of every update
    envs = [make(cfg.env.id, **cfg.env.kwargs) for _ in range((hi - lo) * cfg.rollout.group_size)]
    if (iso := isolation_of(envs[0])) is not None:  # policy-written code runs: say how it is held
        say(iso.summary() + "".join(f"\n  {r}" for r in iso.reasons))
    return None, envs


def raise_on_errors(episodes: list[Episode], saved: Path | None) -> None:
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


def _groups(episodes: list[Episode]) -> list[list[Episode]]:
    out: dict[int, list[Episode]] = {}
    for e in episodes:
        out.setdefault(e.group_id, []).append(e)
    return list(out.values())


__all__ = ["Collector", "EpisodeErrors", "raise_on_errors", "rollout_metrics", "sources", "agent_runner"]
