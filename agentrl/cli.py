"""The `agentrl` command: a thin layer over the Python API.

    agentrl train [--algo grpo] [--config run.yaml] [--set rollout.group_size=4 ...]
    agentrl sft --env agentrl/Vault-v0 --out warm/
    agentrl check-env my_pkg.envs:MyEnv
    agentrl algos
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

console = Console(stderr=False)


def _kv(items: list[str] | None) -> dict[str, Any]:
    import yaml

    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"error: expected key=value, got {item!r}")
        k, _, v = item.partition("=")
        out[k] = yaml.safe_load(v)
    return out


def _validation_error(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "config"
        lines.append(f"  {loc}: {err['msg']}")
    return "invalid configuration:\n" + "\n".join(lines)


# -- train --------------------------------------------------------------------------------------


def add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="RL on an environment (on defaults: tiny policy, SFT warm start, GRPO on Vault, CPU, minutes)",
        description="Roll out the policy in groups, assign credit with --algo, update with the shared PPO-clip loss. "
        "Without --model, builds a tiny policy for the environment and warm-starts it by SFT on noisy expert "
        "demonstrations (cached under $AGENTRL_CACHE, default ~/.cache/agentrl). Writes config.yaml, "
        "metrics.jsonl, store/*.parquet, checkpoint/ and summary.json into the run folder.",
    )
    p.add_argument("--algo", help="credit assigner (see `agentrl algos`); default grpo")
    p.add_argument("--preset", choices=["dapo", "dr-grpo"], help="fill in a published recipe's settings")
    p.add_argument("--env", help="environment id or module:Class; default agentrl/Vault-v0")
    p.add_argument("--env-kw", action="append", metavar="KEY=VALUE", help="environment constructor argument, e.g. locks=4 (repeatable)")
    p.add_argument("--model", help="HF hub id or local folder; default: build and warm-start the tiny policy")
    p.add_argument("--engine", choices=["torch", "vllm"], help="generation backend; default torch")
    p.add_argument("--device", help="auto | cpu | cuda")
    p.add_argument("--updates", type=int, help="number of policy updates")
    p.add_argument("--seed", type=int)
    p.add_argument("--out", help="run folder; default runs/<algo>-<time>")
    p.add_argument("--config", help="YAML config file (a run's config.yaml works)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[], help="override any config field, e.g. rollout.group_size=4 (repeatable)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    from agentrl.config import load_config, parse_override

    overrides: list[dict[str, Any]] = []
    flat = {"algo": args.algo, "preset": args.preset, "model": args.model, "engine": args.engine, "device": args.device,
            "updates": args.updates, "seed": args.seed, "out": args.out}
    overrides.append({k: v for k, v in flat.items() if v is not None})
    if args.env:
        overrides.append({"env": {"id": args.env}})
    if args.env_kw:
        overrides.append({"env": {"kwargs": _kv(args.env_kw)}})
    try:
        overrides += [parse_override(s) for s in args.set]
        cfg = load_config(args.config, overrides)
    except ValidationError as e:
        console.print(f"[red]error[/red]: {_validation_error(e)}")
        return 2
    except (ValueError, FileNotFoundError) as e:
        console.print(f"[red]error[/red]: {e}")
        return 2
    if args.print_config:
        console.print(cfg.to_yaml(), highlight=False)
        return 0
    try:
        from agentrl.core import make

        make(cfg.env.id, **cfg.env.kwargs)  # fail on a bad env before building anything
    except (ValueError, TypeError) as e:
        console.print(f"[red]error[/red]: environment: {e}")
        return 2
    from agentrl.trainer import Trainer

    Trainer(cfg).train()
    return 0


# -- sft ----------------------------------------------------------------------------------------


def add_sft(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sft", help="stage one: fine-tune on expert demonstrations (loss on action tokens only)",
                       description="Build the tiny policy for the environment (or load --model) and fine-tune it on its "
                       "scripted expert's demonstrations; saves an HF folder and reports the held-out pass rate.")
    p.add_argument("--env", default="agentrl/Vault-v0")
    p.add_argument("--env-kw", action="append", metavar="KEY=VALUE")
    p.add_argument("--model", help="start from this model instead of building the tiny one")
    p.add_argument("--out", required=True, help="folder for the fine-tuned model")
    p.add_argument("--episodes", type=int, default=3000)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=None, help="default 3e-3 for the tiny model, 2e-5 for a loaded one")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--noise", type=float, default=0.25, help="the expert's slip rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-episodes", type=int, default=128)
    p.set_defaults(func=cmd_sft)


def cmd_sft(args: argparse.Namespace) -> int:
    import json
    import shutil
    from pathlib import Path

    from agentrl.config import SFTConfig, TrainConfig
    from agentrl.core import make
    from agentrl.policy import Policy
    from agentrl.stages.sft import collect_demos, sft, warm_start
    from agentrl.trainer import evaluate

    env_kw = _kv(args.env_kw)
    try:
        make(args.env, **env_kw)
        lr = args.lr if args.lr is not None else (3e-3 if args.model is None else 2e-5)
        sft_cfg = SFTConfig(episodes=args.episodes, epochs=args.epochs, lr=lr, batch_size=args.batch_size, noise=args.noise)
        cfg = TrainConfig(env={"id": args.env, "kwargs": env_kw}, model=args.model, sft=sft_cfg, seed=args.seed,
                          eval={"episodes": args.eval_episodes})
    except ValidationError as e:
        console.print(f"[red]error[/red]: {_validation_error(e)}")
        return 2
    except (ValueError, TypeError) as e:
        console.print(f"[red]error[/red]: {e}")
        return 2
    out = Path(args.out)
    if args.model is None:
        folder = warm_start(args.env, env_kw, cfg.tiny, sft_cfg, args.seed, say=console.print)
        shutil.copytree(folder, out, dirs_exist_ok=True)
        policy = Policy.load(out)
    else:
        policy = Policy.load(args.model)
        demos = collect_demos(lambda: make(args.env, **env_kw), policy.chat, list(range(20_000_000, 20_000_000 + args.episodes)), args.noise)
        metrics = sft(policy.model, demos, policy.chat.pad_id, epochs=args.epochs, lr=lr, batch_size=args.batch_size, seed=args.seed)
        policy.save(out)
        (out / "warm_start.json").write_text(json.dumps(metrics, indent=2))
    result = evaluate(cfg, policy, cfg.rollout.sampling, getattr(policy.model.config, "max_position_embeddings", 2048))
    console.print(f"held-out pass rate {result.pass_rate:.3f} over {result.episodes} episodes; model saved to {out}")
    return 0


# -- check-env, algos ------------------------------------------------------------------------------


def add_check_env(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check-env", help="does an environment follow the AgentEnv contract?",
                       description="Runs agentrl.checker's checks (reset/step types, malformed calls become observations, "
                       "turn budget truncates, same seed and actions give the same episode, ...). Exit 1 if any fails.")
    p.add_argument("target", help="registered id (agentrl/Vault-v0) or module:Class")
    p.add_argument("--kw", action="append", metavar="KEY=VALUE", help="constructor argument (repeatable)")
    p.set_defaults(func=cmd_check_env)


def cmd_check_env(args: argparse.Namespace) -> int:
    from agentrl.checker import check_env

    try:
        results = check_env(args.target, **_kv(args.kw))
    except (ValueError, TypeError) as e:
        console.print(f"[red]error[/red]: {e}")
        return 2
    table = Table(title=f"check-env {args.target}")
    table.add_column("check")
    table.add_column("result")
    table.add_column("why")
    for r in results:
        table.add_row(r.name, "[green]ok[/green]" if r.ok else "[red]FAIL[/red]", r.message)
    console.print(table)
    return 0 if all(r.ok for r in results) else 1


def add_algos(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("algos", help="list the credit assigners")
    p.set_defaults(func=cmd_algos)


def cmd_algos(args: argparse.Namespace) -> int:
    from agentrl.algorithms import ASSIGNERS

    table = Table(title="credit assigners (--algo)")
    table.add_column("algo")
    table.add_column("what it does")
    for name, cls in ASSIGNERS.items():
        table.add_row(name, cls.description)
    console.print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentrl", description="Multi-turn agentic RL for language-model agents.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_train(sub)
    add_sft(sub)
    add_check_env(sub)
    add_algos(sub)
    try:
        from agentrl.verify.probe import add_cli as add_verify_probe
    except ImportError:
        pass
    else:
        add_verify_probe(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
