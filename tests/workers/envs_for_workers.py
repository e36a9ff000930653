"""Environments for tests/workers/test_workers.py, in a module of their own: a process pool's worker
unpickles them by importing this module, which imports no torch (so the worker starts fast)."""

from __future__ import annotations

import asyncio
import threading

from agentrl.core import AgentEnv
from agentrl.envs.vault import VaultEnv


class SlowEnv(AgentEnv):
    """`wait` sleeps as asked (a hung remote call when asked too long); `ping` answers at once."""

    max_turns = 3

    def wait(self, seconds: float) -> str:
        """Wait."""
        threading.Event().wait(seconds)
        return f"waited {seconds}"

    async def await_(self, seconds: float) -> str:
        """Wait on the event loop."""
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            SlowEnv.cancelled += 1
            raise
        return f"awaited on {threading.current_thread().name}"

    def ping(self) -> str:
        """Answer."""
        return "pong"

    tools = [wait, await_, ping]
    cancelled = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "go", {}

    def verify(self) -> float:
        return 1.0





class BrokenVault(VaultEnv):
    def open(self, lock: int, code: int) -> str:
        """Open a lock with its code."""
        raise RuntimeError("lock mechanism jammed")

    tools = [VaultEnv.clue, open]


class CrashingVault(VaultEnv):
    """Vault whose `open` kills the process it runs in, as a segfaulting simulator would."""

    def open(self, lock: int, code: int) -> str:
        """Open a lock with its code."""
        import os

        os._exit(17)

    tools = [VaultEnv.clue, open]
