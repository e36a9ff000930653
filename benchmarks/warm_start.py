"""Warm start: which expert slip rate gives RL the best start, across kinds of environments.

    python benchmarks/warm_start.py                 # 4 envs x 3 rules x 3 seeds (~45 min on 2 cores)
    python benchmarks/warm_start.py --quick         # 2 envs x 3 rules x 1 seed, smaller (< 5 min)
    python benchmarks/warm_start.py --envs sokoban --seeds 0

For each environment and seed, three rules choose `--sft.noise`, and each warm start is trained
with the same fixed small RL budget (grpo):

- `default`: 0.35, the default (Vault's);
- `old_auto`: the old `--sft.noise auto`, the slip rate at which the *expert* passes 0.5 of 48
  episodes (`agentrl.stages.warm_start.calibrate_noise`);
- `new_auto`: today's `--sft.noise auto`, judged by the *warm start's* own pass rate
  (`agentrl.stages.warm_start.choose_noise`: keep 0.35 inside the useful band, cleaner demonstrations below it).

The environments are one of each kind: slips that are fatal (Vault: a wrong code loses), slips that
can be recovered from (TextArena's Sokoban: a detour costs turns), long episodes (TextWorld), and a
plain gymnasium text env (GuessNumber, `examples/gym_guess.py`, through `gym:`). Recorded per cell:
the noise chosen, the warm start's held-out pass rate and the pass rate after RL, and whether the
warm start lay inside the useful band. The baseline is `default`; `ratio` (last line, one JSON
object) is new_auto's mean final pass rate over default's, over every env and seed. Every cell goes to
benchmarks/results/warm_start.json (a quick run: warm_start_quick.json), rewritten after each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `gym:examples.gym_guess:...` imports the example from the checkout
sys.path.insert(0, str(ROOT / "benchmarks"))
from benchlib import parser, report, save  # noqa: E402

# (env id, kwargs, demonstrations, SFT epochs, tiny model: None for TrainConfig's default): sized so that the
# default's warm start learns something (the sizing runs are in benchmarks/results/warm_start.json's note)
ENVS: dict[str, tuple[str, dict, int, int, dict | None]] = {
    "vault": ("agentrl/Vault-v0", {"locks": 1}, 1000, 4, None),
    "sokoban": ("agentrl/TA-Sokoban-v0", {"size": 5, "boxes": 1}, 400, 4, None),
    "textworld": ("agentrl/TextWorld-v0", {"quest_length": 2, "games": 2}, 256, 9, None),
    "guess": ("gym:examples.gym_guess:GuessNumber-v0", {}, 600, 8, None),
}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 1024, "vocab_size": 600}  # --small: the reduced model


OLD_AUTO: dict[str, float] = {}  # the old rule's noise depends on the env alone: bisected once per env


def cell(env: str, rule: str, seed: int, args: argparse.Namespace, out: Path, default: dict | None) -> dict:
    from agentrl.config import SFTConfig, TrainConfig
    from agentrl.registry import make
    from agentrl.stages.pipeline import train
    from agentrl.stages.warm_start import calibrate_noise

    env_id, kwargs, demos, epochs, tiny = ENVS[env]
    demos = max(50, int((args.demos or demos) * args.scale))
    epochs = args.epochs or epochs
    tiny = TINY if args.small else (tiny or {})
    noise: float | str = SFTConfig.model_fields["noise"].default
    if rule == "old_auto":
        if env not in OLD_AUTO:  # the rule --sft.noise auto used to apply
            OLD_AUTO[env] = calibrate_noise(make(env_id, **kwargs), 0.5, 48)[0]
        noise = OLD_AUTO[env]
    elif rule == "new_auto":
        noise = "auto"
    cfg = TrainConfig(env={"id": env_id, "kwargs": kwargs}, algo="grpo", updates=args.updates, seed=seed,
                      tiny=tiny, eval={"episodes": args.eval_episodes, "every": 0},
                      rollout={"groups": args.groups, "group_size": 8},
                      sft={"episodes": demos, "epochs": epochs, "noise": noise,
                           "calibration_episodes": args.calibration_episodes},
                      out=str(out / f"{env}-{rule}-seed{seed}"))
    t0 = time.perf_counter()
    lo, hi = SFTConfig().useful_band
    if rule == "new_auto" and default is not None:
        from agentrl.stages.warm_start import warm_start

        said_auto: list[str] = []
        folder = warm_start(env_id, kwargs, cfg.tiny, cfg.sft, seed, say=said_auto.append)
        chosen = json.loads((folder / "warm_start.json").read_text())["noise_auto"]
        if chosen["noise"] == default["noise"]:  # the default's warm start, bit for bit: its RL run is this one's
            return {**default, "rule": rule, "noise_auto": chosen, "reused": "the default's warm start and RL run",
                    "said": [t for t in said_auto if t.startswith("warm start: noise")],
                    "wall_s": round(time.perf_counter() - t0, 1)}
    said: list[str] = []
    from agentrl.monitor import SilentMonitor

    class Quiet(SilentMonitor):  # keeps what the run says, to record the auto rule's own account
        def say(self, text: str) -> None:
            said.append(text)

    summary = train(cfg, monitor=Quiet(cfg.out, cfg.updates), overwrite=True)
    sft = (summary.get("decisions", {}).get("warm_start") or {}).get("sft") or {}
    warm = summary["warm_start_pass_rate"]
    return {"env": env, "rule": rule, "seed": seed, "demonstrations": demos, "epochs": epochs,
            "noise": sft.get("noise", noise),
            "noise_auto": sft.get("noise_auto"), "expert_pass_rate": sft.get("demo_pass_rate"),
            "warm": warm, "final": summary["final_pass_rate"], "in_band": lo <= warm <= hi,
            "warning": next((t for t in said if t.startswith("warning: the warm start")), None),
            "said": [t for t in said if t.startswith("warm start: noise")],
            "wall_s": round(time.perf_counter() - t0, 1)}


def main() -> None:
    from agentrl.config import SFTConfig

    ap = parser(__doc__, quick="vault and guess, 1 seed, half the demonstrations")
    ap.add_argument("--envs", nargs="+", choices=list(ENVS), default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=None)
    ap.add_argument("--updates", type=int, default=None, help="grpo updates after the warm start (default 4; quick 2)")
    ap.add_argument("--groups", type=int, default=4, help="tasks per update, 8 episodes each")
    ap.add_argument("--eval-episodes", type=int, default=None, help="held-out episodes (default 32; quick 24)")
    ap.add_argument("--calibration-episodes", type=int, default=None,
                    help="held-out episodes per probed warm start under auto (default: --eval-episodes; the "
                         "library's default is 64)")
    ap.add_argument("--scale", type=float, default=None, help="demonstrations x this (default 1; quick 0.5)")
    ap.add_argument("--demos", type=int, default=None, help="demonstrations for every env (default: ENVS's)")
    ap.add_argument("--epochs", type=int, default=None, help="SFT epochs for every env (default: ENVS's)")
    ap.add_argument("--small", action="store_true", help="the reduced TINY model instead of the default tiny policy")
    ap.add_argument("--rules", nargs="+", choices=["default", "old_auto", "new_auto"], default=None,
                    help="the rules to run (default all three; new_auto reuses default's cell where it keeps 0.35)")
    ap.add_argument("--note", default="", help="a note kept in the results JSON (how the sizes were chosen)")
    ap.add_argument("--out", default="runs/warm-start")
    ap.add_argument("--results", default=None, help="default: benchmarks/results/warm_start[_quick].json")
    args = ap.parse_args()
    args.envs = args.envs or (["vault", "guess"] if args.quick else list(ENVS))
    args.seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    args.updates = args.updates if args.updates is not None else (2 if args.quick else 4)
    args.eval_episodes = args.eval_episodes or (24 if args.quick else 32)
    args.calibration_episodes = args.calibration_episodes or args.eval_episodes
    args.scale = args.scale or (0.5 if args.quick else 1.0)
    os.environ.setdefault("AGENTRL_CACHE", str(Path(args.out) / "cache"))  # warm starts of this run only

    rules = args.rules or ["default", "old_auto", "new_auto"]
    out = Path(args.out)
    results: dict = {"benchmark": "warm_start", "partial": True, "note": args.note,
                     "started": time.strftime("%Y-%m-%d %H:%M"), "quick": args.quick, "updates": args.updates,
                     "groups": args.groups, "group_size": 8, "eval_episodes": args.eval_episodes,
                     "calibration_episodes": args.calibration_episodes,
                     "scale": args.scale, "useful_band": list(SFTConfig().useful_band),
                     "envs": {e: {"id": ENVS[e][0], "kwargs": ENVS[e][1], "demonstrations": args.demos or ENVS[e][2],
                                  "epochs": args.epochs or ENVS[e][3],
                                  "tiny": TINY if args.small else (ENVS[e][4] or "TrainConfig's default")}
                              for e in args.envs},
                     "load_average_start": os.getloadavg()[0], "cells": []}
    t0 = time.perf_counter()
    lines: list[str] = []
    for seed in args.seeds:  # every env at one seed before the next seed: a cut-short run still covers them all
        for env in args.envs:
            default = None
            for rule in rules:  # default first: new_auto's first probe (0.35) is the same warm start, cached
                row = cell(env, rule, seed, args, out, default)
                default = row if rule == "default" else default
                results["cells"].append(row)
                print(f"{env:9s} seed {seed} {rule:8s} noise {row['noise']!s:7.7s} warm {row['warm']:.3f} -> "
                      f"final {row['final']:.3f}{'' if row['in_band'] else ' (warm start outside the band)'} "
                      f"({row['wall_s']:.0f}s)", flush=True)
                results["wall_s"] = round(time.perf_counter() - t0)
                lines = summarize(results, args.envs, rules)  # rewritten after every cell: a cut-short run keeps all
                save("warm_start", results, args.quick, args.results)
    results["partial"] = False
    results["load_average_end"] = os.getloadavg()[0]
    print("\n".join(lines))
    mean = {rule: statistics.mean(r["final"] for r in results["cells"] if r["rule"] == rule) for rule in rules}
    report("warm_start", results, args.quick, args.results,
           summary={"quick": args.quick, "envs": args.envs, "seeds": len(args.seeds), "updates": args.updates,
                    **{f"final_{k}": round(v, 3) for k, v in mean.items()}, "wall_s": results["wall_s"],
                    "done_when": results["done_when"],
                    "ratio": (round(mean["new_auto"] / mean["default"], 3)
                              if mean.get("default") and "new_auto" in mean else None)})


def summarize(results: dict, envs: list[str], rules: list[str]) -> list[str]:
    """Per env and rule: means over the seeds run so far (into results["summary"]), the issue's two
    "done when" lines per env (into results["done_when"]), and the table as markdown lines."""
    summary: dict = {}
    lines = ["| env | rule | noise | warm start | after RL | warm start in band |", "|---|---|---|---|---|---|"]
    for env in envs:
        for rule in rules:
            rows = [r for r in results["cells"] if r["env"] == env and r["rule"] == rule]
            if not rows:
                continue
            warm, final = statistics.mean(r["warm"] for r in rows), statistics.mean(r["final"] for r in rows)
            sd = statistics.stdev(r["final"] for r in rows) if len(rows) > 1 else 0.0
            noises = "/".join(f"{float(r['noise']):.3g}" for r in rows)
            summary[f"{env}/{rule}"] = {"noise": [r["noise"] for r in rows], "warm": round(warm, 3),
                                        "final": round(final, 3), "final_sd": round(sd, 3),
                                        "in_band": sum(r["in_band"] for r in rows), "seeds": len(rows)}
            lines.append(f"| {env} | {rule} | {noises} | {warm:.3f} | {final:.3f} ± {sd:.3f} | "
                         f"{sum(r['in_band'] for r in rows)}/{len(rows)} |")
    done: dict = {}
    for env in envs:
        new, dflt, old = (summary.get(f"{env}/{r}") for r in ("new_auto", "default", "old_auto"))
        if new is None:
            continue
        row: dict = {}
        if dflt is not None:
            row["new_auto_final_ge_default"] = new["final"] >= dflt["final"]
        if old is not None:
            row["old_auto_outside_band"] = old["in_band"] < old["seeds"]
            if row["old_auto_outside_band"]:
                row["new_auto_final_gt_old_auto"] = new["final"] > old["final"]
        done[env] = row
    results["summary"], results["done_when"] = summary, done
    return lines


if __name__ == "__main__":
    main()
