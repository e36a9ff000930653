"""Configuration: pydantic models with `extra="forbid"`, so a typo fails before any work is done.

Every field says why its default is what it is; the command line is generated from these models
(`agentrl train --help` shows each field's description). A run's resolved config, with the chosen
assigner's options and their defaults, is written to its folder as `config.yaml`, and that file can
be passed back with `--config` to repeat the run. This module imports neither torch nor
transformers, so a bad flag or file is answered at once.

>>> cfg = TrainConfig(algo="grpo", preset="dr-grpo")
>>> cfg.credit.std_norm, cfg.loss.agg
(False, 'seq-mean-token-sum-norm')
>>> TrainConfig(algo="turn-ppo").credit.gamma
0.99
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
import re
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from tyro.conf import Suppress, arg  # the command line's generator: how a field appears as a flag

from agentrl.algorithms import CreditConfig, get_spec
from agentrl.context import ContextConfig
from agentrl.engines import get_engine_spec
from agentrl.health.config import HealthConfig

# Presets fill in fields the user did not set (docs/algorithms.md, "Presets").
PRESETS: dict[str, dict[str, Any]] = {
    # DAPO (arXiv 2503.14476): clip-higher, dynamic sampling, token-mean, soft overlong, no KL term
    "dapo": {
        "loss": {"eps_low": 0.2, "eps_high": 0.28, "agg": "token-mean", "kl_coef": 0.0},
        "credit": {"dynamic_sampling": "resample", "overlong": "soft"},
    },
    # Dr. GRPO (arXiv 2503.20783): no std normalisation, constant-length normaliser, no KL term
    "dr-grpo": {"loss": {"agg": "seq-mean-token-sum-norm", "kl_coef": 0.0}, "credit": {"std_norm": False}},
}

class Default(NamedTuple):
    """A default for a pretrained model: its value and why (the measurement it comes from, by its JSON)."""

    value: Any
    why: str


# Each field's own default below is the tiny policy's: a model built from scratch, which needs thousands of
# demonstrations at a high rate. A pretrained model (`--model` that is not agentrl's tiny policy) already writes
# text and learns a call format from a hundred; at the tiny policy's budget its SFT would run for hours on a CPU. So
# `agentrl sft` and `agentrl train` with such a model fill these in, for the fields the user did not set (by flag,
# --set or --config), and say which (`fit_pretrained`). Each value is what was measured to work on
# SmolLM2-135M-Instruct (benchmarks/real_model.py), named by its JSON; a value no run measured says so.
# docs/models.md, "Defaults for a pretrained model".
PRETRAINED: dict[str, dict[str, Default]] = {
    # agentrl sft --model M: full fine-tuning (--lora-r 0), which a model of SmolLM2's size fits in a CPU's memory
    "sft": {
        "sft.episodes": Default(128, "real_model.json sft.0.demonstrations: a warm start that calls the tool"),
        "sft.epochs": Default(2, "real_model.json sft.0.epochs"),
        "sft.batch_size": Default(8, "real_model.json settings.sft_batch"),
        "sft.lr": Default(1e-4, "real_model.json settings.sft_lr, full fine-tuning (sft_lora 0)"),
        "eval_episodes": Default(24, "real_model.json settings.eval_episodes: the held-out episodes every arm was "
                                 "judged on"),
    },
    # agentrl sft --model M --lora-r R: LoRA's own recipe, the one LoRA SFT that taught the call format (at 3e-4
    # a LoRA SFT still wrote prose: docs/benchmarks.md, "A real model")
    "sft-lora": {
        "sft.episodes": Default(64, "real_model_lora.json sft.0.demonstrations"),
        "sft.epochs": Default(3, "real_model_lora.json sft.0.epochs"),
        "sft.batch_size": Default(4, "real_model_lora.json settings.sft_batch"),
        "sft.lr": Default(1e-3, "real_model_lora.json settings.sft_lr with sft_lora 16: its warm start matched full "
                          "fine-tuning's"),
        "eval_episodes": Default(24, "real_model_lora.json settings.eval_episodes"),
    },
    # agentrl train --model M: RL with LoRA adapters from the warm start, as every real-model arm ran
    "train": {
        "updates": Default(6, "real_model.json runs.*.updates: lifted the held-out pass rate in every grpo seed"),
        "rollout.groups": Default(2, "real_model.json settings.groups"),
        "rollout.group_size": Default(4, "real_model.json settings.group_size"),
        "optim.lora.r": Default(16, "real_model.json settings.lora"),
        "optim.lr": Default(5e-5, "real_model.json settings.lr, with LoRA r16"),
        "optim.minibatches": Default(1, "benchmarks/real_model.py's RL command: one step per update"),
        "eval.episodes": Default(24, "real_model.json settings.eval_episodes"),
        "eval.every": Default(0, "benchmarks/real_model.py's RL command: held out before the first update and after "
                              "the last"),
    },
    # agentrl train --model M --optim.lora.r 0: RL that trains every weight, at the rate the gateway's real-model
    # run trained SmolLM2 fully with
    "train-full": {
        "optim.lr": Default(1e-5, "gateway_smollm2.json: full fine-tuning at benchmarks/gateway_smollm2.py's --lr "
                            "lifted the held-out pass rate in every seed (warm_start_mean to final_mean)"),
    },
}


def _pretrained(path: str, command: str = "train", lora: str | None = None) -> str:
    """The sentence a field's description ends with: what a pretrained model gets instead of the field's default."""
    text = f" In agentrl {command.split('-')[0]}, a pretrained --model gets {PRETRAINED[command][path].value:g}"
    if lora is not None:
        text += f" ({PRETRAINED[lora][path].value:g} with LoRA)"
    return text + " unless set: measured on SmolLM2-135M-Instruct (docs/models.md, 'Defaults for a pretrained model')."


Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
PrefLoss = Literal["dpo", "simpo", "ipo"]
# A free-form mapping the command line cannot type field by field: given with --set KEY.NAME=VALUE
# or a subcommand's own KEY=VALUE flag instead (tyro would otherwise refuse the type).
FreeMapping = Annotated[dict[str, Any], Suppress]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SamplingConfig(Strict):
    """How actions are sampled."""

    temperature: float = Field(1.0, ge=0.0, description="Softmax temperature; 1.0 samples the policy as trained, 0 is "
                               "greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling; 1.0 keeps the exact policy distribution "
                         "that PPO's ratio assumes.")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens; 0 disables.")
    max_new_tokens: int = Field(48, ge=1, description="Per-turn cap on action tokens; an action cut here ends with "
                                "finish reason 'length'.")


class LossConfig(Strict):
    """The policy loss shared by every assigner."""

    eps_low: float = Field(0.2, ge=0.0, lt=1.0, description="Lower clip range of the ratio (PPO's 0.2).")
    eps_high: float = Field(0.2, ge=0.0, description="Upper clip range; DAPO's clip-higher raises it to 0.28 so that "
                            "unlikely good tokens can grow, which resists entropy collapse.")
    dual_clip: float | None = Field(None, gt=1.0, description="For A < 0, cap the loss at c * |A| (dual-clip PPO, c = "
                                    "3), so a stale very-likely token cannot blow the update up.")
    kl_coef: float = Field(0.0, ge=0.0, description="beta on the k3 KL to the reference. 0 as in DAPO and Dr. GRPO: "
                           "the verifier, not the reference, anchors the policy; KL is still measured.")
    entropy_coef: float = Field(0.0, ge=0.0, description="c_H: entropy bonus. Off by default; the health monitor's "
                                "entropy alarm says when to raise it.")
    agg: Aggregation = Field("token-mean", description="token-mean (DAPO: long episodes are not down-weighted), "
                             "seq-mean-token-mean (original GRPO), seq-mean-token-sum-norm (Dr. GRPO, with max_len).")
    max_len: int = Field(512, ge=1, description="L_max of seq-mean-token-sum-norm: the constant that replaces each "
                         "episode's own length.")
    ratio: Literal["token", "sequence", "turn"] = Field("token", description="Importance ratio per token (PPO), per "
                                                        "episode or per turn (GSPO: exp of the mean log-ratio).")
    off_policy: Literal["behaviour", "decoupled"] = Field(
        "behaviour", description="What the ratio is taken against when rollouts run ahead (rollout.max_staleness > 0): "
        "behaviour (pi / mu, the stored behaviour log-probs, as on-policy) or decoupled (AReaL's decoupled PPO: clip "
        "pi / pi_prox, pi_prox the weights at the start of the update at one extra forward, and weight each token by "
        "min(pi_prox / mu, is_cap)); docs/algorithms.md, 'Off-policy episodes'.")
    is_cap: float = Field(2.0, gt=0.0, description="C of the decoupled loss: the cap on the importance weight "
                          "pi_prox / mu, so that a token the old policy found unlikely cannot dominate (AReaL: 2-5).")
    mismatch: Literal["none", "token-tis", "seq-tis", "token-mask", "seq-mask", "icepop"] = Field(
        "none", description="Correction for the engine/trainer gap: the rollout engine's log-probs mu (bf16, another "
        "kernel) against the trainer's own pi_old under the same weights. none (default: the ratio against mu, as "
        "ever; the gap is still measured, mismatch/*); token-tis (weight min(pi_old / mu, mismatch_cap), Yao et al.'s "
        "truncated IS); seq-tis (one capped weight per episode, mismatch_seq); token-mask / seq-mask (drop tokens or "
        "episodes whose ratio leaves [mismatch_low, mismatch_high], out of the loss's denominator too: verl's "
        "rejection sampling); icepop (keep the ratio as a weight inside the bounds, 0 outside, denominator kept). "
        "Any correction takes the PPO ratio against pi_old and costs one forward per batch; docs/algorithms.md, "
        "'Engine mismatch'.")
    mismatch_cap: float = Field(2.0, gt=1.0, description="C of token-tis and seq-tis, and the band [1/C, C] the "
                                "mismatch/*_out_frac metrics count outside: 2, verl's rollout_is_threshold and the "
                                "cap Yao et al. report stable.")
    mismatch_seq: Literal["geometric", "product"] = Field(
        "geometric", description="An episode's ratio for seq-tis and seq-mask: geometric (exp of the mean token "
        "log-ratio: comparable across lengths) or product (the exact sequence IS weight, whose variance grows with "
        "length).")
    mismatch_low: float = Field(0.5, gt=0.0, lt=1.0, description="Lower bound of the masks (token-mask, seq-mask, "
                                "icepop): ICE-POP's alpha 0.5.")
    mismatch_high: float = Field(5.0, gt=1.0, description="Upper bound of the masks: ICE-POP's beta 5 (asymmetric: "
                                 "tokens the trainer likes far more than the engine are the ones that blow up).")


class TinyModelConfig(Strict):
    """The built-in policy's size: ~0.25M parameters, big enough to learn Vault's sums by SFT in a
    couple of minutes on 2 CPU cores, small enough that a rollout batch of 64 is fast."""

    hidden_size: int = Field(96, ge=8, description="Width of the residual stream; a multiple of num_attention_heads.")
    intermediate_size: int = Field(256, ge=8, description="Width of the MLP blocks.")
    num_hidden_layers: int = Field(2, ge=1, description="Transformer blocks.")
    num_attention_heads: int = Field(4, ge=1, description="Query heads; hidden_size / heads must be even (rotary "
                                     "embeddings).")
    num_key_value_heads: int = Field(2, ge=1, description="Key/value heads (grouped-query attention); divides "
                                     "num_attention_heads.")
    max_position_embeddings: int = Field(1024, ge=64, description="Context length; also the rollout's max_context.")
    vocab_size: int = Field(1024, ge=300, description="BPE target size; the trainer stops early when the corpus has no "
                            "more merges.")

    @model_validator(mode="after")
    def _shapes_fit(self) -> TinyModelConfig:
        # checked here, not when the model is built: a bad shape must fail before the warm start starts
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                             f"{self.num_attention_heads}")
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError("head size hidden_size / num_attention_heads = "
                             f"{self.hidden_size // self.num_attention_heads} must be even (rotary position embeddings "
                             "rotate pairs of dimensions)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_key_value_heads {self.num_key_value_heads} must divide num_attention_heads "
                             f"{self.num_attention_heads}")
        return self


class EnvConfig(Strict):
    id: Annotated[str, arg(aliases=("--env",))] = Field("agentrl/Vault-v0", description="A registered id "
                                                        "(agentrl/Vault-v0), module:Class or path/to/file.py:Class.")
    kwargs: FreeMapping = Field(default_factory=dict, description="Passed to the environment's constructor (e.g. "
                                "locks, slack); on the command line --env-kw locks=4.")


class RolloutConfig(Strict):
    groups: int = Field(8, ge=1, description="Tasks per update. 8 x 8 = 64 episodes keeps one batched forward busy on "
                        "2 cores." + _pretrained("rollout.groups"))
    group_size: int = Field(8, ge=1, description="G episodes per task: the group baseline's sample. 8 leaves few "
                            "all-equal groups at pass rates 0.2-0.8." + _pretrained("rollout.group_size"))
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="How rollout actions are sampled.")
    max_context: int | None = Field(None, ge=16, description="Episodes whose next turn would not fit are truncated; "
                                    "default: the model's max positions.")
    env_workers: str = Field("thread:64", description="Where env reset/step/verify run: thread:N (default; slow tools "
                             "mostly wait on I/O or a subprocess, and 64 waiting threads overlap a whole 8x8 batch), "
                             "process:N (CPU-bound Python envs), ray:N (Ray actors, [ray] extra), or serial (one after "
                             "another, the old loop).")
    tool_timeout: float | None = Field(60.0, gt=0, description="Wall-clock seconds a tool call may take before the "
                                       "policy is told it timed out and the episode goes on; 60 s: far beyond a "
                                       "healthy remote API or the sandbox's own limits, so it only ever catches a hung "
                                       "call. None: no limit.")
    tool_timeouts: FreeMapping = Field(default_factory=dict, description="Per-tool limits in seconds by tool name "
                                       "(e.g. run_tests: 10), over the tool's own `timeout` attribute and "
                                       "tool_timeout.")
    max_batch_rows: int | None = Field(None, ge=1, description="Rows the engine holds at once; the queue's next "
                                       "episodes take the rows of those that end (continuous batching). None: the "
                                       "whole update at once, which fits the tiny policy on a CPU; on a GPU, what its "
                                       "memory holds.")
    max_staleness: int = Field(
        0, ge=0, description="How many policy versions behind the learner an episode may be. 0 (default): on-policy, "
        "each update rolls out with the weights it trains. 1 or more: the rollouts of the next updates run in a "
        "thread while this one trains (from a copy of the weights refreshed after every update), which pays where "
        "rollouts wait on slow tools or a GPU idles while the learner steps, and costs off-policy drift "
        "(loss.off_policy corrects it). One process only; a resumed run is not bit-exact (README, 'Rollouts that "
        "never wait').")
    dtype: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="The precision the engine samples in. auto: the engine's own (torch: the trainer's "
        "weights as they are, fp32; vllm: bf16). bf16 on the torch engine samples from a bf16 copy of the weights, "
        "refreshed after every update, while the trainer stays fp32: the engine/trainer gap that vLLM in bf16 "
        "against an fp32 learner has, on a CPU (measured as mismatch/*; loss.mismatch corrects it).")
    schedule: Literal["arrival", "lockstep"] = Field(
        "arrival", description="When ready rows generate: arrival (a row whose observation is back goes into the next "
        "batch without waiting for slower tools, so a slow tool costs the others at most one generation) or lockstep "
        "(every turn waits for every env call, tools still concurrent). Batched log-probs depend in their last bit on "
        "which rows share a forward, and under arrival that depends on timing: lockstep (or env_workers serial) makes "
        "a run, and a resumed run, bit-identical on CPU.")
    share_prefill: bool = Field(
        True, description="Prefill a prompt that several rows start from once and copy its keys and values to each "
        "(a group's G samples share one prompt: G times fewer prompt tokens through the model). The samples are "
        "those of a row-by-row prefill up to the last bit of a matmul at another batch size; off: every row's prompt "
        "runs (torch engine; vLLM shares prefixes in its own cache).")
    history: Literal["auto", "append", "template"] = Field(
        "auto", description="How each turn's context is laid out. append: the model's earlier actions and the "
        "observations token for token, one sequence per episode (one prefill, the cache kept). template: the chat "
        "template's rendering of the conversation so far, as a server would give it; where the template rewrote the "
        "history (Qwen3's drops earlier <think>), the next action starts a new segment, trained on exactly that "
        "context. auto: template where a probe conversation shows that appending would part from the template, else "
        "append (docs/models.md, 'History').")
    context: ContextConfig = Field(
        default_factory=ContextConfig, description="What an episode does when its next turn would not fit the "
        "context budget: truncate (default, as before), drop-observations, window, summarize (the policy's own "
        "summary, a trained action) or env (docs/context.md).")

    @model_validator(mode="after")
    def _budget_fits(self) -> RolloutConfig:
        c = self.context
        if c.budget is not None and self.max_context is not None and c.budget > self.max_context:
            raise ValueError(f"context.budget {c.budget} is over max_context {self.max_context}: the budget can only "
                             "be tighter than the model's context")
        if c.policy == "summarize" and c.summary_max_tokens > self.sampling.max_new_tokens:
            raise ValueError(f"context.summary_max_tokens {c.summary_max_tokens} is over sampling.max_new_tokens "
                             f"{self.sampling.max_new_tokens}: a summary is one generation, cut to the cap")
        return self

    @field_validator("env_workers")
    @classmethod
    def _workers_spec(cls, v: str) -> str:
        if not re.fullmatch(r"(thread|process|ray):[1-9][0-9]*|serial", v.strip()):
            raise ValueError(f"env_workers must be thread:N, process:N, ray:N (N >= 1) or serial, got {v!r}")
        return v.strip()

    @field_validator("tool_timeouts")
    @classmethod
    def _positive_limits(cls, v: dict[str, Any]) -> dict[str, Any]:
        bad = {k: x for k, x in v.items() if isinstance(x, bool) or not isinstance(x, (int, float)) or x <= 0}
        if bad:
            raise ValueError(f"tool_timeouts: every limit must be a number of seconds > 0, got {bad}")
        return {k: float(x) for k, x in v.items()}

class LoraSettings(Strict):
    """LoRA adapters through peft. With r > 0 only the adapters train, and the KL reference is the
    same model with its adapters switched off, so no second copy of the weights is held."""

    r: int = Field(0, ge=0, description="Adapter rank; 0 trains every weight (full fine-tuning). In "
                   "agentrl train, a pretrained --model gets "
                   f"{PRETRAINED['train']['optim.lora.r'].value} unless set: every real-model RL run trained LoRA "
                   "adapters (docs/models.md, 'Defaults for a pretrained model').")
    alpha: float | None = Field(None, gt=0, description="Scaling numerator (the update is alpha/r * BA); default 2r.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapters' input; 0 keeps rollouts and "
                           "training the same function.")
    target_modules: list[str] = Field(["all-linear"], min_length=1, description="Modules that get adapters: "
                                      "all-linear, or names such as q_proj v_proj.")

    @field_validator("target_modules", mode="before")
    @classmethod
    def _one_name_is_a_list(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v  # older config files wrote target_modules: all-linear

    @property
    def peft_targets(self) -> str | list[str]:
        """What peft's LoraConfig expects: the string 'all-linear' or a list of module names."""
        return "all-linear" if self.target_modules == ["all-linear"] else list(self.target_modules)


class OptimConfig(Strict):
    lr: float = Field(2e-4, gt=0, description="Policy learning rate. Tiny models tolerate more than LLMs (1e-6 to 1e-5 "
                      "for 7B). A pretrained --model gets "
                      f"{PRETRAINED['train']['optim.lr'].value:g} with LoRA (measured on SmolLM2-135M-Instruct) and "
                      f"{PRETRAINED['train-full']['optim.lr'].value:g} with full fine-tuning (measured through the "
                      "gateway) unless set "
                      "(docs/models.md, 'Defaults for a pretrained model').")
    weight_decay: float = Field(0.0, ge=0, description="AdamW's decoupled weight decay; 0, since RL updates are few "
                                "and small.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping, the usual PPO guard against one bad batch.")
    ppo_epochs: int = Field(1, ge=1, description="Passes over each batch. 1 keeps updates on-policy (ratio ~1); more "
                            "reuse data at the price of clipping.")
    minibatches: int = Field(2, ge=1, description="Optimizer steps per epoch, each over 1/minibatches of the episodes."
                             + _pretrained("optim.minibatches"))
    micro_batch_tokens: int | None = Field(None, ge=1, description="Padded tokens per forward: a minibatch is split "
                                           "into micro-batches of episodes of similar length (each padded only to its "
                                           "own longest) whose gradients add up to the minibatch's. None: 16384, or "
                                           "fewer where the model's activations for them would pass 4 GiB (about "
                                           "3000 on SmolLM2-135M: at 16384, RL on TextWorld's episodes ran a 24 GB "
                                           "machine out of memory). Raise it on a GPU with memory to spare.")
    share_prefix: bool = Field(True, description="Rows that begin with the same prompt (a GRPO group's) run it "
                               "through the layers once in the training and scoring forwards, the rows' tails on top "
                               "of its keys and values: (G - 1) / G of the prompt's compute saved, the same log-probs "
                               "and gradients up to the last bits of a matmul. Off under DDP (one forward per "
                               "backward) and where it would save under 16 tokens or a tenth of the padded forward.")
    bf16: bool = Field(True, description="bf16 autocast on a CUDA GPU that supports it (weights and optimizer stay "
                       "fp32); ignored on CPU.")
    lora: LoraSettings = Field(default_factory=LoraSettings, description="LoRA adapters (r 0: full fine-tuning).")


TINY_SFT_LR = 3e-3  # from scratch: a high peak rate (linear decay) teaches the tiny policy the format in minutes
LOADED_SFT_LR = PRETRAINED["sft"]["sft.lr"].value  # a pretrained model, fully fine-tuned: the rate measured to work


class SFTConfig(Strict):
    episodes: int = Field(3000, ge=1, description="Demonstrations from the environment's noisy expert (3,000 taught "
                          "Vault's sums to the tiny policy)." + _pretrained("sft.episodes", "sft", "sft-lora"))
    epochs: int = Field(4, ge=1, description="Passes over the demonstrations; 4 teach Vault's sums to the tiny policy "
                        "(3 taught the format but not the sums)." + _pretrained("sft.epochs", "sft", "sft-lora"))
    lr: float | None = Field(None, gt=0, description=f"Peak learning rate (linear decay); default {TINY_SFT_LR:g} for "
                             "the tiny policy (it starts from scratch)." + _pretrained("sft.lr", "sft", "sft-lora"))
    batch_size: int = Field(32, ge=1, description="Demonstrations per optimizer step."
                            + _pretrained("sft.batch_size", "sft", "sft-lora"))
    max_batch_tokens: int | None = Field(None, ge=256, description="Padded tokens per forward: a batch runs as "
                                         "micro-batches this size whose gradients add up to the batch's (the same "
                                         "step, less memory). None: what keeps the activations near 4 GiB (about "
                                         "3000 tokens on SmolLM2-135M; eight 2400-token demonstrations at once ran "
                                         "a 24 GB machine out of memory).")
    noise: Annotated[float, Field(ge=0, le=1)] | Literal["auto"] = Field(
        0.35, description="The expert's slip rate: noisy on purpose, so that the warm start leaves RL headroom (Vault "
        "at 3 locks: the expert itself passes ~0.55). 'auto': judge it by the warm start's own held-out pass rate, "
        "not the expert's -- build the warm start at 0.35, keep it if it lands inside useful_band, and try cleaner "
        "demonstrations while it lands below. Aiming the expert's pass rate at 0.5 instead (the old auto) picks 0.69 "
        "on Sokoban 6x6 and 1.0 on GuessNumber, where slips are recoverable, and the warm start learns random moves "
        "(docs/warm_start.md).")
    useful_band: tuple[float, float] = Field((0.15, 0.85), description="With noise auto, and for the warning before "
                                             "RL: the warm-start pass rates RL can work from. Inside it at least 73% "
                                             "of GRPO groups of 8 hold a pass and a fail (non-zero advantages); at "
                                             "0.05 or 0.95 only a third do.")
    calibration_episodes: int = Field(64, ge=8, description="With noise auto: held-out episodes each probed warm start "
                                      "is evaluated on (64: a pass-rate standard error of ~0.06 at 0.5), on seeds "
                                      "neither the demonstrations nor the run's held-out evaluation use.")
    calibration_probes: int = Field(3, ge=1, description="With noise auto: at most this many warm starts are built "
                                    "(each a whole SFT, cached under its own noise, so --sft.noise N reuses it); the "
                                    "first, at 0.35, is the only one when it lands inside the band.")
    warm_start: str | None = Field(None, description="Reuse this warm-start folder (an HF folder, e.g. a cached "
                                   "~/.cache/agentrl/warm/<key> or an `agentrl sft` output) instead of looking one up "
                                   "by key: keeps a warm start across changes that would rebuild it.")
    rebuild: bool = Field(False, description="Rebuild the warm start even if one with the same key is cached (e.g. "
                          "after changing the expert's behaviour in a way the key's few fingerprint seeds did not "
                          "show).")

    @field_validator("useful_band")
    @classmethod
    def _band(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not 0.0 <= v[0] < v[1] <= 1.0:
            raise ValueError(f"useful_band must be two pass rates, low < high, within [0, 1]; got {v}")
        return v

    def lr_for(self, pretrained: bool) -> float:
        """The learning rate this SFT runs at: the one given, else the default for a tiny or a pretrained model."""
        return self.lr if self.lr is not None else (LOADED_SFT_LR if pretrained else TINY_SFT_LR)


# a source's name is a segment of its metric keys (eval/<name>/pass@4): no slash, nothing a logger would mangle
SOURCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_SCORER = re.compile(r"[^:\s]+:[A-Za-z_][A-Za-z0-9_]*")  # module:function or path/to/file.py:function


class EvalSource(Strict):
    """One evaluation source (`eval.sources`, docs/evaluation.md): an environment, its own held-out tasks, k
    samples per task at its own cadence, scored by the env's own checker or a `scorer` of yours.

    >>> s = EvalSource(name="chain", env={"id": "agentrl/RG-v0", "kwargs": {"task": "chain_sum"}}, k=8)
    >>> s.name, s.k, s.episodes, s.every, s.greedy
    ('chain', 8, 32, 0, True)
    """

    name: str = Field(description="What the metrics are called: eval/<name>/pass@k; letters, digits, _ . - (no "
                      "slash: it is one segment of the key).")
    env: EnvConfig | None = Field(None, description="The environment, given as the training env is (id and kwargs). "
                                  "None (and no agent): the training env itself, on this source's own seeds and "
                                  "samples.")
    agent: AgentConfig | None = Field(None, description="An agent of your own through the gateway instead of an env "
                                      "(docs/gateway.md), on its held-out tasks: agent.heldout, else the task "
                                      "function at this source's seeds, else the tasks file's last `episodes` "
                                      "records. Scored by the agent's own reward (solve's, or agent.verify).")
    seed_offset: int | None = Field(None, ge=0, description="The source's tasks are the seeds seed_offset, "
                                    "seed_offset + 1, ... (episodes of them). None: eval.seed_offset, which training's "
                                    "task stream never reaches, so a source on the training env is held out too. An "
                                    "env that declares a held-out split (a `split` attribute, Code-v0) is also built "
                                    "with split=\"eval\" unless env.kwargs names a split.")
    episodes: int = Field(32, ge=1, description="Tasks (seeds) per evaluation. 32 tasks x k 4 are 128 episodes, the "
                          "default held-out evaluation's count.")
    k: int = Field(4, ge=1, description="Samples per task: pass@k and avg@k are read from them. 4 gives pass@2 and "
                   "pass@4, and an avg@4 (the unbiased pass@1) with a quarter of one sample's variance per task.")
    every: int = Field(0, ge=0, description="Evaluate every N updates; 0: only before the first update (step 0) and "
                       "after the last. 0 by default, since each evaluation costs episodes x (k + greedy) episodes: "
                       "set it for a curve.")
    temperature: float | None = Field(None, ge=0.0, description="The k samples' temperature; None: eval.temperature, "
                                      "so a source compares with the held-out evaluation and across runs.")
    greedy: bool = Field(True, description="Also one greedy episode per task (temperature 0): greedy pass@1, the "
                         "number most benchmark tables report, for one more episode per task.")
    scorer: str | None = Field(None, description="module:function or path/to/file.py:function, called as fn(episode, "
                               "env) with the episode and the env it ran in (its task and final state), returning a "
                               "number in [0, 1] or a bool; a sample succeeds at 1. None: the env's own verifier "
                               "(the episode's reward; BFCL's multi_turn_checker, reasoning-gym's score_answer, "
                               "TextWorld's won flag in the adapters), succeeding at 1 as Episode.passed does.")

    @field_validator("name")
    @classmethod
    def _metric_name(cls, v: str) -> str:
        if not SOURCE_NAME.fullmatch(v):
            raise ValueError(f"source name {v!r}: use 1-64 letters, digits, _ . or - (it becomes eval/<name>/... in "
                             "the metrics), starting with a letter or digit")
        return v

    @field_validator("scorer")
    @classmethod
    def _scorer_form(cls, v: str | None) -> str | None:
        if v is not None and not _SCORER.fullmatch(v):
            raise ValueError(f"scorer {v!r}: expected module:function or path/to/file.py:function")
        return v

    @model_validator(mode="after")
    def _env_or_agent(self) -> EvalSource:
        if self.agent is not None and self.env is not None:
            raise ValueError(f"source {self.name!r}: give env or agent, not both")
        if self.agent is not None and self.scorer is not None:
            raise ValueError(f"source {self.name!r}: an agent scores its own episodes (solve's reward, or "
                             "agent.verify); scorer is for an env source")
        return self


class EvalConfig(Strict):
    episodes: int = Field(128, ge=1, description="Held-out episodes per evaluation; 128 gives a pass-rate standard "
                          "error of about 0.044." + _pretrained("eval.episodes"))
    every: int = Field(10, ge=0, description="Evaluate every N updates (0: only before and after training)."
                       + _pretrained("eval.every"))
    seed_offset: int = Field(1_000_000, ge=0, description="Held-out seeds start here; training seeds stay below it.")
    temperature: float = Field(1.0, ge=0.0, description="Held-out episodes are sampled at this fixed temperature, "
                               "whatever the run samples at (or an intervention turned it to), so evaluations of "
                               "different runs compare; 0 is greedy.")
    sources: Annotated[list[EvalSource], Suppress] = Field(
        default_factory=list, description="More evaluations beside the held-out one: environments (or other seeds of "
        "the training one), each with its own tasks, k samples per task, cadence and scorer, reported as "
        "eval/<name>/pass@k, avg@k and greedy_pass@1 from step 0 on (docs/evaluation.md). Empty: only the held-out "
        "evaluation. On the command line --set 'eval.sources=[{name: ..., env: {id: ...}}]' or a config file.")

    @field_validator("sources")
    @classmethod
    def _distinct_names(cls, v: list[EvalSource]) -> list[EvalSource]:
        names = [s.name for s in v]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"source names must differ (each names its metrics): {', '.join(twice)} given twice")
        return v


class CheckpointConfig(Strict):
    """When the run saves what its next update depends on (agentrl.checkpoint), so that it can be resumed."""

    every: int = Field(10, ge=0, description="Save a checkpoint every N updates (and always at the end and on "
                       "SIGTERM/SIGINT); 10 gives the default 40-update run four, at a cost of well under a second "
                       "each for the tiny policy (README, 'Runs that survive'). 0: only at the end and on a signal.")
    keep: int = Field(3, ge=1, description="Checkpoints kept (the newest); more than one, so that a checkpoint "
                      "corrupted on disk still leaves an older one to resume from.")


class LogConfig(Strict):
    tensorboard: bool = Field(False, description="Also write TensorBoard event files into <run>/tensorboard (needs "
                              "`tensorboard`); off: metrics.jsonl always has everything.")
    wandb: bool = Field(False, description="Also log to Weights & Biases in offline mode into <run>/wandb (needs "
                        "`wandb`); offline, since runs here have no network.")
    wandb_project: str = Field("agentrl", description="W&B project name for `wandb sync` later.")


class DPOConfig(Strict):
    """Stage two: preference optimisation on multi-turn episodes (only action tokens count)."""

    loss: PrefLoss = Field("dpo", description="dpo (frozen reference), simpo (reference-free, length-normalised), ipo "
                           "(squared, bounded margins).")
    beta: float | None = Field(None, gt=0, description="How far the policy may move from the reference; default 0.1 "
                               "for dpo and ipo (DPO's paper), 2.0 for simpo (its length-normalised scores need a "
                               "larger scale).")
    simpo_gamma: float = Field(0.5, ge=0, description="SimPO's target reward margin.")
    epochs: int = Field(2, ge=1, description="Passes over the pairs.")
    lr: float = Field(5e-4, gt=0, description="Higher than for LLMs (5e-7) because the tiny policy is small and fresh.")
    batch_pairs: int = Field(16, ge=1, description="Pairs per optimizer step.")
    groups: int = Field(32, ge=1, description="Rollout groups used to build pairs from the policy's own episodes (pass "
                        "vs fail of one task).")
    group_size: int = Field(8, ge=2, description="Episodes per group; at least 2 so a group can hold a pass and a "
                            "fail.")
    max_pairs_per_group: int = Field(4, ge=1, description="Caps pairs from one task so easy tasks do not dominate.")
    max_batch_tokens: int | None = Field(None, ge=256, description="Padded tokens per forward: a batch of pairs runs "
                                         "as micro-batches of whole pairs this size whose gradients add up to the "
                                         "batch's (the same step, less memory). None: what keeps the activations near "
                                         "4 GiB, as sft.max_batch_tokens (eight TextWorld pairs at once ran a 24 GB "
                                         "machine out of memory).")
    nll_weight: float = Field(1.0, ge=0, description="Adds this times the chosen episodes' per-token NLL (RPO, Pang et "
                              "al. 2024), so DPO cannot push the chosen likelihood down with the rejected one. "
                              "Measured on Vault (~100 pairs): without it held-out pass rate went 0.47 -> 0.00; with "
                              "it 0.47 -> 0.63.")

    @property
    def resolved_beta(self) -> float:
        return self.beta if self.beta is not None else (2.0 if self.loss == "simpo" else 0.1)


_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")



class RejectionConfig(Strict):
    """`agentrl distill --mode rejection`: sample the teacher on training tasks, keep the best passing episode of
    each task, and fine-tune the student on them (the SFT stage, with `sft.epochs`, `sft.lr`, `sft.batch_size`)."""

    tasks: int = Field(256, ge=1, description="Training tasks the teacher is sampled on (seeds below the held-out "
                       "range); the kept episodes are at most this many demonstrations.")
    k: int = Field(4, ge=1, description="Teacher samples per task; the best one that passes is kept (best-of-k). "
                   "More samples rescue harder tasks at k times the teacher's rollout cost.")
    temperature: float = Field(1.0, ge=0.0, description="The teacher's sampling temperature: 1.0 samples it as "
                               "trained, so that k samples differ; 0 (greedy) makes k > 1 pointless.")
    min_reward: float = Field(1.0, description="An episode is kept only if the verifier's reward reaches this (1.0: "
                              "it passed, as Episode.passed counts).")


class GatewayConfig(Strict):
    """The OpenAI-compatible endpoint an agent calls the policy through (docs/gateway.md)."""

    host: str = Field("127.0.0.1", description="Where the gateway listens. Loopback by default: the endpoint samples "
                      "the policy being trained and takes rewards, so it is never offered to the network unasked.")
    port: int = Field(0, ge=0, le=65535, description="0: a free port chosen at start (the in-process agent is given "
                      "the address); serve-policy prints it.")
    session_timeout: float = Field(300.0, gt=0, description="Seconds a session may stay silent (no call, no reward) "
                                   "before its episode ends truncated: an agent that hung or forgot its reward must "
                                   "not hold an update forever. 300 s covers slow tools between two calls.")
    max_body_bytes: int = Field(4 << 20, ge=1024, description="Largest request body; 4 MiB holds any chat history that "
                                "fits a context window, and refuses a flood before it is parsed.")
    max_messages: int = Field(1024, ge=1, description="Most messages in one call: past this a history is no "
                              "conversation a model's context holds.")
    max_tools: int = Field(128, ge=0, description="Most tools offered in one call.")
    max_sessions: int = Field(4096, ge=1, description="Sessions held at once (in flight or waiting for a reward); "
                              "a new one past this gets 429.")
    batch_wait: float = Field(0.05, ge=0, description="Seconds a call may always wait for others to share its "
                              "batched generate (a forward costs nearly the same for more rows); past the first "
                              "generate it may wait as long as the last one took, since a split batch costs one "
                              "more (docs/gateway.md, 'Batching').")


class AgentConfig(Strict):
    """An agent of the user's own, trained through the gateway instead of an `AgentEnv` (docs/gateway.md)."""

    entry: str = Field(description="The agent: path/to/file.py:solve or module:solve. `solve(task, client)` (sync or "
                       "async) runs one episode against the OpenAI-compatible client it is given and returns its "
                       "reward (a number), or None to leave it to `verify`.")
    tasks: str | None = Field(None, description="Where tasks come from: path/to/file.py:fn or module:fn (fn(seed) -> "
                              "a task, any JSON-able value), or a JSONL file of task records (one per line; seeds "
                              "index it). None: the agent module's `tasks` function.")
    heldout: str | None = Field(None, description="Tasks for held-out evaluation: another JSONL file. None: the "
                                "training source at seeds >= eval.seed_offset (a function), or the file's last "
                                "eval.episodes records, which training then never draws.")
    verify: str | None = Field(None, description="file.py:fn or module:fn, fn(task, messages) -> reward, for a solve "
                               "that returns None. None: the agent module's `verify`, if it has one.")
    state_key: str | None = Field(None, description="file.py:fn or module:fn, fn(task, messages) -> hashable, the "
                                  "state before each call, for step-level grouping (gigpo).")
    demos: str | None = Field(None, description="Demonstrations of the agent (a JSONL file of OpenAI-format "
                              "conversations with tool_calls, as `agentrl sft --data` reads): with no model, the tiny "
                              "policy and its tokenizer are built from them and warm-started on them (cached), since "
                              "a fresh model speaks no tool-call syntax.")
    gateway: GatewayConfig = Field(default_factory=GatewayConfig, description="The endpoint the agent calls.")


class TrainConfig(Strict):
    """Everything `agentrl train` needs; the defaults run the main job on a 2-core CPU in minutes."""

    algo: str = Field("grpo", description="Credit assigner, a key of agentrl.algorithms.ASSIGNERS (see `agentrl "
                      "algos`); on the command line also `auto`: run the horizon probe first and train with its pick.")
    preset: Literal["dapo", "dr-grpo"] | None = Field(None, description="Fills in the named recipe's settings that you "
                                                      "did not set.")
    env: EnvConfig = Field(default_factory=EnvConfig, description="The environment to train in.")
    agent: Annotated[AgentConfig | None, Suppress] = Field(
        None, description="Train an agent of your own through the OpenAI-compatible gateway instead of env "
        "(docs/gateway.md); on the command line --agent FILE.py:solve and --agent.* (not generated: `agentrl train "
        "--help` lists them).")
    model: str | None = Field(None, description="HF hub id or folder. None builds the tiny policy and warm-starts it "
                              "by SFT (cached).")
    tool_format: str | None = Field(None, description="How the model writes tool calls, a key of "
                                    "agentrl.chat.FORMATS (hermes, qwen3-coder, llama3-json, mistral, mistral-v11, "
                                    "pythonic, harmony). None: detected from the chat template's own markers, Hermes "
                                    "when it has none (the tiny policy, SmolLM2): a model trained on one family's "
                                    "calls rarely writes another's.")
    teacher: str | None = Field(None, description="A frozen teacher (HF folder, hub id, or a name `agentrl models` "
                                "fetches) for distillation: `--algo distill` scores every action token the student "
                                "samples under it, which needs the student's tokenizer; `agentrl distill --mode "
                                "rejection` samples it and trains the student on its passing episodes as text, which "
                                "does not. None: no teacher (an assigner that reads one is refused).")
    engine: str = Field("torch", description="Generation backend, a key of agentrl.engines.ENGINES: torch (CPU/GPU) or "
                        "vllm (GPU, [vllm] extra).")
    device: str = Field("auto", description="'auto' (cuda if available), 'cpu', 'cuda' or 'cuda:N'.")
    updates: int = Field(40, ge=0, description="Policy updates (each one rollout batch); 40 lift Vault-v0 by ~0.3 in "
                         "~100 s on 2 cores." + _pretrained("updates"))
    seed: int = Field(0, description="Seeds the model build, the warm start, sampling and the task stream. On a CPU "
                      "the same seed repeats a run bit for bit with rollout.schedule lockstep or rollout.env_workers "
                      "serial; under the default arrival schedule with a thread pool it repeats the tasks and each "
                      "token's sampling draw, but which rows share a forward follows the tools' timing, so log-probs "
                      "and weights may differ in their last bits (README, 'Runs that survive').")
    out: str | None = Field(None, description="Run folder; default runs/<algo>-<time>.")
    credit: SerializeAsAny[CreditConfig] = Field(None, validate_default=True,  # type: ignore[assignment]
                                                 description="Options of the chosen assigner; default: its defaults.")
    loss: LossConfig = Field(default_factory=LossConfig, description="The policy loss every assigner shares.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Groups, sampling and the env workers.")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="The policy's optimizer and batching.")
    sft: SFTConfig = Field(default_factory=SFTConfig, description="The tiny policy's warm start (used when model is "
                           "None).")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="The built-in policy's size "
                                  "(used when model is None).")
    health: HealthConfig = Field(default_factory=HealthConfig, description="Alarms (entropy collapse, KL drift, "
                                 "stalls, verifier over-fit, ...) and interventions; see agentrl.health.")
    log: LogConfig = Field(default_factory=LogConfig, description="Optional loggers beside metrics.jsonl.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpoints for `agentrl "
                                         "train --resume`.")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset"):
            name = data["preset"]
            if name not in PRESETS:
                return data  # the Literal check reports it
            merged = copy.deepcopy(PRESETS[name])
            try:  # a preset's credit options apply to the assigners that have them (dapo's resampling is grpo-family)
                fields = get_spec(data.get("algo", "grpo")).config.model_fields
                merged["credit"] = {k: v for k, v in merged.get("credit", {}).items() if k in fields}
            except ValueError:
                pass  # an unknown algo: its own validator says so
            credit = data.get("credit")
            if isinstance(credit, BaseModel):  # options given as a model already: the preset fills only what is unset
                data = {**data, "credit": credit.model_dump(exclude_unset=True)}
            _deep_update(merged, dict(data))
            return merged
        return data

    @field_validator("algo")
    @classmethod
    def _known_algo(cls, v: str) -> str:
        get_spec(v)  # raises with the list of known ones
        return v

    @field_validator("credit", mode="before")
    @classmethod
    def _credit_of_algo(cls, v: Any, info: ValidationInfo) -> CreditConfig:
        algo = info.data.get("algo")
        if algo is None:
            raise ValueError("no options without a valid algo")  # algo's own error says why
        spec = get_spec(algo)
        if isinstance(v, BaseModel):
            v = v.model_dump(exclude_unset=not isinstance(v, spec.config))
        v = dict(v or {})
        given = v.setdefault("algo", algo)
        if given != algo:
            raise ValueError(f"these options are for {given!r} but algo is {algo!r}: drop credit (or credit.algo) to "
                             f"use {algo}'s defaults, or set algo: {given}")
        try:
            return spec.config.model_validate(v)
        except ValidationError as e:
            lines = [f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
            raise ValueError(f"invalid options for {algo}: " + "; ".join(lines)) from None

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, v: str) -> str:
        get_engine_spec(v)
        return v

    @field_validator("device")
    @classmethod
    def _known_device(cls, v: str) -> str:
        if not _DEVICE.fullmatch(v):
            raise ValueError(f"unknown device {v!r}: use auto, cpu, cuda, cuda:N or mps")
        return v

    @model_validator(mode="after")
    def _engine_serves_the_assigner(self) -> TrainConfig:
        engine = get_engine_spec(self.engine)
        if engine.needs_cuda and self.device in ("cpu", "mps"):
            raise ValueError(f"engine {self.engine} needs a CUDA GPU, but device is {self.device}: use --engine torch "
                             "on this device, or --device cuda")
        if get_spec(self.algo).reads_hidden(self.credit) and not engine.returns_hidden:
            raise ValueError(f"engine {self.engine} cannot serve algo {self.algo} with these options: its turn critic "
                             f"or learned PRM reads the policy's hidden states, which {self.engine} does not return; "
                             "use an engine that does (torch), or an assigner that reads none (grpo, gigpo, steppo "
                             "with prm env or implicit)")
        return self

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _deep_update(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_update(base[k], v)
        else:
            base[k] = v
    return base


# Where a config enters (a file, a --set value), it is bounded before it is built. A real config is a page of
# settings: 1 MiB holds any one many times over, and a bigger file is refused from its size alone, before it is
# read (PyYAML parses about 1 MB a second, so a 50 MB file would hold the command for a minute).
MAX_CONFIG_BYTES = 1 << 20
# Anchors and aliases stay allowed (a config may name a block once and reuse it), but YAML shares an aliased node
# and everything that writes the config out (config.yaml, --print-config, the log) expands it: nine levels of ten
# aliases are 10^9 values from 600 bytes. So the loaded value is counted as if every alias were written out, on the
# parsed node graph (each distinct node once) before anything is built, and refused past this many values.
MAX_CONFIG_NODES = 100_000


def load_yaml(text: str, where: str) -> Any:
    r"""`text` parsed as YAML (PyYAML's safe loader), refused where it is over `MAX_CONFIG_BYTES` or its aliases
    expand past `MAX_CONFIG_NODES` values; `where` (a file, ``--set KEY``) begins the message.

    >>> load_yaml("a: &x [1, 2]\nb: *x", "f.yaml")
    {'a': [1, 2], 'b': [1, 2]}
    >>> tens = ["a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [f"{n}: &{n} [{', '.join(['*' + p] * 10)}]"
    ...                                                  for p, n in zip("abcd", "bcde")]
    >>> load_yaml("\n".join(tens), "f.yaml")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: f.yaml: its anchors and aliases expand to over 100,000 values (an alias bomb?); ...
    """
    if len(text) > MAX_CONFIG_BYTES:
        raise ValueError(f"{where}: {len(text):,} characters, over the limit of {MAX_CONFIG_BYTES:,} for a config")
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, {})
        return loader.construct_document(node)
    except _OverBudget as e:
        raise ValueError(f"{where}: {e}") from None
    except RecursionError:
        raise ValueError(f"{where}: nested deeper than the YAML reader can follow") from None
    finally:
        loader.dispose()


class _OverBudget(Exception):
    pass


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many values `node` stands for with every alias written out. An alias is the very node its anchor named,
    so each distinct node is counted once and its size remembered (`sizes`, by id; -1 while inside it)."""
    size = sizes.get(id(node))
    if size is not None:
        if size < 0:
            raise _OverBudget("an alias refers to a node that contains it, which expands without end")
        return size
    sizes[id(node)] = -1
    size = 1
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    else:
        children = []
    for child in children:
        size += _expanded_size(child, sizes)
        if size > MAX_CONFIG_NODES:
            raise _OverBudget(f"its anchors and aliases expand to over {MAX_CONFIG_NODES:,} values (an alias bomb?); "
                              "a config may reuse a block, not multiply one")
    sizes[id(node)] = size
    return size


def parse_override(item: str) -> dict[str, Any]:
    """`rollout.group_size=4` -> {"rollout": {"group_size": 4}} (values parsed as YAML, bounded as a file is).

    >>> parse_override("env.kwargs.locks=4")
    {'env': {'kwargs': {'locks': 4}}}
    """
    key, sep, raw = item.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(p.strip() for p in parts):
        raise ValueError(f"--set expects KEY=VALUE with a dotted key such as rollout.group_size=4, got {item!r}")
    try:
        value = load_yaml(raw, f"--set {key}") if raw else ""
    except yaml.YAMLError as e:
        raise ValueError(f"--set {key}: the value {raw!r} is not valid YAML ({getattr(e, 'problem', e)})") from None
    out: dict[str, Any] = {}
    node = out
    for p in parts[:-1]:
        node = node.setdefault(p.strip(), {})
    node[parts[-1].strip()] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A config file as a mapping; a missing file, one over `MAX_CONFIG_BYTES`, a YAML error or an alias bomb
    names the file (and the line)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"config file {p} does not exist")
    too_big = f"config file {p} is {{:,}} bytes, over the limit of {MAX_CONFIG_BYTES:,} (1 MiB) for a config"
    if (size := p.stat().st_size) > MAX_CONFIG_BYTES:
        raise ValueError(too_big.format(size))
    with p.open("rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)  # a file that grew after the stat is cut here
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(too_big.format(len(raw)))
    try:
        loaded = load_yaml(raw.decode(), str(p))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(p)
        problem = getattr(e, "problem", None) or str(e)
        raise ValueError(f"{where}: not valid YAML: {problem}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not a text file ({e.reason})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ValueError(f"{p}: a config file must hold a mapping, got {type(loaded).__name__}")
    return loaded


M = TypeVar("M", bound=BaseModel)


def named(path: str, given: Collection[str]) -> bool:
    """Whether the user set the field `path` (dotted): `given` names it, or a section above it.

    >>> named("optim.lora.r", {"optim.lora"}), named("optim.lr", {"optim.lora.r"})
    (True, False)
    """
    return any(path == g or path.startswith(g + ".") for g in given)


def flag(path: str) -> str:
    """A dotted field as its command-line flag: `sft.batch_size` -> `--sft.batch-size`."""
    return "--" + path.replace("_", "-")


class Fitted(NamedTuple):
    """What `fit_pretrained` decided: the values it filled in, and the user's own for the table's other fields."""

    filled: dict[str, Default]
    yours: dict[str, Any]

    def describe(self) -> str:
        """The decision as the console says it: each value filled in (marked where no run measured it), then the
        user's."""
        def shown(path: str, value: Any) -> str:
            return f"{flag(path)} {value:g}" if isinstance(value, float) else f"{flag(path)} {value}"

        text = ", ".join(shown(p, d.value) + (" (unmeasured)" if d.why.startswith("unmeasured") else "")
                         for p, d in self.filled.items()) or "none"
        if self.yours:
            text += "; set by you: " + ", ".join(shown(p, v) for p, v in self.yours.items())
        return text


def fit_pretrained(model: M, command: Literal["sft", "train"], given: Collection[str]) -> tuple[M, Fitted]:
    """`model` (`agentrl sft`'s flags, or a `TrainConfig` for `agentrl train`) fitted to a pretrained model:
    `PRETRAINED`'s values for `command` in every field the user did not set (`given`: the dotted names set by a
    flag, --set or --config). LoRA or full fine-tuning picks the table: the rank the user gave, else the default's
    (full fine-tuning for sft, LoRA for train).

    >>> cfg, fitted = fit_pretrained(TrainConfig(updates=40), "train", {"updates"})
    >>> cfg.updates, cfg.rollout.groups, cfg.optim.lora.r, cfg.optim.lr
    (40, 2, 16, 5e-05)
    >>> fitted.yours
    {'updates': 40}
    >>> fit_pretrained(TrainConfig(optim={"lora": {"r": 0}}), "train", {"optim.lora.r"})[0].optim.lr
    1e-05
    """
    data = model.model_dump()
    if command == "sft":
        table = PRETRAINED["sft-lora" if _get(data, "lora_r") else "sft"]
    else:
        lora = _get(data, "optim.lora.r") if named("optim.lora.r", given) else PRETRAINED["train"]["optim.lora.r"].value
        table = {**PRETRAINED["train"], **({} if lora else PRETRAINED["train-full"])}
    filled: dict[str, Default] = {}
    yours: dict[str, Any] = {}
    for path, default in table.items():
        if named(path, given):
            yours[path] = _get(data, path)
            continue
        *head, last = path.split(".")
        node = data
        for part in head:
            node = node[part]
        node[last] = default.value
        filled[path] = default
    return type(model).model_validate(data), Fitted(filled, yours)


def _get(data: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        data = data[part]
    return data


def load_config(path: str | Path | None = None, overrides: list[dict[str, Any]] | None = None) -> TrainConfig:
    """A config file (YAML) with overrides applied on top, validated once at the end."""
    data: dict[str, Any] = read_yaml(path) if path is not None else {}
    for o in overrides or []:
        _deep_update(data, o)
    return TrainConfig(**data)


def describe_errors(e: ValidationError) -> str:
    """A pydantic error as one line per field, `field.path: message`, for a person."""
    lines = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "config"
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)
