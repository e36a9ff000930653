"""Longer RL on the real model (issue 50, item 4's second half): past recipe_real.py's 8 updates, does grpo keep
lifting SmolLM2-135M-Instruct's held-out pass rate, and does its entropy collapse or its KL drift on the way?

    python benchmarks/recipe_real.py --families rg-chain --arms sft --seeds 0 1 2   # the SFT models (cached)
    python benchmarks/rl_longer_real.py                     # 40 grpo updates from each, held out every 10
    python benchmarks/rl_longer_real.py --quick             # the whole path on the tiny policy, a minute or two

Each seed starts from recipe_real's SFT model of that seed (`--sft-from`, recipe_real's `--out`; built there and
cached if absent) and runs recipe_real's `sft+rl` arm (grpo, LoRA r16 at lr 5e-5, 2 x 4 episodes an update)
for `--updates` updates instead of 8, evaluating on the env's held-out split every `--eval-every` updates
(24 episodes at temperature 1.0, the benchmark's own scorer, as recipe_real). recipe_real's runs were 6-8
updates: shorter than the health monitor's 5-update baseline and 8-update trend span, so they could neither
collapse nor be caught; 40 can.

Baseline and `ratio`: the same run's step-0 evaluation (the SFT model it starts from, on the same held-out tasks)
is the baseline; `ratio` is the mean final held-out pass rate over the mean step-0 one. Per seed the JSON keeps the
held-out curve, entropy and KL per update (None where every advantage was zero: no gradient step), each update's
health status, and every alarm or warning that fired; over seeds, the mean and standard error at each evaluation,
and `rise` (every seed above its start, and the mean rise beyond twice its standard error).

A finished run in `--out` whose config.yaml is this one's is read, not run again (a run made with
`agentrl train --config <recipe_real's sft_rl/config.yaml> --updates 40 --set eval.every=10` qualifies).

Last line: one JSON object with `ratio`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recipe_real  # noqa: E402
from benchlib import parser, report  # noqa: E402
from recipe_real import mean_se  # noqa: E402

NAME = "rl_longer_real"


def build_parser() -> argparse.ArgumentParser:
    ap = parser(__doc__, quick="the tiny policy, seed 0, 4 updates held out every 2 (a minute or two)")
    ap.add_argument("--family", choices=list(recipe_real.FAMILIES), default="rg-chain")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2; --quick 0")
    ap.add_argument("--updates", type=int, default=None, help="default 40; --quick 4 (at least 1)")
    ap.add_argument("--eval-every", type=int, default=None, help="default 10; --quick 2")
    ap.add_argument("--sft-from", default="runs/recipe-real", help="recipe_real's --out: its SFT models, per seed")
    ap.add_argument("--out", default="runs/rl-longer-real")
    ap.add_argument("--json", default=None, help="result file (default results/rl_longer_real[_quick].json)")
    return ap


def stage_config(args: argparse.Namespace, seed: int, sft: Path, folder: Path) -> Any:
    """recipe_real's `sft+rl` RL config for this seed, at `args.updates` updates, held out every `eval_every`."""
    rr = recipe_real.sized(recipe_real.build_parser().parse_args(["--quick"] if args.quick else []))
    rc = recipe_real.config(rr, args.family, "sft+rl", seed)
    cfg = rc.rl.model_copy(update={"model": str(sft), "out": str(folder), "updates": args.updates})
    return rc, cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"every": args.eval_every})})


# Fields that change where a run writes or how much memory a step takes, never what it computes: the learner's
# micro-batches add up to the minibatch's gradient (tests/test_training.py), so a run made under the old fixed
# 16,384-token micro-batch is the same run as one under today's model-shaped default.
NOT_THE_RUN = {"out": True, "optim": {"micro_batch_tokens"}}


def finished(cfg: Any, folder: Path) -> bool:
    """Has `folder` a finished run of `cfg` (its config.yaml, the fields in NOT_THE_RUN aside)?"""
    import yaml

    from agentrl.config import TrainConfig

    if not (folder / "summary.json").is_file() or not (folder / "config.yaml").is_file():
        return False
    done = TrainConfig(**yaml.safe_load((folder / "config.yaml").read_text()))
    return done.model_dump(exclude=NOT_THE_RUN) == cfg.model_dump(exclude=NOT_THE_RUN)


def run_record(folder: Path) -> dict[str, Any]:
    """One seed's curves from its metrics.jsonl: held out at step 0 and every evaluation, entropy, KL, rollout
    pass rate and health status per update, the alarms and warnings that fired (the update of the first), and the
    run's seconds (its last row's clock)."""
    from agentrl.report import read_metrics

    rows, _ = read_metrics(folder / "metrics.jsonl")
    held = [(r["step"], r["eval/pass_rate"]) for r in rows if isinstance(r.get("eval/pass_rate"), (int, float))]
    updates = [r for r in rows if r.get("step", 0) > 0 and not r.get("final")]

    def curve(key: str) -> list[float | None]:
        return [round(r[key], 5) if isinstance(r.get(key), (int, float)) else None for r in updates]

    fired: dict[str, int] = {}
    for r in updates:
        for reason in r.get("health/reasons") or []:
            fired.setdefault(reason.split(":", 1)[0], r["step"])
    entropy = curve("train/entropy")
    moved = [e for e in entropy if e is not None]
    head, tail = moved[:5], moved[-5:]
    return {"heldout": [{"step": s, "pass_rate": p} for s, p in held], "step0": held[0][1], "final": held[-1][1],
            "entropy": entropy, "kl": curve("train/kl"), "rollout_pass_rate": curve("rollout/pass_rate"),
            "status": [r.get("health/status") for r in updates], "fired": fired,
            "updates": len(updates), "updates_without_gradient": entropy.count(None),
            "entropy_last5_over_first5": round(statistics.mean(tail) / statistics.mean(head), 3) if head else None,
            "kl_max": max((k for k in curve("train/kl") if k is not None), default=None),
            "seconds": max((r.get("time", 0.0) for r in rows), default=None)}


def summarize(runs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Over seeds: mean and standard error at every evaluation step, the rise from step 0, and `ratio`."""
    steps = sorted({h["step"] for r in runs.values() for h in r["heldout"]})
    at = {str(s): mean_se([h["pass_rate"] for r in runs.values() for h in r["heldout"] if h["step"] == s])
          for s in steps}
    start, end = mean_se([r["step0"] for r in runs.values()]), mean_se([r["final"] for r in runs.values()])
    rises = [r["final"] - r["step0"] for r in runs.values()]
    spread = mean_se(rises)
    return {"heldout": at, "step0": start, "final": end,
            "rise": {"every_seed_above": all(x > 0 for x in rises), "mean": spread["mean"], "stderr": spread["stderr"],
                     "beyond_spread": len(rises) > 1 and spread["mean"] > 2 * (spread["stderr"] or 0.0)},
            "fired": sorted({a for r in runs.values() for a in r["fired"]}),
            "entropy_last5_over_first5": [r["entropy_last5_over_first5"] for r in runs.values()],
            "kl_max": max((r["kl_max"] for r in runs.values() if r["kl_max"] is not None), default=None),
            "ratio": round(end["mean"] / start["mean"], 3) if start["mean"] > 0 else None}


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    quick = args.quick
    for name, small, full in (("seeds", [0], [0, 1, 2]), ("updates", 4, 40), ("eval_every", 2, 10)):
        if getattr(args, name) is None:  # an explicit 0 is the user's (and TrainConfig judges it)
            setattr(args, name, small if quick else full)
    suffix = "-quick" if quick else ""
    sft_root, out = Path(args.sft_from + suffix), Path(args.out + suffix)
    runs: dict[int, dict[str, Any]] = {}
    t0 = time.perf_counter()
    for seed in args.seeds:
        sft = sft_root / args.family / f"seed{seed}" / "sft"
        folder = out / args.family / f"seed{seed}"
        rc, cfg = stage_config(args, seed, sft, folder)
        recipe_real.run_sft_stage(rc, sft)  # recipe_real's cached SFT model, built there if absent
        if finished(cfg, folder):
            print(f"seed {seed}: a finished run of this config in {folder}: read, not run", flush=True)
        else:
            from agentrl.trainer import Trainer

            Trainer(cfg, overwrite=True).train()
        runs[seed] = run_record(folder)
        r = runs[seed]
        print(f"seed {seed}: held out " + " -> ".join(f"{h['pass_rate']:.3f}" for h in r["heldout"])
              + f" (steps {', '.join(str(h['step']) for h in r['heldout'])}); entropy last5/first5 "
              f"{r['entropy_last5_over_first5']}; KL max {r['kl_max']}; fired: {r['fired'] or 'nothing'}", flush=True)
    summary = summarize(runs)
    res = {"model": recipe_real.MODEL if not quick else "the tiny policy (--quick)", "quick": quick,
           "family": args.family, "env": recipe_real.FAMILIES[args.family].env_id,
           "scorer": recipe_real.FAMILIES[args.family].scorer, "updates": args.updates,
           "eval_every": args.eval_every, "baseline": "the same run's step-0 held-out evaluation (the SFT model)",
           "ratio": summary["ratio"], "summary": summary, "runs": {str(s): r for s, r in runs.items()},
           "wall_s": round(time.perf_counter() - t0)}
    json_path = args.json or recipe_real.RESULTS / f"{NAME}{'_quick' if quick else ''}.json"
    report(NAME, res, path=json_path, summary={"ratio": res["ratio"], "step0": summary["step0"],
                                               "final": summary["final"], "rise": summary["rise"],
                                               "fired": summary["fired"], "wall_s": res["wall_s"]})


if __name__ == "__main__":
    main()
