"""Distillation against RL on the tiny policy: does a weak student gain more from a strong teacher than from GRPO?

The recipe's claim (issue 51): small policies "often gain more from SFT-plus-distillation than from RL".
Teacher: the tiny policy warm-started on the clean expert (noise 0, the default 3,000 demonstrations x 4
epochs), which passes nearly every held-out Vault task. Student: a thinner warm start on the same tokenizer
(the tokenizer's corpus is the same: noise 0 or 0.3 alike, seed 0): 2,000 clean demonstrations x 2 epochs.
From the same student, four arms with the same budget of sampled episodes (updates x groups x group size),
three seeds each:

    grpo            --algo grpo: the verifier's group-relative advantage
    rejection       agentrl distill --mode rejection: the teacher sampled k times (default 2) on
                    budget / k tasks, the best passing episode of each kept, SFT on them
    on-policy       --algo distill: the teacher's log-prob minus the student's, per action token
    on-policy+grpo  --algo distill --credit.reward-weight 1: both signals

Each run: the held-out pass rate before and after (the same held-out seeds for every arm), wall seconds, and
the teacher's seconds (scoring for on-policy, sampling for rejection). `ratio` is on-policy's mean final
pass rate over grpo's. Warm starts are cached under $AGENTRL_CACHE (built on the first run).

    python benchmarks/distill.py [--quick] [--updates 8] [--seeds 0 1 2]
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from benchlib import parser, report, save

from agentrl.config import RejectionConfig, SFTConfig, TrainConfig
from agentrl.evaluation import evaluate
from agentrl.policy import Policy
from agentrl.stages.distill import on_policy_config, run_rejection
from agentrl.stages.warm_start import warm_start
from agentrl.trainer import Trainer

ENV = "agentrl/Vault-v0"
ARMS = ["grpo", "rejection", "on-policy", "on-policy+grpo"]


def base_config(student: str, teacher: str, seed: int, out: Path, args) -> TrainConfig:
    return TrainConfig(env={"id": ENV}, model=student, teacher=teacher, seed=seed, updates=args.updates,
                       out=str(out), rollout={"groups": args.groups, "group_size": args.group_size},
                       eval={"episodes": args.eval_episodes, "every": 0}, checkpoint={"every": 0},
                       optim={"lr": args.lr},
                       sft={"epochs": args.sft_epochs, "lr": args.sft_lr, "batch_size": 16})


def rl_run(cfg: TrainConfig) -> dict:
    t0 = time.perf_counter()
    summary = Trainer(cfg).train()
    seconds = time.perf_counter() - t0
    rows = [json.loads(line) for line in (Path(cfg.out) / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if r.get("step", 0) > 0 and not r.get("final")]
    return {"warm_start_pass_rate": summary["warm_start_pass_rate"], "final_pass_rate": summary["final_pass_rate"],
            "seconds": round(seconds, 1),
            "teacher_seconds": round(sum(r.get("time/teacher_s", 0.0) for r in updates), 1),
            "rollout_pass_rate": [round(r["rollout/pass_rate"], 3) for r in updates],
            "teacher_kl": [round(r["credit/teacher_kl"], 4) for r in updates if "credit/teacher_kl" in r] or None}


def rejection_run(cfg: TrainConfig, args) -> dict:
    t0 = time.perf_counter()
    warm = evaluate(cfg, Policy.load(cfg.model), None, 1024)  # what a Trainer of this seed evaluates at step 0
    episodes = args.updates * args.groups * args.group_size  # the RL arms' sampled episodes: the same budget
    rec = run_rejection(cfg, RejectionConfig(tasks=episodes // args.rejection_k, k=args.rejection_k), cfg.out,
                        say=lambda s: print(s, flush=True))
    return {"warm_start_pass_rate": warm.pass_rate, "final_pass_rate": rec["held_out_pass_rate"],
            "seconds": round(time.perf_counter() - t0, 1), "teacher_seconds": round(rec["teacher_seconds"], 1),
            "kept": rec["counts"]["kept"], "dropped": rec["counts"]["dropped"]}


def main() -> None:
    ap = parser(__doc__, quick="2 updates, one seed, 16 held-out episodes: checks the script runs end to end")
    ap.add_argument("--updates", type=int, default=8)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", default=ARMS, choices=ARMS)
    ap.add_argument("--eval-episodes", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-4, help="the RL arms' learning rate (agentrl train's default)")
    ap.add_argument("--student-episodes", type=int, default=2000, help="the student's demonstrations")
    ap.add_argument("--student-epochs", type=int, default=2, help="the student's SFT epochs")
    ap.add_argument("--rejection-k", type=int, default=2, help="rejection arm: teacher samples per task (best-of-k); "
                    "the tasks are the budget's episodes / k")
    ap.add_argument("--sft-epochs", type=int, default=2, help="rejection arm: SFT epochs on the kept episodes")
    ap.add_argument("--sft-lr", type=float, default=1e-3, help="rejection arm: SFT's peak rate on the kept episodes")
    ap.add_argument("--out", help="folder for the runs (default: a temporary one)")
    ap.add_argument("--results", help="write the JSON here instead of results/distill.json (a supplementary run)")
    args = ap.parse_args()
    if args.quick:
        args.updates, args.seeds, args.eval_episodes = 2, [0], 16
    say = lambda s: print(s, flush=True)  # noqa: E731
    teacher = str(warm_start(ENV, {}, TrainConfig().tiny, SFTConfig(noise=0.0), 0, say=say))
    student = str(warm_start(ENV, {}, TrainConfig().tiny, SFTConfig(noise=0.0, episodes=args.student_episodes,
                                                                     epochs=args.student_epochs), 0, say=say))
    root = Path(args.out or tempfile.mkdtemp(prefix="distill-bench-"))
    runs = []
    for seed in args.seeds:
        for arm in args.arms:
            out = root / f"{arm}-{seed}"
            cfg = base_config(student, teacher, seed, out, args)
            say(f"== {arm}, seed {seed} -> {out}")
            if arm == "rejection":
                got = rejection_run(cfg, args)
            else:
                credit = {"grpo": None, "on-policy": {}, "on-policy+grpo": {"reward_weight": 1.0}}[arm]
                got = rl_run(cfg if credit is None else on_policy_config(cfg, **credit))
            runs.append({"arm": arm, "seed": seed, **got})
            save("distill", {"env": ENV, "runs": runs, "partial": True}, quick=args.quick, path=args.results)
            say(f"   {arm} seed {seed}: {got['warm_start_pass_rate']:.3f} -> {got['final_pass_rate']:.3f} "
                f"({got['seconds']:.0f}s)")
    by_arm = {arm: [r["final_pass_rate"] for r in runs if r["arm"] == arm] for arm in args.arms}
    summary = {arm: {"mean": round(statistics.mean(v), 4), "min": min(v), "max": max(v),
                     "stdev": round(statistics.stdev(v), 4) if len(v) > 1 else None} for arm, v in by_arm.items()}
    grpo, on_policy = by_arm.get("grpo"), by_arm.get("on-policy")
    ratio = statistics.mean(on_policy) / statistics.mean(grpo) if grpo and on_policy and statistics.mean(grpo) else None
    result = {
        "teacher": {"dir": Path(teacher).name, "sft": {"noise": 0.0, "episodes": 3000, "epochs": 4}},
        "student": {"dir": Path(student).name, "sft": {"noise": 0.0, "episodes": args.student_episodes,
                                                       "epochs": args.student_epochs}},
        "env": ENV, "budget": {"updates": args.updates, "groups": args.groups, "group_size": args.group_size,
                               "episodes": args.updates * args.groups * args.group_size,
                               "eval_episodes": args.eval_episodes},
        "runs": runs, "final_pass_rate_by_arm": summary, "ratio": round(ratio, 4) if ratio is not None else None,
    }
    report("distill", result, quick=args.quick, path=args.results,
           summary={k: result[k] for k in ("env", "budget", "final_pass_rate_by_arm", "ratio")})


if __name__ == "__main__":
    main()
