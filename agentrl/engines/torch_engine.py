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

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agentrl.engines.base import Generation, SamplingConfig


def sample_tokens(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return it and its log-prob under the temperature-scaled policy.

    The log-prob is taken before top-k/top-p truncation (as vLLM reports it), so that it matches
    what the learner recomputes from the same logits.
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
    tok = torch.multinomial(masked.softmax(-1), 1, generator=generator).squeeze(-1)  # (B,)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def _append(view: torch.Tensor, buf: torch.Tensor | None, new: torch.Tensor, room: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
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

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if self.get_seq_length() == 0:  # the first write sets the layer up as the parent does (its API varies by version)
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

    def __init__(self, model: torch.nn.Module, sampling: SamplingConfig, stop_ids: Sequence[int], eos_id: int, pad_id: int,
                 seed: int | None = None, capture_hidden: bool = False):
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
        self.generator = None
        if seed is not None:
            self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def open(self, prompts: Sequence[Sequence[int]]) -> TorchSession:
        return TorchSession(self, [list(p) for p in prompts])


class TorchSession:
    def __init__(self, engine: TorchEngine, prompts: list[list[int]]):
        self.engine = engine
        self.rows = list(range(len(prompts)))
        dev = engine.device
        self.cache: DynamicCache = _RollingCache()
        self.mask = torch.zeros(len(prompts), 0, dtype=torch.long, device=dev)  # (B, L) 1 = real token
        self.mask_buf: torch.Tensor | None = None  # (B, capacity): `mask` is its leading part
        self.room = 0  # cache length to reserve room for at the next growth
        self.holes = False  # is any cached position masked (padding, a stopped row's pad)?
        self.pos = torch.zeros(len(prompts), dtype=torch.long, device=dev)  # (B,) real tokens so far
        self.pending: list[list[int]] = prompts  # tokens each row has not yet fed to the model
        self.tokens_fed = 0  # padded positions run through the model (for throughput accounting)
        self.turn_hidden: torch.Tensor | None = None

    @property
    def cache_len(self) -> int:
        return self.mask.shape[1]

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

    def _feed_pending(self) -> torch.Tensor:
        width = max(len(c) for c in self.pending)
        dev = self.engine.device
        ids = torch.full((len(self.pending), width), self.engine.pad_id, dtype=torch.long, device=dev)  # (B, C)
        m = torch.zeros_like(ids)
        for i, chunk in enumerate(self.pending):  # left-pad: the last column is every row's newest token
            if chunk:
                ids[i, width - len(chunk) :] = torch.tensor(chunk, dtype=torch.long)
                m[i, width - len(chunk) :] = 1
        self.pending = [[] for _ in self.pending]
        # room for this chunk and the longest action: no growth while decoding this turn
        self.room = self.cache_len + width + self.engine.sampling.max_new_tokens
        if isinstance(self.cache, _RollingCache):
            self.cache.room = self.room
        return self._forward(ids, m, hidden=self.engine.capture_hidden)

    @torch.inference_mode()
    def generate(self, forced: Sequence[Sequence[int]] | None = None) -> list[Generation]:
        """One action per row. `forced` (one token list per row) replaces sampling by those tokens
        (teacher forcing: same forwards, same log-probs; for replaying episodes and benchmarks)."""
        eng, cfg = self.engine, self.engine.sampling
        B, dev = len(self.rows), eng.device
        logits = self._feed_pending()
        if forced is not None:
            forced_t = torch.full((B, cfg.max_new_tokens), eng.pad_id, dtype=torch.long, device=dev)
            for i, f in enumerate(forced):
                forced_t[i, : len(f)] = torch.tensor(f[: cfg.max_new_tokens], dtype=torch.long)
        tokens = torch.full((B, cfg.max_new_tokens), eng.pad_id, dtype=torch.long, device=dev)  # (B, N)
        logps = torch.zeros(B, cfg.max_new_tokens, device=dev)  # (B, N)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        length = torch.zeros(B, dtype=torch.long, device=dev)
        stop_ids = eng.stop_ids.to(dev)
        n = 0
        for t in range(cfg.max_new_tokens):
            if forced is None:
                tok, lp = sample_tokens(logits, cfg, eng.generator)
            else:
                tok = forced_t[:, t]
                lp = torch.log_softmax(logits.float() / (cfg.temperature or 1.0), -1).gather(-1, tok[:, None]).squeeze(-1)
            live = ~done  # rows that produce a real token at this step
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
        for i in range(B):
            ids = tokens[i][: lengths[i]]
            if last_live[i]:
                self.pending[i] = [ids[-1]]
            finish = "length"
            if ids and ids[-1] in stops:
                finish = "eos" if ids[-1] == eng.eos_id else "stop"
            out.append(Generation(ids, logps[i][: lengths[i]], finish, hidden[i]))
        return out

    def extend(self, chunks: Sequence[Sequence[int]]) -> None:
        if len(chunks) != len(self.rows):
            raise ValueError(f"extend() got {len(chunks)} chunks for {len(self.rows)} rows")
        for i, chunk in enumerate(chunks):
            self.pending[i] = self.pending[i] + list(chunk)

    def keep(self, positions: Sequence[int]) -> None:
        """Keep only these batch positions (drop finished episodes); slices the KV cache."""
        if len(positions) == len(self.rows):
            return
        idx = torch.tensor(list(positions), dtype=torch.long, device=self.engine.device)
        if len(positions) and self.cache.get_seq_length() > 0:
            self.cache.batch_select_indices(idx)
        self.mask = self.mask[idx]
        self.pos = self.pos[idx]
        self.rows = [self.rows[p] for p in positions]
        self.pending = [self.pending[p] for p in positions]
        self.turn_hidden = None
