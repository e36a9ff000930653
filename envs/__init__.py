"""Built-in environments, registered with gymnasium as ``agentrl/<Name>-v0``."""

import importlib.util

from agentrl.envs import (  # noqa: F401
    code,
    math,
    sql,
    vault,  # noqa: F401
    vault_memory,  # noqa: F401
)

# Adapters to other projects' environments register their ids only where that project is installed (the
# optional extras in pyproject.toml), so `import agentrl.envs` and check_env over every id work without them.
if importlib.util.find_spec("textarena") is not None:
    from agentrl.adapters import textarena_games  # noqa: F401
if importlib.util.find_spec("reasoning_gym") is not None:
    from agentrl.adapters import reasoning_gym_tasks  # noqa: F401
if importlib.util.find_spec("textworld") is not None:
    from agentrl.adapters import textworld_games  # noqa: F401
if importlib.util.find_spec("bfcl_eval") is not None:  # installed with --no-deps (agentrl/adapters/bfcl.py says why)
    from agentrl.adapters import bfcl  # noqa: F401
