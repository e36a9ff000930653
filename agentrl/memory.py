"""How much memory this process has taken and may take, and one warning before it runs out.

A process that runs out of memory on Linux is ended by the kernel's out-of-memory killer with SIGKILL: exit
status 137, no traceback, no line in its own output (only `dmesg` says why). Two of the recipe's stages on a
real model died that way before they were bounded (docs/models.md). `MemoryWatch` is called once a step; it
returns the process's peak resident memory as a metric and says, once, when that peak passes a share of what
the process may use (the cgroup's limit where one is set, else the machine's memory), naming the knob that
trades memory for time.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
from collections.abc import Callable
from pathlib import Path

GB = 1024**3
# cgroup v2, then v1: a container's limit, which the kernel enforces before the machine runs out
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def peak_rss_bytes() -> int:
    """This process's peak resident memory: the kernel's VmHWM where /proc has it (it starts afresh at exec, while
    getrusage's peak can keep the forking parent's), else getrusage (KiB on Linux, bytes on macOS)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def limit_bytes(cgroup_files: tuple[Path, ...] = CGROUP_LIMITS) -> int | None:
    """What this process may use: the smaller of the machine's memory and a cgroup limit, where one is set."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not every platform names these
        pass
    for path in cgroup_files:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # "max" (v2) or a page-rounded 2**63 (v1): no limit
            limits.append(int(text))
    return min(limits) if limits else None


class MemoryWatch:
    """Call once a step: returns `{"sys/rss_peak_gb": ...}` and, the first time the peak passes `share` of the
    limit, says so with `hint` (what to lower). It says once a run: a warning repeated every step is noise."""

    def __init__(self, hint: str, say: Callable[[str], None] | None = None, share: float = 0.8,
                 limit: int | None = None, peak: Callable[[], int] = peak_rss_bytes):
        self.hint, self.share, self.peak = hint, share, peak
        self.say = say or logging.getLogger(__name__).warning
        self.limit = limit if limit is not None else limit_bytes()
        self.warned = False

    def __call__(self) -> dict[str, float]:
        peak = self.peak()
        if self.limit and not self.warned and peak >= self.share * self.limit:
            self.warned = True
            self.say(f"memory: this process has reached {peak / GB:.1f} GB of the {self.limit / GB:.1f} GB it may use "
                     f"({peak / self.limit:.0%}). Past the limit the kernel kills it without a word (exit status "
                     f"137; `dmesg` says why). Smaller micro-batches cost time, not results: lower {self.hint}.")
        return {"sys/rss_peak_gb": round(peak / GB, 3)}


__all__ = ["MemoryWatch", "limit_bytes", "peak_rss_bytes"]
