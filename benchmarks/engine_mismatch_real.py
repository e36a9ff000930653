"""The engine/trainer gap on a real instruct model: SmolLM2-135M-Instruct sampling in bf16 against the fp32 trainer.

`benchmarks/engine_mismatch.py` trains on the tiny policy; this one measures the gap's level on the real
model, with no training: the same episodes' worth of prompts are rolled out by the torch engine twice, once
from the fp32 weights (the baseline, where the gap is the rounding of a differently batched sum) and once
from a bf16 copy (`--rollout.dtype bf16`), and each episode's action tokens are scored by the fp32 trainer's
forward (`agentrl.trainer.Trainer._score` does the same). The figures are `agentrl.mismatch.stats`, the
`mismatch/*` metrics of a training run (docs/algorithms.md, "Engine mismatch").

    python benchmarks/engine_mismatch_real.py            # 8 episodes per arm, 48 new tokens (~5 min on 2 cores)
    python benchmarks/engine_mismatch_real.py --quick    # 2 episodes per arm, 24 new tokens

Last line: one JSON object (`ratio` = the bf16 engine's k3 KL over the fp32 engine's); also written to
benchmarks/results/engine_mismatch_real.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import parser, report  # noqa: E402

from agentrl.config import TrainConfig  # noqa: E402
from agentrl.evaluation import make_engine  # noqa: E402
from agentrl.mismatch import stats as mismatch_stats  # noqa: E402
from agentrl.models import resolve  # noqa: E402
from agentrl.policy import Policy, token_stats  # noqa: E402
from agentrl.registry import make  # noqa: E402
from agentrl.rollout import rollout  # noqa: E402
from agentrl.store import make_batch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"


def arm(dtype: str, policy: Policy, a: argparse.Namespace) -> dict:
    """Roll out `a.episodes` episodes from an engine in `dtype`, score them with the fp32 policy, return the gap."""
    cfg = TrainConfig(model=str(a.model_dir), env={"id": a.env}, rollout={"dtype": dtype, "sampling": {
        "max_new_tokens": a.max_new_tokens, "temperature": 1.0}})
    engine = make_engine(cfg, policy, cfg.rollout.sampling, seed=a.seed)
    envs = [make(a.env) for _ in range(a.episodes)]
    t0 = time.perf_counter()
    episodes = rollout(envs, list(range(a.seed, a.seed + a.episodes)), engine, policy.chat,
                       max_new_tokens=a.max_new_tokens)[0]
    rollout_s = time.perf_counter() - t0
    batch = make_batch(episodes, policy.tokenizer.pad_token_id or 0)
    with torch.inference_mode():
        logp = token_stats(policy.model, batch.input_ids, batch.attention_mask, 1.0, only=batch.action_mask).logp
    measured = mismatch_stats(logp.float() - batch.behaviour_logp, batch.action_mask, a.cap)
    tokens = int(batch.action_mask.sum())
    print(f"{dtype:5s}: {len(episodes)} episodes, {tokens} action tokens in {rollout_s:.0f}s; "
          f"kl_k3 {measured['kl_k3']:.3g}, |log r| mean {measured['logp_diff_mean']:.3g} max "
          f"{measured['logp_diff_max']:.3g}, ess {measured['ess']:.4f}", flush=True)
    return {"dtype": dtype, "episodes": len(episodes), "action_tokens": tokens, "rollout_s": round(rollout_s, 1),
            "tokens_per_s": round(tokens / rollout_s, 2), **{k: float(v) for k, v in measured.items()}}


def main() -> None:
    p = parser(__doc__, quick="2 episodes per arm, 24 new tokens")
    p.add_argument("--episodes", type=int, default=None, help="episodes per arm (default 8; quick 2)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="per turn (default 48; quick 24)")
    p.add_argument("--env", default="examples/custom_env.py:Arithmetic")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cap", type=float, default=2.0, help="C of the [1/C, C] band for the out-of-band shares")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--results", default=None, help="where the JSON goes (default results/engine_mismatch_real"
                   "[_quick].json)")
    a = p.parse_args()
    a.episodes = a.episodes or (2 if a.quick else 8)
    a.max_new_tokens = a.max_new_tokens or (24 if a.quick else 48)
    if a.threads:
        torch.set_num_threads(a.threads)
    os.chdir(ROOT)  # the example env's file path is relative to the checkout
    a.model_dir = resolve(MODEL)
    torch.manual_seed(a.seed)
    policy = Policy.load(str(a.model_dir), device=torch.device("cpu"))
    policy.model.eval()
    load = os.getloadavg()[0]
    arms = {dtype: arm(dtype, policy, a) for dtype in ("auto", "bf16")}
    fp32, bf16 = arms["auto"]["kl_k3"], arms["bf16"]["kl_k3"]
    ratio = round(bf16 / fp32, 1) if fp32 > 0 else None  # None: the fp32 engine measured exactly 0
    print(f"bf16 engine's k3 KL / fp32 engine's: {ratio}")
    report("engine_mismatch_real", {"model": MODEL, "env": a.env, "quick": a.quick, "episodes": a.episodes,
                                    "max_new_tokens": a.max_new_tokens, "seed": a.seed, "arms": arms,
                                    "machine": {"loadavg_1min_start": load}, "ratio": ratio},
           quick=a.quick, path=a.results)


if __name__ == "__main__":
    main()
