"""The gateway's state, apart from any wire format: sessions, the engine loop, the token, the limits.

A wire format (`agentrl.gateway.openai_api`) checks a request's shape, turns it into a `Call` and asks
`Gateway.complete`; the in-process runner (`agentrl.gateway.agent`) and `serve-policy` open sessions and
collect the episodes they end. Every method is safe to call from any thread.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.chat.layout import ChatFormat
from agentrl.config import GatewayConfig
from agentrl.core import Episode
from agentrl.engines.base import Engine
from agentrl.gateway.engine_loop import EngineLoop
from agentrl.gateway.session import AgentSession, Call, CallError, Reply
from agentrl.rollout import RolloutStats

IDS_CHECKED = 4  # sessions per rollout whose every context is compared with the template's own encoding


@dataclass
class _Open:
    """A session and what the gateway keeps beside it."""

    session: AgentSession
    last_seen: float
    overflowed: bool = False  # a call did not fit the context: the episode ends truncated, however it ends
    hook: Callable[[list[dict[str, Any]]], Any] | None = None  # state_key(messages) before each call
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class GatewayStats:
    """What a rollout through the gateway measured (per update: `gateway/...` metrics)."""

    calls: int = 0
    prefix_breaks: int = 0
    ids_checked: int = 0
    ids_drift: int = 0
    timeouts: int = 0
    overflows: int = 0
    cancelled: int = 0
    sampling_overridden: int = 0
    max_in_flight: int = 0

    def metrics(self, episodes: list[Episode]) -> dict[str, float]:
        n = max(1, len(episodes))
        segments = sum(1 + sum(t.segment_context is not None for t in e.turns[1:]) for e in episodes)
        return {"gateway/calls_per_episode": self.calls / n,
                "gateway/prefix_break_rate": self.prefix_breaks / max(1, self.calls - len(episodes)),
                "gateway/segments_per_episode": segments / n,
                "gateway/rerender_drift": self.ids_drift / max(1, self.ids_checked),
                "gateway/session_timeouts": float(self.timeouts),
                "gateway/context_overflows": float(self.overflows),
                "gateway/cancelled_calls": float(self.cancelled),
                "gateway/sampling_overridden": float(self.sampling_overridden),
                "gateway/sessions_in_flight_max": float(self.max_in_flight)}


class Gateway:
    """Sessions over one engine. `open_rollout(engine, chat, ...)` points it at the policy to sample;
    `open_session` names an episode; `complete` serves a call; `end` closes a session with its reward."""

    def __init__(self, cfg: GatewayConfig | None = None, token: str | None = None, model_name: str = "agentrl-policy"):
        self.cfg = cfg or GatewayConfig()
        self.token = token or secrets.token_urlsafe(32)  # a bearer token per run: every request must carry it
        self.model_name = model_name
        self._lock = threading.RLock()
        self._open: dict[str, _Open] = {}
        self._rows = itertools.count()
        self.chat: ChatFormat | None = None
        self.max_context = 0
        self.max_new_tokens = 0
        self.version = 0
        self.sampling: Any = None
        self.stats = GatewayStats()
        self._in_flight = 0
        self.loop = EngineLoop(self.cfg.batch_wait, live=self._callers)

    # -- a rollout's frame ---------------------------------------------------------------------------

    def open_rollout(self, engine: Engine, chat: ChatFormat, *, max_context: int, version: int = 0) -> None:
        """Sample from `engine` (a fresh engine session: one per rollout, as `agentrl.rollout` does)."""
        with self._lock:
            self.chat, self.max_context, self.version = chat, max_context, version
            self.sampling = getattr(engine, "sampling", None)
            self.max_new_tokens = getattr(self.sampling, "max_new_tokens", 0)
            self.stats = GatewayStats()
            self.loop.open(engine)

    def authorized(self, header: str | None) -> bool:
        """`Authorization: Bearer <token>`, compared in constant time."""
        scheme, _, given = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode())

    def open_session(self, *, group_id: int, task_id: str, seed: int | None = None, name: str | None = None,
                     row: int | None = None, state_key: Callable[[list[dict[str, Any]]], Any] | None = None,
                     env_id: str = "agent") -> str:
        """A new session (one episode); returns its name, the path segment its calls go to."""
        with self._lock:
            if self.chat is None:
                raise CallError("the gateway is not serving a policy yet", code="not_ready", status=503)
            if len(self._open) >= self.cfg.max_sessions:
                raise CallError(f"{len(self._open)} sessions are open, the most this gateway holds "
                                "(gateway.max_sessions): end some first", code="too_many_sessions", status=429)
            name = name or secrets.token_hex(8)
            if name in self._open:
                raise CallError(f"session {name!r} exists already", code="session_exists", status=409)
            check = sum(o.session.check_ids for o in self._open.values()) < IDS_CHECKED
            session = AgentSession(self.chat, name=name, row=next(self._rows) if row is None else row,
                                   group_id=group_id, task_id=task_id, seed=seed, version=self.version,
                                   env_id=env_id, check_ids=check)
            self._open[name] = _Open(session, time.monotonic(), hook=state_key)
            return name

    def session(self, name: str) -> AgentSession:
        with self._lock:
            return self._get(name).session

    def _get(self, name: str) -> _Open:
        found = self._open.get(name)
        if found is None:
            raise CallError(f"no session {name[:80]!r}: open one first (in-process runs open them for the agent; "
                            "serve-policy: POST /sessions)", code="session_not_found", status=404)
        return found

    def _callers(self) -> int:
        """Sessions that may call before the next generate: every open one (the engine loop asks between generates,
        so none is being generated for; those between their call's arrival and the queue are on their way)."""
        with self._lock:
            return sum(1 for o in self._open.values() if not o.session.ended)

    # -- a call -------------------------------------------------------------------------------------------

    async def complete(self, name: str, call: Call, disconnected: Callable[[], Awaitable[bool]] | None = None,
                       sampling: dict[str, Any] | None = None) -> Reply:
        """Serve one call of session `name`. `disconnected()` is polled while it waits: a client that left
        frees its place (its action is never laid into the episode). `sampling` (temperature, top_p the client
        asked for) is recorded where it differs from the run's, which decides."""
        opened, plan, engine_ext = await asyncio.to_thread(self._plan, name, call, sampling or {})
        future = self.loop.submit(opened.session.row, plan.context, engine_ext)
        waiting = asyncio.wrap_future(future)
        try:
            while True:
                done, _ = await asyncio.wait({waiting}, timeout=0.25)
                if done:
                    break
                if disconnected is not None and await disconnected():
                    raise asyncio.CancelledError
        except asyncio.CancelledError:
            future.cancel()
            with self._lock:
                self._in_flight -= 1
                self.stats.cancelled += 1
                opened.session.cancel()
                opened.last_seen = time.monotonic()
            self.loop.release(opened.session.row)
            raise
        try:
            gen = waiting.result()
        except BaseException:
            with self._lock:
                self._in_flight -= 1
                opened.session.cancel()
            raise
        return await asyncio.to_thread(self._record, opened, gen)

    def _plan(self, name: str, call: Call, sampling: dict[str, Any]) -> tuple[_Open, Any, list[int] | None]:
        with self._lock:
            opened = self._get(name)
            s = opened.session
            if len(call.messages) > self.cfg.max_messages:
                raise CallError(f"{len(call.messages)} messages, more than gateway.max_messages "
                                f"({self.cfg.max_messages})", param="messages")
            if len(call.tools) > self.cfg.max_tools:
                raise CallError(f"{len(call.tools)} tools, more than gateway.max_tools ({self.cfg.max_tools})",
                                param="tools")
            holds = s.engine_holds == len(s.seq) and s.engine_holds > 0
            plan = s.plan(call)
            if len(plan.context) + self.max_new_tokens > self.max_context:
                s.pending = None
                opened.overflowed = True
                self.stats.overflows += 1
                raise CallError(f"this call's context is {len(plan.context)} tokens and its completion may take "
                                f"{self.max_new_tokens}: over the model's {self.max_context}; the episode ends "
                                "truncated", code="context_length_exceeded", param="messages")
            if opened.hook is not None:
                key = opened.hook(call.messages)
                s.pending_state_key = None if key is None else repr(key)
            for knob, value in sampling.items():
                ours = getattr(self.sampling, knob, None)
                if value is not None and ours is not None and float(value) != float(ours):
                    self.stats.sampling_overridden += 1
                    break
            self._in_flight += 1
            self.stats.max_in_flight = max(self.stats.max_in_flight, self._in_flight)
            opened.last_seen = time.monotonic()
            return opened, plan, plan.extension if holds and plan.extension is not None else None

    def _record(self, opened: _Open, gen: Any) -> Reply:
        with self._lock:
            self._in_flight -= 1
            s = opened.session
            key = getattr(s, "pending_state_key", None)
            reply = s.record(gen)
            s.set_state_key(key)
            self.stats.calls += 1
            opened.last_seen = time.monotonic()
            return reply

    # -- rewards and the end of a session -------------------------------------------------------------

    def step_reward(self, name: str, value: float, call: int | None = None) -> None:
        with self._lock:
            opened = self._get(name)
            opened.session.add_step_reward(value, call)
            opened.last_seen = time.monotonic()

    def end(self, name: str, reward: float | None, *, error: str | None = None, truncated: bool = False) -> Episode:
        """Close session `name` (its engine row freed) and return its episode."""
        with self._lock:
            opened = self._get(name)
            s = opened.session
            if s.ended:
                raise CallError(f"session {name!r} has ended already", code="session_ended", status=409)
            ep = s.end(reward, truncated=truncated or opened.overflowed, error=error)
            self.stats.prefix_breaks += s.prefix_breaks
            self.stats.ids_checked += s.ids_checked
            self.stats.ids_drift += s.ids_drift
            opened.done.set()
        self.loop.release(s.row)
        return ep

    def overflowed(self, name: str) -> bool:
        with self._lock:
            return self._get(name).overflowed

    def forget(self, name: str) -> None:
        with self._lock:
            self._open.pop(name, None)

    def sweep(self, now: float | None = None) -> list[str]:
        """End every session silent for longer than `session_timeout` (and not waiting on a generate) as
        truncated; returns their names."""
        now = time.monotonic() if now is None else now
        expired = []
        with self._lock:
            for name, o in self._open.items():
                s = o.session
                if not s.ended and s.pending is None and now - o.last_seen > self.cfg.session_timeout:
                    expired.append(name)
        for name in expired:
            try:
                self.end(name, None, truncated=True)
            except CallError:  # ended meanwhile by its own agent
                continue
            with self._lock:
                self.stats.timeouts += 1
        return expired

    def rollout_stats(self, episodes: list[Episode], seconds: float) -> RolloutStats:
        """A rollout's statistics, as `agentrl.rollout` reports them, with the gateway's own in `extra`."""
        stats = RolloutStats(seconds=seconds, generate_calls=self.loop.generates).count(episodes)
        engine = self.loop.stats()
        stats.prefill_tokens = int(engine["prefill_tokens"])
        stats.positions_attended = int(engine["positions_attended"])
        stats.positions_padding = int(engine["positions_padding"])
        stats.extra = self.stats.metrics(episodes)
        return stats

    def close(self) -> None:
        self.loop.close()
