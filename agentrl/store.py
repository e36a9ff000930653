"""The turn-segmented trajectory store, and the training batch it hands out.

Episodes are kept whole (prompt, then turns of action and observation tokens) with their group,
rewards and per-turn records, and saved as Parquet (one row per episode, turns as a list of
structs), so a run's rollouts can be reloaded, probed or trained on without the environment.
`TrajectoryStore.batch` lays episodes out as (B, T) token tensors with a loss mask that is 1 on
action tokens only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from agentrl.core import Episode, Turn

TURN_TYPE = pa.struct(
    [
        ("context_len", pa.int32()),
        ("action_ids", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float32())),
        ("obs_ids", pa.list_(pa.int32())),
        ("action", pa.string()),
        ("observation", pa.string()),
        ("step_reward", pa.float32()),
        ("state_key", pa.string()),
        ("malformed", pa.int32()),
        ("hidden", pa.list_(pa.float32())),
        ("segment_context", pa.list_(pa.int32())),  # absent in stores written before segments: None
        ("policy_version", pa.int64()),  # absent in stores written before the gateway: None
        ("kind", pa.string()),  # absent in stores written before context policies: "action"
    ]
)
SCHEMA = pa.schema(
    [
        ("env_id", pa.string()),
        ("task_id", pa.string()),
        ("group_id", pa.int64()),
        ("seed", pa.int64()),
        ("reward", pa.float64()),
        ("terminated", pa.bool_()),
        ("truncated", pa.bool_()),
        ("error", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("turns", pa.list_(TURN_TYPE)),
        ("policy_version", pa.int64()),  # updates applied to the weights that generated it (later than the rest)
    ]
)
OPTIONAL = {"policy_version"}  # columns a store written before them lacks (read as their default)


class StoreError(ValueError):
    """A store file is missing, unreadable or not an agentrl store."""


@dataclass(frozen=True)
class TurnBatch:
    """Episodes as tensors, one row per episode, aligned to token positions.

    ``turn_index[b, t]`` is the turn that action token t belongs to (-1 elsewhere), so a turn-level
    advantage (B, K) becomes a token-level one by a gather. ``turn_pos[b, k]`` is the position of
    the last context token before turn k's action (where a turn critic reads the hidden state).
    """

    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) long
    action_mask: torch.Tensor  # (B, T) float, 1 on action tokens
    behaviour_logp: torch.Tensor  # (B, T) float
    turn_index: torch.Tensor  # (B, T) long, -1 off action tokens
    turn_pos: torch.Tensor  # (B, K) long, -1 past the episode's last turn
    num_turns: torch.Tensor  # (B,) long
    step_rewards: torch.Tensor  # (B, K) float
    rewards: torch.Tensor  # (B,) float, the verifier's terminal reward
    group_ids: torch.Tensor  # (B,) long
    terminated: torch.Tensor  # (B,) bool
    truncated: torch.Tensor  # (B,) bool
    episodes: list[Episode]
    turn_hidden: torch.Tensor | None = None  # (B, K, H) policy state before each action, if captured
    ref_logp: torch.Tensor | None = None  # (B, T) reference log-probs: batch.with_(ref_logp=...) by the trainer
    advantages: torch.Tensor | None = None  # (B, T) the assigner's, attached for the loss (select/trim carry them)
    prox_logp: torch.Tensor | None = None  # (B, T) the proximal policy's (decoupled PPO on off-policy episodes)
    # set on a batch whose rows are segments (`segment_batch`): row s is a segment of row seg_row[s] of the
    # episode batch it was made from, and its token t is that row's token seg_pos[s, t] (-1: not an action token)
    seg_row: torch.Tensor | None = None  # (B,) long
    seg_pos: torch.Tensor | None = None  # (B, T) long
    sampler_logp: torch.Tensor | None = None  # (B, T) the trainer's, under the weights that sampled (agentrl.mismatch)
    teacher_logp: torch.Tensor | None = None  # (B, T) a frozen teacher's, for an assigner that reads one (distill)

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def with_(self, **columns: torch.Tensor) -> TurnBatch:
        """A copy with more columns (the batch itself never changes once built)."""
        return replace(self, **columns)

    @property
    def turn_mask(self) -> torch.Tensor:
        """(B, K) bool: which turn slots hold a turn."""
        return self.turn_pos >= 0

    def select(self, rows: Sequence[int] | torch.Tensor) -> TurnBatch:
        idx = torch.as_tensor(rows, dtype=torch.long)
        kw = {}
        for f in fields(self):
            v = getattr(self, f.name)
            kw[f.name] = [v[i] for i in idx.tolist()] if f.name == "episodes" else (None if v is None else v[idx])
        return TurnBatch(**kw)

    def trim(self) -> TurnBatch:
        """Drop the padding columns every row has (rows are right-padded)."""
        T = int(self.attention_mask.sum(1).max())
        if T == self.input_ids.shape[1]:
            return self
        per_token = {"input_ids", "attention_mask", "action_mask", "behaviour_logp", "turn_index", "ref_logp",
                     "advantages", "prox_logp", "sampler_logp", "teacher_logp"}
        return replace(self, **{k: getattr(self, k)[:, :T] for k in per_token if getattr(self, k) is not None})

    def micro_batches(self, max_tokens: int, by_prompt: bool = False) -> list[torch.Tensor]:
        """Row indices in groups of similar length whose padded size (rows x longest) stays within
        `max_tokens` (a row longer than that is a group by itself): the forward pads each group only
        to its own longest row, not to the batch's. `by_prompt`: rows that begin with the same tokens up to
        their first action token are kept side by side (longest prompt group first), so that a forward
        sharing their prompt (`agentrl.policy.token_stats(share_heads=...)`) finds them together."""
        lengths = self.attention_mask.sum(1)
        order = torch.argsort(lengths, descending=True, stable=True).tolist()
        if by_prompt:
            first = self.action_mask.float().argmax(1).tolist()  # 0 for a row without action tokens
            prompt = {i: tuple(self.input_ids[i, : first[i]].tolist()) for i in order}
            rank: dict[tuple[int, ...], int] = {}
            for i in order:  # a prompt ranks by its longest row, and its rows keep their order (longest first)
                rank.setdefault(prompt[i], len(rank))
            order = sorted(order, key=lambda i: rank[prompt[i]])
        groups: list[list[int]] = []
        for i in order:
            if groups and (len(groups[-1]) + 1) * int(lengths[groups[-1][0]]) <= max_tokens:
                groups[-1].append(i)  # rows come longest first, so the group's first row sets its width
            else:
                groups.append([i])
        return [torch.tensor(g, dtype=torch.long) for g in groups]

    def to(self, device: torch.device | str) -> TurnBatch:
        return TurnBatch(**{f.name: (v.to(device) if isinstance(v := getattr(self, f.name), torch.Tensor) else v)
                            for f in fields(self)})


def make_batch(episodes: Sequence[Episode], pad_id: int, mask_summary: bool = False) -> TurnBatch:
    """Lay `episodes` out as right-padded (B, T) tensors. `mask_summary` (rollout.context.mask_summary) leaves
    the summaries' tokens out of the loss: their action mask is 0, while their turn keeps its slot (a turn
    critic still values the state the summary was written in)."""
    if not episodes:
        raise ValueError("make_batch: no episodes")
    B = len(episodes)
    T = max(len(e.token_ids()) for e in episodes)
    K = max(max(e.num_turns for e in episodes), 1)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attention = torch.zeros(B, T, dtype=torch.long)
    action_mask = torch.zeros(B, T)
    blogp = torch.zeros(B, T)
    turn_index = torch.full((B, T), -1, dtype=torch.long)
    turn_pos = torch.full((B, K), -1, dtype=torch.long)
    step_rewards = torch.zeros(B, K)
    has_hidden = all(t.hidden is not None for e in episodes for t in e.turns) and any(e.turns for e in episodes)
    turn_hidden = None
    if has_hidden:
        H = len(next(t.hidden for e in episodes for t in e.turns))
        turn_hidden = torch.zeros(B, K, H)
    for b, ep in enumerate(episodes):
        ids = ep.token_ids()
        input_ids[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention[b, : len(ids)] = 1
        for k, turn in enumerate(ep.turns):
            s, n = turn.context_len, len(turn.action_ids)
            action_mask[b, s : s + n] = 0 if mask_summary and turn.kind == "summary" else 1
            blogp[b, s : s + n] = torch.tensor(turn.logprobs)
            turn_index[b, s : s + n] = k
            turn_pos[b, k] = s - 1
            step_rewards[b, k] = turn.step_reward
            if turn_hidden is not None:
                turn_hidden[b, k] = torch.tensor(turn.hidden)
    return TurnBatch(
        input_ids=input_ids,
        attention_mask=attention,
        action_mask=action_mask,
        behaviour_logp=blogp,
        turn_index=turn_index,
        turn_pos=turn_pos,
        num_turns=torch.tensor([e.num_turns for e in episodes], dtype=torch.long),
        step_rewards=step_rewards,
        rewards=torch.tensor([e.reward for e in episodes], dtype=torch.float32),
        group_ids=torch.tensor([e.group_id for e in episodes], dtype=torch.long),
        terminated=torch.tensor([e.terminated for e in episodes]),
        truncated=torch.tensor([e.truncated for e in episodes]),
        episodes=list(episodes),
        turn_hidden=turn_hidden,
    )


def segment_batch(batch: TurnBatch) -> TurnBatch:
    """`batch` with one row per sequence the model was actually given (`Episode.segments`): where a chat
    template rewrote the history, an episode is trained as several segments, each action on exactly the
    context it was sampled from. The per-token columns (advantages, behaviour and reference log-probs,
    the masks) are carried to the segments' positions, the per-episode ones repeated; `seg_row` and
    `seg_pos` say where each segment token came from (`to_episodes` takes values back). A batch with no
    segmented episode is returned as it is.
    """
    if batch.seg_row is not None or not any(e.segmented for e in batch.episodes):
        return batch
    rows, parts = [], []
    for b, ep in enumerate(batch.episodes):
        for ids, src in ep.segments():
            rows.append(b)
            parts.append((ids, src))
    S, T = len(parts), max(len(ids) for ids, _ in parts)
    seg_row = torch.tensor(rows, dtype=torch.long)
    input_ids = torch.full((S, T), _pad_of(batch), dtype=torch.long)
    attention = torch.zeros(S, T, dtype=torch.long)
    seg_pos = torch.full((S, T), -1, dtype=torch.long)
    for s, (ids, src) in enumerate(parts):
        input_ids[s, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention[s, : len(ids)] = 1
        seg_pos[s, : len(src)] = torch.tensor(src, dtype=torch.long)
    on = seg_pos >= 0
    gather_at = seg_pos.clamp(min=0)

    def carried(name: str, v: torch.Tensor) -> torch.Tensor:
        fill = torch.full_like(gather_at, -1 if name == "turn_index" else 0, dtype=v.dtype)
        return torch.where(on, v[seg_row.unsqueeze(1), gather_at], fill)

    columns: dict = {}
    for f in fields(batch):
        v = getattr(batch, f.name)
        if f.name in ("input_ids", "attention_mask", "episodes") or v is None:
            continue
        # per token: (B, T) like the ids, taken to the segments' positions; per episode: repeated
        columns[f.name] = carried(f.name, v) if v.shape == batch.input_ids.shape else v[seg_row]
    return TurnBatch(input_ids=input_ids, attention_mask=attention, episodes=[batch.episodes[b] for b in rows],
                     **{**columns, "seg_row": seg_row, "seg_pos": seg_pos})


def to_episodes(values: torch.Tensor, segments: TurnBatch, shape: torch.Size | tuple[int, int],
                rows: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token `values` (S, T') of a `segment_batch` back in its episode batch's layout `shape` (B, T),
    0 off action tokens; `rows` maps the segment batch's source rows to rows of the result (default: the same)."""
    out = torch.zeros(shape, dtype=values.dtype)
    on = segments.seg_pos[:, : values.shape[1]] >= 0
    s, t = on.nonzero(as_tuple=True)
    target = segments.seg_row[s] if rows is None else rows[segments.seg_row[s]]
    out[target, segments.seg_pos[s, t]] = values[s, t]
    return out


def _pad_of(batch: TurnBatch) -> int:
    """The pad id a batch was laid out with: what fills a row past its end (0 if no row is padded)."""
    off = batch.attention_mask == 0
    return int(batch.input_ids[off][0]) if bool(off.any()) else 0


def truncate_store(folder: str | Path, update: int) -> list[Path]:
    """Remove the store files of updates after `update` (`update_XXXXX_*.parquet`, and any half-written
    `.tmp`): a run resumed from `update`'s checkpoint rolls those updates out again. Returns what it removed."""
    folder = Path(folder)
    removed = []
    for f in sorted(folder.glob("update_*.parquet*")) if folder.is_dir() else []:
        number = f.name[len("update_"):].split("_", 1)[0]
        if number.isdigit() and (f.name.endswith(".tmp") or int(number) > update):
            f.unlink()
            removed.append(f)
    return removed


class TrajectoryStore:
    """Episodes grouped by `group_id`; append, save/load as Parquet, hand out `TurnBatch`es.

    >>> store = TrajectoryStore([Episode([1], [Turn(1, [2], [-0.5], [3])], reward=1.0, group_id=7)])
    >>> len(store), list(store.groups())
    (1, [7])
    >>> store.batch(pad_id=0).action_mask.tolist()
    [[0.0, 1.0]]
    """

    def __init__(self, episodes: Iterable[Episode] = ()):
        self.episodes: list[Episode] = list(episodes)

    def __len__(self) -> int:
        return len(self.episodes)

    def __iter__(self) -> Iterator[Episode]:
        return iter(self.episodes)

    def add(self, episodes: Iterable[Episode]) -> None:
        self.episodes.extend(episodes)

    def groups(self) -> dict[int, list[Episode]]:
        out: dict[int, list[Episode]] = defaultdict(list)
        for ep in self.episodes:
            out[ep.group_id].append(ep)
        return dict(out)

    def batch(self, pad_id: int) -> TurnBatch:
        return make_batch(self.episodes, pad_id)

    # -- Parquet ----------------------------------------------------------------------------------

    def to_table(self) -> pa.Table:
        rows = []
        for ep in self.episodes:
            rows.append(
                {
                    "env_id": ep.env_id,
                    "task_id": ep.task_id,
                    "group_id": ep.group_id,
                    "seed": ep.seed,
                    "reward": ep.reward,
                    "terminated": ep.terminated,
                    "truncated": ep.truncated,
                    "error": ep.error,
                    "prompt_ids": ep.prompt_ids,
                    "turns": [{f.name: getattr(t, f.name) for f in fields(Turn)} for t in ep.turns],
                    "policy_version": ep.policy_version,
                }
            )
        return pa.Table.from_pylist(rows, schema=SCHEMA)

    def save(self, path: str | Path) -> Path:
        """Write the store as one Parquet file (atomically: a killed run leaves no half file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        pq.write_table(self.to_table(), tmp)
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> TrajectoryStore:
        """Load a Parquet file, or every `*.parquet` in a folder (in name order)."""
        path = Path(path)
        if not path.exists():
            raise StoreError(f"no store at {path}")
        files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
        if not files:
            raise StoreError(f"{path} holds no .parquet files")
        store = cls()
        for f in files:
            try:
                table = pq.read_table(f)
            except (pa.ArrowInvalid, OSError) as e:
                raise StoreError(f"{f} is not a readable Parquet file: {e}") from e
            missing = set(SCHEMA.names) - set(table.column_names) - OPTIONAL
            if missing:
                raise StoreError(f"{f} is not an agentrl store: missing columns {sorted(missing)}")
            for row in table.to_pylist():
                turns = [Turn(**t) for t in row.pop("turns")]
                store.episodes.append(Episode(turns=turns, **row))
        return store
