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

from pydantic import BaseModel, ConfigDict, Field

FinishReason = Literal["stop", "eos", "length"]


class SamplingConfig(BaseModel):
    """How actions are sampled."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, ge=0.0, description="Softmax temperature; 1.0 samples the policy as trained, 0 is greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling; 1.0 keeps the exact policy distribution that PPO's ratio assumes.")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens; 0 disables.")
    max_new_tokens: int = Field(48, ge=1, description="Per-turn cap on action tokens; an action cut here ends with finish reason 'length'.")


@dataclass
class Generation:
    """One row's action for one turn."""

    ids: list[int]
    logprobs: list[float]  # behaviour log-probs, from the logits that sampled each token
    finish: FinishReason  # "stop": a stop token such as </tool_call>; "eos": end of message
    hidden: list[float] | None = None  # policy hidden state at the last context token (if captured)


class Session(Protocol):
    rows: list[int]  # the caller's index of every row still in the batch, in batch order

    def generate(self) -> list[Generation]: ...

    def extend(self, chunks: Sequence[Sequence[int]]) -> None: ...

    def keep(self, positions: Sequence[int]) -> None: ...


class Engine(Protocol):
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

    def open(self, prompts: Sequence[Sequence[int]]) -> _ScriptedSession:
        return _ScriptedSession(self, list(range(len(prompts))))


class _ScriptedSession:
    def __init__(self, engine: ScriptedEngine, rows: list[int]):
        self.engine = engine
        self.rows = rows

    def generate(self) -> list[Generation]:
        out = []
        for r in self.rows:
            ids = list(self.engine.act(r))
            out.append(Generation(ids, [0.0] * len(ids), "eos" if ids and ids[-1] == self.engine.eos_id else "stop"))
        return out

    def extend(self, chunks: Sequence[Sequence[int]]) -> None:
        if len(chunks) != len(self.rows):
            raise ValueError(f"extend() got {len(chunks)} chunks for {len(self.rows)} rows")

    def keep(self, positions: Sequence[int]) -> None:
        self.rows = [self.rows[p] for p in positions]
