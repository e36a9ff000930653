"""Credit assigners, one module each; choosing one is a lookup in `ASSIGNERS`.

An assigner is constructed as ``cls(config, policy=..., train_config=...)`` and offers
``fit(batch) -> metrics`` and ``assign(batch) -> Credit`` (see `agentrl.credit`).
"""

import inspect
from types import SimpleNamespace

from pydantic import BaseModel

from agentrl.algorithms.arpo import ARPO, ARPOConfig
from agentrl.algorithms.gigpo import GiGPO, GiGPOConfig
from agentrl.algorithms.grpo import GRPO, GRPOConfig
from agentrl.algorithms.steppo import StepPO, StepPOConfig
from agentrl.algorithms.turn_ppo import TurnPPO, TurnPPOConfig

ASSIGNERS = {cls.name: cls for cls in (GRPO, ARPO, StepPO, TurnPPO, GiGPO)}

__all__ = [
    "ARPO", "ASSIGNERS", "GRPO", "ARPOConfig", "GRPOConfig", "GiGPO", "GiGPOConfig", "StepPO", "StepPOConfig",
    "TurnPPO", "TurnPPOConfig", "get_assigner", "reads_hidden",
]


def get_assigner(name: str) -> type:
    """The assigner class registered under `name` (kebab-case on the command line)."""
    try:
        return ASSIGNERS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(sorted(ASSIGNERS))}") from None


def reads_hidden(name: str, config: BaseModel) -> bool:
    """Whether assigner `name` under its `config` reads the policy's hidden states (a turn critic or a
    learned PRM), decided before anything is built: its `needs_hidden`, a class constant or a property
    of its config (steppo's depends on which PRM)."""
    attr = inspect.getattr_static(get_assigner(name), "needs_hidden", False)
    return bool(attr.fget(SimpleNamespace(cfg=config))) if isinstance(attr, property) else bool(attr)
