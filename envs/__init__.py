"""Built-in environments, registered with gymnasium as ``agentrl/<Name>-v0``."""

from agentrl.envs import vault  # noqa: F401
