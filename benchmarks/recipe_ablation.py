"""Recipe ablation: SFT->RL vs SFT->DPO vs SFT->DPO->RL on the default environment, equal budget.

    python benchmarks/recipe_ablation.py                  # 3 seeds, 1,280 episodes after SFT each
    python benchmarks/recipe_ablation.py --seeds 0 --budget 640

All three arms start from the same SFT warm start (cached) and may sample the same number of
episodes after it: SFT->RL spends them on GRPO updates (64 per update), SFT->DPO on rollouts
that become preference pairs (pass vs fail within a group), SFT->DPO->RL a quarter on pairs and
the rest on GRPO. Each arm's held-out pass rate (same seeds) is recorded; baseline is SFT->RL,
and `ratio` (last line) is SFT->DPO->RL's mean final pass rate over SFT->RL's. Every run's figures go to
`<out>/ablation.json`, the table to `<out>/table.md`.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from benchlib import parser, report


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--budget", type=int, default=1280, help="episodes each arm may sample after SFT")
    ap.add_argument("--preference", choices=["dpo", "simpo", "ipo"], default="dpo")
    ap.add_argument("--out", default="runs/recipe-ablation")
    args = ap.parse_args()

    from agentrl.config import DPOConfig, TrainConfig
    from agentrl.stages.pipeline import run_pipeline

    G, per_update = 8, 64
    arms = {
        "sft->rl": (None, args.budget // per_update),
        f"sft->{args.preference}": (DPOConfig(loss=args.preference, groups=args.budget // G, group_size=G), 0),
        f"sft->{args.preference}->rl": (DPOConfig(loss=args.preference, groups=args.budget // 4 // G, group_size=G),
                                        (args.budget - args.budget // 4) // per_update),
    }
    out = Path(args.out)
    results: dict = {"started": time.strftime("%Y-%m-%d %H:%M"), "budget": args.budget, "arms": {}}
    t0 = time.perf_counter()
    for arm, (dpo, updates) in arms.items():
        for seed in args.seeds:
            cfg = TrainConfig(updates=updates, seed=seed, eval={"every": 0})
            t1 = time.perf_counter()
            res = run_pipeline(cfg, dpo, out / f"{arm.replace('>', '')}-seed{seed}", say=lambda s: None)
            stages = res["stages"]
            row = {"seed": seed, "sft": stages[0]["held_out_pass_rate"], "final": stages[-1]["held_out_pass_rate"],
                   "stages": stages, "wall_s": round(time.perf_counter() - t1, 1)}
            results["arms"].setdefault(arm, []).append(row)
            print(f"{arm:14s} seed {seed}: sft {row['sft']:.3f} -> final {row['final']:.3f} ({row['wall_s']:.0f}s)",
                  flush=True)
            (out / "ablation.json").parent.mkdir(parents=True, exist_ok=True)
            (out / "ablation.json").write_text(json.dumps(results, indent=1))  # after every run: a partial ablation
    results["wall_s"] = round(time.perf_counter() - t0)
    lines = ["| arm | held-out pass rate after SFT | final held-out pass rate (mean ± std) | seeds |",
             "|---|---|---|---|"]
    means = {}
    for arm, rows in results["arms"].items():
        finals = [r["final"] for r in rows]
        means[arm] = statistics.mean(finals)
        sd = statistics.stdev(finals) if len(finals) > 1 else 0.0
        lines.append(f"| {arm} | {statistics.mean(r['sft'] for r in rows):.3f} | {means[arm]:.3f} ± {sd:.3f} | "
                     f"{len(rows)} |")
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n")
    print(table)
    base, full = means["sft->rl"], means[f"sft->{args.preference}->rl"]
    report("recipe_ablation", results, path=out / "ablation.json",
           summary={"budget_episodes": args.budget, "seeds": len(args.seeds),
                    **{k.replace("->", "_to_"): round(v, 3) for k, v in means.items()}, "wall_s": results["wall_s"],
                    "ratio": round(full / base, 3) if base > 0 else None})


if __name__ == "__main__":
    main()
