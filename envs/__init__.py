"""Built-in environments, registered with gymnasium as ``agentrl/<Name>-v0``."""

from agentrl.envs import (  # noqa: F401
    code,
    math,
    sql,
    vault,  # noqa: F401
)
