"""examples/accelerate/'s config files: each loads with accelerate's own loader and launcher, names only
settings the launcher knows, and says what the file promises (FSDP keeps the original parameters and
wraps a decoder layer the model has); what can run on a CPU runs: DeepSpeed ZeRO-2 and ZeRO-3 (with
LoRA) over 2 gloo processes give the one-process update. FSDP runs only where accelerate finds a GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DistributedType
from distributed_harness import launch_env, one_process, one_process_model, synced_weights, tiny_model, two_processes

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "accelerate"
CONFIGS = {"ddp.yaml": DistributedType.MULTI_GPU, "fsdp.yaml": DistributedType.FSDP,
           "deepspeed_zero2.yaml": DistributedType.DEEPSPEED, "deepspeed_zero3.yaml": DistributedType.DEEPSPEED}


def test_the_folder_holds_the_configs_tested_here():
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted(CONFIGS)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_loads_with_accelerates_loader_and_launcher(name, monkeypatch):
    monkeypatch.chdir(EXAMPLES.parent.parent)  # the files name paths from the repository root, as launched
    cfg = load_config_from_file(str(EXAMPLES / name))
    assert isinstance(cfg, ClusterConfig) and cfg.distributed_type == CONFIGS[name]
    assert cfg.num_processes == 8 and cfg.num_machines == 1 and cfg.mixed_precision == "no"
    args = launch_command_parser().parse_args(["--config_file", str(EXAMPLES / name), "-m", "agentrl", "train"])
    args, _, _ = _validate_launch_command(args)
    assert (args.use_fsdp, args.use_deepspeed, args.multi_gpu) == (
        CONFIGS[name] == DistributedType.FSDP, CONFIGS[name] == DistributedType.DEEPSPEED,
        CONFIGS[name] == DistributedType.MULTI_GPU)
    assert args.num_processes == 8


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_nested_setting_is_a_launcher_flag(name):
    """accelerate copies fsdp_config/deepspeed_config keys onto its arguments unchecked: a misspelt key
    would be dropped in silence, so each must be one of the launcher's own flags."""
    cfg = load_config_from_file(str(EXAMPLES / name))
    flags = vars(launch_command_parser().parse_args(["-m", "agentrl"]))
    keys = [k if k.startswith("fsdp") else f"fsdp_{k}" for k in cfg.fsdp_config] + list(cfg.deepspeed_config)
    assert [k for k in keys if k not in flags] == []


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_json_is_what_the_yaml_names(stage, monkeypatch):
    import json

    monkeypatch.chdir(EXAMPLES.parent.parent)
    env = launch_env(str(EXAMPLES / f"deepspeed_zero{stage}.yaml"))
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true" and env["ACCELERATE_DEEPSPEED_ZERO3_INIT"] == "false"
    ds = json.loads(Path(env["ACCELERATE_DEEPSPEED_CONFIG_FILE"]).read_text())
    assert ds["zero_optimization"]["stage"] == stage
    # no dataloader is prepared: DeepSpeed must be told a micro-batch size, and accumulate nothing itself
    assert ds["train_micro_batch_size_per_gpu"] == 1 and ds["gradient_accumulation_steps"] == 1


def test_fsdp_keeps_the_original_parameters_and_wraps_the_models_decoder_layer(monkeypatch):
    """The env `accelerate launch` gives each rank, read back by accelerate's own FSDP plugin."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    env = launch_env(str(EXAMPLES / "fsdp.yaml"))
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_USE_ORIG_PARAMS"] == "true"
    assert env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "Qwen2DecoderLayer" and env["FSDP_SHARDING_STRATEGY"] == "FULL_SHARD"
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # sync_module_states asks the plugin for the current GPU, which this check does not need
    monkeypatch.setenv("FSDP_SYNC_MODULE_STATES", "false")
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.use_orig_params is True and plugin.fsdp_version == 1

    qwen = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2))
    plugin.set_auto_wrap_policy(qwen)
    assert plugin.auto_wrap_policy.keywords["transformer_layer_cls"] == {Qwen2DecoderLayer}
    # agentrl's tiny policy (a Llama, here with LoRA around it) needs its own class named ...
    with pytest.raises(ValueError, match="Could not find the transformer layer class Qwen2DecoderLayer"):
        FullyShardedDataParallelPlugin().set_auto_wrap_policy(tiny_model(lora=True))
    monkeypatch.setenv("FSDP_TRANSFORMER_CLS_TO_WRAP", "LlamaDecoderLayer")
    llama = FullyShardedDataParallelPlugin()
    llama.set_auto_wrap_policy(tiny_model(lora=True))
    assert llama.auto_wrap_policy.keywords["transformer_layer_cls"] == {LlamaDecoderLayer}
    # ... or none: the model's own _no_split_modules
    monkeypatch.delenv("FSDP_TRANSFORMER_CLS_TO_WRAP")
    default = FullyShardedDataParallelPlugin()
    default.set_auto_wrap_policy(tiny_model(lora=False))
    assert default.auto_wrap_policy.keywords["transformer_layer_cls"] == {LlamaDecoderLayer}


def assert_same_update(result, lora):
    want, reference = one_process(lora)
    got = result["state"]
    assert sorted(got) == sorted(want)
    worst = max((got[k] - want[k]).abs().max().item() for k in want)
    assert worst < 1e-5, worst
    start = {k: v.detach().float() for k, v in tiny_model(lora).state_dict().items()}
    moved = [k for k in want if (want[k] - start[k]).abs().max() > 0]
    assert moved  # the step changed something, so equal states say something
    if lora:
        assert all("lora_" in k for k in moved)  # the frozen base stayed as it was
        assert (result["reference"] - reference).abs().max().item() < 1e-5
    # the vLLM engine's sync_weights on each rank sends the whole, updated (LoRA: merged) weights
    expected = synced_weights(one_process_model(lora)[0])
    for synced in (result["synced"], result["synced_rank1"]):
        assert sorted(synced) == sorted(expected)
        assert max((synced[k] - expected[k]).abs().max().item() for k in expected) < 1e-5


@pytest.mark.parametrize("stage,lora", [(2, False), (3, True)])
def test_deepspeed_two_processes_give_the_one_process_update(stage, lora, tmp_path, monkeypatch):
    """DeepSpeed's CPU accelerator and gloo: the shipped JSON as it is, 2 ranks x 2 rows vs 1 x 4; and
    what each rank's vLLM engine would be sent after the update (ZeRO-3: gathered from the shards)."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (not in the dev extra: an sdist that builds "
                                            "against the installed torch; pip install --no-build-isolation deepspeed)")
    monkeypatch.chdir(EXAMPLES.parent.parent)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    result = two_processes(str(EXAMPLES / f"deepspeed_zero{stage}.yaml"), lora, str(tmp_path / "rank0.pkl"))
    assert result["distributed_type"] == "DistributedType.DEEPSPEED" and result["wrapper"] == "DeepSpeedEngine"
    assert_same_update(result, lora)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="FSDP through accelerate needs 2 GPUs: accelerate 1.15 "
                    "selects FSDP only on GPU-type runs (a CPU run with ACCELERATE_USE_FSDP becomes MULTI_CPU, i.e. "
                    "DDP), and its plugin's sync_module_states asks for the current GPU")
@pytest.mark.parametrize("lora", [False, True])
def test_fsdp_two_gpus_give_the_one_process_update(lora, tmp_path, monkeypatch):
    monkeypatch.chdir(EXAMPLES.parent.parent)
    result = two_processes(str(EXAMPLES / "fsdp.yaml"), lora, str(tmp_path / "rank0.pkl"),
                           {"FSDP_TRANSFORMER_CLS_TO_WRAP": "LlamaDecoderLayer"})
    assert result["distributed_type"] == "DistributedType.FSDP"
    assert_same_update(result, lora)
