"""Drive many environments against one engine, turn by turn, into `Episode`s.

Environment calls (`reset`, `step`, and the verifier through `truncate`) run in a worker pool
(`agentrl.workers`), so slow tools overlap each other and the next generation. There is no turn
barrier: the engine generates for the rows whose observation has arrived while the others' tools
still run, and with `max_batch_rows` the batch is refilled as episodes end (continuous batching:
the next episodes, in order, take the free rows). Each action's observation tokens are appended to
its row's cache. The environment sees only text and the engine only tokens. Where the chat
template rewrites the history (`ChatFormat.history == "template"`), each turn's context is the
template's rendering of the conversation so far: appended where it extends the running sequence,
a new segment of the episode (the row re-admitted with that context) where it does not.

An episode that outgrows its context budget is ended as truncated, or compacted by the context policy
(`rollout.context`, `agentrl.context`): the conversation is rewritten (older results dropped, a window
kept, the env's own hook) or the policy is asked for a summary, a turn of its own with no env step; the
episode goes on from the compacted context as a new segment, the row's old cache dropped.

What the pool and the batching change is timing, never content: each env's calls are made in order,
every episode is reset with its own seed, and the episodes come back in the order of `envs` with
their group ids; with greedy decoding an episode is the same whatever the pool or the batch bound.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.chat.layout import ChatFormat, rerender_check
from agentrl.context import ContextConfig, after_summary, get_policy, summary_request
from agentrl.core import AgentEnv, EnvError, Episode, Turn
from agentrl.engines.base import Engine, Generation
from agentrl.workers import DEFAULT_WORKERS, EnvPool, make_pool

LAYOUT_CHECKS = 4  # episodes per rollout whose ids are compared with the chat template's rendering


@dataclass
class RolloutStats:
    episodes: int = 0
    turns: int = 0
    action_tokens: int = 0
    seconds: float = 0.0
    tool_timeouts: int = 0
    generate_calls: int = 0  # batched generations (with per-row readiness, more than the turns of the longest episode)
    layout_checked: int = 0  # episodes re-rendered through the chat template (the first few of a rollout)
    layout_drift: int = 0  # ... whose text differs from the template's rendering (a template that rewrites history)
    layout_retokenised: int = 0  # ... with an action sampled as ids other than the tokenizer's encoding of its text
    layout_example: str | None = None  # where the first drifting episode parts from the template
    segmented: int = 0  # episodes trained as several segments (the template rewrote their history)
    segments: int = 0  # segments in all (an unsegmented episode counts one)
    compactions: int = 0  # times the context policy compacted an episode (rollout.context; each opens a segment)
    prefill_tokens: int = 0  # prompt tokens the engine ran (an engine that does not count them: 0)
    prefill_tokens_saved: int = 0  # ... and those it skipped because rows shared a prompt (share_prefill)
    positions_attended: int = 0  # cache positions the engine's forwards attended over (rows x width), and
    positions_padding: int = 0  # ... of them, holes and padding (an engine that does not count them: 0)
    extra: dict[str, float] = field(default_factory=dict)  # metrics of the source's own (gateway/...)

    def count(self, episodes: Sequence[Episode]) -> RolloutStats:
        """Fill in what the episodes themselves say (turns, tokens, timeouts, segments); returns self."""
        self.episodes = len(episodes)
        self.turns = sum(e.num_turns for e in episodes)
        self.action_tokens = sum(e.num_action_tokens for e in episodes)
        self.tool_timeouts = sum(e.tool_timeouts for e in episodes)
        self.segmented = sum(e.segmented for e in episodes)
        self.segments = sum(1 + sum(t.segment_context is not None for t in e.turns[1:]) for e in episodes)
        return self

    @property
    def tokens_per_second(self) -> float:
        return self.action_tokens / self.seconds if self.seconds > 0 else 0.0


def rollout(
    envs: Sequence[AgentEnv],
    seeds: Sequence[int],
    engine: Engine,
    chat: ChatFormat,
    *,
    group_ids: Sequence[int] | None = None,
    max_context: int | None = None,
    max_new_tokens: int = 0,
    workers: EnvPool | str | None = None,
    max_batch_rows: int | None = None,
    policy_version: int = 0,
    schedule: str = "arrival",
    row_offset: int = 0,
    on_episode: Callable[[int, int], None] | None = None,
    context: ContextConfig | None = None,
) -> tuple[list[Episode], RolloutStats]:
    """Run one episode in each env (env i reset with seeds[i]) to its end.

    `workers` is a pool or a `rollout.env_workers` string (default ``thread:64``; a pool built here
    is closed here, so pass one to reuse its workers). `max_batch_rows` bounds the rows the engine
    holds at once (default: every episode at once). An episode whose next turn would not fit in
    `max_context` tokens (prompt, history and `max_new_tokens`) is ended as truncated and judged by
    the verifier as it stands, unless `context` (`rollout.context`, default truncate) compacts it
    first: then the episode goes on as a new segment, and with ``summarize`` the policy's summary is a
    turn of its own (``kind="summary"``). The context policy's budget, where set, is the limit instead of
    `max_context`. An env that raises (`EnvError`) ends its episode with `error` set; the others go on.

    `row_offset` is where these episodes start in the whole update when several processes share it
    (agentrl.distributed): the engine keys each row's sampling stream by its place in the update,
    so a rank's episodes are the ones a single process would have sampled for those rows.
    `on_episode(ended, total)` is called as each episode ends (progress lines).
    """
    if len(envs) != len(seeds):
        raise ValueError(f"rollout: {len(envs)} envs but {len(seeds)} seeds")
    if max_batch_rows is not None and max_batch_rows < 1:
        raise ValueError(f"rollout: max_batch_rows must be >= 1, got {max_batch_rows}")
    group_ids = list(group_ids) if group_ids is not None else list(range(len(envs)))
    if len(group_ids) != len(envs):
        raise ValueError(f"rollout: {len(envs)} envs but {len(group_ids)} group ids")
    pool = workers if isinstance(workers, EnvPool) else make_pool(workers or DEFAULT_WORKERS)
    try:
        return _Driver(envs, seeds, engine, chat, group_ids, max_context, max_new_tokens, pool,
                       max_batch_rows or len(envs), policy_version, schedule, row_offset, on_episode,
                       context).run()
    finally:
        if pool is not workers:
            pool.close()


class _Driver:
    """One rollout's loop: admit episodes into free rows, generate for the rows that are ready,
    hand their actions to the pool, take the pool's answers as they come."""

    def __init__(self, envs, seeds, engine, chat, group_ids, max_context, max_new_tokens, pool, max_rows,
                 policy_version, schedule="arrival", row_offset=0, on_episode=None, context=None):
        self.envs, self.seeds, self.engine, self.chat = envs, seeds, engine, chat
        self.group_ids, self.max_context, self.max_new_tokens = group_ids, max_context, max_new_tokens
        self.pool, self.max_rows, self.policy_version = pool, max_rows, policy_version
        if schedule not in ("arrival", "lockstep"):
            raise ValueError(f"rollout: schedule must be arrival or lockstep, got {schedule!r}")
        self.lockstep = schedule == "lockstep"
        self.on_episode = on_episode
        self.offset = row_offset  # the engine knows a row by its place in the whole update: row + offset
        n = len(envs)
        self.episodes: list[Episode | None] = [None] * n
        self.ctx = [0] * n
        self.gen: dict[int, Generation] = {}  # the action whose step is in flight, by row
        self.in_flight: dict[cf.Future, tuple[str, int]] = {}
        self.ready: list[int] = []  # rows whose observation is in the cache, waiting to generate
        self.ready_since = 0.0  # when the oldest ready row became ready
        self.live = 0  # rows in the session (ready, generating, or waiting on their env)
        self.admitted = 0  # episodes that have entered the session
        self.left = n  # episodes not yet ended
        self.stats = RolloutStats()
        self.first_obs: dict[int, str] = {}  # row -> its task text, for the layout check
        # history "template": each row's conversation as messages, the ids of its current segment, and the
        # context the next action's new segment starts from
        self.by_template = chat.history == "template"
        self.msgs: dict[int, list[dict[str, str]]] = {}
        self.seq: dict[int, list[int]] = {}
        self.opening: dict[int, list[int]] = {}
        # the context policy: a compacting one keeps every row's messages and segment ids, whatever the history mode
        self.context = context or ContextConfig()
        self.policy = get_policy(self.context.policy)
        self.limit = self.context.limit(max_context)  # a turn's context and new tokens never pass it
        self.threshold = self.context.threshold(max_context)  # past it the policy compacts (None: never)
        if self.policy.asks_policy and self.threshold is not None and self.limit is not None:
            # ask early enough that the instruction and a whole summary still fit after the next turn's tokens
            asking = len(chat.encode(chat.render([{"role": "user", "content": self.context.instruction}], [])))
            self.threshold = min(self.threshold, self.limit - asking - self.context.summary_max_tokens)
        self.tracks = self.by_template or self.policy.compacts
        self.head: dict[int, list[dict[str, str]]] = {}  # row -> its first messages (system, task): kept at a cut
        self.mark: dict[int, int] = {}  # row -> where its last observation starts in seq (a summary request's base)
        self.summarizing: set[int] = set()  # rows whose next action is a summary
        self.summary: dict[int, str] = {}  # row -> its summary, while the env judges what it kept
        self.compacted: set[int] = set()  # rows compacted at least once (their layout is not the template's)
        self.compaction_tokens: list[int] = []  # context size at each compaction
        self.summary_tokens: list[int] = []
        self.facts: list[float] = []  # the env's facts_kept of each summary, where it can say
        for env in envs:  # the env reads calls in the model's format (pickled with it to process workers)
            env.tool_format = chat.tool_format

    def run(self) -> tuple[list[Episode], RolloutStats]:
        t0 = time.perf_counter()
        n = len(self.envs)
        prompts: dict[int, list[int]] = {}
        resets = {self.pool.submit(i, env, "reset", seed): i for i, env in enumerate(self.envs)
                  for seed in [self.seeds[i]]}
        self.in_flight.update({f: ("reset", i) for f, i in resets.items()})
        queue = collections.deque(range(n))  # admitted in order, so groups enter together
        self.session = self.engine.open([])
        self.prompts = prompts
        last_generate = 0.0
        while self.left:
            while queue and self.live < self.max_rows and queue[0] in prompts:
                row = queue.popleft()
                self.session.add([row + self.offset], [prompts.pop(row)])
                self.live += 1
                self.admitted += 1
                self._make_ready(row)
            if self.ready and self._should_generate(last_generate):
                started = time.perf_counter()
                self.session.start([row + self.offset for row in self.ready])
                self.ready = []
                for row, gen in self.session.collect():
                    self._act(row - self.offset, gen)
                self.stats.generate_calls += 1
                last_generate = time.perf_counter() - started
                continue
            if not self.in_flight:
                if self.ready:
                    continue
                raise RuntimeError("rollout: episodes left but nothing to generate or wait for")  # a bug, not an input
            # wait for the next answer, but not past the moment the ready rows should go anyway
            timeout = None if not self.ready or self.lockstep else max(0.0, self.ready_since
                                                                       + last_generate - time.perf_counter())
            done, _ = cf.wait(self.in_flight, timeout=timeout, return_when=cf.FIRST_COMPLETED)
            for future in done:
                self._answer(future)
            for future in [f for f in self.in_flight if f.done()]:  # everything else that has arrived
                self._answer(future)
        self.stats.seconds = time.perf_counter() - t0
        self.stats.prefill_tokens = int(getattr(self.session, "prefill_tokens", 0))
        self.stats.prefill_tokens_saved = int(getattr(self.session, "prefill_saved", 0))
        self.stats.positions_attended = int(getattr(self.session, "positions_attended", 0))
        self.stats.positions_padding = int(getattr(self.session, "positions_padding", 0))
        episodes = [e for e in self.episodes if e is not None]
        self.stats.count(episodes)
        if self.policy.compacts:
            self.stats.extra.update(self._context_metrics(len(episodes)))
        return episodes, self.stats

    def _context_metrics(self, episodes: int) -> dict[str, float]:
        """The context/ metrics of this rollout (the health alarms read them: agentrl.health.alarms)."""
        out = {"context/compactions_per_episode": self.stats.compactions / max(episodes, 1)}
        for key, values in (("context/tokens_at_compaction", self.compaction_tokens),
                            ("context/summary_tokens", self.summary_tokens), ("context/facts_kept", self.facts)):
            if values:
                out[key] = sum(values) / len(values)
        return out

    def _should_generate(self, last_generate: float) -> bool:
        """Generate now, or wait for rows whose env is still busy so that they share the batch?
        Go when nobody is waiting on an env, or when the oldest ready row has waited as long as the
        last generation took: a tool faster than a generation never splits the batch (a forward
        costs nearly the same for half the rows), a slow one delays the ready rows by at most one
        generation's time."""
        if self.lockstep:  # every env call answered first: which rows share a forward never depends on timing
            return not self.in_flight
        if not self.session.turn_level:
            return True  # the engine's own scheduler joins rows into its running batch
        waiting = any(kind != "reset" for kind, _ in self.in_flight.values())
        return not waiting or time.perf_counter() - self.ready_since >= last_generate

    def _make_ready(self, row: int) -> None:
        if not self.ready:
            self.ready_since = time.perf_counter()
        self.ready.append(row)

    def _submit(self, kind: str, row: int, *args: Any) -> None:
        self.in_flight[self.pool.submit(row, self.envs[row], kind, *args)] = (kind, row)

    def _act(self, row: int, gen: Generation) -> None:
        if row in self.summarizing:
            self._summarized(row, gen)
            return
        self.gen[row] = gen
        self._submit("step", row, self.chat.decode(gen.ids))

    def _end(self, row: int) -> None:
        if row in self.compacted:  # a compacted conversation is the policy's, not the template's rendering
            self.first_obs.pop(row, None)
            self.compacted.discard(row)
        if row in self.first_obs and self.episodes[row] is not None and self.episodes[row].error is None:
            env = self.envs[row]
            check = rerender_check(self.chat, self.episodes[row], self.first_obs.pop(row), env.tool_schemas(),
                                   env.system_prompt)
            self.stats.layout_checked += 1
            self.stats.layout_drift += not check.text_equal
            self.stats.layout_retokenised += check.retokenised_actions > 0
            self.stats.layout_example = self.stats.layout_example or check.first_difference
        self.session.drop([row + self.offset])
        for kept in (self.msgs, self.seq, self.opening, self.head, self.mark, self.summary):
            kept.pop(row, None)
        self.summarizing.discard(row)
        self.live -= 1
        self.left -= 1
        if self.on_episode is not None:
            self.on_episode(len(self.envs) - self.left, len(self.envs))
        # with nobody left to admit, freed rows only cost compute (a forward runs every slot):
        # shrink the batch once half of it is free
        slots = len(getattr(self.session, "slot_rows", ()))
        if self.admitted == len(self.envs) and self.live and 2 * self.live <= slots:
            self.session.keep(range(self.live))

    def _answer(self, future: cf.Future) -> None:
        kind, row = self.in_flight.pop(future)
        error = future.exception()
        if error is not None and not isinstance(error, EnvError):
            raise error  # the pool failed (a worker died, a result could not be sent): not the env's doing
        if kind == "reset":
            if error is not None:  # reset raised: an env bug the episode cannot start from
                raise error
            obs, info = future.result()
            env = self.envs[row]
            if len(self.first_obs) < LAYOUT_CHECKS:
                self.first_obs[row] = obs
            prompt = self.chat.prompt_ids(obs, env.tool_schemas(), env.system_prompt)
            seed = self.seeds[row]
            named = info.get("task_id") if isinstance(info, dict) else None  # the env's own name for the task
            task_id = f"{env.name}:{named if isinstance(named, str) and named else seed}"
            self.episodes[row] = Episode(prompt_ids=prompt, env_id=env.name, task_id=task_id,
                                         group_id=self.group_ids[row], seed=seed, policy_version=self.policy_version)
            self.ctx[row] = len(prompt)
            self.prompts[row] = prompt
            if self.tracks:
                self.msgs[row] = self.chat.messages(obs, env.tool_schemas(), env.system_prompt)
                self.head[row] = list(self.msgs[row])
                self.seq[row] = list(prompt)
            return
        ep = self.episodes[row]
        if error is not None:
            ep.error = str(error)
            self._end(row)
            return
        if kind == "truncate":
            ep.reward, ep.truncated = float(future.result()), True
            self._end(row)
            return
        if kind == "facts_kept":
            kept = future.result()
            if kept is not None:
                self.facts.append(float(kept))
            self._open(row, after_summary(self.head[row], self.summary.pop(row)))
            return
        if kind == "compact":
            try:
                messages = _messages(future.result(), self.envs[row])
            except EnvError as e:  # a malformed answer is the env's bug: this episode errs, the others go on
                ep.error = str(e)
                self._end(row)
                return
            self._open(row, messages)
            return
        obs, reward, terminated, truncated, info = future.result()
        gen = self.gen.pop(row)
        action = self.chat.decode(gen.ids)
        obs_ids, opening = self.chat.following(gen.ids, obs), None
        if self.tracks:
            self.msgs[row] += [{"role": "assistant", "content": action}, {"role": "tool", "content": obs}]
            self.seq[row] += gen.ids
            self.mark[row] = len(self.seq[row])
        if self.by_template:  # the template's own continuation, or a new segment where it rewrote the history
            env = self.envs[row]
            extension, opening = self.chat.continuation(self.seq[row], self.msgs[row], env.tool_schemas())
            if opening is None:
                obs_ids = extension
                self.seq[row] += extension
            else:
                self.seq[row] = list(opening)  # obs_ids stay the appended layout's: the episode's layout for credit
        elif self.tracks:
            self.seq[row] += obs_ids
        key = info.get("state_key")
        ep.turns.append(
            Turn(self.ctx[row], gen.ids, gen.logprobs, obs_ids, action, obs,
                 float(info.get("step_reward") or 0.0), None if key is None else repr(key),
                 int(info.get("malformed", 0)),
                 gen.hidden, self.opening.pop(row, None))
        )
        ep.tool_timeouts += int(info.get("tool_timeouts", 0))
        self.ctx[row] += len(gen.ids) + len(obs_ids)
        # the context the model would be given next: the running sequence, or the new segment
        given = len(self.seq[row]) if self.tracks else self.ctx[row]
        if terminated or truncated:
            ep.reward, ep.terminated, ep.truncated = float(reward), bool(terminated), bool(truncated)
            self._end(row)
        elif self.threshold is not None and given + self.max_new_tokens > self.threshold:
            self._compact(row, given, rewritten=opening is not None)
        elif self.limit is not None and given + self.max_new_tokens > self.limit:
            self._submit("truncate", row)
        elif opening is not None:
            self.opening[row] = opening
            self.session.drop([row + self.offset])
            self.session.add([row + self.offset], [opening])
            self._make_ready(row)
        else:
            self.session.extend([obs_ids], rows=[row + self.offset])
            self._make_ready(row)

    # -- compaction (rollout.context) ------------------------------------------------------------

    def _compact(self, row: int, given: int, rewritten: bool) -> None:
        """The row's context has passed the policy's threshold: compact it (or ask for a summary first)."""
        self.stats.compactions += 1
        self.compacted.add(row)
        self.compaction_tokens.append(given)
        if self.policy.asks_policy:
            self._ask_summary(row, rewritten)
        elif self.policy.asks_env:  # the env may live in a worker process: its hook goes through the pool
            self._submit("compact", row, [dict(m) for m in self.msgs[row]])
        else:
            self._open(row, self.policy.compact(self.msgs[row], len(self.head[row]), self.context))

    def _ask_summary(self, row: int, rewritten: bool) -> None:
        """Give the row the instruction to summarise: appended after the last observation where the template's
        rendering extends the running sequence (it becomes part of that turn's observation, the cache kept),
        else as a new segment. The summary is the row's next action (`_summarized`)."""
        env, ep = self.envs[row], self.episodes[row]
        request = summary_request(self.msgs[row], self.context)
        if rewritten:  # this turn already opened a segment: the request is rendered whole
            extension, opening = [], self.chat.encode(self.chat.render(request, env.tool_schemas()))
        else:
            extension, opening = self.chat.continuation(self.seq[row][: self.mark[row]], request, env.tool_schemas())
        size = self.mark[row] + len(extension) if opening is None else len(opening)
        if self.limit is not None and size + self.context.summary_max_tokens > self.limit:
            self._submit("truncate", row)  # no room left to write a summary in (context.trigger leaves too little)
            return
        self.summarizing.add(row)
        if opening is None:
            turn = ep.turns[-1]
            self.ctx[row] += len(extension) - len(turn.obs_ids)
            turn.obs_ids = extension  # the observation, then the instruction, as the model is given them
            self.seq[row] = self.seq[row][: self.mark[row]] + extension
            self.session.extend([extension], rows=[row + self.offset])
        else:
            self.opening[row] = opening
            self.session.drop([row + self.offset])
            self.session.add([row + self.offset], [opening])
        self._make_ready(row)

    def _summarized(self, row: int, gen: Generation) -> None:
        """The summary is in: a turn of its own (trained like any action, no env step), cut to
        `summary_max_tokens` (the kept tokens are a sample of the policy's as they stand). The episode
        goes on from the head and the summary, after the env has said what the summary kept."""
        self.summarizing.discard(row)
        cap = self.context.summary_max_tokens
        ids, logprobs = list(gen.ids[:cap]), list(gen.logprobs[:cap])
        text = self.chat.decode(ids)
        ep, env = self.episodes[row], self.envs[row]
        before = ep.turns[-1].state_key if ep.turns else None  # the env's state is where the last step left it
        ep.turns.append(Turn(self.ctx[row], ids, logprobs, [], text, "", 0.0,
                             None if before is None else f"summary {before}", 0, gen.hidden,
                             self.opening.pop(row, None), kind="summary"))
        self.ctx[row] += len(ids)
        self.summary_tokens.append(len(ids))
        if getattr(type(env), "facts_kept", AgentEnv.facts_kept) is not AgentEnv.facts_kept:
            self.summary[row] = text
            self._submit("facts_kept", row, text)
        else:
            self._open(row, after_summary(self.head[row], text))

    def _open(self, row: int, messages: list[dict[str, str]]) -> None:
        """Continue the row from the compacted conversation `messages`: a new segment, the row's old cache
        dropped and the row started again on the new context; truncated if even that does not fit."""
        opening = self.chat.encode(self.chat.render(messages, self.envs[row].tool_schemas()))
        self.msgs[row], self.seq[row] = messages, list(opening)
        self.opening.pop(row, None)
        if self.limit is not None and len(opening) + self.max_new_tokens > self.limit:
            self._submit("truncate", row)
            return
        self.opening[row] = opening
        self.session.drop([row + self.offset])
        self.session.add([row + self.offset], [opening])
        self._make_ready(row)


def _messages(value: Any, env: AgentEnv) -> list[dict[str, str]]:
    """An env's compact() answer, checked: chat messages with a role and text content each."""
    if not isinstance(value, list) or not value or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value):
        raise EnvError(f"env {env.name}: compact() must return a non-empty list of {{'role': str, 'content': str}} "
                       f"messages, got {type(value).__name__}")
    return [{"role": m["role"], "content": m["content"]} for m in value]
