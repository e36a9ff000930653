"""Rollouts that run ahead of training, at most `max_staleness` policy versions behind the learner.

With `rollout.max_staleness` = S > 0 the trainer's rollouts move into a thread: while the learner
trains update u, the thread already rolls out updates u+1 .. u+S, from a copy of the weights (the
actor) that it refreshes to the newest published version before each rollout. A policy's version is
the number of updates applied to it; update u may be rolled out by any version >= u - 1 - S, so the
thread waits when it is S updates ahead. Each episode records its version, and the trainer refuses a
batch older than the bound (a bug, never trained on silently).

    learner:  train 1 (v0 -> v1)   train 2 (v1 -> v2)   train 3 ...
    thread :  roll 1 (v0)  roll 2 (v0)   roll 3 (v1)   roll 4 (v2) ...      S = 1

On a GPU the learner's step and generation contend for one device, and on 2 CPU cores for two
cores; what it saves is the time a rollout spends waiting (slow tools, stragglers), at the cost of
training on episodes one version old (docs/algorithms.md, 'Off-policy episodes').
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch


class RolloutAhead:
    """The rollout thread. `collect(update, version)` rolls out one update's episodes with the actor at
    `version`; `publish(version, weights)` hands the learner's new weights over after each update; `get(u)`
    waits for update u's rollout; `close()` stops the thread after the rollout under way."""

    def __init__(self, collect: Callable[[int, int], Any], actor: torch.nn.Module, first: int, last: int,
                 max_staleness: int, version: int, on_new_weights: Callable[[torch.nn.Module], None] | None = None):
        self._collect, self._actor, self._bound = collect, actor, max_staleness
        self._on_new_weights = on_new_weights  # e.g. an engine with its own copy of the weights syncs here
        self._cond = threading.Condition()
        self._published: tuple[int, dict[str, torch.Tensor] | None] = (version, None)  # None: the actor has them
        self._actor_version = version
        self._results: dict[int, Any] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._run, args=(first, last), name="agentrl-rollout-ahead",
                                        daemon=True)
        self._thread.start()

    def _run(self, first: int, last: int) -> None:
        for update in range(first, last + 1):
            with self._cond:
                self._cond.wait_for(lambda u=update: self._stop or self._published[0] >= u - 1 - self._bound)
                if self._stop:
                    return
                version, weights = self._published
            if weights is not None and version > self._actor_version:
                with torch.no_grad():  # a snapshot: the learner keeps training its own weights meanwhile
                    self._actor.load_state_dict(weights, strict=False)
                self._actor_version = version
                if self._on_new_weights is not None:
                    self._on_new_weights(self._actor)
            try:
                result: Any = self._collect(update, self._actor_version)
            except BaseException as e:  # handed to the learner, which raises it as its own
                result = e
            with self._cond:
                self._results[update] = result
                self._cond.notify_all()
            if isinstance(result, BaseException):
                return

    def publish(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        """The learner's weights after `version` updates (a copy the thread may read at any time)."""
        with self._cond:
            self._published = (version, weights)
            self._cond.notify_all()

    def get(self, update: int) -> Any:
        """Update `update`'s rollout, once it is done (the thread's exception, if it raised)."""
        with self._cond:
            self._cond.wait_for(lambda: update in self._results or not self._thread.is_alive())
            if update not in self._results:
                raise RuntimeError(f"the rollout thread stopped before update {update}'s rollout")
            result = self._results.pop(update)
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self, wait: bool = True) -> None:
        """Stop after the rollout under way (`wait`: until it is over; a daemon thread either way)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if wait:
            self._thread.join()


__all__ = ["RolloutAhead"]
