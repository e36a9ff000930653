"""A llama-family decoder run layer by layer in the engine rather than through the model's forward.

`_run_layers` calls the embedding, the rotary tables, each decoder layer, the final norm and the LM head in turn,
without the model-level wrappers; `_layer` runs a decoder layer's own ops (`_LAYERS`: llama, qwen2, qwen3) without
its module calls. The same ops on the same numbers: tests/engines/test_engine_padding.py holds the logits, the
cache and the hidden states equal bit for bit to the model's own forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from agentrl.engines.torch.cpu.attention import _GQA_MODELS, _gqa_sdpa


def _decoder(model: torch.nn.Module) -> torch.nn.Module | None:
    """The causal LM whose decoder layers the engine may call in turn (`_run_layers`): a llama-family model laid out
    as transformers lays it out (embedding, rotary tables, layers, final norm, LM head); None: call the model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft: its layers carry the adapters
    inner = getattr(base, "model", None)
    if getattr(base.config, "model_type", None) not in _GQA_MODELS or inner is None or not hasattr(base, "lm_head"):
        return None
    if not all(hasattr(inner, name) for name in ("embed_tokens", "rotary_emb", "layers", "norm")):
        return None
    return base


# the decoder layers `_layer` runs: pre-norm attention and a SwiGLU MLP, RMSNorm, rotary positions (qwen3: each head's
# query and key normed first)
_LAYERS = {"LlamaDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer"}
_NORMS = {"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"}


def _hub_kernels(model: torch.nn.Module) -> bool:
    """Has the `kernels` library swapped a hub kernel in for any of the model's layers or functions?

    transformers kernelizes every model it loads while `kernels` is installed (its dependency), so `use_kernels` is
    True for any model from disk; on a device without a mapped kernel, or offline, kernelize keeps each module's own
    forward. `kernels`' own inspector lists only what a kernel did replace, so it is asked rather than the flag,
    which would keep every model loaded from disk off `_layer` (docs/benchmarks.md, "Many turns")."""
    try:
        import kernels
    except ImportError:  # nothing can have been swapped in
        return False
    inspector = getattr(kernels, "get_kernelized_layers", None)
    if inspector is None:  # a kernels too old to say: trust the flag, as before
        return bool(getattr(model, "use_kernels", False))
    found = inspector(model)
    return bool(found.layers or found.funcs)


def _inline_layers(base: torch.nn.Module) -> bool:
    """Can `_layer` run each of the decoder's layers in its place: every layer, norm and activation the kind it
    computes, and no hub kernels swapped in for the model's own forwards?"""
    if getattr(base.config, "hidden_act", None) != "silu" or _hub_kernels(base):
        return False
    for layer in base.model.layers:
        attn = layer.self_attn
        norms = [layer.input_layernorm, layer.post_attention_layernorm] + [
            getattr(attn, n) for n in ("q_norm", "k_norm") if hasattr(attn, n)]
        if (type(layer).__name__ not in _LAYERS or any(type(n).__name__ not in _NORMS for n in norms)
                or hasattr(attn, "q_norm") != (type(layer).__name__ == "Qwen3DecoderLayer")):
            return False
    return True


def _norm(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The llama family's RMSNorm, op for op: normalized in fp32, scaled in the input's dtype. In fp32 throughout,
    torch's own `rms_norm` computes the same numbers in one call where the module runs six ops (checked bit for bit
    by `test_layers_called_in_turn_match_the_model_bit_for_bit`); a bf16 model rounds between the two scalings, which
    `rms_norm` would not."""
    if x.dtype == torch.float32 and module.weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), module.weight, module.variance_epsilon)
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + module.variance_epsilon)
    return module.weight * h.to(x.dtype)


def _linear(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A projection: a plain `nn.Linear` by its weights, anything else (a peft LoRA layer) by calling it."""
    return F.linear(x, module.weight, module.bias) if type(module) is torch.nn.Linear else module(x)


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """The rotary sine with its first half negated, for `_rotate` (once per forward, for every layer)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), -1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions as transformers applies them, x * cos + rotate_half(x) * sin, with rotate_half's negation
    moved onto the sine (`_signed_sin`): (-a) * b and a * (-b) are the same float, and a roll of the halves is one op
    where rotate_half is four."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin


def _layer(layer: torch.nn.Module, hidden: torch.Tensor, mask: torch.Tensor | None, cos: torch.Tensor,
           signed_sin: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
    """One llama-family decoder layer (`_LAYERS`) under the engine's attention: the ops its modules run, in their
    order, called here rather than through its ten module calls, rotary and kernel-hub wrappers: for a small
    model a decode step is hundreds of small ops, and the wrappers are a large share of its time.
    `test_layers_called_in_turn_match_the_model_bit_for_bit` holds the samples, log-probs and hidden states equal
    to the model's own forward."""
    attn, mlp = layer.self_attn, layer.mlp
    shape = (*hidden.shape[:-1], -1, attn.head_dim)  # (b, s, heads, D)
    x = _norm(layer.input_layernorm, hidden)
    q, k = _linear(attn.q_proj, x).view(shape), _linear(attn.k_proj, x).view(shape)
    if hasattr(attn, "q_norm"):  # qwen3
        q, k = _norm(attn.q_norm, q), _norm(attn.k_norm, k)
    v = _linear(attn.v_proj, x).view(shape).transpose(1, 2)
    q, k = _rotate(q.transpose(1, 2), cos, signed_sin), _rotate(k.transpose(1, 2), cos, signed_sin)  # (b, heads, s, D)
    k, v = cache.update(k, v, attn.layer_idx)
    out, _ = _gqa_sdpa(attn, q, k, v, mask, scaling=attn.scaling)  # (b, s, heads, D)
    hidden = hidden + _linear(attn.o_proj, out.reshape(*hidden.shape[:-1], -1))
    x = _norm(layer.post_attention_layernorm, hidden)
    return hidden + _linear(mlp.down_proj, F.silu(_linear(mlp.gate_proj, x)) * _linear(mlp.up_proj, x))


def _run_layers(base: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor | None, position_ids: torch.Tensor,
                cache: DynamicCache, cache_kwarg: str, last: torch.Tensor | None,
                inline: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits (b, V) and final hidden states (b, H) that `base(...)` computes at each row's last position (or at
    the packed positions `last` of a (1, N) sequence), calling its modules in turn: the embedding, the rotary tables,
    each decoder layer (`inline`: its ops, `_layer`), the final norm, the LM head. The same ops on the same numbers,
    without the model-level wrappers (output capture, config defaults, deprecated-argument checks), a fixed cost
    of every forward (tests/engines/test_engine_padding.py checks the logits and the cache bit for bit)."""
    inner = base.model
    hidden = inner.embed_tokens(ids)
    rotary = inner.rotary_emb(hidden, position_ids)
    if inline:
        cos, signed_sin = rotary[0][:, None], _signed_sin(rotary[1][:, None])  # (b, 1, s, D): broadcast over the heads
    for layer in inner.layers[: inner.config.num_hidden_layers]:
        if inline:
            hidden = _layer(layer, hidden, mask, cos, signed_sin, cache)
        else:
            hidden = layer(hidden, attention_mask=mask, position_ids=position_ids, use_cache=True,
                           position_embeddings=rotary, **{cache_kwarg: cache})
    hidden = inner.norm(hidden[:, -1] if last is None else hidden[0, last])  # (b, H)
    return base.lm_head(hidden), hidden

