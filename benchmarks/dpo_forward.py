"""DPO's forward: the output layer at the action tokens only, a pair's shared prompt once, against the plain forward.

    python benchmarks/dpo_forward.py          # SmolLM2-135M-Instruct on TextWorld pairs from recipe_real's runs
    python benchmarks/dpo_forward.py --quick  # a small random Llama on synthetic pairs of the same shape (a minute)

A DPO step scores each pair's chosen and rejected episodes under the policy (with a backward) and under the
frozen reference. The plain forward computes the vocabulary's logits at every position of every episode; on
SmolLM2 (49,152 tokens, 576 wide) that is more memory a token than the layers, and a TextWorld episode is ~80%
observation, which scores nothing. `agentrl.stages.dpo` now runs the output layer at the action positions only
and, since a pair's two sides are one task, their common prompt once (`token_stats(only=, share_heads=)`).

Arms, each in its own process (so that peak memory does not mix), on the same pairs, micro-batches and steps:
- `plain` (the baseline): `token_stats` without `only` and `share_heads`: what DPO ran before;
- `sparse`: as shipped.
Figures: seconds for `--steps` DPO steps of `--pairs` pairs, the process's peak resident memory, and the first
step's loss in each arm (the same sums, so the same loss up to float rounding: `loss_diff`). `ratio` is the plain
arm's seconds over the sparse arm's. Pairs come from `--store` (an RL run's episodes: groups with a pass and a
fail), by default recipe_real's TextWorld seed-0 run; `--quick` builds synthetic ones of TextWorld's shape.
Last line: one JSON object, written to benchmarks/results/dpo_forward[_quick].json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import parser, report  # noqa: E402

NAME = "dpo_forward"
RECIPE = Path("runs/recipe-real/textworld/seed0")  # recipe_real's default --out


def build_parser() -> argparse.ArgumentParser:
    ap = parser(__doc__, quick="a small random Llama on synthetic pairs of TextWorld's shape (about a minute)")
    ap.add_argument("--model", default=str(RECIPE / "sft"), help="a policy folder (default: recipe_real's TextWorld "
                    "seed-0 SFT model)")
    ap.add_argument("--store", default=str(RECIPE / "sft_dpo_rl" / "store"), help="an RL run's store/ to pair "
                    "episodes from (default: recipe_real's TextWorld seed-0 recipe run)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=8, help="pairs a step (recipe_real's dpo batch_pairs)")
    ap.add_argument("--json", default=None, help="result file (default results/dpo_forward[_quick].json)")
    ap.add_argument("--arm", choices=["plain", "sparse"], help=argparse.SUPPRESS)  # a worker: one arm, this process
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    return ap


def peak_rss_gb() -> float:
    from agentrl.memory import GB, peak_rss_bytes

    return round(peak_rss_bytes() / GB, 3)


def quick_model_and_pairs(n: int) -> tuple[object, int, list]:
    """A random 4-layer Llama with SmolLM2's vocabulary (the output layer is what the arms differ on) and `n`
    synthetic pairs of TextWorld's shape: a 400-token prompt shared by a pair's sides, then 5 turns of a
    20-token action and a 60-token observation."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentrl.core import Episode, Turn

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    model = LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(1)

    def toks(k: int) -> list[int]:
        return torch.randint(3, cfg.vocab_size, (k,), generator=g).tolist()

    def episode(prompt: list[int], reward: float) -> Episode:
        e = Episode(list(prompt), reward=reward)
        for _ in range(5):
            e.turns.append(Turn(len(e.token_ids()), toks(20), [0.0] * 20, toks(60)))
        return e

    pairs = []
    for _ in range(n):
        prompt = toks(400)
        pairs.append((episode(prompt, 1.0), episode(prompt, 0.0)))
    return model, 0, pairs


def check_inputs(args: argparse.Namespace) -> None:
    """The model and store folders exist (asked before any arm starts, so a typo costs no process)."""
    for path, what in ((args.model, "--model"), (args.store, "--store")):
        if not Path(path).exists():
            raise SystemExit(f"{what} {path} does not exist: run recipe_real's TextWorld arms first "
                             "(python benchmarks/recipe_real.py --families textworld --arms sft+dpo+rl --seeds 0), "
                             "name other folders, or use --quick")


def real_model_and_pairs(args: argparse.Namespace, n: int) -> tuple[object, int, list]:
    from agentrl.policy import Policy
    from agentrl.stages.dpo import pairs_from_episodes
    from agentrl.store import TrajectoryStore

    policy = Policy.load(args.model)
    pairs, counts = pairs_from_episodes(list(TrajectoryStore.load(args.store)), 4, 0)
    if len(pairs) < n:
        raise SystemExit(f"{args.store} gives {len(pairs)} pairs ({counts}); {n} wanted (--steps x --pairs)")
    return policy.model, policy.chat.pad_id, pairs[:n]


def worker(args: argparse.Namespace) -> None:
    """One arm, in this process: the DPO steps, timed, and the peak memory."""
    import copy

    import torch

    from agentrl.config import DPOConfig
    from agentrl.stages import dpo

    torch.manual_seed(0)
    n = args.steps * args.pairs
    model, pad_id, pairs = quick_model_and_pairs(n) if args.quick else real_model_and_pairs(args, n)
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    if args.arm == "plain":  # what DPO ran before: the vocabulary at every position, no shared prompt
        full = dpo.token_stats
        dpo.token_stats = lambda m, ids, mask, only=None, share_heads=0, **kw: full(m, ids, mask, **kw)
    losses: list[float] = []
    t0 = time.perf_counter()
    out = dpo.train_preferences(model, reference, pairs, pad_id, DPOConfig(batch_pairs=args.pairs, epochs=1),
                                seed=0, log=lambda m: losses.append(m["dpo/loss"]))
    seconds = time.perf_counter() - t0
    tokens = sum(len(e.token_ids()) for pair in pairs for e in pair)
    Path(args.worker_out).write_text(json.dumps({
        "seconds": round(seconds, 2), "peak_rss_gb": peak_rss_gb(), "first_loss": losses[0],
        "steps": out["dpo/steps"], "pairs": len(pairs), "episode_tokens": tokens}))


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.arm:
        return worker(args)
    import tempfile

    if args.quick:
        args.steps, args.pairs = min(args.steps, 2), min(args.pairs, 4)
    else:
        check_inputs(args)
    arms = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arm in ("plain", "sparse"):
            out = Path(tmp) / f"{arm}.json"
            cmd = [sys.executable, __file__, "--arm", arm, "--worker-out", str(out), "--model", args.model,
                   "--store", args.store, "--steps", str(args.steps), "--pairs", str(args.pairs)]
            rc = subprocess.run(cmd + (["--quick"] if args.quick else [])).returncode
            if rc != 0:  # the worker said why above (too few pairs, a model that does not load, memory: 137)
                raise SystemExit(f"the {arm} arm failed (exit status {rc}); nothing was written")
            arms[arm] = json.loads(out.read_text())
            print(f"{arm}: {arms[arm]['seconds']:.1f} s for {arms[arm]['steps']} steps, peak "
                  f"{arms[arm]['peak_rss_gb']:.2f} GB, first loss {arms[arm]['first_loss']:.6f}", flush=True)
    plain, sparse = arms["plain"], arms["sparse"]
    ratio = round(plain["seconds"] / sparse["seconds"], 3)
    memory_ratio = round(plain["peak_rss_gb"] / sparse["peak_rss_gb"], 3)
    print(f"sparse forward: {ratio}x faster, {memory_ratio}x less peak memory", flush=True)
    res = {"quick": args.quick, "model": "a random 4-layer Llama, SmolLM2's vocabulary (--quick)" if args.quick
           else args.model, "pairs_from": "synthetic, TextWorld's shape" if args.quick else args.store,
           "baseline": "plain: the vocabulary's logits at every position, every episode its own prompt",
           "ratio": ratio, "memory_ratio": memory_ratio,
           "loss_diff": abs(plain["first_loss"] - sparse["first_loss"]), "arms": arms}
    report(NAME, res, quick=args.quick, path=args.json)


if __name__ == "__main__":
    main()
