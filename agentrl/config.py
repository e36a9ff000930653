"""Configuration: pydantic models with `extra="forbid"`, so a typo fails before any work is done.

Every field says why its default is what it is. A run's resolved config is written to its folder
as `config.yaml`, and that file can be passed back with `--config` to repeat the run.

>>> cfg = TrainConfig(algo="grpo", preset="dr-grpo")
>>> cfg.credit_config.std_norm, cfg.loss.agg
(False, 'seq-mean-token-sum-norm')
>>> TrainConfig(rollout={"group_size": 0})
Traceback (most recent call last):
...
pydantic_core._pydantic_core.ValidationError: 1 validation error for TrainConfig
rollout.group_size
  Input should be greater than or equal to 1 [type=greater_than_equal, input_value=0, input_type=int]
...
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from agentrl.engines.base import SamplingConfig
from agentrl.health import HealthConfig
from agentrl.loss import LossConfig
from agentrl.policy import TinyModelConfig

# Presets fill in fields the user did not set (ALGORITHMS.md §2).
PRESETS: dict[str, dict[str, Any]] = {
    # DAPO (arXiv 2503.14476): clip-higher, dynamic sampling, token-mean, soft overlong, no KL term
    "dapo": {
        "loss": {"eps_low": 0.2, "eps_high": 0.28, "agg": "token-mean", "kl_coef": 0.0},
        "credit": {"dynamic_sampling": "resample", "overlong": "soft"},
    },
    # Dr. GRPO (arXiv 2503.20783): no std normalisation, constant-length normaliser, no KL term
    "dr-grpo": {"loss": {"agg": "seq-mean-token-sum-norm", "kl_coef": 0.0}, "credit": {"std_norm": False}},
}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EnvConfig(Strict):
    id: str = Field("agentrl/Vault-v0", description="A registered id (agentrl/Vault-v0) or module:Class.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Passed to the environment's constructor (e.g. locks, slack).")


class RolloutConfig(Strict):
    groups: int = Field(8, ge=1, description="Tasks per update. 8 x 8 = 64 episodes keeps one batched forward busy on 2 cores.")
    group_size: int = Field(8, ge=1, description="G episodes per task: the group baseline's sample. 8 leaves few all-equal groups at pass rates 0.2-0.8.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    max_context: int | None = Field(None, ge=16, description="Episodes whose next turn would not fit are truncated; default: the model's max positions.")


class LoraSettings(Strict):
    """LoRA adapters through peft. With r > 0 only the adapters train, and the KL reference is the
    same model with its adapters switched off, so no second copy of the weights is held."""

    r: int = Field(0, ge=0, description="Adapter rank; 0 trains every weight (full fine-tuning).")
    alpha: float | None = Field(None, gt=0, description="Scaling numerator (the update is alpha/r * BA); default 2r.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapters' input; 0 keeps rollouts and training the same function.")
    target_modules: str | list[str] = Field("all-linear", description="Modules that get adapters: 'all-linear' or names such as [q_proj, v_proj].")


class OptimConfig(Strict):
    lr: float = Field(2e-4, gt=0, description="Policy learning rate. Tiny models tolerate more than LLMs (1e-6 to 1e-5 for 7B).")
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping, the usual PPO guard against one bad batch.")
    ppo_epochs: int = Field(1, ge=1, description="Passes over each batch. 1 keeps updates on-policy (ratio ~1); more reuse data at the price of clipping.")
    minibatches: int = Field(2, ge=1, description="Optimizer steps per epoch, each over 1/minibatches of the episodes.")
    micro_batch_tokens: int = Field(16384, ge=1, description="Padded tokens per forward: a minibatch is split into micro-batches of "
                                    "episodes of similar length (each padded only to its own longest) whose gradients add up to the minibatch's.")
    bf16: bool = Field(True, description="bf16 autocast on a CUDA GPU that supports it (weights and optimizer stay fp32); ignored on CPU.")
    lora: LoraSettings = Field(default_factory=LoraSettings)


class SFTConfig(Strict):
    episodes: int = Field(3000, ge=1, description="Demonstrations from the environment's noisy expert (DESIGN.md: 3,000 taught Vault's sums).")
    epochs: int = Field(4, ge=1, description="Passes over the demonstrations; 4 teach Vault's sums to the tiny policy (3 were not enough in DESIGN.md's measurement).")
    lr: float = Field(3e-3, gt=0, description="Peak learning rate of the warm start (linear decay); high because the model starts from scratch.")
    batch_size: int = Field(32, ge=1)
    noise: float = Field(0.35, ge=0, le=1, description="The expert's slip rate: noisy on purpose, so that the warm start leaves RL headroom (Vault at 3 locks: the expert itself passes ~0.55).")


class EvalConfig(Strict):
    episodes: int = Field(128, ge=1, description="Held-out episodes per evaluation; 128 gives a pass-rate standard error of about 0.044.")
    every: int = Field(10, ge=0, description="Evaluate every N updates (0: only before and after training).")
    seed_offset: int = Field(1_000_000, ge=0, description="Held-out seeds start here; training seeds stay below it.")


class LogConfig(Strict):
    tensorboard: bool = Field(False, description="Also write TensorBoard event files into <run>/tensorboard (needs `tensorboard`); off: metrics.jsonl always has everything.")
    wandb: bool = Field(False, description="Also log to Weights & Biases in offline mode into <run>/wandb (needs `wandb`); offline, since runs here have no network.")
    wandb_project: str = Field("agentrl", description="W&B project name for `wandb sync` later.")


class TrainConfig(Strict):
    """Everything `agentrl train` needs; the defaults run the main job on a 2-core CPU in minutes."""

    algo: str = Field("grpo", description="Credit assigner, a key of agentrl.algorithms.ASSIGNERS (see `agentrl algos`).")
    preset: Literal["dapo", "dr-grpo"] | None = Field(None, description="Fills in the named recipe's settings that you did not set.")
    env: EnvConfig = Field(default_factory=EnvConfig)
    model: str | None = Field(None, description="HF hub id or folder. None builds the tiny policy and warm-starts it by SFT (cached).")
    engine: Literal["torch", "vllm"] = Field("torch", description="Generation backend: torch (CPU/GPU) or vllm (GPU, [vllm] extra).")
    device: str = Field("auto", description="'auto' (cuda if available), 'cpu' or 'cuda'.")
    updates: int = Field(40, ge=0, description="Policy updates (each one rollout batch); 40 lift Vault-v0 by ~0.3 in ~100 s on 2 cores.")
    seed: int = Field(0, description="Seeds the model build, the warm start, sampling and the task stream.")
    out: str | None = Field(None, description="Run folder; default runs/<algo>-<time>.")
    credit: dict[str, Any] = Field(default_factory=dict, description="Options of the chosen assigner (its Config).")
    loss: LossConfig = Field(default_factory=LossConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)
    health: HealthConfig = Field(default_factory=HealthConfig, description="Alarms (entropy collapse, KL drift, stalls, verifier over-fit, ...) and interventions; see agentrl.health.")
    log: LogConfig = Field(default_factory=LogConfig, description="Optional loggers beside metrics.jsonl.")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset"):
            name = data["preset"]
            if name not in PRESETS:
                return data  # the Literal check reports it
            merged = copy.deepcopy(PRESETS[name])
            _deep_update(merged, {k: v for k, v in data.items()})
            return merged
        return data

    @field_validator("algo")
    @classmethod
    def _known_algo(cls, v: str) -> str:
        from agentrl.algorithms import get_assigner

        get_assigner(v)  # raises with the list of known ones
        return v

    @field_validator("credit")
    @classmethod
    def _valid_credit(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        from agentrl.algorithms import get_assigner

        algo = info.data.get("algo")
        if algo is None:
            return v  # algo itself failed; that error is reported
        try:
            get_assigner(algo).Config(**v)
        except ValidationError as e:
            lines = [f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
            raise ValueError(f"invalid options for --algo {algo}: " + "; ".join(lines)) from None
        return v

    @model_validator(mode="after")
    def _engine_serves_the_assigner(self) -> TrainConfig:
        from agentrl.algorithms import reads_hidden

        if self.engine == "vllm" and reads_hidden(self.algo, self.credit_config):
            raise ValueError(f"--engine vllm cannot serve --algo {self.algo} with these options: its turn critic or learned PRM reads the policy's hidden states, "
                             "which vLLM does not return; use --engine torch (or grpo, gigpo, steppo with the env or implicit PRM)")
        return self

    @property
    def credit_config(self) -> BaseModel:
        from agentrl.algorithms import get_assigner

        return get_assigner(self.algo).Config(**self.credit)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _deep_update(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_update(base[k], v)
        else:
            base[k] = v
    return base


def parse_override(item: str) -> dict[str, Any]:
    """`rollout.group_size=4` -> {"rollout": {"group_size": 4}} (values parsed as YAML)."""
    if "=" not in item:
        raise ValueError(f"--set expects key=value, got {item!r}")
    key, _, raw = item.partition("=")
    value = yaml.safe_load(raw) if raw else ""
    out: dict[str, Any] = {}
    node = out
    parts = key.strip().split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


def load_config(path: str | Path | None = None, overrides: list[dict[str, Any]] | None = None) -> TrainConfig:
    """A config file (YAML) with overrides applied on top, validated once at the end."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"config file {p} does not exist")
        loaded = yaml.safe_load(p.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{p}: a config file must hold a mapping, got {type(loaded).__name__}")
        data = loaded
    for o in overrides or []:
        _deep_update(data, o)
    return TrainConfig(**data)
