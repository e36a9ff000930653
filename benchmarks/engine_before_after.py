"""The torch engine before and after a refactor: the same episodes, token for token.

Runs the episodes of `benchmarks/multi_turn.py` (its tiny policy, Vault at slack 0, no stop tokens, sampling at
temperature 1, one seed per episode) with the engine of two source trees and compares every sampled token id,
every log-prob and the engine's own counts (forwards, positions attended, padding, packed tokens). Each tree runs
in a subprocess of its own, with `PYTHONPATH=<tree>` and the tree as its working directory, through that tree's
own `benchmarks/multi_turn.py` (`engine_episodes`, whose `rollout` is wrapped to keep the episodes). The policy
is built once and loaded by both, so the two differ in nothing but their code. The env steps run serially
(`workers="serial"`): with threads a row rejoins the batch when its step finishes, so which rows share a forward
(and so the last bit of a log-prob, and the engine's counts) would vary from run to run; a row's tokens would not.

    python benchmarks/engine_before_after.py --before /work/before            # 2, 4 and 8 turns, 16 episodes
    python benchmarks/engine_before_after.py --before /work/before --quick    # 2 turns, 4 episodes

Last line: one JSON object, also written to benchmarks/results/engine_before_after[_quick].json: the tokens
compared, `mismatches` (token ids that differ, 0 when behaviour is unchanged), `ratio` (the share of tokens
equal: 1.0 when identical) and `identical` (tokens, log-probs and counts all equal). No timing: it is a
correctness check, run on whatever machine is at hand.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import parser, report

HERE = Path(__file__).resolve().parents[1]  # the tree this script belongs to: "after"


def worker(policy_dir: str, locks: list[int], episodes: int, new_tokens: int, out: str) -> None:
    """In a tree's own process: its multi_turn.py's episodes, their action ids and log-probs, and its counts."""
    import agentrl

    tree = Path.cwd().resolve()
    assert Path(agentrl.__file__).resolve().is_relative_to(tree), f"agentrl from {agentrl.__file__}, not {tree}"
    spec = importlib.util.spec_from_file_location("multi_turn", tree / "benchmarks" / "multi_turn.py")
    multi_turn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(multi_turn)
    kept = []

    def rollout(*args, **kwargs):  # serial env steps: the same rows in the same forwards in both trees
        episodes, stats = multi_turn_rollout(*args, workers="serial", **kwargs)
        kept.extend(episodes)
        return episodes, stats

    multi_turn_rollout, multi_turn.rollout = multi_turn.rollout, rollout
    policy = multi_turn.Policy.load(policy_dir)
    policy.model.eval()
    runs = []
    for n in locks:
        kept.clear()
        counts: dict[str, int] = {}
        multi_turn.engine_episodes(policy, n, list(range(episodes)), new_tokens, counts)
        runs.append({"locks": n, "counts": counts,
                     "ids": [[t.action_ids for t in e.turns] for e in kept],
                     "logprobs": [[t.logprobs for t in e.turns] for e in kept]})
    Path(out).write_text(json.dumps({"agentrl": agentrl.__file__, "runs": runs}))


def run_tree(tree: Path, policy_dir: str, args) -> dict:
    """This script's worker, run with `tree` as its working directory and the only agentrl on its path."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", out, "--policy", policy_dir,
           "--locks", *map(str, args.locks), "--episodes", str(args.episodes), "--new-tokens", str(args.new_tokens)]
    subprocess.run(cmd, cwd=tree, env=env, check=True)
    result = json.loads(Path(out).read_text())
    os.unlink(out)
    return result


def commit(tree: Path) -> str:
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--", "agentrl"], capture_output=True,
                           text=True)
    return head.stdout.strip() + (" (agentrl/ modified)" if dirty.stdout.strip() else "")


def main() -> None:
    ap = parser(__doc__, quick="2 turns, 4 episodes")
    ap.add_argument("--before", help="the tree before the change (a git worktree at the old commit)")
    ap.add_argument("--after", default=str(HERE), help="the tree after it (default: this script's)")
    ap.add_argument("--locks", type=int, nargs="+", default=[1, 2, 4], help="horizons: 2*locks turns each")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=16, help="tokens per action (every action is this long)")
    ap.add_argument("--policy", help=argparse.SUPPRESS)  # the worker's: where the policy was built
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # ... and where it writes its episodes
    args = ap.parse_args()
    if args.worker:
        worker(args.policy, args.locks, args.episodes, args.new_tokens, args.worker)
        return
    if not args.before:
        ap.error("--before: the tree to compare against is needed")
    if args.quick:
        args.locks, args.episodes = [1], 4
    trees = {"before": Path(args.before).resolve(), "after": Path(args.after).resolve()}

    # the policy multi_turn.py builds, once, in this process (this script's tree and its agentrl)
    sys.path[:0] = [str(HERE), str(HERE / "benchmarks")]
    import multi_turn

    with tempfile.TemporaryDirectory() as policy_dir:
        texts = multi_turn.expert_texts(multi_turn.make("agentrl/Vault-v0", locks=4, slack=0), range(200), noise=0.3)
        multi_turn.build_tiny_policy(texts, policy_dir, multi_turn.MODEL, seed=0)
        results = {side: run_tree(tree, policy_dir, args) for side, tree in trees.items()}

    before, after = results["before"]["runs"], results["after"]["runs"]
    compared = mismatches = logprob_mismatches = episodes = 0
    counts_equal, per_horizon = True, []
    for b, a in zip(before, after):
        tokens = [(x, y) for eb, ea in zip(b["ids"], a["ids"]) for tb, ta in zip(eb, ea) for x, y in zip(tb, ta)]
        lengths_equal = [[len(t) for t in e] for e in b["ids"]] == [[len(t) for t in e] for e in a["ids"]]
        differ = sum(x != y for x, y in tokens) + (0 if lengths_equal else 1)
        lp_differ = sum(x != y for eb, ea in zip(b["logprobs"], a["logprobs"]) for tb, ta in zip(eb, ea)
                        for x, y in zip(tb, ta))
        compared += len(tokens)
        mismatches += differ
        logprob_mismatches += lp_differ
        episodes += len(b["ids"])
        counts_equal &= b["counts"] == a["counts"]
        per_horizon.append({"locks": b["locks"], "turns": 2 * b["locks"], "episodes": len(b["ids"]),
                            "tokens": len(tokens), "mismatches": differ, "logprob_mismatches": lp_differ,
                            "counts_equal": b["counts"] == a["counts"], "counts": a["counts"]})
    result = {
        "before": {"tree": str(trees["before"]), "commit": commit(trees["before"])},
        "after": {"tree": str(trees["after"]), "commit": commit(trees["after"])},
        "locks": args.locks, "episodes": args.episodes, "new_tokens": args.new_tokens,
        "episodes_compared": episodes, "tokens_compared": compared, "mismatches": mismatches,
        "logprob_mismatches": logprob_mismatches, "counts_equal": counts_equal,
        "ratio": round((compared - mismatches) / compared, 6) if compared else None,
        "identical": compared > 0 and mismatches == 0 and logprob_mismatches == 0 and counts_equal,
        "per_horizon": per_horizon,
    }
    report("engine_before_after", result, quick=args.quick)


if __name__ == "__main__":
    main()
