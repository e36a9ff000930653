"""Credit assigners, one module each; choosing one is a lookup in `ASSIGNERS`.

An assigner is a class constructed as ``cls(config, policy=..., train_config=...)`` that offers
``fit(batch) -> Fit`` and ``assign(batch, fit) -> Credit`` (see `agentrl.credit`). Its registry entry
(`AssignerSpec`) says what the rest of agentrl needs to know before anything is built: its options
(`config`), whether it assigns credit per turn (`turn_level`, read by the horizon probe and the
sweep), whether it reads the policy's hidden states (`needs_hidden`, which rules out an engine that
returns none), whether it can roll out extra groups when a batch carries no signal
(`resampling`), and whether it reads a frozen teacher's log-probs (`reads_teacher`). The implementation
is imported only when a run builds it, so the configuration and the command line load without torch.

Adding an assigner is one module and one `register(AssignerSpec(...))` (docs/extending.md):

>>> from agentrl.algorithms import ASSIGNERS, get_spec
>>> sorted(ASSIGNERS)
['arpo', 'distill', 'gigpo', 'grpo', 'steppo', 'turn-ppo']
>>> get_spec("turn-ppo").turn_level, get_spec("grpo").turn_level
(True, False)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from agentrl.algorithms.configs import (
    ARPOConfig,
    CreditConfig,
    CriticConfig,
    DistillConfig,
    GiGPOConfig,
    GRPOConfig,
    StepPOConfig,
    TurnPPOConfig,
)
from agentrl.lookup import lookup
from agentrl.lookup import register as _register


@dataclass(frozen=True)
class AssignerSpec:
    """One credit assigner as the registry knows it."""

    name: str  # kebab-case, as on the command line (--algo turn-ppo)
    config: type[CreditConfig]  # its options; `config.algo` must default to `name`
    impl: str | type  # "module:Class", imported when a run builds it, or the class itself
    description: str  # one line for `agentrl algos`
    turn_level: bool  # credit differs between the turns of an episode (not one advantage per episode)
    # reads the policy's hidden states (under these options)
    needs_hidden: bool | Callable[[CreditConfig], bool] = False
    resampling: bool = False  # honours `dynamic_sampling="resample"`: the trainer rolls out extra batches for it
    # reads a frozen teacher's log-probs of the action tokens (`TurnBatch.teacher_logp`): the trainer loads
    # `TrainConfig.teacher` and scores it beside the reference; a run without a teacher is refused
    reads_teacher: bool = False

    def __post_init__(self) -> None:
        default = self.config.model_fields["algo"].default if "algo" in self.config.model_fields else None
        if default != self.name:
            raise ValueError(f"assigner {self.name!r}: its config {self.config.__name__}.algo must default to "
                             f"{self.name!r}, got {default!r}")
        if self.resampling and not {"dynamic_sampling", "max_resample_batches"} <= set(self.config.model_fields):
            raise ValueError(f"assigner {self.name!r} declares resampling, but {self.config.__name__} has no "
                             "dynamic_sampling / max_resample_batches options")

    def reads_hidden(self, config: CreditConfig | None = None) -> bool:
        """Whether this assigner under `config` (default options if None) reads hidden states."""
        if callable(self.needs_hidden):
            return bool(self.needs_hidden(config if config is not None else self.config()))
        return bool(self.needs_hidden)

    def load(self) -> type:
        """The implementing class (imported on first use)."""
        if isinstance(self.impl, type):
            return self.impl
        module, _, attr = self.impl.partition(":")
        return getattr(importlib.import_module(module), attr)


ASSIGNERS: dict[str, AssignerSpec] = {}


def register(spec: AssignerSpec, *, replace: bool = False) -> AssignerSpec:
    """Add an assigner to the registry; `agentrl train --algo NAME` and the probe see it from then on."""
    return _register(ASSIGNERS, spec.name, spec, what="assigner", replace=replace)


def get_spec(name: str) -> AssignerSpec:
    """The registry entry of `name` (kebab-case on the command line)."""
    return lookup(ASSIGNERS, name, what="algorithm")


def get_assigner(name: str) -> type:
    """The assigner class registered under `name`."""
    return get_spec(name).load()


def reads_hidden(name: str, config: CreditConfig | None = None) -> bool:
    """Whether assigner `name` under `config` reads the policy's hidden states (a turn critic or a learned PRM)."""
    return get_spec(name).reads_hidden(config)


def teacherless_assigners() -> list[str]:
    """Registered assigners that train from the verifier alone (no teacher), in registration order: what a
    bake-off or a sweep can run on any environment."""
    return [name for name, spec in ASSIGNERS.items() if not spec.reads_teacher]


def turn_level_assigners() -> list[str]:
    """Registered assigners that assign credit per turn, in registration order."""
    return [name for name, spec in ASSIGNERS.items() if spec.turn_level]


_PKG = "agentrl.algorithms"
register(AssignerSpec("grpo", GRPOConfig, f"{_PKG}.grpo:GRPO", turn_level=False, resampling=True,
                      description="group-relative outcome advantage on every token (GRPO/RLOO/Dr. GRPO/DAPO options); "
                      "no critic"))
register(AssignerSpec("arpo", ARPOConfig, f"{_PKG}.arpo:ARPO", turn_level=True, needs_hidden=True, resampling=True,
                      description="turn-critic reweighting: a value head spreads the group advantage over turns by "
                      "|value change| (gated on critic EV)"))
register(AssignerSpec("steppo", StepPOConfig, f"{_PKG}.steppo:StepPO", turn_level=True, resampling=True,
                      needs_hidden=lambda c: c.prm == "learned",  # only the learned PRM has a head on the hidden state
                      description="process rewards: outcome advantage + reward-to-go of group-normalised PRM step "
                      "scores (env / learned / implicit PRM)"))
register(AssignerSpec("turn-ppo", TurnPPOConfig, f"{_PKG}.turn_ppo:TurnPPO", turn_level=True, needs_hidden=True,
                      description="turn-level critic + GAE over turns, each turn's tokens share A_k (critic warm-up "
                      "first)"))
register(AssignerSpec("gigpo", GiGPOConfig, f"{_PKG}.gigpo:GiGPO", turn_level=True, resampling=True,
                      description="critic-free step credit: turns from the same state inside a group are compared by "
                      "discounted return (needs state_key)"))
# per token and from a teacher, not the verifier: never one of the probe's turn-level picks
register(AssignerSpec("distill", DistillConfig, f"{_PKG}.distill:Distill", turn_level=False, reads_teacher=True,
                      description="on-policy distillation: each action token's advantage is the teacher's log-prob "
                      "minus the student's (reverse KL; needs --teacher), optionally plus the verifier's group "
                      "advantage"))

__all__ = [
    "ASSIGNERS", "ARPOConfig", "AssignerSpec", "CreditConfig", "CriticConfig", "DistillConfig", "GRPOConfig",
    "GiGPOConfig",
    "StepPOConfig",
    "TurnPPOConfig", "get_assigner", "get_spec", "reads_hidden", "register", "teacherless_assigners",
    "turn_level_assigners",
]
