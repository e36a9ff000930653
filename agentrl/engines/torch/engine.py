"""The torch engine and its session: generate with a transformers causal LM, each row's KV cache kept across turns.

`TorchEngine` decides once, from its model and device, which fast paths a forward takes (`EngineTuning` for the
cost model); `TorchSession` holds a batch of rows in the slots of one cache and decodes whole actions for the rows
asked for. See the package's docstring for how the cache is laid out.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from transformers import DynamicCache

from agentrl.config import SamplingConfig
from agentrl.engines.base import Generation
from agentrl.engines.torch.cache import _fit, _gather_positions, _Group, _RollingCache, _RollingLayer, _WindowLayer
from agentrl.engines.torch.cpu.attention import _GQA_MODELS, _GQA_SDPA, _plain_sdpa
from agentrl.engines.torch.cpu.layers import _decoder, _inline_layers
from agentrl.engines.torch.cpu.malloc import keep_freed_memory
from agentrl.engines.torch.forward import _feed_heads, _group_forward
from agentrl.engines.torch.planning import _partition
from agentrl.engines.torch.prefill import _share_prefill
from agentrl.engines.torch.sampling import row_uniforms, sample_tokens
from agentrl.engines.torch.tuning import EngineTuning


class TorchEngine:
    """Generate with a transformers causal LM, keeping each row's KV cache across turns."""

    def __init__(self, model: torch.nn.Module, sampling: SamplingConfig, stop_ids: Sequence[int], eos_id: int,
                 pad_id: int, seed: int | None = None, capture_hidden: bool = False, dtype: str = "auto",
                 tuning: EngineTuning | None = None):
        """`dtype` bf16: sample from a bf16 copy of `model` (refresh it with `sync_weights` after every update)
        while the trainer keeps its own precision: the gap vLLM in bf16 has against an fp32 learner, on any
        device. auto / fp32: generate from `model` itself, the trainer's weights as they are. `tuning`: the cost
        model (default: the preset for the model's device, `EngineTuning.for_device`)."""
        # the engine holds its own weights (the trainer syncs them after every update, as vLLM's)
        self.owns_weights = dtype == "bf16"
        self.model = copy.deepcopy(model).to(torch.bfloat16).eval() if self.owns_weights else model
        # Turn critics read the hidden state at the last context token of each turn; it falls out
        # of the forward that produces the turn's first logits, so capturing it costs no pass.
        self.capture_hidden = capture_hidden
        self.sampling = sampling
        self.stop_ids = torch.tensor(sorted(set(stop_ids)), dtype=torch.long)
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        self.tuning = EngineTuning.for_device(self.device) if tuning is None else tuning
        cpu = self.device.type == "cpu"
        if cpu:  # the cache lives in host memory: reuse freed blocks, do not fault them in anew
            keep_freed_memory()
        # Where a forward needs a mask (holes in the cache, a chunk after cached positions), the engine builds the 4D
        # one itself, additive (0 / -inf) in the model's dtype, once per forward: transformers would expand the 2D
        # mask to a boolean one and SDPA convert it back in every layer. The same numbers reach the same kernel.
        # Only on CPU, and only where every layer is plain causal SDPA (a sliding-window layer needs the model's own
        # mask); None: pass the 2D mask.
        self.mask_dtype = next(self.model.parameters()).dtype if cpu and _plain_sdpa(self.model.config) else None
        # Under that mask, SDPA reads each grouped key and value head in place (enable_gqa, bit for bit the same)
        # rather than after transformers' repeat_kv has copied the cache once per query head. Accelerators keep
        # transformers' path, whose kernels do not all take a mask with grouped heads.
        self.gqa_attention = (_GQA_SDPA if self.mask_dtype is not None
                              and getattr(self.model.config, "model_type", None) in _GQA_MODELS else None)
        # transformers 5 renamed `past_key_values` to `cache`
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model passes kwargs on
        params = inspect.signature(base.forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        # only the last position's logits are sampled from: skip the LM head on the rest of a chunk
        self.last_logits = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        # Under the engine's attention an observation chunk with padding does not pay for its pads: it runs packed
        # and its attention in levels (`packing._Chunk`). This supersedes feeding the longest chunks' heads alone
        # (`forward._feed_heads`), a forward per row, which remains for models off the engine's attention.
        self.skip_chunk_padding = self.gqa_attention is not None
        # ... and the forward calls the decoder's layers in turn (`_run_layers`) rather than the model,
        self.decoder = _decoder(self.model) if self.gqa_attention is not None else None
        # ... running each layer's ops itself (`_layer`) for the llama family's own layers
        self.inline_layers = self.decoder is not None and _inline_layers(self.decoder)
        # Each row samples from a stream of its own: a counter-based generator keyed by the session
        # and the caller's row index, so a row's tokens do not depend on which rows share its batch
        # (rows join and leave at times set by their tools' latency).
        self.generator = None
        if seed is not None:
            self.generator = torch.Generator().manual_seed(seed)
        self.sessions = 0
        # Rows that start with the same prompt (a GRPO group's G samples) are prefilled once and their keys and
        # values copied to each row (`prefill._share_prefill`): the run's switch (rollout.share_prefill), not tuning.
        self.share_prefill = True

    def tune(self, **changes: Any) -> None:
        """Change some of the cost model's values (`EngineTuning`'s fields), e.g. to pull one lever in a test."""
        self.tuning = replace(self.tuning, **changes)

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy the learner's current weights into the engine's own bf16 copy (dtype bf16 only)."""
        if not self.owns_weights:
            raise ValueError("this engine generates from the trainer's own weights: nothing to sync")
        with torch.no_grad():
            self.model.load_state_dict(model.state_dict())  # copy_ casts each tensor to the copy's bf16

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

    Rows need not move together: `generate(rows)` decodes only the rows named (the others stay as
    they are), so a row whose observation has arrived need not wait for the rest; `drop(rows)` frees
    a finished row's slot without touching the cache, and `add(rows, prompts)` puts new rows into
    free slots (continuous batching): the new row's old slot contents are masked out and its prompt
    is prefilled by its first `generate`. Positions come from each row's own count of real tokens,
    never from the cache index, so moving keys changes nothing.

    Rows of very different lengths (a refilled batch holds fresh episodes beside old ones) would make
    every forward attend over the longest row's width. So each turn is planned (`_plan`): the slots
    are cut into contiguous runs, each decoded over a window of the cache that starts at its own
    earliest real position (`_WindowLayer`: views, no copies), where the saved attention outweighs
    the cost of another forward; the cut is chosen exactly (a partition over the slot order) from a
    cost model of a turn, `split_cost` + rows * (`row_cost` + width) (`EngineTuning`, `planning._partition`).
    When sorting the rows by length
    and squeezing out the holes (`_compact`: one gather of the cache) would save more than it costs,
    the slots are first reordered that way, longest first, freed slots last.

    Holes also fill up as the rows go: a turn's observations, left-padded to the longest, leave holes in the
    shorter rows, and the next packed chunk writes each row's tokens into its own holes first (`_fill_plan`), so
    that the cache widens only by what the row needing most room lacks. Attention does not care where a key sits:
    the keys carry their positions, the mask says which a query sees.
    """

    turn_level = True  # generate() decodes whole actions: rows join and leave between calls

    def __init__(self, engine: TorchEngine, prompts: list[list[int]], key: int = 0):
        self.engine = engine
        dev = engine.device
        self.key = key
        self.slot_rows: list[int | None] = list(range(len(prompts)))  # the caller's row in each slot (None: free)
        self.order: list[int] = list(range(len(prompts)))  # the caller's rows in the order `rows` lists them
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
        self.tokens_packed_out = 0  # ... of them padding that skipped the layers' matmuls (a packed chunk, _Chunk)
        self.chunks_in_levels = 0  # chunks whose attention ran in more than one level (_chunk_levels)
        self.chunks_filled = 0  # chunks written into their rows' holes (_fill_plan)
        self.forwards = 0  # model forwards run (prefills of shared prompts not counted)
        # cache positions the forwards attended over (rows x width, summed over forwards), and of them masked holes
        self.positions_attended = 0
        self.positions_padding = 0
        # query-key pairs the attention computed (rows x chunk x cache width) and of them the real ones (a real query
        # and a real key it may see), for chunks (more than one query) and decode steps apart: the share of the
        # attention's time that padding costs, which bounds what removing it can gain (benchmarks/multi_turn.py)
        self.attention_pairs: dict[str, list[int]] = {"chunk": [0, 0], "decode": [0, 0]}
        self.groups_run = 0  # turns' forwards run on a window of the cache (a run of slots), for tests and benchmarks
        self.compactions = 0
        self.heads_fed = 0  # long chunks whose leading tokens ran in a forward of their own (_feed_heads)
        self.prefill_tokens = 0  # prompt tokens the model ran for rows joining the batch (real, not padding)
        self.prefill_saved = 0  # ... and those it did not run because another row's prompt shared them
        self.turn_hidden: torch.Tensor | None = None
        self.started: list[int] = []
        self._group: _Group | None = None

    @property
    def rows(self) -> list[int]:
        """The caller's index of every row in the batch (positions for `keep`): in the order they were
        added, whatever slots they occupy."""
        return list(self.order)

    @property
    def cache_len(self) -> int:
        return self.mask.shape[1]

    def _slots(self, rows: Sequence[int] | None) -> list[int]:
        where = {r: s for s, r in enumerate(self.slot_rows) if r is not None}
        if rows is None:
            return [where[r] for r in self.order]
        missing = [r for r in rows if r not in where]
        if missing:
            raise KeyError(f"rows {missing} are not in this session")
        return [where[r] for r in rows]

    def _forward(self, ids: torch.Tensor, chunk_mask: torch.Tensor, hidden: bool = False,
                 fill: bool = False) -> torch.Tensor:
        """The logits (b, V) at the last token each row of the current group feeds (`forward._group_forward`)."""
        return _group_forward(self, ids, chunk_mask, hidden, fill)

    def _layers(self) -> list[Any]:
        return [layer for layer in getattr(self.cache, "layers", []) if layer.get_seq_length() > 0]

    def _compact(self, order: Sequence[int] | None = None) -> None:
        """Drop the masked holes: each row's real positions, in order, right-aligned in a cache as
        long as the longest row's (one gather of every layer). With `order`, slot i afterwards holds
        what slot order[i] held. A free slot keeps nothing."""
        B = len(self.slot_rows)
        perm = list(range(B)) if order is None else list(order)
        idx_rows = torch.tensor(perm, dtype=torch.long, device=self.engine.device)
        live = torch.tensor([self.slot_rows[s] is not None for s in perm], device=self.engine.device)
        real = self.mask.bool()[idx_rows] & live[:, None]  # (B, L)
        width = int(real.sum(1).max()) if real.numel() else 0
        # a stable sort puts each row's holes first and its real positions after, in their order
        idx = torch.argsort(real.int(), dim=1, stable=True)[:, real.shape[1] - width :]  # (B, W)
        self.mask, self.mask_buf = real.gather(1, idx).long(), None
        # the gather also fills the room of the turns ahead (copies of a row's first key, finite and never attended
        # to before a forward overwrites them), so that the next chunk does not copy the compacted cache again
        room = self._room_ahead(width) if width else 0
        idx_room = torch.cat([idx, idx[:, :1].expand(-1, room)], 1) if room else idx  # (B, W + room)
        for layer in self._layers():
            keys, values = (_gather_positions(t, idx_rows, idx_room) for t in (layer.keys, layer.values))
            layer.keys, layer.values = keys.narrow(2, 0, width), values.narrow(2, 0, width)
            if isinstance(layer, _RollingLayer):
                layer.key_buf, layer.value_buf = keys, values
        if order is not None:
            self.pos, self.drawn = self.pos[idx_rows], self.drawn[idx_rows]
            self.slot_rows = [self.slot_rows[s] for s in perm]
            self.pending = [self.pending[s] for s in perm]
            self.fresh = [self.fresh[s] for s in perm]
        self.turn_hidden = None
        self.compactions += 1

    def _room_ahead(self, length: int) -> int:
        """Positions to reserve past a cache of `length`: the next chunk, the longest action, and a quarter more."""
        widest = max((len(p) for p in self.pending), default=0)
        return widest + self.engine.sampling.max_new_tokens + (length + widest) // 4

    def _plan(self, slots: list[int]) -> list[tuple[int, int, int]]:
        """The runs of slots this turn's forwards go over, as (lo, hi, start): see the class doc."""
        B, length = len(self.slot_rows), self.cache_len
        layers = getattr(self.cache, "layers", [])
        tuning = self.engine.tuning
        windows = (tuning.length_buckets and length > 0 and isinstance(self.cache, _RollingCache) and layers
                   and all(isinstance(layer, _RollingLayer) and layer.get_seq_length() == length for layer in layers))
        if not windows:
            if self.holes and length > 64 and 2 * int(self.mask.sum(1).max()) < length:
                self._compact()
            return [(0, B, 0)]
        real = self.mask.bool()
        counts = real.sum(1).tolist()
        firsts = torch.where(real.any(1), real.int().argmax(1), length).tolist()
        active = set(slots)
        now, runs = _partition([firsts[s] if s in active else None for s in range(B)], length, tuning.split_cost,
                               tuning.row_cost)
        # the same turn after sorting the live rows by length and squeezing out every hole
        live = [s for s in range(B) if self.slot_rows[s] is not None]
        live.sort(key=lambda s: -counts[s])  # stable: ties keep their slot order
        order = live + [s for s in range(B) if self.slot_rows[s] is None]
        width = max((counts[s] for s in live), default=0)
        sorted_starts = [width - counts[s] if s in active else None for s in order]
        after, sorted_runs = _partition(sorted_starts, width, tuning.split_cost, tuning.row_cost)
        if width > 0 and now - after > tuning.compact_cost * B * length:
            self._compact(order)
            runs = sorted_runs
        return runs

    def _prepare(self, slots: list[int]) -> list[int]:
        """Check every slot has something to feed and clear the reused ones; returns the slots joining the batch."""
        joining = []
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
                joining.append(s)
        return joining

    def _open(self, lo: int, hi: int, start: int, window: bool) -> _Group:
        if not window:
            return _Group(0, len(self.slot_rows), 0, self.cache, self.mask, self.mask_buf, self.holes, False)
        length = self.cache_len
        win = DynamicCache()
        win.layers = [_WindowLayer(layer.key_buf[lo:hi, :, start:], layer.value_buf[lo:hi, :, start:], length - start)
                      for layer in self.cache.layers]
        mask_buf = self.mask_buf[lo:hi, start:]
        return _Group(lo, hi, start, win, mask_buf[:, : length - start], mask_buf, True, True)

    @torch.inference_mode()
    def generate(self, forced: Sequence[Sequence[int]] | None = None,
                 rows: Sequence[int] | None = None) -> list[Generation]:
        """One action for each of `rows` (default: every row), in that order; the other rows stay as
        they are. `forced` (one token list per row) replaces sampling by those tokens (teacher
        forcing: same forwards, same log-probs; for replaying episodes and benchmarks)."""
        cfg = self.engine.sampling
        wanted = list(self.order if rows is None else rows)
        slots = self._slots(wanted)
        if not slots:
            return []
        if forced is not None:
            forced = list(forced)
            if len(forced) != len(wanted):
                raise ValueError(f"generate() got {len(forced)} forced actions for {len(wanted)} rows")
        joining = self._prepare(slots)
        _share_prefill(self, joining, slots)
        runs = self._plan(slots)
        slots = self._slots(wanted)  # the plan may have moved rows to other slots
        B, length = len(self.slot_rows), self.cache_len
        if len(runs) == 1 and runs[0][:2] == (0, B) and 4 * runs[0][2] < length:
            # one run over every slot that would skip under a quarter of the cache: the window's per-step
            # bookkeeping costs more than the skipped columns save (benchmarks/kv_cache.py's rows of equal length)
            runs = [(0, B, 0)]
        window = runs != [(0, B, 0)]
        if window:  # room for every run's chunk and longest action, before any run writes into it
            widest = max(len(self.pending[s]) for s in slots)
            need = length + widest + cfg.max_new_tokens
            for layer in self.cache.layers:
                layer.keys, layer.key_buf = _fit(layer.keys, layer.key_buf, need, dim=-2)
                layer.values, layer.value_buf = _fit(layer.values, layer.value_buf, need, dim=-2)
            self.mask, self.mask_buf = _fit(self.mask, self.mask_buf, need, dim=1)
        by_slot = dict(zip(slots, forced)) if forced is not None else None
        out: dict[int, Generation] = {}
        span = 0
        for lo, hi, start in runs:
            self._group = g = self._open(lo, hi, start, window)
            self._turn(g, set(slots), by_slot, out)
            span = max(span, g.mask.shape[1] - (length - g.start))
            if not window:
                self.mask, self.mask_buf, self.holes = g.mask, g.mask_buf, g.holes
        self._group = None
        if window:
            self.mask = self.mask_buf.narrow(1, 0, length + span)
            for layer in self.cache.layers:
                layer.keys = layer.key_buf.narrow(-2, 0, length + span)
                layer.values = layer.value_buf.narrow(-2, 0, length + span)
            self.holes = True
            self.groups_run += len(runs)
        return [out[s] for s in slots]

    def _turn(self, g: _Group, wanted: set[int], forced: dict[int, Sequence[int]] | None,
              out: dict[int, Generation]) -> None:
        """Decode one action for each wanted slot in g.lo:g.hi; the group's other slots feed masked pads."""
        eng, cfg = self.engine, self.engine.sampling
        b, dev, length = g.hi - g.lo, eng.device, self.cache_len
        slots = [s for s in range(g.lo, g.hi) if s in wanted]
        local = [s - g.lo for s in slots]
        active = torch.zeros(b, dtype=torch.bool, device=dev)
        active[local] = True
        width = max(len(self.pending[s]) for s in slots)
        tail = _feed_heads(self, g, slots, width)  # the chunk's last `tail` columns; the rest fed already
        ids = torch.full((b, tail), eng.pad_id, dtype=torch.long, device=dev)  # (b, C)
        m = torch.zeros_like(ids)
        for s in slots:  # left-pad: the last column is every row's newest token
            chunk = self.pending[s]
            ids[s - g.lo, tail - len(chunk) :] = torch.tensor(chunk, dtype=torch.long)
            m[s - g.lo, tail - len(chunk) :] = 1
            self.pending[s] = []
        # A row not decoded may see no real position in its window (a free or fresh slot, or one whose
        # positions begin before the window): it would attend to nothing (NaN, which its masked positions
        # would then hold). Its pad sees itself during the turn; that position is masked again after it.
        idle = ~active
        m[idle, -1] = 1
        before = self.pos[g.lo : g.hi].clone()
        # room for this chunk and the longest action: no growth while decoding this turn; a quarter more, so that
        # the next turns grow into it instead of copying the whole cache at every turn's chunk
        need = length + width + cfg.max_new_tokens
        self.room = need + need // 4
        if isinstance(self.cache, _RollingCache):
            self.cache.room = self.room
        logits = self._forward(ids, m, hidden=eng.capture_hidden, fill=len(slots) == b)
        hidden = self.turn_hidden.tolist() if eng.capture_hidden and self.turn_hidden is not None else [None] * b
        if forced is not None:
            forced_t = torch.full((b, cfg.max_new_tokens), eng.pad_id, dtype=torch.long, device=dev)
            for s in slots:
                f = forced[s]
                forced_t[s - g.lo, : len(f)] = torch.tensor(f[: cfg.max_new_tokens], dtype=torch.long)
        tokens = torch.full((b, cfg.max_new_tokens), eng.pad_id, dtype=torch.long, device=dev)  # (b, N)
        logps = torch.zeros(b, cfg.max_new_tokens, device=dev)  # (b, N)
        done = idle.clone()  # rows not asked for feed masked pads throughout
        count = torch.zeros(b, dtype=torch.long, device=dev)
        stop_ids = eng.stop_ids.to(dev)
        stream = torch.tensor([self.key + (-1 if r is None else r) * 1_000_003 for r in self.slot_rows[g.lo : g.hi]],
                              dtype=torch.long, device=dev)  # (b,)
        drawn = self.drawn[g.lo : g.hi]  # a view: updated in place
        # a row draws at every step until it stops, so its t-th draw of the turn is number drawn + t: the turn's
        # uniforms in one go (b, N) rather than a splitmix of ~30 small ops per step
        uniforms = None
        if forced is None and cfg.temperature > 0:
            steps = torch.arange(cfg.max_new_tokens, device=dev)
            uniforms = row_uniforms(stream[:, None], drawn[:, None] + steps)  # (b, N)
        n = 0
        for t in range(cfg.max_new_tokens):
            if forced is None:
                tok, lp = sample_tokens(logits, cfg, uniforms=None if uniforms is None else uniforms[:, t])
            else:
                tok = forced_t[:, t]
                lp = torch.log_softmax(logits.float() / (cfg.temperature or 1.0), -1).gather(
                    -1, tok[:, None]).squeeze(-1)
            live = ~done  # rows that produce a real token at this step
            tokens[:, t] = torch.where(live, tok, eng.pad_id)
            logps[:, t] = torch.where(live, lp, 0.0)
            count += live.long()
            done = done | (live & torch.isin(tok, stop_ids))
            n = t + 1
            if bool(done.all()) or n == cfg.max_new_tokens:
                break
            logits = self._forward(tokens[:, t : t + 1], live.long()[:, None])
        drawn += count  # one draw per token produced
        # the idle rows' pads: masked again, and not counted as positions
        self.pos[g.lo : g.hi] = torch.where(active, self.pos[g.lo : g.hi], before)
        if bool(idle.any()):
            g.mask[idle, length - g.start + width - 1] = 0
            g.holes = True
        # the last token each row produced at the final step is not in the cache yet: it goes
        # first in the row's next chunk, saving a forward pass now.
        tokens, logps = tokens[:, :n].tolist(), logps[:, :n].tolist()
        lengths, last_live = count.tolist(), live.tolist()
        stops = set(eng.stop_ids.tolist())
        for s, i in zip(slots, local):
            ids_i = tokens[i][: lengths[i]]
            if last_live[i]:
                self.pending[s] = [ids_i[-1]]
            finish = "length"
            if ids_i and ids_i[-1] in stops:
                finish = "eos" if ids_i[-1] == eng.eos_id else "stop"
            out[s] = Generation(ids_i, logps[i][: lengths[i]], finish, hidden[i])

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

    @torch.inference_mode()  # the session's tensors are made in inference mode (generate)
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
        self.order += list(rows)

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
        gone = set(rows)
        self.order = [r for r in self.order if r not in gone]

    @torch.inference_mode()  # the session's tensors are made in inference mode (generate)
    def keep(self, positions: Sequence[int]) -> None:
        """Keep only these positions of `rows` (drop finished episodes); slices the KV cache."""
        chosen = [self.order[p] for p in positions]
        if len(chosen) == len(self.slot_rows):  # every slot stays: nothing to slice
            self.order = chosen
            return
        slots = self._slots(chosen)
        idx = torch.tensor(slots, dtype=torch.long, device=self.engine.device)
        if len(slots) and self.cache.get_seq_length() > 0:
            self.cache.batch_select_indices(idx)
        self.mask, self.mask_buf = self.mask[idx], None
        self.pos = self.pos[idx]
        self.drawn = self.drawn[idx]
        self.slot_rows = [self.slot_rows[s] for s in slots]
        self.pending = [self.pending[s] for s in slots]
        self.fresh = [self.fresh[s] for s in slots]
        self.order = chosen
        self.turn_hidden = None


def for_policy(policy: Any, sampling: SamplingConfig, seed: int, capture_hidden: bool = False,
               dtype: str = "auto") -> TorchEngine:
    """The registry's builder (agentrl.engines.ENGINES["torch"]): generate from the policy's own model (or,
    `dtype` bf16, from a bf16 copy of it)."""
    chat = policy.chat
    return TorchEngine(policy.model, sampling, chat.stop_ids, chat.eos_id, chat.pad_id, seed=seed,
                       capture_hidden=capture_hidden, dtype=dtype)
