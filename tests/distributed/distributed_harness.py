"""Two processes, one update, under one of examples/accelerate/'s config files, against the same update
in one process (tests/distributed/test_distributed_configs.py). A module of its own, so that spawned processes
import it by name (and none of the test module's fixtures).

Each rank takes half of one fixed batch of 4 rows, the model is a tiny Llama built from a seed (with LoRA
adapters whose B is non-zero, so that the adapters change the output), the optimizer plain SGD (an
update that is the mean gradient times lr, nothing else); rank 0 hands back the full state dict after
the step and, with LoRA, the logits of the model with its adapters off (agentrl's KL reference).
"""

from __future__ import annotations

import os
import pickle
import socket
from typing import Any

import torch

VOCAB, ROWS, LENGTH, LR = 64, 4, 12, 0.5


def tiny_model(lora: bool) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                         tie_word_embeddings=True))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 task_type="CAUSAL_LM"))
        torch.manual_seed(1)
        for name, p in model.named_parameters():
            if "lora_B" in name:  # peft starts B at zero: the adapters would not change the output
                torch.nn.init.normal_(p, std=0.1)
    return model


def batch() -> torch.Tensor:
    return torch.randint(0, VOCAB, (ROWS, LENGTH), generator=torch.Generator().manual_seed(5))  # (B, T)


def one_process(lora: bool) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """The reference: one process, the mean of the two halves' losses (what DDP's averaged gradients are)."""
    model, reference = one_process_model(lora)
    return {k: v.detach().float().clone() for k, v in model.state_dict().items()}, reference


def one_process_model(lora: bool) -> tuple[torch.nn.Module, torch.Tensor | None]:
    model = tiny_model(lora)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)
    ids = batch()
    half = ROWS // 2
    loss = (model(input_ids=ids[:half], labels=ids[:half]).loss + model(input_ids=ids[half:], labels=ids[half:]).loss)
    (loss / 2).backward()
    opt.step()
    reference = None
    if lora:
        with torch.no_grad(), model.disable_adapter():
            reference = model(input_ids=batch()).logits
    return model, reference


class WeightsSink:
    """Stands in for `vllm.LLM` where `VLLMEngine.sync_weights` hands it the weights."""

    def __init__(self):
        self.weights: dict[str, torch.Tensor] = {}

    def collective_rpc(self, fn: Any, kwargs: dict[str, Any]) -> None:
        self.weights = {k: v.detach().float().cpu().clone() for k, v in kwargs["weights"]}

    def reset_prefix_cache(self) -> bool:
        return True


def synced_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What the vLLM engine's real `sync_weights` sends for `model` (its LLM a `WeightsSink`)."""
    from agentrl.engines.vllm_engine import VLLMEngine

    engine = object.__new__(VLLMEngine)  # no vLLM here: only the attributes sync_weights reads
    engine.enable_lora, engine.llm = False, WeightsSink()
    engine.sync_weights(model)
    return engine.llm.weights


def launch_env(config_file: str, num_processes: int = 2) -> dict[str, str]:
    """The environment `accelerate launch --config_file ... --num_processes N` gives each rank,
    from accelerate's own launcher code."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", config_file, "--num_processes", str(num_processes),
                                               "-m", "agentrl", "train"])
    args, defaults, _ = _validate_launch_command(args)
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)  # as launch_command sets
        _, env = prepare_deepspeed_cmd_env(args)
    else:
        env = prepare_multi_gpu_env(args)
    return {k: v for k, v in env.items() if k.startswith(("ACCELERATE_", "FSDP_"))}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank: int, world: int, env: dict[str, str], lora: bool, port: int, out: str) -> None:
    os.environ.update(env)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import torch.distributed as dist
    from accelerate import Accelerator

    acc = Accelerator()
    model = tiny_model(lora)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)
    prepared, opt = acc.prepare(model, opt)
    half = ROWS // world
    ids = batch()[rank * half:(rank + 1) * half].to(acc.device)
    acc.backward(prepared(input_ids=ids, labels=ids).loss)
    opt.step()
    result: dict[str, Any] = {"distributed_type": str(acc.distributed_type), "wrapper": type(prepared).__name__}
    if lora:  # the reference as agentrl's trainer takes it: the same model, adapters off
        with torch.no_grad(), acc.unwrap_model(prepared).disable_adapter():
            result["reference"] = prepared(input_ids=batch().to(acc.device)).logits.float().cpu().numpy()
    # what a vLLM engine on this rank would be sent: whole weights on every rank (a collective under ZeRO-3)
    synced = synced_weights(acc.unwrap_model(prepared))
    state = acc.get_state_dict(prepared)  # collective: every rank takes part
    if rank == 0:
        result["state"] = {k: v.detach().float().cpu().numpy() for k, v in state.items()}
    result["synced"] = {k: v.numpy() for k, v in synced.items()}
    if rank == 1:  # rank 1's copy, to be compared with rank 0's
        with open(out + ".rank1", "wb") as f:
            pickle.dump(result["synced"], f)
    if rank == 0:
        with open(out, "wb") as f:
            pickle.dump(result, f)
    dist.barrier()
    acc.end_training()


def two_processes(config_file: str, lora: bool, out: str, env_overrides: dict[str, str] | None = None) -> dict:
    """Run `rank_main` on 2 spawned processes; rank 0's result (state dict as tensors)."""
    import torch.multiprocessing as tmp

    env = {**launch_env(config_file), **(env_overrides or {})}
    tmp.start_processes(rank_main, args=(2, env, lora, free_port(), out), nprocs=2, start_method="spawn")
    with open(out, "rb") as f:
        result = pickle.load(f)
    result["state"] = {k: torch.from_numpy(v) for k, v in result["state"].items()}
    with open(out + ".rank1", "rb") as f:
        result["synced_rank1"] = {k: torch.from_numpy(v) for k, v in pickle.load(f).items()}
    result["synced"] = {k: torch.from_numpy(v) for k, v in result["synced"].items()}
    if "reference" in result:
        result["reference"] = torch.from_numpy(result["reference"])
    return result
