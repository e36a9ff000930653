"""Agents in other processes or languages: `agentrl serve-policy`, where sessions and rewards arrive over HTTP.

A client opens a session, calls the model through it, and posts the reward::

    POST /sessions                 {"group": "task-17", "task_id": "task-17"}  -> {"session", "base_url", "heldout"}
    POST {base_url}/chat/completions ...                                      (as many calls as the agent makes)
    POST /sessions/{session}/reward {"reward": 1.0}                            (ends the episode)

The sessions that name one `group` are the G samples of one task, the group a group-relative assigner
compares: an update trains on the first `rollout.groups` groups whose `rollout.group_size` episodes have
ended. While the trainer updates the weights, calls wait (the policy is not sampled mid-step); a session
that outlives an update, and an episode of a group not complete when the update starts, is finished but not
trained on (the weights that sampled it are gone), and counted in `gateway/stale_dropped`. During a held-out
evaluation, `POST /sessions` answers ``"heldout": true``: a client should then draw its task from its held-out set.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.chat.layout import ChatFormat
from agentrl.config import GatewayConfig
from agentrl.core import Episode
from agentrl.engines.base import Engine
from agentrl.gateway.server import Server, build_app
from agentrl.gateway.service import Gateway
from agentrl.gateway.session import CallError
from agentrl.rollout import RolloutStats


class RemoteRunner:
    """The episode source of `serve-policy`: `rollout(...)` waits for clients to bring the groups it needs."""

    name = "serve-policy"

    def __init__(self, cfg: GatewayConfig | None = None, say: Callable[[str], None] | None = None):
        self.gateway = Gateway(cfg)
        self.gateway.loop.pause(True)  # nothing is sampled before the first rollout opens
        self.server = Server(build_app(self.gateway, on_session=self._open, on_reward=self._reward),
                             self.gateway.cfg.host, self.gateway.cfg.port,
                             max_connections=self.gateway.cfg.max_sessions + 64).start()
        self.say = say or (lambda _: None)
        self._cond = threading.Condition()
        self._groups: dict[str, list[Episode]] = {}  # group label -> its ended episodes, in order
        self._complete: list[str] = []  # group labels in the order their last needed episode ended
        self._size = 1
        self._label: dict[str, str] = {}  # session -> its group label
        self._opened_at: dict[str, int] = {}  # session -> the rollout it was opened in
        self._rollout = 0
        self._heldout = False
        self.stale_dropped = 0

    @property
    def base_url(self) -> str:
        return self.server.url

    def _open(self, body: dict[str, Any]) -> dict[str, Any]:
        unknown = set(body) - {"group", "task_id"}
        if unknown:
            raise CallError(f"unknown fields {sorted(unknown)[:5]}: group, task_id", param="body")
        group, task_id = body.get("group"), body.get("task_id")
        for key, value in (("group", group), ("task_id", task_id)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int))
                                      or len(str(value)) > 200):
                raise CallError(f"{key} must be a string or an integer of at most 200 characters", param=key)
        with self._cond:
            if self._rollout == 0:
                raise CallError("the trainer has not started its first rollout yet; retry shortly", "not_ready",
                                status=503)
            name = self.gateway.open_session(group_id=0, task_id=str(task_id if task_id is not None else group),
                                             env_id="serve-policy")
            # held-out episodes are judged one by one: each session is a group of its own
            self._label[name] = str(group) if group is not None and not self._heldout else name
            self._opened_at[name] = self._rollout
            heldout = self._heldout
        return {"session": name, "base_url": f"{self.server.url}/sessions/{name}/v1", "group": self._label[name],
                "heldout": heldout}

    def _reward(self, name: str, reward: float) -> None:
        episode = self.gateway.end(name, reward)
        self._collect(name, episode)

    def _collect(self, name: str, episode: Episode) -> None:
        self.gateway.forget(name)
        with self._cond:
            label = self._label.pop(name, name)
            if self._opened_at.pop(name, None) != self._rollout:
                self.stale_dropped += 1
                return
            self._groups.setdefault(label, []).append(episode)
            if len(self._groups[label]) == self._size:
                self._complete.append(label)
            self._cond.notify_all()

    def rollout(self, engine: Engine, chat: ChatFormat, seeds: Sequence[int], *,
                group_ids: Sequence[int] | None = None, max_context: int, policy_version: int = 0,
                row_offset: int = 0, on_episode: Callable[[int, int], None] | None = None,
                ) -> tuple[list[Episode], RolloutStats]:
        t0 = time.perf_counter()
        group_ids = list(group_ids) if group_ids is not None else list(range(len(seeds)))
        wanted = list(dict.fromkeys(group_ids))
        size = len(seeds) // len(wanted)
        with self._cond:
            self._rollout += 1
            self._heldout = len(set(group_ids)) == len(group_ids) and size == 1 and len(seeds) > 1
            self._groups, self._complete, self._size = {}, [], size
        self.gateway.open_rollout(engine, chat, max_context=max_context, version=policy_version)
        self.gateway.loop.pause(False)
        self.say(f"serve-policy: waiting for {len(wanted)} group(s) of {size} ended episode(s)"
                 + (" (held-out: clients should draw held-out tasks)" if self._heldout else ""))
        try:
            done = self._wait(len(wanted), size, on_episode)
        finally:
            self.gateway.loop.pause(True)
        episodes = []
        for gid, label in zip(wanted, done):
            for ep in self._groups[label][:size]:
                ep.group_id = gid
                episodes.append(ep)
        with self._cond:  # the rest (groups not complete, samples past a group's size) the update makes stale
            self.stale_dropped += sum(len(eps) for eps in self._groups.values()) - len(episodes)
        stats = self.gateway.rollout_stats(episodes, time.perf_counter() - t0)
        stats.extra["gateway/stale_dropped"] = float(self.stale_dropped)
        return episodes, stats

    def _wait(self, groups: int, size: int, on_episode: Callable[[int, int], None] | None) -> list[str]:
        """The labels of the first `groups` groups to have `size` ended episodes, in the order they completed."""
        seen = 0
        while True:
            for name in self.gateway.sweep():  # silent too long: ended truncated, trained as it stands
                self._collect(name, self.gateway.session(name).episode)
            with self._cond:
                done = [label for label in self._complete if len(self._groups[label]) >= size]
                ended = sum(min(len(eps), size) for eps in self._groups.values())
                if len(done) >= groups:
                    return done[:groups]
                self._cond.wait(timeout=0.5)
            if on_episode is not None and ended != seen:
                seen = ended
                on_episode(min(ended, groups * size), groups * size)
            if self.gateway.loop.error is not None:
                error = self.gateway.loop.error
                raise RuntimeError(f"the gateway's engine failed: {error}") from error

    def close(self) -> None:
        self.server.stop()
        self.gateway.close()
