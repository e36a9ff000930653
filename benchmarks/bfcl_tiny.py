"""A short `agentrl train` on BFCL-v0 with the tiny policy: does the held-out pass rate rise above its warm start?

The run is `agentrl train`'s own route for an env with an expert: the tiny policy is built, warm-started by SFT
on the expert's noisy demonstrations (BFCL's ground-truth calls), evaluated (the baseline, measured in the same
run), trained with grpo, evaluated again. BFCL's full prompts (20-40 functions, 9,000-21,000 characters of schema)
do not fit a small policy's context, so the run uses ``functions=path`` (only the functions each entry's solution
uses) on a few of the base category's shortest entries; the held-out episodes are those same entries (other
seeds), so this measures learning the entries, not generalising to new ones.

    nice -n 10 python benchmarks/bfcl_tiny.py

Last line: one JSON object (also written to benchmarks/results/bfcl_tiny.json); ``ratio`` is the final held-out
pass rate over the warm start's.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import parser, report  # noqa: E402
from train_runs import train  # noqa: E402

ENTRIES = [144, 91, 100, 115]  # base entries with the shortest prompts under functions=path (1,359-1,900 chars)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--updates", type=int, default=4)
    p.add_argument("--eval-episodes", type=int, default=16)
    p.add_argument("--sft-episodes", type=int, default=160)
    p.add_argument("--sft-epochs", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="benchmarks/results/bfcl_tiny.json")
    args = p.parse_args()
    # split=train named: the held-out evaluation plays these same entries (other seeds), not BFCL's eval split
    flags = ["--env.id", "agentrl/BFCL-v0", "--env-kw", "functions=path", "--env-kw", f"subset={ENTRIES}",
             "--env-kw", "split=train",
             "--tiny.max-position-embeddings", "4096", "--rollout.sampling.max-new-tokens", "160",
             "--sft.episodes", str(args.sft_episodes), "--sft.epochs", str(args.sft_epochs),
             "--rollout.groups", "4", "--rollout.group-size", "4"]
    with tempfile.TemporaryDirectory() as tmp:
        run = train(Path(tmp) / "run", 0, args.updates, args.eval_episodes, flags, args.threads)
        rows = [json.loads(x) for x in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    # why a flat run is flat: all-fail groups give grpo no advantage to follow
    per_update = [{k: r.get(k) for k in ("step", "rollout/pass_rate", "credit/zero_adv_frac", "credit/all_fail_frac",
                                         "rollout/malformed_per_episode", "rollout/turns_mean")}
                  for r in rows if r.get("step", 0) > 0 and "rollout/pass_rate" in r]
    warm, final = run["warm_start_pass_rate"], run["final_pass_rate"]
    result = {"benchmark": "bfcl_tiny", "env": "agentrl/BFCL-v0 (base, functions=path)", "entries": ENTRIES,
              "baseline": "the SFT warm start, evaluated in the same run", "warm_start_pass_rate": warm,
              "final_pass_rate": final, "ratio": round(final / warm, 3) if warm else None,
              "updates": args.updates, "eval_episodes": args.eval_episodes, "per_update": per_update, "run": run}
    report("bfcl_tiny", result, path=args.out)  # adds the machine and the command


if __name__ == "__main__":
    main()
