"""Entropy collapse, made on purpose and caught: two GRPO runs on the default environment.

    python benchmarks/entropy_collapse.py                      # ~2 x 30 updates on 2 cores
    python benchmarks/entropy_collapse.py --updates 20 --out /tmp/ec

- **collapse**: no entropy term, low rollout temperature (0.7), a high learning rate (1e-3, 5x
  the default), no KL term: the policy sharpens onto whatever it samples first. (5e-4 collapsed the
  policy while Vault's observations said "N left"; once they named the next lock, 5e-4 only drifted.)
- **healthy** (the baseline): `agentrl train`'s defaults (temperature 1.0, lr 2e-4).

Both start from the same cached warm start, run with `--health.on-alarm warn` (they are only watched),
and keep their folders and reports (`<out>/<name>/report.html`). Success: ENTROPY COLLAPSE is
flagged in the first run and not in the second. The last line printed is one JSON object (also written to
`<out>/result.json`); its
`ratio` is the collapse run's final entropy as a fraction of its early level, divided by the
same fraction in the healthy run (below 1: the collapse run lost more of its entropy).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchlib import parser, report

from agentrl.config import TrainConfig
from agentrl.health import ENTROPY_COLLAPSE
from agentrl.health.series import early_level, series
from agentrl.report import read_metrics, write_report
from agentrl.stages.pipeline import train


def configs(args: argparse.Namespace) -> dict[str, TrainConfig]:
    common: dict[str, Any] = {"updates": args.updates, "seed": args.seed,
                              "eval": {"episodes": args.eval_episodes, "every": args.eval_every}}
    return {
        "collapse": TrainConfig(**common, out=str(args.out / "collapse"), optim={"lr": args.collapse_lr},
                                loss={"entropy_coef": 0.0, "kl_coef": 0.0},
                                rollout={"sampling": {"temperature": args.collapse_temperature}}),
        "healthy": TrainConfig(**common, out=str(args.out / "healthy")),
    }


def timeline(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """alarm -> the updates at which the run logged it on."""
    out: dict[str, list[float]] = {}
    for r in rows:
        if r.get("final"):
            continue
        for text in r.get("health/reasons", []):
            if ":" in text:
                out.setdefault(text.split(":", 1)[0], []).append(r["step"])
    return out


def figures(name: str, run: Path, summary: dict[str, Any], baseline_steps: int) -> dict[str, Any]:
    rows, _ = read_metrics(run / "metrics.jsonl")
    ent = series(rows, "train/entropy")
    early = early_level(ent, baseline_steps) or float("nan")
    alarms = timeline(rows)
    return {
        "name": name,
        "entropy_early": round(early, 4),
        "entropy_final": round(ent[-1][1], 4),
        "entropy_frac": round(ent[-1][1] / early, 4),
        "kl_final": round(series(rows, "train/kl")[-1][1], 4),
        "train_pass_final": round(series(rows, "rollout/pass_rate")[-1][1], 3),
        "heldout_pass": [summary["warm_start_pass_rate"], summary["final_pass_rate"]],
        "collapse_flagged": ENTROPY_COLLAPSE in alarms,
        "first_collapse_step": alarms.get(ENTROPY_COLLAPSE, [None])[0],
        "alarms": {k: [v[0], v[-1], len(v)] for k, v in alarms.items()},  # first, last, how many updates
        "wall_s": round(summary["wall_s"], 1),
        "report": str(run / "report.html"),
    }


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-episodes", type=int, default=64)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--collapse-lr", type=float, default=1e-3)
    ap.add_argument("--collapse-temperature", type=float, default=0.7)
    ap.add_argument("--out", type=Path, default=Path("runs/entropy_collapse"))
    ap.add_argument("--reuse", action="store_true", help="report on runs already in --out (finished) instead of "
                    "training them again")
    args = ap.parse_args()

    t0 = time.perf_counter()
    results = {}
    for name, cfg in configs(args).items():
        run = Path(cfg.out)
        summary = json.loads((run / "summary.json").read_text()) if args.reuse else train(cfg)
        write_report(run)
        results[name] = figures(name, run, summary, cfg.health.baseline_steps)
        print(f"{name}: alarms {results[name]['alarms'] or 'none'}; report {run / 'report.html'}", flush=True)
    c, h = results["collapse"], results["healthy"]
    out = {
        "benchmark": "entropy_collapse",
        "baseline": "healthy (agentrl train defaults)",
        "updates": args.updates,
        "demonstrated": c["collapse_flagged"] and not h["collapse_flagged"],
        "ratio": round(c["entropy_frac"] / h["entropy_frac"], 4),
        "collapse": c,
        "healthy": h,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    report("entropy_collapse", out, path=args.out / "result.json")  # adds the machine and the command


if __name__ == "__main__":
    main()
