"""glibc's malloc, told to keep the engine's freed cache buffers for the next allocation."""

from __future__ import annotations

import ctypes
import os
import platform

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")  # the user's own settings win
_malloc_tuned = False


def keep_freed_memory() -> bool:
    """Let glibc's malloc hand freed blocks of up to 32 MB back to the next allocation instead of to the kernel.

    The engine's largest tensors are allocated afresh every few turns (a grown cache buffer, a compacted cache:
    tens of MB per layer at 32 Vault turns). By default glibc gives such blocks memory mapped for them alone, and
    returns it when freed; every new one is then faulted in page by page. So the mmap threshold goes to glibc's
    maximum (32 MB) and the trim threshold to 512 MB: freed cache buffers are reused, at the price of the freed
    memory the process keeps (page faults and resident memory: docs/benchmarks.md, "Many turns"). Process-wide,
    once, only under glibc and only where the user has not set these knobs (MALLOC_MMAP_THRESHOLD_,
    MALLOC_TRIM_THRESHOLD_) or opted out (AGENTRL_SYSTEM_MALLOC=1). Returns whether it is in effect."""
    global _malloc_tuned
    if _malloc_tuned:
        return True
    if (platform.system() != "Linux" or platform.libc_ver()[0] != "glibc"
            or os.environ.get("AGENTRL_SYSTEM_MALLOC") == "1" or any(os.environ.get(name) for name in _MALLOC_ENV)):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _malloc_tuned = bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 512 << 20))
    return _malloc_tuned
