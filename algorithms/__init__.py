"""Credit assigners, one module each; choosing one is a lookup in `ASSIGNERS`."""

from agentrl.algorithms.grpo import GRPO, GRPOConfig

ASSIGNERS = {"grpo": GRPO}

__all__ = ["ASSIGNERS", "GRPO", "GRPOConfig", "get_assigner"]


def get_assigner(name: str) -> type:
    """The assigner class registered under `name` (kebab-case on the command line)."""
    try:
        return ASSIGNERS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(sorted(ASSIGNERS))}") from None
