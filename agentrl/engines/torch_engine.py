"""The default backend: batched generation with transformers models in plain torch.

All rows of a session share one KV cache (`transformers.DynamicCache`) laid out as a rectangle.
Rows differ in length, so every chunk fed to the model (the prompts, then each turn's
observations) is left-padded to the longest row, and padding stays in the cache as masked holes;
positions come from the attention mask, so a row sees the same positions it would see unpadded
(and in training). One forward per generated token serves the whole batch; a row that has stopped
feeds a masked pad token until the turn ends. Finished episodes leave the batch with `keep()`,
which slices the cache.

Appending a token must not copy what is already there: `DynamicCache` concatenates every layer's
keys and values at every token (`torch.cat`), copying the whole cache each time: a turn of N
tokens copied its context N times. The session instead reserves room, once per turn, for the
turn's chunk and its longest action, and writes each token into it (`_RollingCache`, and the
same for the attention mask); the samples and log-probs are bit for bit those of `DynamicCache`.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agentrl.engines.base import Generation, SamplingConfig


def sample_tokens(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None = None,
                  uniforms: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return it and its log-prob under the temperature-scaled policy.

    The log-prob is taken before top-k/top-p truncation (as vLLM reports it), so that it matches
    what the learner recomputes from the same logits. With `uniforms` (B,) in [0, 1), row b takes
    the token where its cumulative distribution passes uniforms[b] (inverse-CDF sampling), so a
    row's sample depends on its own number only, not on the rows batched with it.
    """
    logits = logits.float()  # (B, V)
    if cfg.temperature == 0:
        tok = logits.argmax(-1)
        return tok, F.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)
    logits = logits / cfg.temperature
    logp = F.log_softmax(logits, -1)  # (B, V)
    masked = logits
    if cfg.top_k > 0 and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[:, -1:]
        masked = masked.masked_fill(masked < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(masked, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) > cfg.top_p  # keep the smallest set reaching top_p
        masked = masked.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = masked.softmax(-1)  # (B, V)
    if uniforms is None:
        tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)
    else:
        cdf = probs.cumsum(-1)  # (B, V)
        # right=True: the first token whose cdf exceeds u, never a zero-probability one
        target = (uniforms.to(cdf.dtype) * cdf[:, -1])[:, None]  # (B, 1)
        tok = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN, _MIX1, _MIX2 = _signed(0x9E3779B97F4A7C15), _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    return (x >> k) & ((1 << (64 - k)) - 1)  # logical shift of int64 (torch's >> keeps the sign)


def _splitmix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 on int64 tensors (products wrap modulo 2^64): a counter-based random number."""
    z = x + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def row_uniforms(stream: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """Uniforms in [0, 1), one per row, from each row's stream and draw counter (int64, (B,))."""
    return _shr(_splitmix(_splitmix(stream) + counter), 11).double() / float(1 << 53)


def _append(view: torch.Tensor, buf: torch.Tensor | None, new: torch.Tensor, room: int,
            dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.cat([view, new], dim)` written into `buf`, of which `view` is the leading part; returns
    the new view and the buffer. The buffer is reallocated (to `room` positions, or just enough when
    `room` is smaller) only when it is full, so appending a token copies one token, not the tensor.
    A `view` that is not the leading part of `buf` (the caller replaced it) becomes the buffer."""
    length, n = view.shape[dim], new.shape[dim]
    leading = buf is not None and view.data_ptr() == buf.data_ptr() and view.stride() == buf.stride() and all(
        a == b for d, (a, b) in enumerate(zip(view.shape, buf.shape)) if d != dim % view.dim())
    if not leading:
        buf = view
    if length + n > buf.shape[dim]:
        shape = list(new.shape)
        shape[dim] = max(length + n, room)
        grown = new.new_empty(shape)
        grown.narrow(dim, 0, length).copy_(view)
        buf = grown
    buf.narrow(dim, length, n).copy_(new)
    return buf.narrow(dim, 0, length + n), buf


class _RollingLayer(DynamicLayer):
    """A `DynamicLayer` that writes new keys and values into room reserved by its cache (see `_append`)
    instead of concatenating; `keys`/`values` are views of the buffers' leading positions, so every
    other `DynamicLayer` method (selecting rows, cropping) works on them unchanged."""

    def __init__(self, cache: _RollingCache):
        super().__init__()
        self.cache = cache
        self.key_buf: torch.Tensor | None = None  # (B, H, capacity, D)
        self.value_buf: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args,
               **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        # the first write sets the layer up as the parent does (its API varies by version)
        if self.get_seq_length() == 0:
            return super().update(key_states, value_states, *args, **kwargs)
        self.keys, self.key_buf = _append(self.keys, self.key_buf, key_states, self.cache.room, dim=-2)
        self.values, self.value_buf = _append(self.values, self.value_buf, value_states, self.cache.room, dim=-2)
        return self.keys, self.values


class _RollingCache(DynamicCache):
    """A `DynamicCache` of `_RollingLayer`s; `room` is the length each layer grows to when it is full."""

    def __init__(self) -> None:
        super().__init__()
        self.room = 0
        # layers are made on first use; a transformers without this hook keeps plain DynamicLayers
        if getattr(self, "layer_class_to_replicate", None) is DynamicLayer:
            self.layer_class_to_replicate = lambda: _RollingLayer(self)


class TorchEngine:
    """Generate with a transformers causal LM, keeping each row's KV cache across turns."""

    def __init__(self, model: torch.nn.Module, sampling: SamplingConfig, stop_ids: Sequence[int], eos_id: int,
                 pad_id: int, seed: int | None = None, capture_hidden: bool = False):
        self.model = model
        # Turn critics read the hidden state at the last context token of each turn; it falls out
        # of the forward that produces the turn's first logits, so capturing it costs no pass.
        self.capture_hidden = capture_hidden
        self.sampling = sampling
        self.stop_ids = torch.tensor(sorted(set(stop_ids)), dtype=torch.long)
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        # transformers 5 renamed `past_key_values` to `cache`
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model passes kwargs on
        params = inspect.signature(base.forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        # only the last position's logits are sampled from: skip the LM head on the rest of a chunk
        self.last_logits = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        # Each row samples from a stream of its own: a counter-based generator keyed by the session
        # and the caller's row index, so a row's tokens do not depend on which rows share its batch
        # (rows join and leave at times set by their tools' latency).
        self.generator = None
        if seed is not None:
            self.generator = torch.Generator().manual_seed(seed)
        self.sessions = 0

    def state_dict(self) -> dict[str, Any]:
        """Where the sampler stands (its session-key generator and the number of sessions opened): a
        resumed run's next session then draws the key, and so the tokens, the uninterrupted run would."""
        return {"generator": None if self.generator is None else self.generator.get_state(), "sessions": self.sessions}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["generator"] is None) != (self.generator is None):
            raise ValueError("engine state: saved from an engine "
                             + ("without" if state["generator"] is None else "with")
                             + " a seed, loaded into one " + ("without" if self.generator is None else "with") + " one")
        if self.generator is not None:
            self.generator.set_state(state["generator"])
        self.sessions = int(state["sessions"])

    def open(self, prompts: Sequence[Sequence[int]]) -> TorchSession:
        # the session's key: the engine's seed and the number of sessions before it (or torch's own RNG without a seed)
        key = int(torch.randint(0, 2**62, (1,), generator=self.generator))
        self.sessions += 1
        return TorchSession(self, [list(p) for p in prompts], key)


class TorchSession:
    """A batch of rows in slots of one rectangular cache.

    Rows need not move together: `generate(rows)` decodes only the rows named (the others feed
    masked pads and stay as they are), so a row whose observation has arrived need not wait for the
    rest; `drop(rows)` frees a finished row's slot without touching the cache, and `add(rows,
    prompts)` puts new rows into free slots (continuous batching): the new row's old slot contents
    are masked out and its prompt is prefilled by its first `generate`. Holes that build up this way
    are squeezed out (`_compact`) once they outnumber the real positions. Positions come from each
    row's own count of real tokens, never from the cache index, so moving keys changes nothing.
    """

    turn_level = True  # generate() decodes whole actions: rows join and leave between calls

    def __init__(self, engine: TorchEngine, prompts: list[list[int]], key: int = 0):
        self.engine = engine
        dev = engine.device
        self.key = key
        self.slot_rows: list[int | None] = list(range(len(prompts)))  # the caller's row in each slot (None: free)
        self.drawn = torch.zeros(len(prompts), dtype=torch.long, device=dev)  # (B,) tokens each row has sampled
        # not fed yet: a reused slot's old positions are masked out at its first feed
        self.fresh = [True] * len(prompts)
        self.cache: DynamicCache = _RollingCache()
        self.mask = torch.zeros(len(prompts), 0, dtype=torch.long, device=dev)  # (B, L) 1 = real token
        self.mask_buf: torch.Tensor | None = None  # (B, capacity): `mask` is its leading part
        self.room = 0  # cache length to reserve room for at the next growth
        self.holes = False  # is any cached position masked (padding, a stopped row's pad)?
        self.pos = torch.zeros(len(prompts), dtype=torch.long, device=dev)  # (B,) real tokens so far
        self.pending: list[list[int]] = prompts  # tokens each row has not yet fed to the model
        self.tokens_fed = 0  # padded positions run through the model (for throughput accounting)
        self.turn_hidden: torch.Tensor | None = None
        self.started: list[int] = []

    @property
    def rows(self) -> list[int]:
        """The caller's index of every row in the batch, in slot order (positions for `keep`)."""
        return [r for r in self.slot_rows if r is not None]

    @property
    def cache_len(self) -> int:
        return self.mask.shape[1]

    def _slots(self, rows: Sequence[int] | None) -> list[int]:
        if rows is None:
            return [s for s, r in enumerate(self.slot_rows) if r is not None]
        where = {r: s for s, r in enumerate(self.slot_rows) if r is not None}
        missing = [r for r in rows if r not in where]
        if missing:
            raise KeyError(f"rows {missing} are not in this session")
        return [where[r] for r in rows]

    def _forward(self, ids: torch.Tensor, chunk_mask: torch.Tensor, hidden: bool = False) -> torch.Tensor:
        self.mask, self.mask_buf = _append(self.mask, self.mask_buf, chunk_mask, self.room, dim=1)  # (B, L + C)
        pos_ids = (self.pos[:, None] + chunk_mask.cumsum(1) - 1).clamp(min=0)  # (B, C)
        # An all-ones mask is one that transformers checks (a reduction, a host sync) and then
        # drops: until the first hole, pass none; the model runs the same kernels on the same numbers.
        self.holes = self.holes or not bool(chunk_mask.all())
        out = self.engine.model(
            input_ids=ids, attention_mask=self.mask if self.holes else None, position_ids=pos_ids, use_cache=True,
            output_hidden_states=hidden, **{self.engine.cache_kwarg: self.cache}, **self.engine.last_logits,
        )
        self.pos += chunk_mask.sum(1)
        self.tokens_fed += ids.numel()
        if hidden:  # the state at the last context token, which a turn critic reads
            self.turn_hidden = out.hidden_states[-1][:, -1].float()  # (B, H)
        return out.logits[:, -1]  # (B, V)

    def _layers(self) -> list[Any]:
        return [layer for layer in getattr(self.cache, "layers", []) if layer.get_seq_length() > 0]

    def _compact(self) -> None:
        """Drop the masked holes: each row's real positions, in order, right-aligned in a cache as
        long as the longest row's (one gather of every layer)."""
        real = self.mask.bool()  # (B, L)
        width = int(real.sum(1).max()) if real.numel() else 0
        # a stable sort puts each row's holes first and its real positions after, in their order
        idx = torch.argsort(real.int(), dim=1, stable=True)[:, real.shape[1] - width :]  # (B, W)
        self.mask, self.mask_buf = real.gather(1, idx).long(), None
        for layer in self._layers():
            k_idx = idx[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])  # (B, H, W, D)
            layer.keys, layer.values = layer.keys.gather(2, k_idx), layer.values.gather(2, k_idx)
            if isinstance(layer, _RollingLayer):
                layer.key_buf = layer.value_buf = None

    def _feed_pending(self, slots: list[int]) -> torch.Tensor:
        B, dev = len(self.slot_rows), self.engine.device
        active = set(slots)
        for s in slots:
            if not self.pending[s]:
                raise ValueError(f"row {self.slot_rows[s]} has nothing to feed: extend() it with its observation "
                                 "before generate()")
            if self.fresh[s]:  # a reused slot: the previous row's positions are holes to the new one
                if self.cache_len:
                    self.mask[s] = 0
                    self.holes = True
                self.pos[s] = 0
                self.fresh[s] = False
        if self.holes and self.cache_len > 64 and 2 * int(self.mask.sum(1).max()) < self.cache_len:
            self._compact()
        width = max(len(self.pending[s]) for s in slots)
        ids = torch.full((B, width), self.engine.pad_id, dtype=torch.long, device=dev)  # (B, C)
        m = torch.zeros_like(ids)
        for s in range(B):  # left-pad: the last column is every row's newest token
            chunk = self.pending[s] if s in active else []
            if chunk:
                ids[s, width - len(chunk) :] = torch.tensor(chunk, dtype=torch.long)
                m[s, width - len(chunk) :] = 1
                self.pending[s] = []
            elif self.fresh[s]:
                # a row with no real position yet would attend to nothing (NaN, which the masked
                # slots would then hold); let its pad see itself: its first feed masks it out again
                m[s, -1] = 1
        # room for this chunk and the longest action: no growth while decoding this turn
        self.room = self.cache_len + width + self.engine.sampling.max_new_tokens
        if isinstance(self.cache, _RollingCache):
            self.cache.room = self.room
        return self._forward(ids, m, hidden=self.engine.capture_hidden)

    @torch.inference_mode()
    def generate(self, forced: Sequence[Sequence[int]] | None = None,
                 rows: Sequence[int] | None = None) -> list[Generation]:
        """One action for each of `rows` (default: every row), in that order; the other rows stay as
        they are. `forced` (one token list per row) replaces sampling by those tokens (teacher
        forcing: same forwards, same log-probs; for replaying episodes and benchmarks)."""
        eng, cfg = self.engine, self.engine.sampling
        slots = self._slots(rows)
        if not slots:
            return []
        B, dev = len(self.slot_rows), eng.device
        logits = self._feed_pending(slots)
        active = torch.zeros(B, dtype=torch.bool, device=dev)
        active[slots] = True
        if forced is not None:
            forced_t = torch.full((B, cfg.max_new_tokens), eng.pad_id, dtype=torch.long, device=dev)
            for s, f in zip(slots, forced, strict=True):
                forced_t[s, : len(f)] = torch.tensor(f[: cfg.max_new_tokens], dtype=torch.long)
        tokens = torch.full((B, cfg.max_new_tokens), eng.pad_id, dtype=torch.long, device=dev)  # (B, N)
        logps = torch.zeros(B, cfg.max_new_tokens, device=dev)  # (B, N)
        done = ~active  # rows not asked for feed masked pads throughout
        length = torch.zeros(B, dtype=torch.long, device=dev)
        stop_ids = eng.stop_ids.to(dev)
        stream = torch.tensor([self.key + (r if r is not None else -1) * 1_000_003 for r in self.slot_rows],
                              dtype=torch.long, device=dev)  # (B,)
        n = 0
        for t in range(cfg.max_new_tokens):
            if forced is None:
                u = row_uniforms(stream, self.drawn) if cfg.temperature > 0 else None
                tok, lp = sample_tokens(logits, cfg, uniforms=u)
            else:
                tok = forced_t[:, t]
                lp = torch.log_softmax(logits.float() / (cfg.temperature or 1.0), -1).gather(
                    -1, tok[:, None]).squeeze(-1)
            live = ~done  # rows that produce a real token at this step
            self.drawn += live.long()
            tokens[:, t] = torch.where(live, tok, eng.pad_id)
            logps[:, t] = torch.where(live, lp, 0.0)
            length += live.long()
            done = done | (live & torch.isin(tok, stop_ids))
            n = t + 1
            if bool(done.all()) or n == cfg.max_new_tokens:
                break
            logits = self._forward(tokens[:, t : t + 1], live.long()[:, None])
        # the last token each row produced at the final step is not in the cache yet: it goes
        # first in the row's next chunk, saving a forward pass now.
        tokens, logps = tokens[:, :n].tolist(), logps[:, :n].tolist()
        lengths, last_live = length.tolist(), live.tolist()
        hidden = self.turn_hidden.tolist() if eng.capture_hidden and self.turn_hidden is not None else [None] * B
        stops = set(eng.stop_ids.tolist())
        out = []
        for s in slots:
            ids = tokens[s][: lengths[s]]
            if last_live[s]:
                self.pending[s] = [ids[-1]]
            finish = "length"
            if ids and ids[-1] in stops:
                finish = "eos" if ids[-1] == eng.eos_id else "stop"
            out.append(Generation(ids, logps[s][: lengths[s]], finish, hidden[s]))
        return out

    def start(self, rows: Sequence[int]) -> None:
        """Ask for the next action of `rows`; `collect()` decodes them (in one batch)."""
        self.started += list(rows)

    def collect(self) -> list[tuple[int, Generation]]:
        """The actions of every started row, decoded together."""
        rows, self.started = self.started, []
        return list(zip(rows, self.generate(rows=rows)))

    def extend(self, chunks: Sequence[Sequence[int]], rows: Sequence[int] | None = None) -> None:
        slots = self._slots(rows)
        if len(chunks) != len(slots):
            raise ValueError(f"extend() got {len(chunks)} chunks for {len(slots)} rows")
        for s, chunk in zip(slots, chunks):
            self.pending[s] = self.pending[s] + list(chunk)

    def add(self, rows: Sequence[int], prompts: Sequence[Sequence[int]]) -> None:
        """New rows join the batch: into free slots (their cache stays, masked out), else new ones."""
        if len(rows) != len(prompts):
            raise ValueError(f"add() got {len(prompts)} prompts for {len(rows)} rows")
        taken = set(self.rows) & set(rows)
        if taken:
            raise ValueError(f"rows {sorted(taken)} are already in this session")
        free = [s for s, r in enumerate(self.slot_rows) if r is None]
        new = len(rows) - len(free)
        if new > 0:
            self._grow(new)
            free += list(range(len(self.slot_rows) - new, len(self.slot_rows)))
        for s, row, prompt in zip(free, rows, prompts):
            if not prompt:
                raise ValueError(f"row {row}: an empty prompt")
            self.slot_rows[s], self.pending[s], self.fresh[s] = row, list(prompt), True
            self.drawn[s] = 0

    def _grow(self, n: int) -> None:
        self.mask, self.mask_buf = torch.cat([self.mask, self.mask.new_zeros(n, self.cache_len)]), None
        self.pos = torch.cat([self.pos, self.pos.new_zeros(n)])
        self.drawn = torch.cat([self.drawn, self.drawn.new_zeros(n)])
        for layer in self._layers():
            layer.keys = torch.cat([layer.keys, layer.keys.new_zeros(n, *layer.keys.shape[1:])])
            layer.values = torch.cat([layer.values, layer.values.new_zeros(n, *layer.values.shape[1:])])
            if isinstance(layer, _RollingLayer):
                layer.key_buf = layer.value_buf = None
        self.slot_rows += [None] * n
        self.pending += [[] for _ in range(n)]
        self.fresh += [True] * n
        self.holes = self.holes or self.cache_len > 0
        self.turn_hidden = None

    def drop(self, rows: Sequence[int]) -> None:
        """These rows leave the batch; their slots are free for `add` (the cache is not touched)."""
        for s in self._slots(rows):
            self.slot_rows[s], self.pending[s] = None, []

    def keep(self, positions: Sequence[int]) -> None:
        """Keep only these positions of `rows` (drop finished episodes); slices the KV cache."""
        live = self._slots(None)
        if len(positions) == len(self.slot_rows):
            return
        slots = [live[p] for p in positions]
        idx = torch.tensor(slots, dtype=torch.long, device=self.engine.device)
        if len(slots) and self.cache.get_seq_length() > 0:
            self.cache.batch_select_indices(idx)
        self.mask, self.mask_buf = self.mask[idx], None
        self.pos = self.pos[idx]
        self.drawn = self.drawn[idx]
        self.slot_rows = [self.slot_rows[s] for s in slots]
        self.pending = [self.pending[s] for s in slots]
        self.fresh = [self.fresh[s] for s in slots]
        self.turn_hidden = None


def for_policy(policy: Any, sampling: SamplingConfig, seed: int, capture_hidden: bool = False) -> TorchEngine:
    """The registry's builder (agentrl.engines.ENGINES["torch"]): generate from the policy's own model."""
    chat = policy.chat
    return TorchEngine(policy.model, sampling, chat.stop_ids, chat.eos_id, chat.pad_id, seed=seed,
                       capture_hidden=capture_hidden)
