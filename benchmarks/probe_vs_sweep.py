"""Does the horizon probe recommend what the horizon sweep measured as best, in sample and out of it?

    python benchmarks/probe_vs_sweep.py benchmarks/results/horizon_sweep.json
    python benchmarks/probe_vs_sweep.py runs/horizon-sweep/sweep.json --groups 8 --out runs/probe-vs-sweep
    python benchmarks/probe_vs_sweep.py benchmarks/results/horizon_sweep.json \\
        --holdout benchmarks/results/horizon_sweep_hanoi.json --recalibrate      # out of sample, then both

For each horizon of a sweep (benchmarks/horizon_sweep.py's sweep.json, any of its families), the probe
rolls out that horizon's warm start (rebuilt, or found in $AGENTRL_CACHE, with exactly the sweep's
arguments: `horizon_sweep.train_config` and `agentrl.stages.warm_start.warm_start`) at the sweep's knob and
slack, with thresholds derived from the first sweep (`thresholds_from_sweep`) and the sweep's per-run
budget. The recommendation agrees when it is the sweep's best assigner at that horizon or one whose mean
final pass rate lies within the seeds' spread of the best (`agentrl.probe.calibration.horizon_spread`).

With the committed sweep (benchmarks/results/horizon_sweep.json) these thresholds are the ones the
package ships (agentrl/probe/thresholds.json, rewritten by `python -m agentrl.probe calibrate` when
the sweep changes), so this checks the probe every install runs.

`--holdout SWEEP`: the probe, with thresholds calibrated on the first sweep only, at every horizon of
another sweep (another task family). Its regret there is the sweep-best assigner's mean final pass rate
minus the probe pick's, summed over horizons; every fixed choice (always grpo, always steppo, ...) gets
the same sum. The seeds' spread of a regret: each seed's sum of (best mean - that seed's final pass rate
of the choice), mean ± std over seeds. `--recalibrate` then calibrates on both sweeps merged (their
horizons ordered by max turns, the budget the smaller of the two; `merge_sweeps`), writes that
calibration beside the results (never over the packaged thresholds), and re-applies the rules to the
same probed statistics at every horizon of both families, so the two calibrations differ only in the
thresholds.

Baseline and ratio: the sweep itself is the baseline. Without --holdout, `ratio` (last line, JSON) is
the fraction of horizons where the recommendation agrees. With it, `ratio` is the best fixed choice's
regret over the probe's on the held-out family, each plus 0.005 (a tenth of one held-out evaluation's
standard error, so that a zero regret gives a finite figure): 1 is a tie, above 1 the probe beat every
fixed choice, below 1 some fixed choice beat it. A horizon report per horizon goes to --out.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import announce, parser, report  # noqa: E402
from horizon_sweep import ALGOS, FAMILIES, knob_of, train_config  # noqa: E402

from agentrl.probe.calibration import merge_sweeps  # noqa: E402

REGRET_FLOOR = 0.005


def finals_by_algo(h: dict[str, Any]) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for r in h["runs"].values():
        out.setdefault(r["algo"], {})[int(r["seed"])] = float(r["final_pass_rate"])
    return out


def regrets(sweep: dict[str, Any], picks: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Regret of the probe (its pick per horizon, `picks` keyed like sweep["horizons"]) and of every fixed
    choice: per horizon (best mean - the choice's mean) and its sum; per seed, that seed's sum."""
    present = [a for a in ALGOS if all(a in finals_by_algo(h) for h in sweep["horizons"].values())]
    choices = {"probe": picks, **{a: {k: a for k in sweep["horizons"]} for a in present}}
    out = {}
    for name, pick in choices.items():
        per_h, per_seed = {}, {}
        for k, h in sweep["horizons"].items():
            f = finals_by_algo(h)
            best = max(statistics.mean(v.values()) for v in f.values())
            if pick[k] not in f:
                raise ValueError(f"horizon {k}: the choice {pick[k]!r} has no runs in the sweep")
            per_h[k] = best - statistics.mean(f[pick[k]].values())
            for seed, x in f[pick[k]].items():
                per_seed[seed] = per_seed.get(seed, 0.0) + best - x
        seeds = list(per_seed.values())
        out[name] = {"per_horizon": per_h, "regret": sum(per_h.values()), "per_seed": per_seed,
                     "seed_std": statistics.stdev(seeds) if len(seeds) > 1 else 0.0}
    return out


def probe_sweep(sweep: dict[str, Any], th: Any, groups: int, out: Path, label: str,
                probed: dict[tuple[str, str], dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Probe every horizon of `sweep` with thresholds `th`: one row per horizon, with the probed statistics
    (so that other thresholds can be re-applied to them) and how the pick compares with the sweep. `probed`
    ((family, horizon key) -> an earlier row, `--probed`): reuse that row's statistics instead of rolling
    out again (they depend on the warm start only, not on the sweep's runs)."""
    from agentrl.horizon_report import write_report
    from agentrl.policy import Policy
    from agentrl.probe import ProbeStats, probe_env, recommend
    from agentrl.probe.calibration import summarize_sweep
    from agentrl.stages.warm_start import warm_start

    family = FAMILIES[sweep.get("family", "vault")]
    knob = knob_of(sweep)
    sargs = sweep.get("args") or {}
    measured = {h.max_turns: h for h in summarize_sweep(sweep)}
    rows = []
    for key, h in sweep["horizons"].items():
        n = int(h[knob])
        if not h.get("runs"):
            print(f"[{family.name} {knob} {n}] no runs in the sweep; skipped", flush=True)
            continue
        env_kw = family.env_kwargs(n, h["slack"])
        cfg = train_config(family.env_id, env_kw, h["demos"], h.get("sft_batch", 32), h["noise"], sargs)
        t1 = time.perf_counter()
        earlier = (probed or {}).get((family.name, key))
        if earlier is not None:
            s, budget = ProbeStats.model_validate(earlier["stats"]), earlier["budget_episodes"]
            rec, _ = recommend(s, th, budget)
        else:
            folder = warm_start(cfg.env.id, env_kw, cfg.tiny, cfg.sft, seed=0)
            result = probe_env(cfg, groups=groups, policy=Policy.load(folder), thresholds=th)
            write_report(result, out / label / f"{knob}{n}")
            rec, s, budget = result.recommendation, result.stats, result.budget_episodes
        m = measured[float(h["max_turns"])]
        rows.append({"family": family.name, "key": key, "knob": knob, "size": n, "max_turns": h["max_turns"],
                     "warm_start_pass_rate": h.get("warm_start_pass_rate"), "budget_episodes": budget,
                     "stats": s.model_dump(), "rule": rec.rule, "recommended": rec.algo, "best": m.best,
                     "means": m.means, "spread": m.spread, "within": m.within, "agree": rec.algo in m.within,
                     # a reused row keeps what its probe cost when it ran
                     "probe_s": earlier.get("probe_s", 0.0) if earlier is not None
                     else round(time.perf_counter() - t1, 1)})
        print(f"[{family.name} {knob} {n}] probe ({th.source} thresholds): {rec.algo} ({rec.rule}); sweep best "
              f"{m.best}, within spread "
              f"{m.within}", flush=True)
    return rows


def repick(rows: list[dict[str, Any]], th: Any) -> list[dict[str, Any]]:
    """The same probed statistics under other thresholds."""
    from agentrl.probe import ProbeStats, recommend

    out = []
    for r in rows:
        rec, _ = recommend(ProbeStats.model_validate(r["stats"]), th, r["budget_episodes"])
        out.append({**r, "rule": rec.rule, "recommended": rec.algo, "agree": rec.algo in r["within"]})
    return out


def agreement_table(rows: list[dict[str, Any]], title: str) -> Any:
    from rich.table import Table

    table = Table(title=title)
    for col in ("family", "knob", "max turns", "median turns", "zero-adv", "step dens.", "value R²", "conc / uniform",
                "rule", "probe picks", "sweep best", "within spread", "agree"):
        table.add_column(col)
    for r in rows:
        s = r["stats"]
        r2 = "-" if s["value_r2"] is None else f"{s['value_r2']:.2f}"
        conc = ("-" if s["value_change_concentration"] is None
                else f"{s['value_change_concentration']:.2f} / {s['uniform_share']:.2f}")
        table.add_row(r["family"], f"{r['knob']} {r['size']}", str(r["max_turns"]), f"{s['turns_median']:g}",
                      f"{s['zero_adv_frac']:.2f}", f"{s['step_reward_density']:.2f}", r2, conc, r["rule"],
                      r["recommended"], f"{r['best']} ({r['means'][r['best']]:.2f} ± {r['spread']:.2f})",
                      ", ".join(r["within"]), "yes" if r["agree"] else "NO")
    return table


def regret_table(reg: dict[str, dict[str, Any]], sweep: dict[str, Any], title: str) -> Any:
    from rich.table import Table

    knob = knob_of(sweep)
    keys = list(sweep["horizons"])
    table = Table(title=title)
    table.add_column("choice")
    for k in keys:
        table.add_column(f"{knob} {sweep['horizons'][k][knob]}")
    table.add_column("regret (sum), mean ± std over seeds")
    for name, r in sorted(reg.items(), key=lambda kv: (kv[0] != "probe", kv[1]["regret"])):
        table.add_row(name, *[f"{r['per_horizon'][k]:.3f}" for k in keys], f"{r['regret']:.3f} ± {r['seed_std']:.3f}")
    return table


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("sweep", help="a sweep.json written by benchmarks/horizon_sweep.py: the thresholds are "
                    "calibrated on it")
    ap.add_argument("--holdout", metavar="SWEEP", help="a second sweep (another family): probe it out of sample, "
                    "with the first sweep's thresholds, and compute regrets")
    ap.add_argument("--recalibrate", action="store_true", help="with --holdout: also calibrate on both sweeps and "
                    "re-pick at every horizon of both")
    ap.add_argument("--groups", type=int, default=8, help="tasks the probe rolls out per horizon (x the sweep's group "
                    "size)")
    ap.add_argument("--out", default="runs/probe-vs-sweep", help="a horizon report per horizon")
    ap.add_argument("--json-out", help="write every figure (probed statistics, picks, regrets) to this file")
    ap.add_argument("--probed", metavar="JSON", help="a --json-out of an earlier run: reuse its probed statistics "
                    "(same warm starts) instead of rolling out again, e.g. after more runs were added to a sweep")
    args = ap.parse_args()
    if args.recalibrate and not args.holdout:
        ap.error("--recalibrate needs --holdout (the second sweep to calibrate on)")

    from rich.console import Console

    import agentrl.adapters.textarena_games  # noqa: F401  (registers the TA- ids)
    from agentrl.probe import thresholds_from_sweep

    path = Path(args.sweep)
    sweep = json.loads(path.read_text())
    th = thresholds_from_sweep(sweep, source=str(path))
    out = Path(args.out)
    console = Console(width=220)
    t0 = time.perf_counter()
    cal_title = f"thresholds from {path}: cut-off {th.horizon_cutoff}, candidates {th.turn_level_candidates}"
    probed = None
    if args.probed:
        earlier = json.loads(Path(args.probed).read_text())
        probed = {(r["family"], r["key"]): r for k in ("rows", "holdout_rows", "calibration_rows")
                  for r in earlier.get(k, [])}
    if not args.holdout:
        rows = probe_sweep(sweep, th, args.groups, out, sweep.get("family", "vault"), probed)
        console.print(agreement_table(rows, f"probe vs sweep ({cal_title})"))
        agree = sum(r["agree"] for r in rows)
        record = {"benchmark": "probe_vs_sweep", "sweep": str(path), "sweep_started": sweep.get("started"),
                  "horizon_cutoff": th.horizon_cutoff, "candidates": th.turn_level_candidates,
                  "horizons": len(rows), "agree": agree,
                  "ratio": round(agree / len(rows), 3) if rows else None, "wall_s": round(time.perf_counter() - t0),
                  "per_horizon": [{k: r[k] for k in ("size", "rule", "recommended", "best", "within", "agree")}
                                  | {"turns_median": r["stats"]["turns_median"]} for r in rows]}
        if args.json_out:
            report("probe_vs_sweep", {**record, "rows": rows}, path=args.json_out, summary=record)
        else:
            announce("probe_vs_sweep", record)
        return

    hpath = Path(args.holdout)
    held = json.loads(hpath.read_text())
    held_rows = probe_sweep(held, th, args.groups, out, f"holdout-{held.get('family', 'vault')}", probed)
    if args.json_out:  # the probed statistics first: what --probed reuses, kept even if what follows fails
        Path(args.json_out).write_text(json.dumps({"holdout_rows": held_rows}, indent=1) + "\n")
    picks = {r["key"]: r["recommended"] for r in held_rows}
    reg = regrets(held, picks)
    console.print(agreement_table(held_rows, f"out of sample: probe on {hpath} ({cal_title})"))
    console.print(regret_table(reg, held, f"regret on {hpath} (thresholds from {path} only)"))
    fixed = {a: r for a, r in reg.items() if a != "probe"}
    best_fixed = min(fixed, key=lambda a: fixed[a]["regret"])
    record: dict[str, Any] = {
        "benchmark": "probe_vs_sweep", "mode": "holdout", "calibrated_on": str(path), "holdout": str(hpath),
        "holdout_family": held.get("family"), "horizon_cutoff": th.horizon_cutoff,
        "candidates": th.turn_level_candidates, "long_horizon_algo": th.long_horizon_algo,
        "probe_picks": picks, "probe_regret": round(reg["probe"]["regret"], 4),
        "probe_regret_seed_std": round(reg["probe"]["seed_std"], 4),
        "fixed_regret": {a: round(r["regret"], 4) for a, r in fixed.items()},
        "best_fixed": best_fixed, "best_fixed_regret": round(fixed[best_fixed]["regret"], 4),
        "probe_beats_every_fixed": all(reg["probe"]["regret"] < r["regret"] for r in fixed.values()),
        "ratio": round((fixed[best_fixed]["regret"] + REGRET_FLOOR) / (reg["probe"]["regret"] + REGRET_FLOOR), 3),
    }
    full: dict[str, Any] = {**record, "thresholds": th.model_dump(), "holdout_rows": held_rows, "regrets": reg}
    if args.recalibrate:
        from agentrl.probe.calibration import calibration_record

        merged = merge_sweeps({str(path): sweep, str(hpath): held})
        merged_path = hpath.with_name(hpath.stem + "_merged_for_calibration.json")
        merged_path.write_text(json.dumps(merged, indent=1) + "\n")
        both_rec = calibration_record(merged_path, name=str(merged_path))
        both_path = hpath.with_name("probe_vs_sweep_thresholds_both.json")
        both_path.write_text(json.dumps(both_rec, indent=2) + "\n")
        th2 = thresholds_from_sweep(merged, source=str(merged_path))
        cal_rows = probe_sweep(sweep, th, args.groups, out, f"calibration-{sweep.get('family', 'vault')}", probed)
        both_title = f"thresholds from both: cut-off {th2.horizon_cutoff}, candidates {th2.turn_level_candidates}"
        re_held, re_cal = repick(held_rows, th2), repick(cal_rows, th2)
        console.print(agreement_table(cal_rows, f"in sample: probe on {path} ({cal_title})"))
        console.print(agreement_table(re_cal + re_held, f"re-calibrated on both ({both_title})"))
        reg2_held = regrets(held, {r["key"]: r["recommended"] for r in re_held})
        reg2_cal = regrets(sweep, {r["key"]: r["recommended"] for r in re_cal})
        reg1_cal = regrets(sweep, {r["key"]: r["recommended"] for r in cal_rows})
        console.print(regret_table(reg2_held, held, f"regret on {hpath}, thresholds from both (in sample now)"))
        console.print(regret_table(reg1_cal, sweep, f"regret on {path}, thresholds from {path}"))
        console.print(regret_table(reg2_cal, sweep, f"regret on {path}, thresholds from both"))
        record["recalibrated"] = {
            "thresholds_file": str(both_path), "horizon_cutoff": th2.horizon_cutoff,
            "candidates": th2.turn_level_candidates, "long_horizon_algo": th2.long_horizon_algo,
            "min_budget_episodes": th2.min_budget_episodes,
            "holdout_picks": {r["key"]: r["recommended"] for r in re_held},
            "holdout_probe_regret": round(reg2_held["probe"]["regret"], 4),
            "calibration_picks_before": {r["key"]: r["recommended"] for r in cal_rows},
            "calibration_picks_after": {r["key"]: r["recommended"] for r in re_cal},
            "calibration_probe_regret_before": round(reg1_cal["probe"]["regret"], 4),
            "calibration_probe_regret_after": round(reg2_cal["probe"]["regret"], 4),
            "calibration_fixed_regret": {a: round(r["regret"], 4) for a, r in reg1_cal.items() if a != "probe"},
        }
        full.update(recalibrated=record["recalibrated"], thresholds_both=th2.model_dump(), calibration_rows=cal_rows,
                    regrets_both_holdout=reg2_held, regrets_calibration_before=reg1_cal,
                    regrets_calibration_after=reg2_cal)
    record["wall_s"] = round(time.perf_counter() - t0)
    if args.json_out:
        report("probe_vs_sweep", full | {"wall_s": record["wall_s"]}, path=args.json_out, summary=record)
    else:
        announce("probe_vs_sweep", record)


if __name__ == "__main__":
    main()
