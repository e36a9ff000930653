"""What the commands share: the generated parser, the flags of every command that takes a train config
(--config, --set, --env-kw, --agent...), --resume / --overwrite, and the checks that refuse bad input
before any work is done (each raises `UsageError`: stderr, exit status 2)."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tyro
from pydantic import Field, ValidationError, create_model

from agentrl.config import (
    Strict,
    TrainConfig,
    _deep_update,
    describe_errors,
    parse_override,
    read_yaml,
)


class UsageError(Exception):
    """Bad input on the command line or in a config file: reported on stderr, exit status 2."""


def _err(msg: str) -> None:
    print(f"agentrl: error: {msg}", file=sys.stderr)


def _console() -> Any:
    from rich.console import Console

    return Console()


# -- flags shared by the commands that take a train config -----------------------------------------


class ConfigFlags(Strict):
    config: str | None = Field(None, description="A YAML config file whose values are the defaults (a run's own "
                               "config.yaml works); --set and flags apply on top.")
    set: list[str] = Field([], description="Override any field by its dotted name, KEY=VALUE with a YAML value, e.g. "
                           "rollout.group_size=4 (repeatable); applied after --config, before flags.")
    env_kw: list[str] = Field([], description="An argument of the environment's constructor, KEY=VALUE with a YAML "
                              "value, e.g. locks=4 (repeatable): the same as --set env.kwargs.KEY=VALUE.")
    print_config: bool = Field(False, description="Print the resolved config (every field, the assigner's options with "
                               "their defaults) as YAML and exit.")


_CONFIG_FLAGS = tuple(ConfigFlags.model_fields)


def _prescan(argv: Sequence[str]) -> argparse.Namespace:
    """--config, --set, --env-kw and --algo, read before the full parser is built (it depends on them)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--config")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--env-kw", action="append", default=[])
    p.add_argument("--algo")
    known, _ = p.parse_known_args(list(argv))
    return known


def _kv(items: Sequence[str], flag: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key = item.partition("=")[0]
        if "=" not in item or not key.strip():
            raise UsageError(f"{flag} expects KEY=VALUE, got {item!r}")
        try:
            out.update(parse_override(item))
        except ValueError as e:
            raise UsageError(f"{flag}: {e}") from None
    return out


# --agent and its settings: read before the generated parser, which cannot type an optional section
AGENT_FLAGS = {"--agent": "entry", "--agent.tasks": "tasks", "--agent.heldout": "heldout", "--agent.demos": "demos",
               "--agent.verify": "verify", "--agent.state-key": "state_key"}
AGENT_HELP = ("An agent of your own instead of an env: --agent FILE.py:solve (solve(task, client) calls the policy "
              "through an OpenAI client and returns its reward), --agent.tasks FILE.jsonl|FILE.py:fn (default: the "
              "module's tasks(seed)), --agent.heldout FILE.jsonl, --agent.demos FILE.jsonl (OpenAI-format "
              "conversations that warm-start the tiny policy), --agent.verify FILE.py:fn, --agent.state-key "
              "FILE.py:fn; gateway limits with --set agent.gateway.KEY=VALUE (docs/gateway.md).")


def _agent_flags(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """The --agent flags as AgentConfig's fields, and the rest of argv for the generated parser."""
    found: dict[str, Any] = {}
    rest: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        flag, eq, value = args[i].partition("=")
        if flag in AGENT_FLAGS:
            if not eq:
                if i + 1 >= len(args) or args[i + 1].startswith("--"):
                    raise UsageError(f"{flag} expects a value")
                value, i = args[i + 1], i + 1
            found[AGENT_FLAGS[flag]] = value
        else:
            rest.append(args[i])
        i += 1
    if found and "entry" not in found:
        raise UsageError(f"{', '.join('--agent.' + k.replace('_', '-') for k in found)} without --agent FILE.py:solve")
    return found, rest


def _base_data(argv: Sequence[str]) -> tuple[dict[str, Any], argparse.Namespace]:
    """The config file with --set and --env-kw applied: the defaults the generated parser shows."""
    agent, argv = _agent_flags(argv)
    pre = _prescan(argv)
    try:
        data = read_yaml(pre.config) if pre.config else {}
    except (OSError, ValueError) as e:
        raise UsageError(f"--config: {e}") from None
    for item in pre.set:
        try:
            _deep_update(data, parse_override(item))
        except ValueError as e:
            raise UsageError(str(e)) from None
    if pre.env_kw:
        _deep_update(data, {"env": {"kwargs": _kv(pre.env_kw, "--env-kw")}})
    if agent:
        _deep_update(data, {"agent": agent})
    return data, pre


def given_fields(argv: Sequence[str]) -> set[str]:
    """The dotted names of the fields the user set: in the --config file, by --set or --env-kw, or by a flag. A
    value given counts even where it equals the default, which the parsed config cannot tell (the generated parser
    fills in every field), so the names are read from the file and the command line themselves.

    >>> sorted(given_fields(["--set", "optim.lr=1e-4", "--sft.batch-size", "32", "--updates=6", "--out", "x"]))
    ['optim.lr', 'out', 'sft.batch_size', 'updates']
    """
    data, _ = _base_data(argv)
    given = set(_leaves(data))
    for arg in _agent_flags(argv)[1]:
        if arg.startswith("--") and len(arg) > 2:
            given.add(arg[2:].partition("=")[0].replace("-", "_"))
    return given - set(_CONFIG_FLAGS)


def _leaves(data: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        out += _leaves(value, path + ".") if isinstance(value, dict) else [path]  # an empty section sets nothing
    return out


def _validate(model: type[Strict], data: dict[str, Any], where: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise UsageError(f"invalid configuration ({where}):\n{describe_errors(e)}") from None


@functools.cache
def _train_parser_model(algo: str, extra: type[Strict] | None) -> type[Strict]:
    """TrainConfig with `credit` typed as `algo`'s options (so `--credit.*` are exactly that assigner's
    flags), plus the command's own flags."""
    from agentrl.algorithms import get_spec

    spec = get_spec(algo)
    bases = (ConfigFlags, TrainConfig) if extra is None else (ConfigFlags, extra, TrainConfig)
    return create_model(  # type: ignore[call-overload, no-any-return]
        "TrainFlags", __base__=bases,
        credit=(spec.config, Field(default_factory=spec.config, description=f"Options of {algo}: {spec.description}.")),
    )


def _parse(model: type[Strict], argv: Sequence[str], prog: str, description: str, default: Any = None) -> Any:
    return tyro.cli(model, args=list(argv), prog=prog, description=description, default=default,
                    config=(tyro.conf.UseAppendAction, tyro.conf.HelptextFromCommentsOff))


def parse_train(argv: Sequence[str], prog: str, description: str, extra: type[Strict] | None = None,
                ) -> tuple[TrainConfig, Any, bool]:
    """(the train config, the parsed flags, whether --algo auto was asked for)."""
    data, pre = _base_data(argv)
    auto = pre.algo == "auto"
    if pre.algo and not auto:
        data["algo"] = pre.algo
    argv = _agent_flags(argv)[1]
    if auto:  # not an assigner: the probe picks one later; parse with the config's (or the default) algo
        i = argv.index("--algo") if "--algo" in argv else None
        argv = argv[:i] + argv[i + 2:] if i is not None else [a for a in argv if a != "--algo=auto"]
    base = _validate(TrainConfig, data, f"--config {pre.config}" if pre.config else "--set")
    model = _train_parser_model(base.algo, extra)
    default = model.model_validate({**base.model_dump(), **({} if extra is None else extra().model_dump())})
    flags = _parse(model, argv, prog, description, default)
    drop = set(_CONFIG_FLAGS) | (set(extra.model_fields) if extra is not None else set())
    cfg = _validate(TrainConfig, {**flags.model_dump(exclude=drop), "agent": base.agent}, "flags")
    return cfg, flags, auto


def _check_env(env_id: str, kwargs: dict[str, Any], what: str = "environment") -> None:
    """Build the environment once, so that a bad id or argument fails before any other work."""
    from agentrl.registry import make
    from agentrl.verify.sandbox import SandboxError

    try:
        make(env_id, **kwargs)
    except (ValueError, TypeError, ImportError, AttributeError, SandboxError) as e:
        raise UsageError(f"{what} {env_id}: {e}") from None


def _check_heldout_env(env_id: str, kwargs: dict[str, Any]) -> None:
    """Build the held-out evaluation's env (split="eval" where the env declares a split), so that arguments its
    held-out split cannot take (a BFCL subset that lists training entries) fail now, not after the warm start."""
    from agentrl.evaluation import heldout_kwargs

    held_out = heldout_kwargs(env_id, kwargs)
    if held_out != kwargs:
        _check_env(env_id, held_out, f"the held-out evaluation's environment ({held_out})")


def _check_agent(cfg: TrainConfig) -> None:
    """Load the agent, its tasks and hooks once, so that a bad path or signature fails before any other work."""
    try:
        from agentrl.gateway.agent import Agent, AgentError
    except ImportError as e:
        raise UsageError(str(e)) from None
    try:
        Agent(cfg.agent, heldout_count=cfg.eval.episodes, seed_offset=cfg.eval.seed_offset)
    except (AgentError, ImportError, SyntaxError) as e:
        raise UsageError(str(e)) from None
    if cfg.model is None and cfg.agent.demos is None and cfg.sft.warm_start is None:
        raise UsageError("--agent without --model: the tiny policy is warm-started on the agent's demonstrations; give "
                         "--agent.demos FILE.jsonl (its conversations in OpenAI's format), or --model FOLDER")


def _check_eval_sources(cfg: TrainConfig) -> None:
    """Each evaluation source's env built and scorer imported once, so that a bad one fails before any work."""
    if not cfg.eval.sources:
        return
    from agentrl.eval_sources import resolve_sources

    try:
        resolve_sources(cfg)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _check_expert(env_id: str, kwargs: dict[str, Any]) -> None:
    """Without --model the tiny policy learns from the env's expert: an env without one fails here, at
    once, with the ways forward (not after the tokenizer is trained)."""
    from agentrl.checker import NO_EXPERT, has_expert
    from agentrl.registry import make

    if not has_expert(make(env_id, **kwargs)):
        raise UsageError(f"environment {env_id}: {NO_EXPERT}")


def _check_teacher(cfg: TrainConfig) -> None:
    """An assigner that reads a teacher (--algo distill) without --teacher fails here, before any work."""
    from agentrl.algorithms import get_spec

    if get_spec(cfg.algo).reads_teacher and cfg.teacher is None:
        raise UsageError(f"--algo {cfg.algo} scores the student's tokens under a teacher: give --teacher MODEL (a "
                         "folder, hub id or a name `agentrl models` fetches) that shares the student's tokenizer")


def _check_device(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"device {device}: no CUDA device is visible here (torch {torch.__version__}); use "
                             "--device cpu or auto")



class RunFlags(Strict):
    resume: str | None = Field(None, description="Continue the run in this folder from its newest checkpoint that "
                               "verifies, with the run's own config.yaml: a --config or flag that conflicts with it is "
                               "refused, naming the field (a resumed run is the same run).")
    overwrite: bool = Field(False, description="Remove a previous run's files from --out first; without it (or "
                            "--resume) a folder that is not empty is refused, so two runs never mix in one "
                            "metrics.jsonl.")



def _single_process(command: str) -> None:
    from agentrl.distributed import launched

    if launched():
        raise UsageError(f"agentrl {command} runs in one process; data-parallel training is agentrl train's "
                         "(--num-processes N, or accelerate launch -m agentrl train)")


def _first_difference(ours: Any, theirs: Any, where: str = "") -> tuple[str, Any, Any] | None:
    """The first dotted field where two config dumps differ, with both values."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for k in sorted(set(ours) | set(theirs)):
            found = _first_difference(ours.get(k), theirs.get(k), f"{where}.{k}" if where else k)
            if found:
                return found
        return None
    return None if ours == theirs else (where, ours, theirs)


def _run_flags(argv: Sequence[str], prog: str, help_text: str, extra: type[Strict]) -> tuple[TrainConfig, Any, bool]:
    """parse_train with --resume / --overwrite: a resumed run's config is its config.yaml (flags may only repeat
    it); a new run's --out must be empty or --overwrite given. Checked before any work."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--resume")
    resume = p.parse_known_args(list(argv))[0].resume
    if resume is None:
        cfg, flags, auto = parse_train(argv, prog, help_text, extra=extra)
        out = Path(cfg.out) if cfg.out else None
        if not flags.print_config and not flags.overwrite and out is not None and out.is_dir() and any(out.iterdir()):
            raise UsageError(f"--out {out} is not empty; continue that run with --resume {out}, replace it with "
                             "--overwrite, or choose another folder")
        return cfg, flags, auto
    run = Path(resume)
    own = run / "config.yaml"
    if not own.is_file():
        raise UsageError(f"--resume {run}: no config.yaml there (not a run folder)")
    try:
        run_cfg = TrainConfig.model_validate(read_yaml(own))
    except (OSError, ValueError) as e:
        raise UsageError(f"--resume {run}: its config.yaml does not load: {e}") from None
    argv = list(argv)
    if _prescan(argv).config is None:  # the run's own config is the base the flags apply to
        argv = ["--config", str(own), *argv]
    cfg, flags, auto = parse_train(argv, prog, help_text, extra=extra)
    if auto:
        raise UsageError(f"--resume {run}: --algo auto does not apply; the run trains {run_cfg.algo}")
    if flags.overwrite:
        raise UsageError("--resume and --overwrite contradict each other: resume the run, or replace it")
    if cfg.out is not None and cfg.out != run_cfg.out and Path(cfg.out).resolve() != run.resolve():
        raise UsageError(f"--resume {run}: --out {cfg.out} conflicts; a resumed run stays in its own folder")
    found = _first_difference(cfg.model_dump(mode="json", exclude={"out"}),
                              run_cfg.model_dump(mode="json", exclude={"out"}))
    if found:
        name, ours, theirs = found
        raise UsageError(f"--resume {run}: {name} is {ours!r} here but {theirs!r} in the run's config.yaml; a "
                         "resumed run keeps its config (drop the flag, or start a new run)")
    return cfg.model_copy(update={"out": str(run)}), flags, auto

