"""The generation interface every backend implements, and the scripted backend for demos and tests.

An engine holds a batch of conversations (`Session`). Per turn, the rollout asks it to
`generate()` one action for every row still in the batch, then either `extend()`s each row with
the observation's tokens or drops finished rows with `keep()`. Rows keep their state (a KV cache,
for the torch engine) across turns, so the history is never re-encoded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

FinishReason = Literal["stop", "eos", "length"]




@dataclass
class Generation:
    """One row's action for one turn."""

    ids: list[int]
    logprobs: list[float]  # behaviour log-probs, from the logits that sampled each token
    finish: FinishReason  # "stop": a stop token such as </tool_call>; "eos": end of message
    hidden: list[float] | None = None  # policy hidden state at the last context token (if captured)


class Session(Protocol):
    """Rows are named by the caller's index. The rollout drives a session with `add` (new episodes
    join, possibly into a running batch), `start` + `collect` (actions of the rows whose observation
    has arrived: a turn-level engine decodes every started row in one batch; a continuous one
    returns actions as they finish, at least one per call), `extend` and `drop`. `generate`,
    `extend(chunks)` and `keep(positions)` without rows act on the whole batch, by position."""

    rows: list[int]  # the caller's index of every row still in the batch, in batch order
    turn_level: bool  # True: collect() returns every started row; False: rows started later join running ones

    def generate(self, rows: Sequence[int] | None = None) -> list[Generation]: ...

    def extend(self, chunks: Sequence[Sequence[int]], rows: Sequence[int] | None = None) -> None: ...

    def keep(self, positions: Sequence[int]) -> None: ...

    def add(self, rows: Sequence[int], prompts: Sequence[Sequence[int]]) -> None: ...

    def start(self, rows: Sequence[int]) -> None: ...

    def collect(self) -> list[tuple[int, Generation]]: ...

    def drop(self, rows: Sequence[int]) -> None: ...


class Engine(Protocol):
    """Opens sessions. An engine that samples holds its `SamplingConfig` as `engine.sampling`: the trainer
    builds it with a copy of its own, and may replace it with a new copy between generate calls (an
    intervention turned the temperature; the object an engine holds is never changed in place). So read
    `self.sampling` when generating, not fields copied from it once at construction."""

    def open(self, prompts: Sequence[Sequence[int]]) -> Session: ...


class ScriptedEngine:
    """Plays actions given by a function of the row index (a scripted expert, or a test's script).

    >>> eng = ScriptedEngine(lambda row: [7, 2], eos_id=2)
    >>> s = eng.open([[1], [1]])
    >>> [g.ids for g in s.generate()]
    [[7, 2], [7, 2]]
    """

    def __init__(self, act: Callable[[int], list[int]], eos_id: int):
        self.act = act
        self.eos_id = eos_id
        self._session: _ScriptedSession | None = None

    def open(self, prompts: Sequence[Sequence[int]]) -> _ScriptedSession:
        self._session = _ScriptedSession(self, list(range(len(prompts))))
        self._session.given = {r: list(p) for r, p in enumerate(prompts)}
        return self._session

    def given(self, row: int) -> list[int]:
        """The ids row `row` was last given in the open session: its prompt, a new segment's context, or the
        observation that extended it. A script that answers what it is asked reads it (a scripted expert asked
        for a summary by rollout.context summarize, whose instruction arrives there)."""
        return [] if self._session is None else self._session.given.get(row, [])


class _ScriptedSession:
    turn_level = True

    def __init__(self, engine: ScriptedEngine, rows: list[int]):
        self.engine = engine
        self.rows = rows
        self.started: list[int] = []
        self.given: dict[int, list[int]] = {}

    def generate(self, rows: Sequence[int] | None = None) -> list[Generation]:
        out = []
        for r in self.rows if rows is None else rows:
            if r not in self.rows:
                raise KeyError(f"row {r} is not in this session")
            ids = list(self.engine.act(r))
            out.append(Generation(ids, [0.0] * len(ids), "eos" if ids and ids[-1] == self.engine.eos_id else "stop"))
        return out

    def extend(self, chunks: Sequence[Sequence[int]], rows: Sequence[int] | None = None) -> None:
        rows = self.rows if rows is None else rows
        if len(chunks) != len(rows):
            raise ValueError(f"extend() got {len(chunks)} chunks for {len(rows)} rows")
        self.given.update((r, list(c)) for r, c in zip(rows, chunks))

    def keep(self, positions: Sequence[int]) -> None:
        self.rows = [self.rows[p] for p in positions]

    def add(self, rows: Sequence[int], prompts: Sequence[Sequence[int]]) -> None:
        self.rows += list(rows)
        self.given.update((r, list(p)) for r, p in zip(rows, prompts))

    def start(self, rows: Sequence[int]) -> None:
        self.started += list(rows)

    def collect(self) -> list[tuple[int, Generation]]:
        rows, self.started = self.started, []
        return list(zip(rows, self.generate(rows)))

    def drop(self, rows: Sequence[int]) -> None:
        gone = set(rows)
        self.rows = [r for r in self.rows if r not in gone]
