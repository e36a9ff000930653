"""`agentrl dpo` and `agentrl pipeline`: the command-line faces of stages two and three."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

console = Console()


def _fail(msg: str) -> int:
    console.print(f"[red]error[/red]: {msg}")
    return 2


def add_dpo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dpo", help="stage two: preference optimisation (DPO, SimPO, IPO) on multi-turn episodes",
                       description="Pairs come from --pairs (JSONL of {chosen, rejected} conversations) or are built from the "
                       "model's own rollouts on --env, a passing episode against a failing one of the same task. Only action "
                       "tokens count; observations are masked.")
    p.add_argument("--model", required=True, help="policy to start from (HF folder or hub id); also the frozen reference")
    p.add_argument("--out", required=True, help="folder for the tuned model and dpo_metrics.jsonl")
    p.add_argument("--loss", choices=["dpo", "simpo", "ipo"], default="dpo")
    p.add_argument("--beta", type=float, default=None, help="default 0.1 (dpo, ipo), 2.0 (simpo)")
    p.add_argument("--pairs", help="JSONL preference pairs; without it, pairs come from rollouts on --env")
    p.add_argument("--env", default="agentrl/Vault-v0")
    p.add_argument("--groups", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_dpo)


def cmd_dpo(args: argparse.Namespace) -> int:
    from agentrl.config import TrainConfig
    from agentrl.policy import Policy
    from agentrl.stages.data import DataError, load_pairs
    from agentrl.stages.dpo import DPOConfig, pairs_from_episodes, train_preferences
    from agentrl.stages.pipeline import collect_groups

    try:
        beta = args.beta if args.beta is not None else (2.0 if args.loss == "simpo" else 0.1)
        dcfg = DPOConfig(loss=args.loss, beta=beta, epochs=args.epochs, lr=args.lr, groups=args.groups)
        policy = Policy.load(args.model)
        if args.pairs:
            pairs, counts = load_pairs(args.pairs, policy.chat)
        else:
            cfg = TrainConfig(env={"id": args.env}, seed=args.seed)
            pairs, counts = pairs_from_episodes(collect_groups(cfg, policy, dcfg.groups, dcfg.group_size, args.seed), dcfg.max_pairs_per_group)
            if not pairs:
                return _fail(f"no pairs: all {counts['groups']} groups were all-pass or all-fail; raise --groups or start from a policy with pass rate in (0, 1)")
    except (ValidationError, DataError, ValueError, OSError) as e:
        return _fail(str(e))
    console.print(f"{len(pairs)} pairs ({', '.join(f'{k} {v}' for k, v in counts.items())})")
    reference = copy.deepcopy(policy.model).eval().requires_grad_(False) if dcfg.loss != "simpo" else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "dpo_metrics.jsonl", "w") as log:
        metrics = train_preferences(policy.model, reference, pairs, policy.chat.pad_id, dcfg, args.seed, log=lambda m: log.write(json.dumps(m) + "\n"))
    policy.save(out)
    console.print(f"{dcfg.loss}: loss {metrics['dpo/loss']:.4f}, margin {metrics['dpo/margin']:.3f}, accuracy {metrics['dpo/accuracy']:.2f}; saved to {out}")
    return 0


def add_pipeline(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pipeline", help="the recipe: SFT -> DPO/SimPO/IPO -> RL, with held-out pass rate after every stage",
                       description="Runs the three stages on one config (the same flags as `train`), each stage in its own folder "
                       "under --out, and prints a table of held-out pass rate by stage.")
    p.add_argument("--preference", choices=["dpo", "simpo", "ipo", "none"], default="dpo", help="stage two's loss, or none to skip it")
    p.add_argument("--beta", type=float, default=None)
    p.add_argument("--pref-groups", type=int, default=32, help="rollout groups to build preference pairs from")
    p.add_argument("--algo", default="grpo")
    p.add_argument("--env", default=None)
    p.add_argument("--updates", type=int, default=None, help="RL updates (0 skips stage three)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="default runs/pipeline-<time>")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[], help="override any train config field")
    p.set_defaults(func=cmd_pipeline)


def cmd_pipeline(args: argparse.Namespace) -> int:
    import time

    from agentrl.config import load_config, parse_override
    from agentrl.stages.dpo import DPOConfig
    from agentrl.stages.pipeline import run_pipeline

    try:
        overrides = [{"algo": args.algo, "seed": args.seed}]
        if args.env:
            overrides.append({"env": {"id": args.env}})
        if args.updates is not None:
            overrides.append({"updates": args.updates})
        overrides += [parse_override(s) for s in args.set]
        cfg = load_config(None, overrides)
        dcfg = None
        if args.preference != "none":
            beta = args.beta if args.beta is not None else (2.0 if args.preference == "simpo" else 0.1)
            dcfg = DPOConfig(loss=args.preference, beta=beta, groups=args.pref_groups)
    except (ValidationError, ValueError) as e:
        return _fail(str(e))
    out = Path(args.out or f"runs/pipeline-{time.strftime('%Y%m%d-%H%M%S')}")
    result = run_pipeline(cfg, dcfg, out, say=console.print)
    table = Table(title="held-out pass rate by stage")
    for col in ("stage", "held-out pass rate", "seconds"):
        table.add_column(col)
    for s in result["stages"]:
        table.add_row(s["stage"], f"{s['held_out_pass_rate']:.3f}", f"{s['seconds']:.0f}")
    console.print(table)
    return 0
