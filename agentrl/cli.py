"""The `agentrl` command: a thin layer over the Python API.

    agentrl train [--algo grpo] [--config run.yaml] [--set rollout.group_size=4 ...]
    agentrl sft --env agentrl/Vault-v0 --out warm/
    agentrl check-env my_pkg.envs:MyEnv
    agentrl algos
    agentrl report RUN_DIR        # markdown + self-contained HTML report, alarm spans shaded
    agentrl probe --env agentrl/Vault-v0 [--bakeoff] | --store RUN_DIR   # horizon report, recommended assigner
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from agentrl.stages.commands import add_dpo, add_pipeline
from agentrl.verify.probe import add_cli as add_verify_probe

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
    p.add_argument("--algo", help="credit assigner (see `agentrl algos`), or auto: run the horizon probe first and train with "
                   "its recommendation; default grpo")
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
    p.add_argument("--lora-r", type=int, help="train LoRA adapters of this rank only (peft); the KL reference is the base "
                   "model with adapters off, so no second copy is held; default 0: full fine-tuning")
    p.add_argument("--lora-alpha", type=float, help="LoRA scaling numerator; default 2 x rank")
    p.add_argument("--lora-dropout", type=float, help="dropout on the adapters' input; default 0")
    p.add_argument("--lora-targets", nargs="+", metavar="MODULE", help="modules that get adapters, e.g. q_proj v_proj; default all-linear")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--on-alarm", choices=["warn", "stop", "intervene"],
                   help="on a health alarm: warn (default: show and log), stop the run, or intervene (apply the enabled interventions)")
    p.add_argument("--tensorboard", action="store_true", help="also write TensorBoard event files into <run>/tensorboard")
    p.add_argument("--wandb", action="store_true", help="also log to Weights & Biases, offline, into <run>/wandb")
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    from agentrl.config import load_config, parse_override

    overrides: list[dict[str, Any]] = []
    auto = args.algo == "auto"
    flat = {"algo": None if auto else args.algo, "preset": args.preset, "model": args.model, "engine": args.engine, "device": args.device,
            "updates": args.updates, "seed": args.seed, "out": args.out}
    overrides.append({k: v for k, v in flat.items() if v is not None})
    if args.env:
        overrides.append({"env": {"id": args.env}})
    if args.env_kw:
        overrides.append({"env": {"kwargs": _kv(args.env_kw)}})
    lora = {"r": getattr(args, "lora_r", None), "alpha": getattr(args, "lora_alpha", None), "dropout": getattr(args, "lora_dropout", None),
            "target_modules": getattr(args, "lora_targets", None)}
    if any(v is not None for v in lora.values()):
        overrides.append({"optim": {"lora": {k: v for k, v in lora.items() if v is not None}}})
    if getattr(args, "on_alarm", None):
        overrides.append({"health": {"on_alarm": args.on_alarm}})
    if getattr(args, "tensorboard", False) or getattr(args, "wandb", False):
        overrides.append({"log": {k: True for k in ("tensorboard", "wandb") if getattr(args, k, False)}})
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

    if auto:
        from agentrl.config import TrainConfig
        from agentrl.probe import recommend_for_config

        console.print("--algo auto: probing the environment with the starting policy first")
        algo, reason = recommend_for_config(cfg)
        console.print(f"[bold]--algo auto -> {algo}[/bold]: {reason}")
        try:
            cfg = TrainConfig(**{**cfg.model_dump(), "algo": algo})
        except ValidationError as e:  # credit options given for one assigner may not fit another
            console.print(f"[red]error[/red]: the probe chose {algo}, but {_validation_error(e)}")
            return 2
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
    p.add_argument("--noise", type=float, default=0.35, help="the expert's slip rate")
    p.add_argument("--data", help="JSONL of conversations to train on instead of the env's expert (needs --model)")
    p.add_argument("--lora-r", type=int, default=0, help="train LoRA adapters of this rank (merged into the saved model); 0: full fine-tuning")
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
    if (args.data or args.lora_r) and args.model is None:
        console.print("[red]error[/red]: --data and --lora-r fine-tune an existing model: give --model")
        return 2
    out = Path(args.out)
    if args.model is None:
        folder = warm_start(args.env, env_kw, cfg.tiny, sft_cfg, args.seed, say=console.print)
        shutil.copytree(folder, out, dirs_exist_ok=True)
        policy = Policy.load(out)
    else:
        from agentrl.stages.data import DataError, load_demos

        policy = Policy.load(args.model)
        try:
            demos = (load_demos(args.data, policy.chat) if args.data else
                     collect_demos(lambda: make(args.env, **env_kw), policy.chat, list(range(20_000_000, 20_000_000 + args.episodes)), args.noise))
        except DataError as e:
            console.print(f"[red]error[/red]: {e}")
            return 2
        model = policy.model
        if args.lora_r:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, target_modules="all-linear", lora_dropout=0.0))
        metrics = sft(model, demos, policy.chat.pad_id, epochs=args.epochs, lr=lr, batch_size=args.batch_size, seed=args.seed)
        if args.lora_r:
            policy.model = model.merge_and_unload()  # an ordinary HF folder, loadable without peft
        policy.save(out)
        (out / "warm_start.json").write_text(json.dumps(metrics, indent=2))
    result = evaluate(cfg, policy, cfg.rollout.sampling, getattr(policy.model.config, "max_position_embeddings", 2048))
    console.print(f"held-out pass rate {result.pass_rate:.3f} over {result.episodes} episodes; model saved to {out}")
    return 0


# -- report -------------------------------------------------------------------------------------


def add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="markdown + self-contained HTML report of a run (finished or still running)",
                       description="Reads RUN_DIR/metrics.jsonl (a half-written last line is skipped), replays the health "
                       "alarms where the run did not log them, and writes report.md, report.html (plots embedded) and the "
                       "plots as PNG files into RUN_DIR (or --out).")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder holding metrics.jsonl")
    p.add_argument("--out", help="folder for the report; default RUN_DIR")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from agentrl.report import write_report

    try:
        paths = write_report(args.run_dir, args.out)
    except (FileNotFoundError, ValueError) as e:
        console.print(f"[red]error[/red]: {e}")
        return 2
    console.print(f"report: {paths['markdown']}\n        {paths['html']}", highlight=False)
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


# -- probe ----------------------------------------------------------------------------------------


def add_probe(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "probe",
        help="horizon report: measure episodes (a short rollout or a saved store) and recommend a credit assigner",
        description="Measures the statistics of ALGORITHMS.md §5 (turns per episode, zero-advantage groups, a cross-validated "
        "turn-value probe, value-change concentration, ...) on a short rollout of the current policy (--env; without --model "
        "the cached SFT warm start) or on a saved store (--store), applies the recommendation rules, and writes report.json, "
        "report.md and a self-contained report.html into --out. Thresholds default to the project's horizon sweep "
        "(benchmarks/results/horizon_sweep.json) when it exists.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--env", help="environment id or module:Class to roll out (default agentrl/Vault-v0)")
    src.add_argument("--store", help="a saved store: a Parquet file, a folder of them, or a run folder (its store/)")
    p.add_argument("--env-kw", action="append", metavar="KEY=VALUE", help="environment constructor argument, e.g. locks=4 (repeatable)")
    p.add_argument("--model", help="HF hub id or folder; default: the tiny policy's SFT warm start")
    p.add_argument("--groups", type=int, default=8, help="tasks to roll out (default 8)")
    p.add_argument("--group-size", type=int, help="episodes per task (default: the config's, 8)")
    p.add_argument("--seed", type=int)
    p.add_argument("--config", help="a train config (YAML) to take the environment, model and budget from")
    p.add_argument("--out", default="runs/probe", help="report folder (default runs/probe)")
    p.add_argument("--sweep", help="derive the thresholds from this horizon sweep's sweep.json instead of the committed one")
    p.add_argument("--threshold", action="append", metavar="KEY=VALUE", default=[], help="override a threshold, e.g. horizon_cutoff=12 (repeatable)")
    p.add_argument("--budget", type=int, help="planned training episodes (default for --env: the config's updates x groups x group size)")
    p.add_argument("--bakeoff", action="store_true", help="also train each candidate assigner briefly from the same start and plot the learning curves")
    p.add_argument("--bakeoff-updates", type=int, default=10, help="updates per bakeoff run (default 10)")
    p.add_argument("--bakeoff-algos", nargs="+", help="assigners to run (default: all)")
    p.add_argument("--bakeoff-eval", type=int, default=32, help="held-out episodes per bakeoff evaluation (default 32)")
    p.set_defaults(func=cmd_probe)


def _probe_table(result: Any) -> Table:
    from agentrl.horizon_report import stat_rows

    table = Table(title=f"horizon probe: {result.source}")
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for label, value in stat_rows(result):
        table.add_row(label, value)
    return table


def cmd_probe(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from agentrl.config import load_config
    from agentrl.horizon_report import write_report
    from agentrl.probe import (
        ProbeThresholds,
        bakeoff,
        default_thresholds,
        probe_env,
        probe_store,
        thresholds_from_sweep,
    )
    from agentrl.store import StoreError

    try:
        if args.sweep:
            sweep_path = Path(args.sweep)
            if not sweep_path.is_file():
                raise FileNotFoundError(f"--sweep: no file at {sweep_path}")
            th = thresholds_from_sweep(json.loads(sweep_path.read_text()), source=str(sweep_path))
        else:
            th = default_thresholds()
        if args.threshold:
            th = ProbeThresholds(**{**th.model_dump(), **_kv(args.threshold)})
    except ValidationError as e:
        console.print(f"[red]error[/red]: --threshold: {_validation_error(e)}")
        return 2
    except (ValueError, FileNotFoundError) as e:
        console.print(f"[red]error[/red]: {e}")
        return 2
    cfg = None
    try:
        if args.store:
            if args.bakeoff:
                raise ValueError("--bakeoff trains on an environment; give --env (a store alone has none)")
            result = probe_store(args.store, th, budget_episodes=args.budget)
        else:
            overrides: list[dict[str, Any]] = [{k: v for k, v in {"model": args.model, "seed": args.seed}.items() if v is not None}]
            if args.env:
                overrides.append({"env": {"id": args.env}})
            if args.env_kw:
                overrides.append({"env": {"kwargs": _kv(args.env_kw)}})
            cfg = load_config(args.config, overrides)
            from agentrl.core import make

            make(cfg.env.id, **cfg.env.kwargs)  # fail on a bad env before building anything
            result = probe_env(cfg, groups=args.groups, group_size=args.group_size, thresholds=th,
                               store_out=Path(args.out) / "probe_store.parquet")
            if args.budget is not None:
                from agentrl.probe import recommend

                rec, rules = recommend(result.stats, th, args.budget)
                result = result.model_copy(update={"budget_episodes": args.budget, "recommendation": rec, "rules": rules})
    except StoreError as e:
        console.print(f"[red]error[/red]: store: {e}")
        return 2
    except ValidationError as e:
        console.print(f"[red]error[/red]: {_validation_error(e)}")
        return 2
    except (ValueError, TypeError, FileNotFoundError) as e:
        console.print(f"[red]error[/red]: {e}")
        return 2
    runs = None
    if args.bakeoff and cfg is not None:
        from agentrl.algorithms import ASSIGNERS

        runs = bakeoff(cfg, args.bakeoff_algos or list(ASSIGNERS), args.bakeoff_updates, args.out, args.bakeoff_eval, say=console.print)
    paths = write_report(result, args.out, runs)
    console.print(_probe_table(result))
    rec = result.recommendation
    console.print(f"[bold green]recommended assigner: {rec.algo}[/bold green] ({rec.reason})")
    if rec.advice:
        console.print(f"[yellow]advice[/yellow]: {rec.advice}")
    console.print(f"thresholds: {th.source}" + (f" (sweep of {th.sweep_started})" if th.sweep_started else ""))
    console.print(f"report: {paths['html']}  {paths['md']}  {paths['json']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentrl", description="Multi-turn agentic RL for language-model agents.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_train(sub)
    add_sft(sub)
    add_check_env(sub)
    add_algos(sub)
    add_report(sub)
    add_probe(sub)
    add_verify_probe(sub)
    add_dpo(sub)
    add_pipeline(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
