"""Context policies on a task that needs memory across the cut: VaultMemory-v0 at a context budget of about a
quarter of the expert's episode, every policy from one warm start, trained with grpo over several seeds.

    python benchmarks/context.py                    # 5 arms x 3 seeds x 30 updates: a 13-minute warm start (cached),
                                                    # then 17 minutes on 2 cores
    python benchmarks/context.py --quick            # 5 arms x 1 seed, a few episodes (a smoke run of the path)
    python benchmarks/context.py --arms summarize window --seeds 0 --updates 2   # one comparison, small

The env (`agentrl/VaultMemory-v0`, `--patrols`, `--log-lines`): the codes of two doors are read in the first
two turns, a patrol of long logs follows, and the doors open only with those codes. The budget
(`rollout.context.budget`, `--budget`) holds about a quarter of the noise-free expert's episode (the measured
share is recorded), so every arm must cut the context several times. Arms (`ARMS`): `truncate` (the episode
ends at the budget), `drop-observations` and `window` (the last `--keep-turns` turns kept whole), `summarize`
(the policy writes a summary, trained as an action) and `summarize-masked` (the same with `mask_summary`: the
summary's tokens are left out of the loss).

One warm start serves every arm: the tiny policy fine-tuned on the noisy expert's demonstrations played under
`summarize` at this budget (so the summary turns, written by the expert, are demonstrations too; cached, so a
second run skips it). Per arm: the warm start's held-out pass rate under the arm's policy (before), with the
compactions per episode, the peak KV-cache size and the seconds per turn over the first and the last quarter
of the episode's turns (a held-out rollout through an engine that times each batched turn); then per seed a
grpo run from the warm start and its final held-out pass rate (after). Baseline and ratio: `ratio` (last
line) is `summarize`'s mean final pass rate over the best other arm's (`summarize-masked` aside: it is the
same policy with an ablation, reported beside it); None where every other arm ends at 0.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchlib import parser, report, save

# arm -> rollout.context (the budget and the shared options are added in `context_of`)
ARMS: dict[str, dict[str, Any]] = {  # in the order they run: a run cut short has the comparison that matters first
    "summarize": {"policy": "summarize"},
    "summarize-masked": {"policy": "summarize", "mask_summary": True},
    "window": {"policy": "window"},
    "truncate": {"policy": "truncate"},
    "drop-observations": {"policy": "drop-observations"},
}
ENV_ID = "agentrl/VaultMemory-v0"
MAX_NEW_TOKENS = 24  # an action of the tiny policy is under 12 tokens and the expert's summary of two codes under 20
STUB = "(removed)"  # drop-observations: a short stub, so that the stubs themselves do not fill the budget


def context_of(arm: str, budget: int, keep_turns: int) -> dict[str, Any]:
    return {**ARMS[arm], "budget": budget, "keep_turns": keep_turns, "summary_max_tokens": MAX_NEW_TOKENS,
            "stub": STUB}


def config(args: Any, arm: str, seed: int, model: str | None = None, out: str | None = None) -> Any:
    from agentrl.config import TinyModelConfig, TrainConfig

    return TrainConfig(
        env={"id": ENV_ID, "kwargs": env_kwargs(args)}, tiny=TinyModelConfig(), algo="grpo", seed=seed,
        model=model, out=out or "runs/context",
        sft={"episodes": args.demos, "epochs": args.epochs, "noise": args.noise, "batch_size": args.sft_batch},
        rollout={"groups": args.groups, "group_size": args.group_size,
                 "sampling": {"max_new_tokens": MAX_NEW_TOKENS},
                 "context": context_of(arm, args.budget, args.keep_turns)},
        eval={"episodes": args.eval_episodes, "every": 0}, updates=args.updates)


def env_kwargs(args: Any) -> dict[str, int]:
    return {"doors": 2, "patrols": args.patrols, "log_lines": args.log_lines, "slack": args.slack}


class _TimedSession:
    """An engine session that records, for every batched turn, its wall time, the turn index of its rows (the
    median: in lockstep they move together) and the KV cache's size (rows x positions) after it."""

    def __init__(self, session: Any, calls: list[dict[str, float]]):
        self._session, self._calls, self._turn = session, calls, collections.Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def start(self, rows: Any) -> None:
        self._rows, self._t0 = list(rows), time.perf_counter()
        self._session.start(rows)

    def collect(self) -> Any:
        out = self._session.collect()
        seconds = time.perf_counter() - self._t0
        turn = statistics.median(self._turn[r] for r in self._rows)
        self._turn.update(self._rows)
        mask = getattr(self._session, "mask", None)
        self._calls.append({"seconds": seconds, "turn": turn, "positions": 0 if mask is None else mask.numel()})
        return out


class _TimedEngine:
    def __init__(self, engine: Any):
        self._engine, self.calls = engine, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def open(self, prompts: Any) -> _TimedSession:
        return _TimedSession(self._engine.open(prompts), self.calls)


def measure(cfg: Any, policy: Any) -> dict[str, Any]:
    """The held-out episodes of `policy` under `cfg`'s context policy, in lockstep, through a timed engine: pass
    rate, compactions, turns, the peak KV cache and the seconds per batched turn over the first and last quarter."""
    from agentrl.evaluation import eval_sampling, make_engine
    from agentrl.registry import make
    from agentrl.rollout import rollout

    sampling = eval_sampling(cfg)
    engine = _TimedEngine(make_engine(cfg, policy, sampling, seed=cfg.seed + 12345))
    seeds = [cfg.eval.seed_offset + i for i in range(cfg.eval.episodes)]
    envs = [make(cfg.env.id, **cfg.env.kwargs) for _ in seeds]
    t0 = time.perf_counter()
    episodes, stats = rollout(envs, seeds, engine, policy.chat, max_context=cfg.tiny.max_position_embeddings,
                              max_new_tokens=sampling.max_new_tokens, workers="thread:8", schedule="lockstep",
                              context=cfg.rollout.context)
    seconds = time.perf_counter() - t0
    m = policy.model.config
    per_position = 2 * m.num_hidden_layers * m.num_key_value_heads * (m.hidden_size // m.num_attention_heads) * 4
    turns = max(c["turn"] for c in engine.calls) + 1
    first = [c["seconds"] for c in engine.calls if c["turn"] < turns / 4]
    last = [c["seconds"] for c in engine.calls if c["turn"] >= 3 * turns / 4]
    n = len(episodes)
    return {"pass_rate": sum(e.passed for e in episodes) / n,
            "truncated": sum(e.truncated for e in episodes) / n,
            "turns_mean": statistics.mean(e.num_turns for e in episodes),
            "summaries_per_episode": sum(t.kind == "summary" for e in episodes for t in e.turns) / n,
            "compactions_per_episode": stats.compactions / n,
            "context_metrics": {k: round(v, 4) for k, v in stats.extra.items() if k.startswith("context/")},
            "peak_kv_cache_mb": round(max(c["positions"] for c in engine.calls) * per_position / 2**20, 3),
            "seconds_per_turn_first_quarter": round(statistics.mean(first), 4) if first else None,
            "seconds_per_turn_last_quarter": round(statistics.mean(last), 4) if last else None,
            "batched_turns": len(engine.calls), "seconds": round(seconds, 1)}


def quarters(values: list[float]) -> list[float] | None:
    """[mean of the first quarter, mean of the last quarter] of a run's per-update values (None when it has none)."""
    if not values:
        return None
    k = max(1, len(values) // 4)
    return [round(statistics.mean(values[:k]), 4), round(statistics.mean(values[-k:]), 4)]


def expert_tokens(args: Any, policy: Any) -> float:
    """The noise-free expert's episode in tokens (the whole conversation, no budget): what the budget is a share of."""
    from agentrl.registry import make
    from agentrl.stages.sft import collect_demos

    demos = collect_demos(lambda: make(ENV_ID, **env_kwargs(args)), policy.chat, list(range(40_000_000, 40_000_016)),
                          0.0)
    return statistics.mean(len(d.token_ids()) for d in demos)


def bounded_cost(args: Any, policy: Any) -> dict[str, Any]:
    """The warm start under `summarize` on a 16-turn and a 128-turn VaultMemory (`patrols` 12 and 124, the
    benchmark's logs and budget): the peak KV cache of each, which the issue bounds at 1.2x (128 over 16)."""
    rows = {}
    for turns in (16, 128):
        sized_args = argparse.Namespace(**{**vars(args), "patrols": turns - 4, "eval_episodes": args.cost_episodes})
        m = measure(config(sized_args, "summarize", 0), policy)
        rows[str(turns)] = {k: m[k] for k in ("peak_kv_cache_mb", "turns_mean", "compactions_per_episode",
                                              "seconds_per_turn_first_quarter", "seconds_per_turn_last_quarter")}
        print(f"bounded cost: {turns}-turn VaultMemory under summarize: {m['turns_mean']:.0f} turns, "
              f"{m['compactions_per_episode']:.1f} compactions, peak KV cache {m['peak_kv_cache_mb']} MB", flush=True)
    rows["peak_ratio_128_over_16"] = round(rows["128"]["peak_kv_cache_mb"] / rows["16"]["peak_kv_cache_mb"], 3)
    return rows


def build_parser() -> Any:
    ap = parser(__doc__, quick="a smoke run of every arm: 1 seed, 1 update of 4 episodes, 4 held-out episodes, a "
                "warm start on 32 demonstrations, a 12-turn episode at a budget of 160")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--eval-episodes", type=int, default=64)
    ap.add_argument("--demos", type=int, default=3200, help="the warm start's expert demonstrations")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--sft-batch", type=int, default=8, help="demonstrations per SFT step. Copying a three-digit "
                    "code across a cut is what the tiny policy learns last: 300 steps (400 demonstrations) copied none "
                    "(held-out pass 0.00), 600 and 1,200 steps at noise 0.2 copied the first door's (0.03-0.06), "
                    "1,600 steps at noise 0.1 copy both (0.72)")
    ap.add_argument("--noise", type=float, default=0.1, help="the expert's slip rate in the demonstrations: at 0.2 "
                    "the warm start copies the slips too (a garbled call or a skipped patrol step every few turns), "
                    "and an episode of 28 turns has 4 to spare")
    ap.add_argument("--patrols", type=int, default=20, help="VaultMemory's patrol steps (the episode's length)")
    ap.add_argument("--log-lines", type=int, default=8, help="lines per patrol log (the tool results' length)")
    ap.add_argument("--slack", type=int, default=4)
    ap.add_argument("--budget", type=int, default=256, help="rollout.context.budget in tokens")
    ap.add_argument("--keep-turns", type=int, default=2, help="window and drop-observations: turns kept whole")
    ap.add_argument("--cost-episodes", type=int, default=8, help="episodes of the 16- and 128-turn bounded-cost "
                    "measurement")
    ap.add_argument("--out", default="runs/context")
    ap.add_argument("--save", default=None, help="write the JSON here instead of benchmarks/results/context.json "
                    "(more seeds of some arms, kept beside the main run)")
    ap.add_argument("--from-json", metavar="CONTEXT_JSON", help="only recompute a finished run's derived figures "
                    "(best other arm, ratio, trained over masked), its table and its report")
    return ap


def sized(args: Any) -> Any:
    """`args` at the quick run's size where --quick is set."""
    if args.quick:
        args.seeds, args.updates, args.groups, args.group_size = [0], 1, 2, 2
        args.eval_episodes, args.demos, args.epochs, args.patrols, args.budget = 4, 32, 1, 4, 160
        args.cost_episodes = 2
    return args


def main() -> None:
    args = sized(build_parser().parse_args())
    if args.from_json:  # a finished run's derived figures and table, again (the runs themselves are not touched)
        results = json.loads(Path(args.from_json).read_text())
        results.pop("benchmark", None)
        results["derived_by"] = " ".join(["python", "benchmarks/context.py", "--from-json", args.from_json])
        finish(results, args)
        return

    import torch
    from rich.console import Console

    from agentrl.config import TrainConfig
    from agentrl.evaluation import EvalResult
    from agentrl.health.alarms import ALARMS
    from agentrl.monitor import Monitor
    from agentrl.policy import Policy
    from agentrl.stages.pipeline import demo_context
    from agentrl.stages.warm_start import warm_start
    from agentrl.trainer import Trainer

    torch.set_num_threads(2)
    out = Path(args.out)
    t_start = time.perf_counter()
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M"), "env_id": ENV_ID,
                               "env_kwargs": env_kwargs(args), "args": vars(args), "arms": {}}
    base = config(args, "summarize", 0)
    t0 = time.perf_counter()
    folder = warm_start(base.env.id, base.env.kwargs, base.tiny, base.sft, 0, **demo_context(base))
    policy = Policy.load(folder)
    full = expert_tokens(args, policy)
    results["warm_start"] = {"folder": str(folder), "seconds": round(time.perf_counter() - t0, 1),
                             **json.loads((folder / "warm_start.json").read_text())}
    results["expert_episode_tokens"] = round(full, 1)
    results["budget_share"] = round(args.budget / full, 3)
    print(f"warm start ready ({results['warm_start']['seconds']:.0f}s); the expert's episode is {full:.0f} tokens, "
          f"the budget {args.budget} ({args.budget / full:.2f} of it)", flush=True)
    results["bounded_cost"] = bounded_cost(args, policy)
    save("context", results, path=out / "context.json")
    for arm in args.arms:
        before = measure(config(args, arm, 0), policy)
        print(f"{arm:18s} before RL: pass {before['pass_rate']:.3f}, {before['compactions_per_episode']:.1f} "
              f"compactions/episode, {before['turns_mean']:.1f} turns ({before['seconds']:.0f}s)", flush=True)
        row: dict[str, Any] = {"before": before, "runs": []}
        results["arms"][arm] = row
        for seed in args.seeds:
            run_out = out / f"{arm}-seed{seed}"
            cfg = config(args, arm, seed, model=str(folder), out=str(run_out))
            cfg = TrainConfig(**cfg.model_dump(exclude={"credit"}))
            run_out.mkdir(parents=True, exist_ok=True)
            t1 = time.perf_counter()
            trainer = Trainer(cfg, monitor=Monitor(run_out, total=cfg.updates, console=Console(quiet=True)))
            summary = trainer.train(warm=EvalResult(before["pass_rate"], float("nan"), before["turns_mean"],
                                                    cfg.eval.episodes))
            rows = [json.loads(x) for x in (run_out / "metrics.jsonl").read_text().splitlines()]
            train_rows = [r for r in rows if r.get("step", 0) >= 1 and not r.get("final")]
            compactions = [r["context/compactions_per_episode"] for r in train_rows
                           if "context/compactions_per_episode" in r]
            facts = [r["context/facts_kept"] for r in train_rows if "context/facts_kept" in r]
            lengths = [r["context/summary_tokens"] for r in train_rows if "context/summary_tokens" in r]
            run = {"seed": seed, "final_pass_rate": summary["final_pass_rate"],
                   "training_pass_rate": [r["rollout/pass_rate"] for r in train_rows if "rollout/pass_rate" in r],
                   "compactions_per_episode": statistics.mean(compactions) if compactions else 0.0,
                   "facts_kept": statistics.mean(facts) if facts else None,
                   # the collapse question: do the summaries keep their length and their facts as training goes on
                   "facts_kept_first_last": quarters(facts), "summary_tokens_first_last": quarters(lengths),
                   "alarms": sorted({name for r in train_rows for reason in r.get("health/reasons", [])
                                     if (name := reason.split(":", 1)[0]) in ALARMS}),
                   "wall_s": round(time.perf_counter() - t1, 1)}
            row["runs"].append(run)
            print(f"  seed {seed}: {before['pass_rate']:.3f} -> {run['final_pass_rate']:.3f} ({run['wall_s']:.0f}s)",
                  flush=True)
            save("context", results, path=out / "context.json")  # after every run: a partial result
        finals = [r["final_pass_rate"] for r in row["runs"]]
        row["final_mean"] = statistics.mean(finals)
        row["final_std"] = statistics.stdev(finals) if len(finals) > 1 else 0.0
    results["wall_s"] = round(time.perf_counter() - t_start)
    finish(results, args)


def finish(results: dict[str, Any], args: Any) -> None:
    """The figures derived from the arms' runs (the best other arm, `ratio`, trained over masked), the table and
    the report: at the end of a run, or again from a saved one (`--from-json`)."""
    means = {a: r["final_mean"] for a, r in results["arms"].items() if "final_mean" in r}
    others = {a: m for a, m in means.items() if not a.startswith("summarize")}
    best = max(others, key=others.get) if others and max(others.values()) > 0 else None  # no tie of zeros named
    trained, masked = means.get("summarize"), means.get("summarize-masked")
    results["best_other"] = best
    results["ratio"] = round(trained / others[best], 3) if trained is not None and best else None
    # the ablation beside the ratio: the same policy and runs with the summary's tokens left out of the loss
    results["trained_over_masked"] = round(trained / masked, 3) if trained is not None and masked else None
    print(write_table(results))
    summary_line = {"budget": results["args"]["budget"], "budget_share": results["budget_share"],
                    "seeds": len(results["args"]["seeds"]), "updates": results["args"]["updates"],
                    "wall_s": results.get("wall_s"), **{f"{a}_final": round(m, 3) for a, m in means.items()},
                    "best_other": best, "trained_over_masked": results["trained_over_masked"],
                    "peak_kv_128_over_16": results.get("bounded_cost", {}).get("peak_ratio_128_over_16"),
                    "ratio": results["ratio"]}
    report("context", results, quick=results["args"]["quick"], summary=summary_line, path=results["args"].get("save"))


def write_table(results: dict[str, Any]) -> str:
    lines = ["| arm | before RL | after RL (mean ± std over seeds) | compactions / episode | summaries kept facts | "
             "peak KV cache (MB) | s / turn, first quarter | s / turn, last quarter |", "|---" * 8 + "|"]
    for arm, r in results["arms"].items():
        b = r["before"]
        facts = [x["facts_kept"] for x in r["runs"] if x["facts_kept"] is not None]
        lines.append(f"| {arm} | {b['pass_rate']:.3f} | {r['final_mean']:.3f} ± {r['final_std']:.3f} | "
                     f"{b['compactions_per_episode']:.1f} | {statistics.mean(facts):.2f} | " if facts else
                     f"| {arm} | {b['pass_rate']:.3f} | {r['final_mean']:.3f} ± {r['final_std']:.3f} | "
                     f"{b['compactions_per_episode']:.1f} | - | ")
        lines[-1] += (f"{b['peak_kv_cache_mb']} | {b['seconds_per_turn_first_quarter']} | "
                      f"{b['seconds_per_turn_last_quarter']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
