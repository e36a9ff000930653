"""Causal-LM policies: loading, the built-in tiny policy, chat formatting, log-probs.

Any transformers causal LM folder or hub id works (`Policy.load`). Without one, agentrl builds a
tiny Llama-style model and a byte-level BPE tokenizer trained on the environment's own text
(`build_tiny_policy`), and saves both as an ordinary HF folder, so every later step runs the same
transformers code a 7B model would.

The chat layout (token ids for a tool-using conversation, turn by turn) lives in `agentrl.chat`.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from agentrl.chat.layout import ChatFormat
from agentrl.chat.tiny import TINY_CHAT_TEMPLATE
from agentrl.config import TinyModelConfig

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `corpus`, with ChatML special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # Digits one by one: a code like 12 must be composed from what the clue says, not memorised
    # as a merged token. No regex split otherwise: merges may cross punctuation and spaces, so the
    # boilerplate of a tool call (`{"name": "open", "arguments": {"lock": `) becomes a few tokens
    # and the sequence holds mostly the decisions.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS + TOOL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    hf_tok.chat_template = TINY_CHAT_TEMPLATE
    return hf_tok


def build_tiny_policy(corpus: Iterable[str], out_dir: str | Path, cfg: TinyModelConfig | None = None,
                      seed: int = 0) -> Path:
    """Train a tokenizer on `corpus`, build a tiny Llama around it, save both to `out_dir`."""
    cfg = cfg or TinyModelConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf_tok = build_tokenizer(corpus, cfg.vocab_size)
    hf_tok.save_pretrained(out)
    torch.manual_seed(seed)
    model_cfg = LlamaConfig(
        vocab_size=len(hf_tok),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
    )
    LlamaForCausalLM(model_cfg).save_pretrained(out)
    return out


def render_corpus_text(system: str | None, tools: list[dict[str, Any]], messages: list[tuple[str, str]]) -> str:
    """The tiny template's text for a conversation, without a tokenizer (for training one)."""
    parts = []
    head = system or ""
    if tools:
        for t in tools:
            f = t["function"]
            args = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in f["parameters"].get("properties", {}).items())
            head += ("\nTools:" if t is tools[0] else "") + f"\n{f['name']}({args}): {f['description']}"
    parts.append(f"<|im_start|>system\n{head}<|im_end|>\n")
    for role, content in messages:
        if role == "tool":
            parts.append(f"<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n")
        else:
            parts.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
    return "".join(parts)


class Policy:
    """A causal LM and its tokenizer, with the chat layout agentrl uses."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, tool_format: Any = None, history: str = "auto"):
        self.model = model
        self.tokenizer = tokenizer
        # tool_format None: detected from the chat template; history auto: from a probe conversation
        self.chat = ChatFormat(tokenizer, tool_format, history)

    @classmethod
    def load(cls, name_or_path: str | Path, dtype: torch.dtype = torch.float32,
             device: str | torch.device = "cpu", tool_format: str | None = None, history: str = "auto") -> Policy:
        from agentrl.models import resolve

        name_or_path = resolve(name_or_path)  # a known model's name: its folder, fetched on first use
        tokenizer = AutoTokenizer.from_pretrained(str(name_or_path))
        model = AutoModelForCausalLM.from_pretrained(str(name_or_path), dtype=dtype).to(device)
        return cls(model, tokenizer, tool_format, history)

    def save(self, path: str | Path) -> None:
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def add_lora(model: torch.nn.Module, settings: Any) -> torch.nn.Module:
    """Wrap `model` in peft LoRA adapters (`settings`: agentrl.config.LoraSettings); only the
    adapters train. `model.disable_adapter()` then gives back the base model's function."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=settings.r, lora_alpha=settings.alpha or 2 * settings.r, lora_dropout=settings.dropout,
                     target_modules=settings.peft_targets, task_type="CAUSAL_LM")
    return get_peft_model(model, cfg)


def adamw(params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW, fused where torch has a fused kernel for the parameters' device (CPU and CUDA since torch 2.4): one
    kernel over every tensor instead of a loop of small ones, the step's main cost on CPU (docs/benchmarks.md)."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, TypeError, ValueError):  # a device or dtype without the fused kernel
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip padding, as `generate()` derives them (left or inner padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass
class TokenStats:
    logp: torch.Tensor  # (B, T) log-prob of token t given tokens < t; 0 at t = 0
    entropy: torch.Tensor | None  # (B, T) entropy of the distribution that produced token t
    hidden: torch.Tensor | None  # (B, T, H) last-layer hidden state at t (detached)
    shared: int = 0  # prompt tokens the layers did not run again (`token_stats(share_heads=...)`)


def shards_weights(model: torch.nn.Module) -> bool:
    """Whether `model` is wrapped by something that shards its weights across ranks (FSDP 1 or 2, DeepSpeed):
    then only its own forward gathers them, and nothing may call its submodules directly."""
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError:  # a torch built without distributed
        return False
    return isinstance(model, (FullyShardedDataParallel, FSDPModule)) or type(model).__name__ == "DeepSpeedEngine"


ACTIVATION_BUDGET = 4 * 2**30  # bytes of activations a training forward may keep for its backward


def pass_tokens(model: torch.nn.Module, budget: int = ACTIVATION_BUDGET) -> int:
    """Padded tokens one training forward may take so that the activations kept for the backward stay near
    `budget`: an estimate of ~10 hidden-width and ~4 MLP-width fp32 vectors a token a layer (SmolLM2-135M: 30
    layers of 576 and 1,536, ~1.4 MB a token, so ~3,000 tokens in 4 GiB). A model without those config fields
    gets 16,384, the RL learner's most (`optim.micro_batch_tokens`)."""
    c = getattr(model, "config", None)
    layers, hidden = getattr(c, "num_hidden_layers", None), getattr(c, "hidden_size", None)
    if not isinstance(layers, int) or not isinstance(hidden, int):
        return 16384
    inner = getattr(c, "intermediate_size", None) or 4 * hidden
    per_token = layers * (10 * hidden + 4 * inner) * 4
    return max(512, budget // per_token)


MIN_SHARED_HEAD = 16  # prompt tokens a shared forward must save to be worth its extra call (the engine's prefill: 16)


@dataclass(frozen=True)
class SharedHeads:
    """Rows of a right-padded batch that begin with the same *head*: everything before the position whose
    output predicts the row's first scored token (in a GRPO group, the prompt its rows share). The distinct
    heads run through the model once; each row runs only its own *tail* on top of its head's keys and values.

    >>> ids = torch.tensor([[5, 6, 7, 8, 1, 2], [5, 6, 7, 8, 3, 0], [9, 9, 7, 8, 4, 4]])
    >>> mask = (torch.arange(6) < torch.tensor([[6], [5], [6]])).long()
    >>> scored = torch.zeros(3, 6, dtype=torch.bool); scored[:, 4:] = True
    >>> h = SharedHeads.find(ids, mask, scored, min_saved=1)
    >>> h.source.tolist(), h.length.tolist(), h.saved
    ([0, 0, 2], [3, 3, 3], 3)
    """

    source: torch.Tensor  # (B,) the row whose head each row uses (a row that shares with none is its own)
    length: torch.Tensor  # (B,) each row's head length, in tokens
    saved: int  # tokens the layers no longer run: the repeated heads'

    @staticmethod
    def find(input_ids: torch.Tensor, attention_mask: torch.Tensor, only: torch.Tensor,
             min_saved: int = 16) -> SharedHeads | None:
        """The heads, or None when sharing would not pay: fewer than `min_saved` tokens saved, or a padded
        forward (distinct heads x longest head + rows x longest tail) not below nine tenths of the plain one."""
        B, T = input_ids.shape
        lengths = attention_mask.sum(1)
        scored = only[:, 1:].bool() & attention_mask[:, 1:].bool()  # position c predicts token c + 1
        if B < 2 or not bool(scored.any(1).all()):
            return None
        # the output at the head's last position + 1 (the first col read) must come from the tail pass
        heads = scored.float().argmax(1).tolist()
        if min(heads) < 1:
            return None
        first: dict[tuple[int, ...], int] = {}
        source = [first.setdefault(tuple(input_ids[i, : heads[i]].tolist()), i) for i in range(B)]
        distinct = sorted(set(source))
        saved = sum(heads) - sum(heads[i] for i in distinct)
        tails = max(int(lengths[i]) - heads[i] for i in range(B))
        padded = len(distinct) * max(heads[i] for i in distinct) + B * tails
        if saved < min_saved or padded > 0.9 * B * int(lengths.max()):
            return None
        return SharedHeads(torch.tensor(source), torch.tensor(heads), saved)


def _shared_forward(decoder: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    heads: SharedHeads, whole: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The decoder's last hidden states of every row's tail, (B, S, D), with each distinct head run once and
    its keys and values gathered for the rows that share it (an index, so gradients add up over those rows:
    the same sums as the plain forward, up to the last bits of different matmul shapes); with `whole`, also
    every row's states at all its positions, (B, T, D), heads included (zeros past the row's end)."""
    B, T = input_ids.shape
    distinct = torch.unique(heads.source)  # sorted
    slot = torch.zeros(B, dtype=torch.long)
    slot[distinct] = torch.arange(len(distinct))
    H = int(heads.length[distinct].max())
    head_mask = (torch.arange(H) < heads.length[distinct, None]).long()  # (k, H)
    dev = input_ids.device
    head_ids = input_ids[distinct.to(dev), :H] * head_mask.to(dev)  # (k, H) right-padded with 0 past each head
    from transformers import DynamicCache

    # transformers 5 renamed `past_key_values` to `cache`; a cache made here keeps every position of every layer
    cache = DynamicCache()
    kw = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
    out = decoder(input_ids=head_ids, attention_mask=head_mask.to(dev),
                  position_ids=position_ids_from_mask(head_mask).to(dev), use_cache=True, **{kw: cache})
    cache.batch_select_indices(slot[heads.source].to(dev))  # (B, ...) each row's head
    tail_len = attention_mask.sum(1).cpu() - heads.length  # (B,)
    S = int(tail_len.max())
    cols = heads.length[:, None] + torch.arange(S)  # (B, S) the tail's columns in the row
    real = torch.arange(S) < tail_len[:, None]
    cols = torch.where(real, cols, heads.length[:, None]).to(dev)  # a padded slot repeats a real column
    tail_ids = input_ids.gather(1, cols)
    mask = torch.cat([head_mask[slot[heads.source]], real.long()], 1).to(dev)  # (B, H + S)
    tail = decoder(input_ids=tail_ids, attention_mask=mask, position_ids=cols, use_cache=True,
                   **{kw: cache}).last_hidden_state  # (B, S, D)
    if not whole:
        return tail, None
    t = torch.arange(T)
    in_head = t < heads.length[:, None]  # (B, T)
    from_head = out.last_hidden_state[slot[heads.source][:, None], t.clamp(max=H - 1)]  # (B, T, D)
    at = (t - heads.length[:, None]).clamp(0, S - 1)
    from_tail = tail.gather(1, at[..., None].expand(-1, -1, tail.shape[-1]).to(tail.device))
    beyond = (t < attention_mask.sum(1).cpu()[:, None]).to(tail.device)
    return tail, torch.where(in_head[..., None].to(tail.device), from_head, from_tail) * beyond[..., None]


def token_stats(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    entropy: bool = False,
    hidden: bool = False,
    only: torch.Tensor | None = None,
    share_heads: int = 0,
) -> TokenStats:
    """Per-token log-probs (and entropy, hidden states) of `input_ids` under `model`, one forward.

    Values are aligned to token positions: `logp[:, t]` scores `input_ids[:, t]`. With `only` (a
    (B, T) mask, e.g. the action mask), the output layer and the softmax run at just the positions
    that predict those tokens and every other position reads 0: the prompt and the observations
    cost the transformer's layers but not the vocabulary projection, which for a 150k-token
    vocabulary is most of the memory of a long episode.

    `share_heads` > 0 (with `only`): rows that begin with the same head (`SharedHeads`; a GRPO group's
    prompt) run it through the layers once when that saves at least that many tokens; the log-probs are the
    plain forward's up to the last bits of a matmul, and so are the gradients.
    """
    pos_ids = position_ids_from_mask(attention_mask)
    ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    inner = model.module if ddp else model
    sparse = only is not None and hasattr(inner, "get_decoder") and hasattr(inner, "get_output_embeddings") \
        and not shards_weights(model)  # sharded: the full forward through the wrapper, which gathers the weights
    # under DDP the forward must go through the wrapper (one call per backward), so heads are not shared there
    heads = SharedHeads.find(input_ids, attention_mask, only, share_heads) \
        if sparse and share_heads and not ddp else None
    if heads is not None:
        tail, last = _shared_forward(inner.get_decoder(), input_ids, attention_mask, heads, whole=hidden)
        rows, cols = only[:, 1:].nonzero(as_tuple=True)  # position cols predicts token cols + 1
        logits = inner.get_output_embeddings()(tail[rows, cols - heads.length.to(cols.device)[rows]]).float()
    elif sparse:
        if ddp:
            # through DDP's own forward, which arms its gradient all-reduce for this backward (the decoder
            # called directly would leave the gradients unsynchronised): the last layer's states come
            # out with one position's logits, and the output layer runs at the action positions below
            last = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos_ids,
                         output_hidden_states=True, logits_to_keep=1, use_cache=False).hidden_states[-1]
        else:
            last = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos_ids,
                                       use_cache=False).last_hidden_state
        rows, cols = only[:, 1:].nonzero(as_tuple=True)  # position cols predicts token cols + 1
        logits = inner.get_output_embeddings()(last[rows, cols]).float()  # (N, V)
    else:
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos_ids,
                    output_hidden_states=hidden, use_cache=False)
        last = out.hidden_states[-1] if hidden else None
        logits = out.logits[:, :-1].float()  # (B, T-1, V)
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = F.log_softmax(logits, dim=-1)
    ent = None
    if sparse:
        logp = torch.zeros(input_ids.shape, dtype=logp_all.dtype, device=input_ids.device)
        logp[rows, cols + 1] = logp_all.gather(-1, input_ids[rows, cols + 1, None]).squeeze(-1)
        if entropy:
            ent = torch.zeros_like(logp)
            ent[rows, cols + 1] = -(logp_all.exp() * logp_all).sum(-1)
    else:
        logp = F.pad(logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1), (1, 0))  # (B, T)
        if entropy:
            ent = F.pad(-(logp_all.exp() * logp_all).sum(-1), (1, 0))  # (B, T)
        if only is not None:
            logp, ent = logp * only, (None if ent is None else ent * only)
    hs = None
    if hidden:
        # the state *before* token t is the hidden state at t-1; shift so hs[:, t] precedes token t
        hs = F.pad(last[:, :-1].detach(), (0, 0, 1, 0))  # (B, T, H)
    return TokenStats(logp, ent, hs, heads.saved if heads is not None else 0)
