"""The commands that train: `train` (RL), `sft` and `dpo` (the stages on their own), `pipeline` (SFT ->
(distill) -> DPO -> RL), `distill` (a teacher into the student) and `serve-policy` (RL on an agent in another
process)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from agentrl.cli.flags import (
    AGENT_HELP,
    RunFlags,
    UsageError,
    _check_agent,
    _check_device,
    _check_env,
    _check_eval_sources,
    _check_expert,
    _check_heldout_env,
    _check_teacher,
    _console,
    _parse,
    _run_flags,
    _single_process,
    given_fields,
)
from agentrl.config import (
    PRETRAINED,
    DPOConfig,
    EnvConfig,
    Fitted,
    RejectionConfig,
    SFTConfig,
    Strict,
    TinyModelConfig,
    TrainConfig,
    describe_errors,
    fit_pretrained,
)

TRAIN_HELP = ("RL on an environment. Without --model, builds a tiny policy for the environment and warm-starts it by "
              "SFT on noisy expert demonstrations (cached under $AGENTRL_CACHE, default ~/.cache/agentrl), then rolls "
              "out groups, assigns credit with --algo and updates with the shared PPO-clip loss. Writes config.yaml, "
              "metrics.jsonl, store/*.parquet, checkpoint/ and summary.json into the run folder. Evaluation sources "
              "beside the held-out evaluation (pass@k, avg@k, greedy pass@1 from step 0): --set 'eval.sources=[{name: "
              "NAME, env: {id: ENV}, k: 4}]' or a --config file (docs/evaluation.md). " + AGENT_HELP)


class TrainFlags(RunFlags):
    num_processes: int = Field(1, ge=1, description="Train data-parallel in this many processes: starts accelerate's "
                               "launcher (accelerate launch --multi_gpu --num_processes N -m agentrl train ...), one "
                               "process per GPU, or on a CPU N processes of one thread each (gloo). Each rolls out its "
                               "share of every update's groups and trains on it; DDP averages the gradients; the main "
                               "process writes the run folder. On a cluster, or with an FSDP/DeepSpeed config, run "
                               "accelerate launch yourself (README, 'More than one process').")


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


def fit_to_model(model: Any, command: Literal["sft", "train"], argv: Sequence[str]) -> tuple[Any, Fitted | None]:
    """The command's flags (`agentrl sft`) or config (`agentrl train`) with a pretrained --model's defaults
    (`agentrl.config.PRETRAINED`) in the fields the user did not set; None where the fields keep their own defaults
    (no --model, or agentrl's tiny policy)."""
    from agentrl.models import is_tiny_policy

    if model.model is None or is_tiny_policy(model.model):
        return model, None
    return fit_pretrained(model, command, given_fields(argv))


def say_fitted(command: str, name: str, fitted: Fitted, eta: str) -> None:
    """The console's line, before the long part starts: which defaults a pretrained model got, which were the
    user's, and when the ETA comes."""
    import agentrl.log as agentrl_log

    agentrl_log.say("agentrl.cli")(
        f"{command}: {name} is a pretrained model, not agentrl's tiny policy: the defaults measured on "
        f"SmolLM2-135M-Instruct apply (docs/models.md, 'Defaults for a pretrained model'): {fitted.describe()}; "
        f"the ETA follows the {eta} (an estimate from its time)")


def cmd_train(argv: Sequence[str]) -> int:
    cfg, flags, auto = _run_flags(argv, "agentrl train", TRAIN_HELP, TrainFlags)
    fitted = None
    if flags.resume is None:  # a resumed run keeps its config.yaml, defaults and all
        cfg, fitted = fit_to_model(cfg, "train", argv)
    if flags.print_config:
        print(cfg.to_yaml(), end="")
        return 0
    if cfg.agent is not None:
        _check_agent(cfg)
    else:
        _check_env(cfg.env.id, cfg.env.kwargs)
        _check_heldout_env(cfg.env.id, cfg.env.kwargs)
        if cfg.model is None and cfg.sft.warm_start is None:
            _check_expert(cfg.env.id, cfg.env.kwargs)
    _check_device(cfg.device)
    _check_teacher(cfg)
    _check_eval_sources(cfg)
    from agentrl.distributed import launch, launched

    if flags.num_processes > 1:
        if launched():
            raise UsageError("--num-processes: this process is already one of a multi-process launch; drop the flag")
        if cfg.rollout.max_staleness:
            raise UsageError("--num-processes: rollout.max_staleness > 0 runs in one process (its rollout thread and "
                             "the ranks' exchanges would share one process group); use max_staleness 0 with several")
        if cfg.rollout.groups < flags.num_processes:
            raise UsageError(f"--num-processes {flags.num_processes}: rollout.groups is {cfg.rollout.groups}; each "
                             "process rolls out whole groups, so give it at least one group per process")
        return launch(flags.num_processes, ["train", *_without_flag(argv, "--num-processes")])
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
    if fitted is not None:  # recorded in config.yaml's header and summary.json
        decisions["pretrained_defaults"] = {"filled": {k: d.value for k, d in fitted.filled.items()},
                                            "yours": fitted.yours}
        if os.environ.get("RANK", "0") == "0":  # one line, from the main process of a launch
            say_fitted("train", str(cfg.model), fitted, "first update")
    try:
        train(cfg, decisions=decisions or None, resume=flags.resume is not None, overwrite=flags.overwrite)
    except (ResumeUnsupported, TeacherMismatch) as e:  # found before any training: a usage error, not a traceback
        raise UsageError(str(e)) from None
    return 0


def _probe_for_auto(cfg: TrainConfig) -> tuple[TrainConfig, dict[str, Any]]:
    """--algo auto: the horizon probe's pick, and what the run records of the decision."""
    from agentrl.probe.run import probe_env

    print("--algo auto: probing the environment with the starting policy first", file=sys.stderr)
    probed = probe_env(cfg)
    rec = probed.recommendation
    print(f"--algo auto -> {rec.algo}: {rec.reason}", file=sys.stderr)
    if probed.family is not None and not probed.family.inside:
        print(f"--algo auto: {probed.family.meaning}", file=sys.stderr)
    try:
        cfg = TrainConfig(**{**cfg.model_dump(exclude={"credit"}), "algo": rec.algo})
    except ValidationError as e:
        raise UsageError(f"the probe chose {rec.algo}, but the config does not fit it:\n"
                         f"{describe_errors(e)}") from None
    return cfg, {"algo_auto": probed.decision()}  # for config.yaml's header and summary.json


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
                        "fine-tuning, the default for a pretrained --model too, since it is what taught "
                        "SmolLM2-135M-Instruct the call format and a model of that size fits; with LoRA a pretrained "
                        "--model gets LoRA's own measured recipe (--sft.lr "
                        f"{PRETRAINED['sft-lora']['sft.lr'].value:g}; docs/models.md, 'Defaults for a pretrained "
                        "model').")
    tool_format: str | None = Field(None, description="The call format the demonstrations are written in, a key of "
                                    "agentrl.chat.FORMATS; None: detected from the model's chat template.")
    seed: int = Field(0, description="Seeds the model build and the demonstration order.")
    eval_episodes: int = Field(128, ge=1, description="Held-out episodes to evaluate the result on. A pretrained "
                               f"--model gets {PRETRAINED['sft']['eval_episodes'].value} unless set, as every "
                               "real-model arm was judged on (docs/models.md, 'Defaults for a pretrained model').")


def cmd_sft(argv: Sequence[str]) -> int:
    cmd = _parse(SFTCommand, argv, "agentrl sft", "Stage one: fine-tune on demonstrations (loss on action tokens "
                 "only), from the environment's scripted expert or a JSONL file (--data); saves an HF folder and "
                 "reports the held-out pass rate. Without --model, the tiny policy is built (from the demonstrations' "
                 "own text with --data) and trained at the tiny policy's learning rate.")
    _single_process("sft")
    cmd, fitted = fit_to_model(cmd, "sft", argv)
    _check_env(cmd.env.id, cmd.env.kwargs)
    if cmd.lora_r and cmd.model is None:
        raise UsageError("--lora-r trains adapters on an existing model: give --model")
    if cmd.data is None and cmd.model is None and cmd.sft.warm_start is None:
        _check_expert(cmd.env.id, cmd.env.kwargs)
    from agentrl.stages.data import DataError
    from agentrl.stages.pipeline import run_sft

    cfg = TrainConfig(env=cmd.env, model=cmd.model, tool_format=cmd.tool_format, sft=cmd.sft, tiny=cmd.tiny,
                      seed=cmd.seed, eval={"episodes": cmd.eval_episodes})
    record = None
    if fitted is not None:
        if cmd.data is not None:  # the file's conversations are the demonstrations, however many
            fitted.filled.pop("sft.episodes", None)
        say_fitted("sft", str(cmd.model), fitted, "first step")
        record = {"pretrained_defaults": {"filled": {k: d.value for k, d in fitted.filled.items()},
                                          "yours": fitted.yours}}
    try:
        _, advice = run_sft(cfg, cmd.out, data=cmd.data, lora_r=cmd.lora_r, record=record)
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


# -- distill --------------------------------------------------------------------------------------------

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
    import argparse

    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--mode")
    p.add_argument("--algo")
    pre = p.parse_known_args(list(argv))[0]
    if pre.mode == "on-policy":  # the RL loop with the distill assigner: agentrl train's flags, --resume included
        if pre.algo not in (None, "distill"):
            raise UsageError(f"--mode on-policy trains with --algo distill, not {pre.algo}")
        if any(a.startswith("--rejection.") for a in argv):
            raise UsageError("--rejection.* options are for --mode rejection")
        return cmd_train(["--algo", "distill", *_without_flag(_without_flag(argv, "--mode"), "--algo")])
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
    from agentrl.stages.distill import NothingToDistil, run_rejection

    try:
        run_rejection(cfg, flags.rejection, Path(cfg.out or f"runs/distill-{time.strftime('%Y%m%d-%H%M%S')}"))
    except (DataError, NothingToDistil) as e:  # a teacher that passes nothing: said as an error, not a traceback
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
