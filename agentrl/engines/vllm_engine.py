"""The vLLM backend (GPU, extra `[vllm]`): the torch engine's `Session` interface over `vllm.LLM`.

Multi-turn. A session keeps each live row's whole history as token ids: the prompt, then every
action and observation. Each `generate()` submits every live row's history as one `TokensPrompt`
to `LLM.generate`. The LLM runs with `enable_prefix_caching=True`: the KV blocks of the part of a
history vLLM has already seen (every full block of the prompt, earlier actions and observations)
are found by hash and reused, so a turn computes only the newest observation and the new action.
The torch engine keeps each row's cache itself; here vLLM's block cache does, and if it evicts a
block under memory pressure the block is recomputed, never wrong.

Actions. Generation stops at the chat's stop ids only: `ignore_eos=True` keeps vLLM from also
stopping at the EOS ids in the model's generation_config, which the torch engine does not do (eos
is among the stop ids anyway). vLLM keeps the stop token at the end of `token_ids` (it drops stop
*strings* from the text only), so each action ends with it as in the torch engine, with the same
finish reason ("eos", "stop" or "length"), and the transcript is the same.

Log-probs. Each token's log-prob is requested (`logprobs=0`: the sampled token's only) with the
engine built with `logprobs_mode="processed_logprobs"`, so it is taken after temperature, as the
torch engine and the learner (`token_stats(..., temperature)`) take it; vLLM's default
(`raw_logprobs`) is before temperature. vLLM 0.10.2 is the first release whose processed log-probs
include temperature, hence the version floor. Two differences remain: with top-k or top-p on,
vLLM's processed log-probs are of the truncated distribution while the torch engine's are from
before truncation (the defaults, top_k=0 and top_p=1, truncate nothing); and vLLM runs in bf16 by
default while the learner usually runs in float32, so the two differ by bf16 rounding (about 1e-2).

Weights. The LLM holds its own copy of the weights. After every update `sync_weights(model)` hands
the learner's state dict to each vLLM worker (`LLM.collective_rpc`), whose model's own
`load_weights` maps the HF names (q/k/v -> qkv_proj, ...), then resets the prefix cache, whose
blocks were computed with the old weights. `from_policy` runs vLLM's engine core in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0, as TRL's colocated mode does), so the tensors pass by reference
and nothing is pickled. A PEFT (LoRA) learner is merged for the copy (merge, load, unmerge, as TRL
does), so vLLM runs a plain model. Or, with `enable_lora=True`, the base weights stay fixed and
`sync_lora(adapter_dir)` points later generations at a newly saved adapter.

Several ranks (`accelerate launch --num_processes N ... --engine vllm`): data-parallel engines. Each
rank builds its own in-process LLM on its own GPU (cuda:LOCAL_RANK) with vLLM's
``distributed_executor_backend="external_launcher"``, which takes rank and device from the
torchrun-style environment accelerate sets (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT) and
joins the process group already there instead of starting workers of its own; with
tensor_parallel_size 1 each rank's vLLM is a whole model that generates its rank's groups alone.
Every rank's learner holds the same weights after an update (DDP), so each `sync_weights` is local
(this GPU's learner into this GPU's vLLM: no weights cross GPUs). Each rank's seed is the run's plus
its rank, so no two ranks draw the same sampling streams. One shared vLLM server instead would
need the weights broadcast to it after every update and every rank's requests to queue on it; it
pays off only when the policy does not fit on a GPU beside the learner (then run vLLM as its own
server, outside this engine).

Not supported: hidden states (`capture_hidden`; the turn critics of arpo, turn-ppo and steppo with
a learned PRM read them, so use --engine torch for those), teacher forcing (the torch session's
`forced`), and CPU: this backend is for CUDA GPUs.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from agentrl.config import SamplingConfig
from agentrl.engines.base import FinishReason, Generation

MISSING_EXTRA = "--engine vllm needs the [vllm] extra: pip install 'agentrl[vllm]' (GPU only)"
NO_HIDDEN = ("the vLLM engine does not capture hidden states, which the turn critics read (arpo, turn-ppo, steppo "
             "with a learned PRM); use --engine torch for those assigners")
MIN_VERSION = "0.10.2"  # the first vLLM whose "processed_logprobs" are taken after temperature


def launch_ranks() -> tuple[int, int, int]:
    """(rank, local rank, world size) from the environment a torchrun-style launcher (accelerate
    launch) sets; (0, 0, 1) in a plain process."""
    def read(name: str, default: int) -> int:
        value = os.environ.get(name, "")
        try:
            return int(value) if value != "" else default
        except ValueError:
            raise ValueError(f"--engine vllm: environment variable {name}={value!r} is not an integer") from None

    world = read("WORLD_SIZE", 1)
    rank = read("RANK", 0)
    local = read("LOCAL_RANK", rank if world > 1 else 0)
    if world < 1 or not 0 <= rank < world or local < 0:
        raise ValueError(f"--engine vllm: RANK={rank}, LOCAL_RANK={local}, WORLD_SIZE={world} do not describe a rank")
    return rank, local, world


def rank_kwargs(llm_kwargs: dict[str, Any], seed: int | None) -> tuple[dict[str, Any], int | None]:
    """`vllm.LLM` arguments and the engine seed for this rank: unchanged in one process; under a
    multi-process launch, the external launcher on this rank's GPU and the seed plus the rank."""
    rank, local, world = launch_ranks()
    if world == 1:
        return llm_kwargs, seed
    if llm_kwargs.get("tensor_parallel_size", 1) != 1:
        raise ValueError("--engine vllm under several processes runs one whole vLLM per rank (data parallel): "
                         f"tensor_parallel_size must be 1, got {llm_kwargs['tensor_parallel_size']}")
    gpus = torch.cuda.device_count()
    if local >= gpus:
        raise RuntimeError(f"--engine vllm: rank {rank} has LOCAL_RANK={local} but this machine shows {gpus} CUDA "
                           f"GPU(s) (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}): one GPU per "
                           "process, so launch at most as many processes as GPUs")
    torch.cuda.set_device(local)  # accelerate has done so already; vLLM's worker takes cuda:LOCAL_RANK as well
    out = {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": 1, **llm_kwargs}
    return out, None if seed is None else seed + rank


def _import_vllm() -> SimpleNamespace:
    """The parts of vLLM this engine uses, imported on first use: importing agentrl never needs vLLM."""
    try:
        import vllm
        from vllm.lora.request import LoRARequest
    except ImportError as e:
        raise ImportError(MISSING_EXTRA) from e
    return SimpleNamespace(LLM=vllm.LLM, SamplingParams=vllm.SamplingParams, TokensPrompt=vllm.TokensPrompt,
                           LoRARequest=LoRARequest, version=vllm.__version__)


def _check_version(version: str) -> None:
    from packaging.version import InvalidVersion, Version

    try:
        too_old = Version(version) < Version(MIN_VERSION)
    except InvalidVersion:  # a local build with an odd version string: trust it
        return
    if too_old:
        raise ImportError(f"--engine vllm needs vLLM >= {MIN_VERSION}, found {version}: older releases report "
                          "log-probs before temperature, not the ones the learner recomputes")


def sampling_kwargs(cfg: SamplingConfig, stop_ids: Sequence[int]) -> dict[str, Any]:
    """`vllm.SamplingParams` arguments for one action under `cfg` (the per-request seed aside)."""
    return {
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": cfg.top_k if cfg.top_k > 0 else -1,  # vLLM's "disabled" (0 also means it from 0.10 on)
        "max_tokens": cfg.max_new_tokens,
        "stop_token_ids": list(stop_ids),
        "ignore_eos": True,  # stop at stop_ids only, not also at the EOS ids of generation_config
        "logprobs": 0,  # the sampled token's log-prob, no alternatives
        "detokenize": False,  # the rollout decodes the ids itself
    }


def to_generation(out: Any, stop_ids: Iterable[int], eos_id: int) -> Generation:
    """One vLLM `CompletionOutput` as the torch engine's `Generation` (finish from the last id, as there)."""
    ids = [int(t) for t in out.token_ids]
    if out.logprobs is None:
        raise RuntimeError("vLLM returned no log-probs; the request must set logprobs=0")
    logprobs = [float(step[tok].logprob) for tok, step in zip(ids, out.logprobs)]  # step: {token id: Logprob}
    if len(logprobs) != len(ids):
        raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(ids)} tokens")
    stops = set(stop_ids)
    finish: FinishReason = "length"
    if ids and ids[-1] in stops:
        finish = "eos" if ids[-1] == eos_id else "stop"
    elif out.finish_reason != "length":
        raise RuntimeError(f"vLLM ended an action with finish_reason={out.finish_reason!r} (stop_reason="
                           f"{out.stop_reason!r}) but its ids do not end with a stop token; the transcript would "
                           "lose that token")
    return Generation(ids, logprobs, finish)


def plain_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The model's weights under the plain HF names vLLM's loaders know. For a PEFT model, call with
    its adapters merged: the adapters' own tensors are left out and the wrappers' names unwrapped."""
    out = []
    for name, t in model.state_dict().items():
        if "lora_" in name or ".original_module." in name:
            continue
        name = re.sub(r"\.modules_to_save\.[^.]+\.", ".",
                      name.removeprefix("base_model.model.").replace(".base_layer.", "."))
        out.append((name, _whole(t)))
    return out


@contextlib.contextmanager
def gathered(model: torch.nn.Module) -> Iterator[None]:
    """Whole parameters inside the block, for a learner sharded over the ranks: DeepSpeed ZeRO-3's
    partitioned parameters are gathered (a collective: every rank must call it, as every rank syncs
    its engine after every update); FSDP2's DTensors are made whole by `plain_weights` itself. An
    unsharded model (one process, DDP, ZeRO-1/2) passes through."""
    params = list(model.parameters())
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):  # read only: nothing is written back
            yield
        return
    yield


def _whole(t: torch.Tensor) -> torch.Tensor:
    full = getattr(t, "full_tensor", None)  # an FSDP2 DTensor shard: all-gathered (every rank calls it)
    return (full() if callable(full) else t).detach()


def _load_weights(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Runs inside vLLM on each worker (`collective_rpc` passes the worker first); returns nothing, so
    that nothing large comes back."""
    worker.get_model().load_weights(weights)


def _driver_model(llm: Any) -> torch.nn.Module | None:
    """The model of an in-process engine, reached through its attributes (vLLM without `collective_rpc`)."""
    worker = getattr(getattr(getattr(llm, "llm_engine", None), "model_executor", None), "driver_worker", None)
    worker = getattr(worker, "worker", worker)  # V1 wraps the worker in a WorkerWrapperBase
    runner = getattr(worker, "model_runner", None)
    if runner is not None and hasattr(runner, "get_model"):
        return runner.get_model()  # unwraps a CUDA-graph wrapper
    return getattr(runner, "model", None)


def _load_into(llm: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    if hasattr(llm, "collective_rpc"):  # vLLM V1: runs on every worker, in this process or not
        try:
            llm.collective_rpc(_load_weights, kwargs={"weights": weights})
        except TypeError as e:
            if "serializ" not in str(e):
                raise
            raise RuntimeError("vLLM runs its engine core in another process and will not pickle the weights: build "
                               "the LLM with VLLM_ENABLE_V1_MULTIPROCESSING=0 (from_policy does), or set "
                               "VLLM_ALLOW_INSECURE_SERIALIZATION=1") from e
        return
    inner = _driver_model(llm)  # older engines: the in-process model, through the engine's attributes
    if inner is None:
        raise RuntimeError("sync_weights: this vLLM has neither LLM.collective_rpc nor an in-process "
                           "llm_engine.model_executor.driver_worker to load weights into")
    inner.load_weights(weights)


class VLLMEngine:
    """Generate with a `vllm.LLM`, resubmitting each row's history every turn (see the module docstring).

    Build it with `from_policy`. The constructor wraps an LLM that already exists (one LLM can serve
    engines with different sampling, e.g. training and held-out evaluation); that LLM should have
    prefix caching on and `logprobs_mode="processed_logprobs"`, as `from_policy` sets.
    """

    def __init__(self, llm: Any, sampling: SamplingConfig, stop_ids: Sequence[int], eos_id: int, pad_id: int,
                 seed: int | None = None, capture_hidden: bool = False, enable_lora: bool = False):
        if capture_hidden:
            raise NotImplementedError(NO_HIDDEN)
        self.vllm = _import_vllm()
        self.llm = llm
        self.sampling = sampling  # read at every generate(): the trainer may change its temperature
        self.stop_ids = sorted(set(stop_ids))
        self.eos_id = eos_id
        self.pad_id = pad_id  # unused (vLLM never pads), kept so that every engine takes the same arguments
        # per-request seeds drawn from the engine's seed: a request samples the same tokens whatever
        # else is in vLLM's batch
        self.seeds = random.Random(seed) if seed is not None else None
        self.enable_lora = enable_lora
        self.lora_request: Any = None
        self.lora_version = 0

    @classmethod
    def from_policy(cls, model: str | Path, sampling: SamplingConfig, stop_ids: Sequence[int], eos_id: int, pad_id: int,
                    seed: int | None = None, gpu_memory_utilization: float = 0.3, enable_lora: bool = False,
                    max_lora_rank: int = 16, dtype: str = "bfloat16", capture_hidden: bool = False,
                    **llm_kwargs: Any) -> VLLMEngine:
        """Start vLLM on a model folder or hub id. `gpu_memory_utilization` is vLLM's share of the GPU
        (weights and KV cache); the learner, its reference and optimizer live in the rest. Further
        keyword arguments go to `vllm.LLM` (e.g. `max_model_len`, `enforce_eager`)."""
        if capture_hidden:  # before loading a model for nothing
            raise NotImplementedError(NO_HIDDEN)
        api = _import_vllm()
        _check_version(api.version)
        # in-process engine core: sync_weights hands vLLM the learner's tensors directly (the external
        # launcher of a multi-process run needs it too)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        llm_kwargs, seed = rank_kwargs(dict(llm_kwargs), seed)
        if seed is not None:
            llm_kwargs.setdefault("seed", seed)
        llm = api.LLM(model=str(model), enable_prefix_caching=True, logprobs_mode="processed_logprobs",
                      gpu_memory_utilization=gpu_memory_utilization, enable_lora=enable_lora,
                      max_lora_rank=max_lora_rank, dtype=dtype, **llm_kwargs)
        return cls(llm, sampling, stop_ids, eos_id, pad_id, seed=seed, enable_lora=enable_lora)

    def open(self, prompts: Sequence[Sequence[int]]) -> VLLMSession:
        return VLLMSession(self, prompts)

    def request_params(self, n: int) -> list[Any]:
        """One `SamplingParams` per request, each with its own seed."""
        kwargs = sampling_kwargs(self.sampling, self.stop_ids)
        seeds = [None if self.seeds is None else self.seeds.randrange(2**31) for _ in range(n)]
        return [self.vllm.SamplingParams(**kwargs, seed=seed) for seed in seeds]

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load the learner's current weights into vLLM's copy; call after every optimizer update."""
        if self.enable_lora:
            raise ValueError("this engine serves LoRA adapters on fixed base weights; push the adapter with "
                             "sync_lora(adapter_dir)")
        peft = hasattr(model, "peft_config")
        with gathered(model):  # a sharded learner (ZeRO-3) made whole for the copy, merge and unmerge included
            if peft:
                model.merge_adapter()  # base weights += the adapters' product, until unmerge_adapter()
            try:
                _load_into(self.llm, plain_weights(model))
            finally:
                if peft:
                    model.unmerge_adapter()
        if self.llm.reset_prefix_cache() is False:  # vLLM refuses while requests run
            raise RuntimeError("vLLM did not reset its prefix cache; its blocks hold keys and values of the old "
                               "weights")

    def sync_lora(self, adapter_dir: str | Path) -> None:
        """Generate with the PEFT adapter saved in `adapter_dir` from now on (a new id, so vLLM loads it)."""
        if not self.enable_lora:
            raise ValueError("sync_lora needs an engine built with enable_lora=True")
        self.lora_version += 1
        self.lora_request = self.vllm.LoRARequest(f"agentrl-policy-{self.lora_version}", self.lora_version,
                                                  str(adapter_dir))


class _Histories:
    """Each live row's whole token history, beside the caller's index of that row.

    >>> h = _Histories([[1, 2], [3]])
    >>> h.record([[7], [8, 9]]); h.extend([[5], [6]]); h.keep([1])
    >>> h.rows, h.tokens
    ([1], [[3, 8, 9, 6]])
    """

    def __init__(self, prompts: Sequence[Sequence[int]]):
        self.rows = list(range(len(prompts)))  # the caller's index of every row still in the batch
        self.tokens = [list(p) for p in prompts]  # (B, *) prompt, actions and observations so far

    def record(self, actions: Sequence[Sequence[int]], rows: Sequence[int] | None = None) -> None:
        for p, ids in zip(self._positions(rows), actions, strict=True):
            self.tokens[p].extend(ids)

    def _positions(self, rows: Sequence[int] | None) -> list[int]:
        if rows is None:
            return list(range(len(self.rows)))
        where = {r: p for p, r in enumerate(self.rows)}
        missing = [r for r in rows if r not in where]
        if missing:
            raise KeyError(f"rows {missing} are not in this session")
        return [where[r] for r in rows]

    def extend(self, chunks: Sequence[Sequence[int]], rows: Sequence[int] | None = None) -> None:
        positions = self._positions(rows)
        if len(chunks) != len(positions):
            raise ValueError(f"extend() got {len(chunks)} chunks for {len(positions)} rows")
        for p, chunk in zip(positions, chunks):
            self.tokens[p].extend(chunk)

    def add(self, rows: Sequence[int], prompts: Sequence[Sequence[int]]) -> None:
        """New rows join; vLLM's prefix cache and scheduler need nothing more."""
        if len(rows) != len(prompts):
            raise ValueError(f"add() got {len(prompts)} prompts for {len(rows)} rows")
        self.rows += list(rows)
        self.tokens += [list(p) for p in prompts]

    def drop(self, rows: Sequence[int]) -> None:
        gone = set(self._positions(rows))
        self.keep([p for p in range(len(self.rows)) if p not in gone])

    def keep(self, positions: Sequence[int]) -> None:
        """Keep only these batch positions (drop finished episodes)."""
        self.rows = [self.rows[p] for p in positions]
        self.tokens = [self.tokens[p] for p in positions]


class VLLMSession(_Histories):
    """Rows whose observation has arrived are submitted together; vLLM's scheduler batches them
    continuously inside the call (a row that stops early frees its place for the others), and a
    row that becomes ready while a call runs goes into the next call."""

    turn_level = True

    def __init__(self, engine: VLLMEngine, prompts: Sequence[Sequence[int]]):
        super().__init__(prompts)
        self.engine = engine
        self.started: list[int] = []
        self.submitted: list[int] = []

    def generate(self, rows: Sequence[int] | None = None) -> list[Generation]:
        """One action for each of `rows` (default: every row): each one's whole history goes to
        vLLM, whose prefix cache holds what it has seen before."""
        eng = self.engine
        positions = self._positions(rows)
        if not positions:
            return []
        self.submitted = [self.rows[p] for p in positions]  # the caller's rows, in the order sent
        prompts = [eng.vllm.TokensPrompt(prompt_token_ids=list(self.tokens[p])) for p in positions]
        outputs = eng.llm.generate(prompts, eng.request_params(len(prompts)), use_tqdm=False,
                                   lora_request=eng.lora_request)
        gens = [to_generation(o.outputs[0], eng.stop_ids, eng.eos_id) for o in outputs]
        self.record([g.ids for g in gens], self.submitted)
        return gens

    def start(self, rows: Sequence[int]) -> None:
        self.started += list(rows)

    def collect(self) -> list[tuple[int, Generation]]:
        rows, self.started = self.started, []
        return list(zip(rows, self.generate(rows)))


_LLMS: dict[str, Any] = {}  # one vllm.LLM per model source in this process: evaluations share the training one


def for_policy(policy: Any, sampling: SamplingConfig, seed: int, capture_hidden: bool = False,
               dtype: str = "auto") -> VLLMEngine:
    """The registry's builder (agentrl.engines.ENGINES["vllm"]): vLLM on the folder or hub id the policy
    was loaded from; a second engine on the same source reuses the first one's LLM."""
    chat = policy.chat
    model = policy.model.get_base_model() if hasattr(policy.model, "peft_config") else policy.model
    source = str(model.config._name_or_path)
    if source not in _LLMS:
        precision = {"auto": {}, "fp32": {"dtype": "float32"}, "bf16": {"dtype": "bfloat16"}}[dtype]  # rollout.dtype
        engine = VLLMEngine.from_policy(source, sampling, chat.stop_ids, chat.eos_id, chat.pad_id, seed=seed,
                                        capture_hidden=capture_hidden, **precision)
        _LLMS[source] = engine.llm
        return engine
    rank, _, world = launch_ranks()  # a second engine on this rank's LLM: this rank's seed, as from_policy gives
    return VLLMEngine(_LLMS[source], sampling, chat.stop_ids, chat.eos_id, chat.pad_id,
                      seed=seed + rank if world > 1 else seed, capture_hidden=capture_hidden)
