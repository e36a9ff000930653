"""One forward of a run of slots (a `_Group`): the chunk's mask, how its padding is skipped, the model call, and
what the session counts of it.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from agentrl.engines.torch.cache import _append, _fit, _Group, _RollingCache, _RollingLayer, _WindowLayer
from agentrl.engines.torch.cpu.attention import _attention
from agentrl.engines.torch.cpu.layers import _run_layers
from agentrl.engines.torch.packing import _CHUNK, _additive_mask, _chunk_run, _fill_mask, _fill_plan
from agentrl.engines.torch.planning import _heads_tail


def _group_forward(session: Any, ids: torch.Tensor, chunk_mask: torch.Tensor, hidden: bool = False,
             fill: bool = False) -> torch.Tensor:
    """`TorchSession._forward`: the logits (b, V) at the last token each row of the session's group feeds.
    `fill`: every row of the group feeds real tokens, so a packed chunk may write them into its rows' holes
    (`_fill_plan`)."""
    g, eng, tuning, chunk = session._group, session.engine, session.engine.tuning, ids.shape[1]
    if chunk > 1:  # each row's span: its columns from the first real one to the chunk's end (one host sync)
        *spans, real, ends_real = torch.cat([chunk - chunk_mask.argmax(1),  # argmax: the first maximum
                                             chunk_mask.sum()[None], chunk_mask[:, -1].sum()[None]]).tolist()
        full = real == ids.numel()
    else:
        full = True if g.holes else bool(chunk_mask.all())
    plan, fill_mask = None, None
    if (fill and chunk > 1 and not full and g.holes and not g.window and ends_real == len(spans) and tuning.fill_holes
            and eng.skip_chunk_padding and eng.mask_dtype is not None and eng.last_logits
            and isinstance(g.cache, _RollingCache) and g.cache.packs):
        index = chunk_mask.flatten().nonzero().squeeze(1)  # (N,)
        plan = _fill_plan(g.mask, chunk_mask, index)
        fill_mask = _fill_mask(g.mask, plan, chunk_mask, index, eng.mask_dtype)  # from the mask before the chunk
        grown = g.mask.new_zeros(g.mask.shape[0], plan.grow)
        g.mask, g.mask_buf = _append(g.mask, g.mask_buf, grown, session.room, dim=1)  # (b, W + grow)
        g.mask[plan.rows, plan.columns] = 1
        session.chunks_filled += 1
    elif g.window:  # written in place: the room was reserved (an empty window has no data pointer to check)
        n, c = g.mask.shape[1], chunk_mask.shape[1]
        if n + c > g.mask_buf.shape[1]:
            raise RuntimeError("cache window full: the turn's room was not reserved")  # a bug, not an input
        g.mask_buf.narrow(1, n, c).copy_(chunk_mask)
        g.mask = g.mask_buf.narrow(1, 0, n + c)  # (b, L - start + C)
    else:
        g.mask, g.mask_buf = _append(g.mask, g.mask_buf, chunk_mask, session.room, dim=1)  # (B, L + C)
    pos = session.pos[g.lo : g.hi]  # a view: updated in place
    pos_ids = (pos[:, None] + chunk_mask.cumsum(1) - 1).clamp(min=0)  # (b, C)
    width = g.mask.shape[1]
    # An all-ones mask is one that transformers checks (a reduction, a host sync) and then
    # drops: until the first hole, pass none; the model runs the same kernels on the same numbers.
    g.holes = g.holes or not full
    past = width > chunk  # a chunk after cached positions: transformers materializes a mask even without holes
    mask, attention = None, None
    if eng.mask_dtype is None:
        mask = g.mask if g.holes else None
    elif fill_mask is not None:
        mask, attention = fill_mask, eng.gqa_attention
    elif g.holes or (chunk > 1 and past):
        if chunk > 1:
            mask = _additive_mask(g.mask, chunk, eng.mask_dtype)
        else:
            mask = _decode_mask(g, chunk_mask, eng.mask_dtype, eng.sampling.max_new_tokens)
        attention = eng.gqa_attention  # a decode step too: repeat_kv at one query is most of SDPA's cost
    elif chunk == 1:
        attention = eng.gqa_attention  # no mask: the group's heads still fold into one read of the cache
    fed = chunk_mask.sum(1)  # (b,) real tokens each row feeds
    run, keep, model_ids, model_pos = None, eng.last_logits, ids, pos_ids
    computed = ids.shape[0] * chunk * width  # query-key pairs the attention computes
    if chunk > 1 and not full and attention is not None and eng.skip_chunk_padding:
        packs = ends_real == len(spans) and bool(eng.last_logits) and (
            g.cache.packs if isinstance(g.cache, _RollingCache)
            else all(isinstance(layer, _WindowLayer) for layer in g.cache.layers))
        run, computed = _chunk_run(chunk_mask, spans, packs, mask, tuning.level_gather_cost, tuning.level_call_cost,
                                   plan)
        if run.levels is not None and len(run.levels) > 1:
            session.chunks_in_levels += 1
        if run.index is not None:
            keep = {"logits_to_keep": fed.cumsum(0) - 1}  # (b,) each row's last token, packed
            model_ids, model_pos = ids.flatten()[run.index][None], pos_ids.flatten()[run.index][None]  # (1, N)
    packed = run is not None and run.index is not None
    token = _CHUNK.set(run)
    try:
        with _attention(eng.model, attention):
            if attention is not None and eng.decoder is not None:
                logits, last_hidden = _run_layers(eng.decoder, model_ids, mask, model_pos, g.cache,
                                                  eng.cache_kwarg, keep["logits_to_keep"] if packed else None,
                                                  eng.inline_layers)
            else:
                out = eng.model(
                    input_ids=model_ids, attention_mask=mask, position_ids=model_pos, use_cache=True,
                    output_hidden_states=hidden, **{eng.cache_kwarg: g.cache}, **keep,
                )
                logits = out.logits[0] if packed else out.logits[:, -1]  # (b, V): each row's last token
                last_hidden = (out.hidden_states[-1][0, keep["logits_to_keep"]] if packed
                               else out.hidden_states[-1][:, -1]) if hidden else None
    finally:
        _CHUNK.reset(token)
    pos += fed
    session.tokens_fed += ids.numel()
    session.forwards += 1
    real = g.mask.sum(1)  # (b,) real positions, the chunk's included
    before = (real - fed)[:, None]  # (b, 1) ... before the chunk
    # one host sync for both counts: real positions, and query-key pairs a real query may see
    kept, seen = torch.stack([real.sum(), (chunk_mask * (before + chunk_mask.cumsum(1))).sum()]).tolist()
    session.positions_attended += ids.shape[0] * width
    session.positions_padding += ids.shape[0] * width - kept
    pairs = session.attention_pairs["chunk" if chunk > 1 else "decode"]
    pairs[0] += computed
    pairs[1] += seen
    if packed:
        session.tokens_packed_out += ids.numel() - len(run.index)
    if hidden:  # the state at the last context token, which a turn critic reads
        session.turn_hidden = last_hidden.float()  # (b, H)
    return logits  # (b, V)


def _decode_mask(g: _Group, column: torch.Tensor, dtype: torch.dtype, steps: int) -> torch.Tensor:
    """The additive mask (b, 1, 1, L) of a decode step whose fed column (b, 1) the group's mask now ends with:
    the previous step's, with that column appended into room reserved for the turn's `steps`, rather than built
    afresh from the (b, L) mask at every step."""
    b, width = g.mask.shape
    if g.additive is None or g.additive.shape[-1] != width - 1 or g.additive.dtype != dtype:
        # the turn's first step: as `_additive_mask` makes it, in a buffer with room for the turn's other steps
        buf = g.mask.new_empty(b, 1, 1, width + steps, dtype=dtype)
        g.additive, g.additive_buf = buf.narrow(-1, 0, width).copy_(_additive_mask(g.mask, 1, dtype)), buf
        return g.additive
    new = torch.zeros(b, 1, 1, 1, dtype=dtype, device=column.device)
    new.masked_fill_(column[:, None, None] == 0, float("-inf"))  # (b, 1, 1, 1)
    g.additive, g.additive_buf = _append(g.additive, g.additive_buf, new, 0, dim=-1)
    return g.additive


def _feed_heads(session: Any, g: _Group, slots: list[int], width: int) -> int:
    """Feed the leading tokens of the turn's longest chunks first, each row alone, when that is cheaper than
    padding every row's chunk to the longest; returns the width the batch's chunk keeps (`width`: none fed).

    A chunk forward costs about rows x chunk width x cache width (every query attends over the whole cache),
    so one long observation (an error message, a tool's long output) makes every row pay for its length. Its
    head runs instead in a forward of its own, over its row's window of the cache, right-aligned against the
    batch's chunk, which then keeps `tail` columns: the cache gains the same `width` positions either way, the
    head rows' first ones holes like any padding. How many run alone: `planning._heads_tail`."""
    eng = session.engine
    length = session.cache_len
    layers = getattr(session.cache, "layers", [])
    if (g.window or eng.skip_chunk_padding or not length or not layers or not isinstance(session.cache, _RollingCache)
            or not all(isinstance(layer, _RollingLayer) and layer.get_seq_length() == length for layer in layers)):
        return width
    tail = _heads_tail([len(session.pending[s]) for s in slots], g.hi - g.lo, width, length, eng.tuning.head_cost)
    if tail == width:
        return width
    gap = width - tail
    need = length + width + eng.sampling.max_new_tokens  # the turn's room, zero past the cache
    for layer in layers:
        layer.keys, layer.key_buf = _fit(layer.keys, layer.key_buf, need, dim=-2)
        layer.values, layer.value_buf = _fit(layer.values, layer.value_buf, need, dim=-2)
    session.mask, session.mask_buf = _fit(session.mask, session.mask_buf, need, dim=1)
    for s in slots:
        head = session.pending[s][:-tail]
        if not head:
            continue
        start = length + gap - len(head)  # the head ends where the batch's chunk begins
        win = DynamicCache()
        win.layers = [_WindowLayer(layer.key_buf[s : s + 1], layer.value_buf[s : s + 1], start) for layer in layers]
        mask_buf = session.mask_buf[s : s + 1]
        session._group = _Group(s, s + 1, 0, win, mask_buf[:, :start], mask_buf, True, True)
        ids = torch.tensor([head], dtype=torch.long, device=eng.device)  # (1, h)
        session._forward(ids, torch.ones_like(ids))
        session.pending[s] = session.pending[s][-tail:]
        session.heads_fed += 1
    session._group = g
    for layer in layers:
        layer.keys = layer.key_buf.narrow(-2, 0, length + gap)
        layer.values = layer.value_buf.narrow(-2, 0, length + gap)
    g.mask = session.mask = session.mask_buf.narrow(1, 0, length + gap)
    g.mask_buf, g.holes = session.mask_buf, True
    return tail

