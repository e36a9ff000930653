"""One turn of sampling: the torch engine vs `model.generate()` vs a plain cached forward loop.

Same model (a ~0.9M-parameter Llama: hidden 128, intermediate 384, 4 layers, 4 heads, 2 KV heads,
tied embeddings, the BPE tokenizer of `agentrl train`), same batch of random prompts (64 x 32
tokens), same 64 new tokens per row, plain sampling at temperature 1 (no top-k, no top-p):

- **engine**: `TorchEngine.open(prompts).generate()` with no stop tokens, so every row runs to
  `max_new_tokens`; it also returns each token's log-prob, as a rollout needs.
- **plain**: the minimal loop (the floor an engine's overheads are measured from): prefill the
  prompts with `use_cache=True`, then one forward per token feeding the sampled token with the
  cache, `torch.multinomial` over the softmax. No mask (no padding), no log-probs.
- **generate**: `model.generate(do_sample=True, top_k=0, top_p=1.0, min_new_tokens=64,
  max_new_tokens=64)`: EOS is suppressed until the 64th token, so it too runs every row to the end.

All three run one prefill and 63 single-token forwards for 64 tokens per row. After a warm-up of
each, the three are timed in turn, `--repeats` rounds (interleaved, so load from other jobs on a
shared machine falls on all three alike), and the median of each is reported.

    python benchmarks/single_turn.py
    python benchmarks/single_turn.py --batch 64 --prompt-len 32 --new-tokens 64 --repeats 7

Last line: one JSON object with the figures (also written to benchmarks/results/single_turn.json); `ratio` is
engine tokens/s / plain-loop tokens/s.
"""

from __future__ import annotations

import inspect
import statistics
import time
from collections.abc import Callable

import torch
from benchlib import parser, report
from transformers import DynamicCache

from agentrl.config import TinyModelConfig
from agentrl.engines import SamplingConfig, TorchEngine
from agentrl.policy import Policy, build_tiny_policy
from agentrl.registry import make
from agentrl.stages.sft import expert_texts

MODEL = TinyModelConfig(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=1024)


def engine_run(policy: Policy, prompts: torch.Tensor, new_tokens: int, seed: int) -> torch.Tensor:
    chat = policy.chat
    engine = TorchEngine(policy.model, SamplingConfig(max_new_tokens=new_tokens), stop_ids=[], eos_id=chat.eos_id,
                         pad_id=chat.pad_id, seed=seed)
    gens = engine.open(prompts.tolist()).generate()
    return torch.tensor([g.ids for g in gens])


@torch.inference_mode()
def plain_run(policy: Policy, prompts: torch.Tensor, new_tokens: int, seed: int) -> torch.Tensor:
    model = policy.model
    gen = torch.Generator().manual_seed(seed)
    cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = DynamicCache()  # filled in place by every forward
    logits = model(input_ids=prompts, use_cache=True, **{cache_kwarg: cache}).logits[:, -1]  # (B, V)
    tokens = []
    for t in range(new_tokens):
        tok = torch.multinomial(logits.float().softmax(-1), 1, generator=gen)  # (B, 1)
        tokens.append(tok)
        if t == new_tokens - 1:
            break
        logits = model(input_ids=tok, use_cache=True, **{cache_kwarg: cache}).logits[:, -1]
    return torch.cat(tokens, 1)


@torch.inference_mode()
def generate_run(policy: Policy, prompts: torch.Tensor, new_tokens: int, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    out = policy.model.generate(
        input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
        min_new_tokens=new_tokens, max_new_tokens=new_tokens, pad_token_id=policy.chat.pad_id,
    )
    return out[:, prompts.shape[1]:]


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default="/tmp/agentrl-bench-single-turn")
    args = ap.parse_args()

    env = make("agentrl/Vault-v0", locks=4, slack=0)
    build_tiny_policy(expert_texts(env, range(200), noise=0.3), args.out, MODEL, seed=0)
    policy = Policy.load(args.out)
    policy.model.eval()
    vocab = policy.model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, vocab, (args.batch, args.prompt_len), generator=gen)  # past the special tokens

    runs: dict[str, Callable[[Policy, torch.Tensor, int, int], torch.Tensor]] = {
        "engine": engine_run, "plain": plain_run, "generate": generate_run}
    for name, fn in runs.items():  # warm-up; and every method must produce exactly new_tokens per row
        shape = tuple(fn(policy, prompts, args.new_tokens, 0).shape)
        assert shape == (args.batch, args.new_tokens), f"{name} produced {shape}"
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for rep in range(args.repeats):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn(policy, prompts, args.new_tokens, rep + 1)
            seconds[name].append(time.perf_counter() - t0)

    n_tokens = args.batch * args.new_tokens
    tps = {name: n_tokens / statistics.median(s) for name, s in seconds.items()}
    result = {
        "model_parameters": policy.num_parameters,
        "model": MODEL.model_dump(),
        "vocab_size": vocab,
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "engine_tokens_per_s": round(tps["engine"], 1),
        "plain_tokens_per_s": round(tps["plain"], 1),
        "generate_tokens_per_s": round(tps["generate"], 1),
        "engine_s": [round(s, 4) for s in seconds["engine"]],
        "plain_s": [round(s, 4) for s in seconds["plain"]],
        "generate_s": [round(s, 4) for s in seconds["generate"]],
        "ratio_engine_generate": round(tps["engine"] / tps["generate"], 3),
        "ratio": round(tps["engine"] / tps["plain"], 3),
    }
    print(f"{policy.num_parameters / 1e6:.2f}M-parameter Llama, batch {args.batch}, {args.prompt_len}-token prompts, "
          f"{args.new_tokens} new tokens, median of {args.repeats}: engine {tps['engine']:.0f} tokens/s, plain cached "
          f"loop {tps['plain']:.0f}, generate() {tps['generate']:.0f} -> engine/plain {result['ratio']:.2f}x, "
          f"engine/generate {result['ratio_engine_generate']:.2f}x")
    report("single_turn", result)  # adds the machine and the command


if __name__ == "__main__":
    main()
