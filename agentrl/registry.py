"""`make`: an environment from its id, a `module:Class` or a `path/to/file.py:Class`.

It sits above the contract (`agentrl.core`), the built-in environments (`agentrl.envs`) and the gymnasium
adapter (`agentrl.adapters.gym_text`), which all import `core` and never this module; registering a
built-in environment is gymnasium's own `register` (docs/extending.md, "An environment").
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

import agentrl.envs  # noqa: F401  (registers the built-in environments)
from agentrl.adapters.gym_text import GymTextEnv
from agentrl.core import AgentEnv
from agentrl.loading import IMPORT_HINT, import_from_cwd

__all__ = ["IMPORT_HINT", "make"]


def make(env_id: str, **kwargs: Any) -> AgentEnv:
    """Build a registered environment (`agentrl/Vault-v0`), `module:Class` or `path/to/file.py:Class`,
    without wrappers.

    A registered id goes through `gymnasium.make`; agentrl's own ids are registered without
    gymnasium's checker and order wrappers, so both return the bare `AgentEnv` that the rollout steps.
    `gym:SomeId` wraps any gymnasium env whose spaces are text (`agentrl.adapters.gym_text`);
    `verifiers:<taskset id>` returns a Prime Intellect verifiers environment as a `VerifiersAgent`, not an env: it
    trains through the gateway (`agentrl.adapters.verifiers_env`).
    """
    if env_id.startswith("gym:"):  # before the module:Class split: a gymnasium id may hold a colon of its own
        return GymTextEnv(env_id.removeprefix("gym:"), **kwargs)
    if env_id.startswith("verifiers:"):  # a verifiers taskset package: imported only when named (the [verifiers] extra)
        from agentrl.adapters.verifiers_env import VerifiersAgent

        return VerifiersAgent(env_id.removeprefix("verifiers:"), **kwargs)  # type: ignore[return-value]
    module, _, attr = env_id.rpartition(":")
    if module.endswith(".py") or (module and "/" not in module):
        try:
            loaded = import_from_cwd(module)
        except ModuleNotFoundError as e:
            raise ValueError(f"cannot load environment {env_id!r}: {e}; {IMPORT_HINT}") from e
        except ImportError as e:
            raise ValueError(f"cannot load environment {env_id!r}: {e}") from e
        try:
            cls = getattr(loaded, attr)
        except AttributeError:
            found = sorted(k for k, v in vars(loaded).items() if isinstance(v, type) and issubclass(v, AgentEnv)
                           and v is not AgentEnv)
            raise ValueError(f"cannot load environment {env_id!r}: module {module} has no {attr!r}"
                             + (f"; its AgentEnv classes: {', '.join(found)}" if found else "")) from None
        env = cls(**kwargs)
    else:
        try:
            spec = gym.spec(env_id)
        except gym.error.Error as e:
            known = sorted(k for k in gym.registry if k.startswith("agentrl/"))
            raise ValueError(f"unknown environment {env_id!r}; built-in: {', '.join(known)}") from e
        env = gym.make(spec, **kwargs)  # agentrl's own ids are registered so that this is the bare env
        if not isinstance(env, AgentEnv) and isinstance(env.unwrapped, AgentEnv):
            raise TypeError(f"{env_id!r} is registered with gymnasium wrappers ({type(env).__name__}); agentrl steps "
                            "the AgentEnv itself: register it with disable_env_checker=True, order_enforce=False and "
                            "no max_episode_steps (the turn budget is the env's max_turns)")
    if not isinstance(env, AgentEnv):
        raise TypeError(f"{env_id!r} built a {type(env).__name__}, which is not an agentrl.AgentEnv")
    return env
