"""Does the horizon probe recommend what the horizon sweep measured as best?

    python benchmarks/probe_vs_sweep.py benchmarks/results/horizon_sweep.json
    python benchmarks/probe_vs_sweep.py runs/horizon-sweep/sweep.json --groups 8 --out runs/probe-vs-sweep

For each horizon of a sweep (benchmarks/horizon_sweep.py's sweep.json), the probe rolls out that
horizon's warm start (rebuilt, or found in $AGENTRL_CACHE, with exactly the sweep's arguments:
`agentrl.stages.sft.warm_start`) on Vault at the sweep's locks and slack, with thresholds derived
from the same sweep (`thresholds_from_sweep`) and the sweep's per-run budget. The recommendation
agrees when it is the sweep's best assigner at that horizon or one whose mean final pass rate lies
within the seeds' spread of the best (`agentrl.probe.horizon_spread`).

With the committed sweep (benchmarks/results/horizon_sweep.json) these thresholds are the ones the
package ships (agentrl/probe/thresholds.json, rewritten by `python -m agentrl.probe calibrate` when
the sweep changes), so this checks the probe every install runs.

Baseline and ratio: the sweep itself is the baseline; `ratio` (last line, JSON) is the fraction
of horizons where the recommendation agrees. A horizon report per horizon goes to --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep", help="a sweep.json written by benchmarks/horizon_sweep.py")
    ap.add_argument("--groups", type=int, default=8, help="tasks the probe rolls out per horizon (x the sweep's group "
                    "size)")
    ap.add_argument("--out", default="runs/probe-vs-sweep", help="a horizon report per horizon")
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    from agentrl.config import TrainConfig
    from agentrl.horizon_report import write_report
    from agentrl.policy import Policy, TinyModelConfig
    from agentrl.probe import probe_env, summarize_sweep, thresholds_from_sweep
    from agentrl.stages.sft import warm_start

    path = Path(args.sweep)
    sweep = json.loads(path.read_text())
    sargs = sweep.get("args") or {}
    th = thresholds_from_sweep(sweep, source=str(path))
    measured = {h.locks: h for h in summarize_sweep(sweep)}
    tiny = TinyModelConfig(max_position_embeddings=2048)  # as the sweep builds it
    t0 = time.perf_counter()
    rows = []
    for h in sweep["horizons"].values():
        locks = int(h["locks"])
        if locks not in measured:
            print(f"[locks {locks}] no runs in the sweep; skipped", flush=True)
            continue
        env_kw = {"locks": locks, "slack": h["slack"]}
        # the sweep's warm start, argument for argument (benchmarks/horizon_sweep.py, main)
        cfg = TrainConfig(env={"id": "agentrl/Vault-v0", "kwargs": env_kw}, tiny=tiny,
                          sft={"episodes": h["demos"], "epochs": 4, "noise": h["noise"],
                               "batch_size": h.get("sft_batch", 32)},
                          rollout={"groups": sargs.get("groups", 4), "group_size": sargs.get("group_size", 8)},
                          eval={"episodes": sargs.get("eval_episodes", 128), "every": 0},
                          updates=sargs.get("updates", 20))
        folder = warm_start(cfg.env.id, env_kw, tiny, cfg.sft, seed=0)
        t1 = time.perf_counter()
        result = probe_env(cfg, groups=args.groups, policy=Policy.load(folder), thresholds=th)
        write_report(result, Path(args.out) / f"locks{locks}")
        m = measured[locks]
        rec = result.recommendation
        s = result.stats
        rows.append({"locks": locks, "max_turns": h["max_turns"], "turns_median": s.turns_median,
                     "turns_p90": s.turns_p90,
                     "zero_adv_frac": s.zero_adv_frac, "value_r2": s.value_r2,
                     "concentration": s.value_change_concentration,
                     "uniform_share": s.uniform_share, "rule": rec.rule, "recommended": rec.algo, "best": m.best,
                     "best_mean": m.means[m.best], "recommended_mean": m.means.get(rec.algo), "spread": m.spread,
                     "within": m.within,
                     "agree": rec.algo in m.within, "probe_s": round(time.perf_counter() - t1, 1)})
        print(f"[locks {locks}] probe: {rec.algo} ({rec.rule}); sweep best {m.best}, within spread {m.within}",
              flush=True)

    table = Table(title=f"probe vs sweep ({path}, thresholds: cut-off {th.horizon_cutoff}, candidates "
                  f"{th.turn_level_candidates})")
    for col in ("locks", "max turns", "median turns", "zero-adv", "value R²", "conc / uniform", "rule", "probe picks",
                "sweep best", "within spread", "agree"):
        table.add_column(col)
    for r in rows:
        r2 = "-" if r["value_r2"] is None else f"{r['value_r2']:.2f}"
        conc = "-" if r["concentration"] is None else f"{r['concentration']:.2f} / {r['uniform_share']:.2f}"
        table.add_row(str(r["locks"]), str(r["max_turns"]), f"{r['turns_median']:g}", f"{r['zero_adv_frac']:.2f}", r2,
                      conc, r["rule"],
                      r["recommended"], f"{r['best']} ({r['best_mean']:.2f} ± {r['spread']:.2f})",
                      ", ".join(r["within"]),
                      "yes" if r["agree"] else "NO")
    Console(width=200).print(table)
    agree = sum(r["agree"] for r in rows)
    print(json.dumps({"benchmark": "probe_vs_sweep", "sweep": str(path), "sweep_started": sweep.get("started"),
                      "horizon_cutoff": th.horizon_cutoff, "candidates": th.turn_level_candidates,
                      "horizons": len(rows), "agree": agree,
                      "ratio": round(agree / len(rows), 3) if rows else None, "wall_s": round(time.perf_counter() - t0),
                      "per_horizon": [{k: r[k] for k in ("locks", "turns_median", "rule", "recommended", "best",
                                                         "within", "agree")} for r in rows]}))


if __name__ == "__main__":
    main()
