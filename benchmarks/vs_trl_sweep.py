"""One GRPO update, agentrl against TRL's `GRPOTrainer`, across completion lengths, group sizes and KL beta.

`benchmarks/vs_trl.py` times one point: 32-token completions behind a 189-token prompt, where the prompt is
85% of each row and sharing it dominates, with beta 0.04 on both sides. This sweep runs that same benchmark,
each point in a fresh process, over completion length (`--lengths`, default 32 128 512), group size (`--groups`,
default 4 8 16) and beta (`--betas`, default 0 and 0.04). At beta 0 TRL skips the reference model; agentrl
still scores it, because its KL dashboard and the KL-drift alarm read the KL to the reference at every update
(docs/algorithms.md, Training health), so that arm prices the dashboard. Every point times `--updates` updates
after one warm-up on each side (vs_trl.py's protocol: same model, prompts, loss and optimizer).

    python benchmarks/vs_trl_sweep.py                    # the tiny policy, 18 points
    python benchmarks/vs_trl_sweep.py --quick            # lengths 32 128, group 4 8, beta 0.04: 4 points, 2 updates

Baseline and ratio: TRL is the baseline at every point; a row's `ratio` is TRL's seconds per update over
agentrl's; the summary `ratio` is the median over points, with `ratio_min` and `ratio_max` (the range the
README quotes). Last line: one JSON object; also written to benchmarks/results/vs_trl_sweep[_quick].json, after
every point (a run cut short keeps the points it finished).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import parser, report, save

HERE = Path(__file__).resolve().parent


def point(length: int, group: int, beta: float, args) -> dict:
    """vs_trl.py at one point, in a fresh process; its JSON reduced to the row this sweep keeps."""
    with tempfile.TemporaryDirectory(prefix="agentrl-vs-trl-sweep-") as tmp:
        out = Path(tmp) / "point.json"
        cmd = [sys.executable, str(HERE / "vs_trl.py"), "--model", args.model, "--prompts", str(args.prompts),
               "--group-size", str(group), "--max-new-tokens", str(length), "--kl-coef", str(beta),
               "--updates", str(args.updates), "--out", str(Path(tmp) / "work"), "--save", str(out)]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        res = json.loads(out.read_text())
    a, t = res["agentrl"], res["trl"]
    return {
        "max_new_tokens": length, "group_size": group, "beta": beta, "prompts": args.prompts,
        "agentrl_s_per_update": a["s_per_update"], "trl_s_per_update": t["s_per_update"],
        "agentrl_completion_tokens": a["mean_completion_tokens"], "trl_completion_tokens": t["mean_completion_tokens"],
        "ratio": res["ratio"], "ratio_min": res.get("ratio_min"), "fair": res.get("fair"),
        "agentrl_skipped_updates": res.get("agentrl_skipped_updates"), "seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    ap = parser(__doc__, quick="lengths 32 128, group sizes 4 8, beta 0.04, 2 timed updates")
    ap.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512], help="completion length caps (L)")
    ap.add_argument("--groups", type=int, nargs="+", default=[4, 8, 16], help="group sizes (G)")
    ap.add_argument("--betas", type=float, nargs="+", default=[0.0, 0.04], help="KL beta, both sides")
    ap.add_argument("--prompts", type=int, default=4, help="prompts (groups) per update")
    ap.add_argument("--updates", type=int, default=5, help="timed updates per side, after one warm-up")
    ap.add_argument("--model", default="tiny", help="as vs_trl.py --model")
    args = ap.parse_args()
    if args.quick:
        args.lengths, args.groups, args.betas, args.updates = [32, 128], [4, 8], [0.04], 2

    load_before = round(os.getloadavg()[0], 2)
    rows = []
    result: dict = {}
    for length, group, beta in itertools.product(args.lengths, args.groups, args.betas):
        row = point(length, group, beta, args)
        rows.append(row)
        print(f"L {length:4d}  G {group:3d}  beta {beta:<5g}: agentrl {row['agentrl_s_per_update']:7.2f} s/update, "
              f"TRL {row['trl_s_per_update']:7.2f} -> {row['ratio']:.2f}x ({row['seconds']:.0f} s)", flush=True)
        ratios = [r["ratio"] for r in rows]
        result = {
            "model": args.model, "prompts": args.prompts, "timed_updates": args.updates,
            "rows": rows, "ratio": round(statistics.median(ratios), 3),
            "ratio_min": min(ratios), "ratio_max": max(ratios),
            "ratio_is": "median over points of TRL's seconds per update over agentrl's (each point vs_trl.py's ratio)",
            "loadavg_1min_before": load_before, "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        }
        save("vs_trl_sweep", result, args.quick)
    by_beta = {str(b): round(statistics.median(r["ratio"] for r in rows if r["beta"] == b), 3) for b in args.betas}
    by_length = {str(n): round(statistics.median(r["ratio"] for r in rows if r["max_new_tokens"] == n), 3)
                 for n in args.lengths}
    result.update({"ratio_by_beta": by_beta, "ratio_by_length": by_length})
    report("vs_trl_sweep", result, args.quick,
           summary={k: result[k] for k in ("model", "ratio", "ratio_min", "ratio_max", "ratio_by_beta",
                                           "ratio_by_length")})


if __name__ == "__main__":
    main()
