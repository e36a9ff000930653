"""Memory cgroups: one per run, so that one limit holds for all of a run's processes together."""

from __future__ import annotations

import errno
import itertools
import os
import threading
import time
from pathlib import Path

from .contract import SandboxError


class MemoryCgroups:
    """One memory cgroup per run, made under this process's own cgroup: cgroup v2 where its memory
    controller is ours to use, else cgroup v1's memory hierarchy. The launcher joins it before it
    runs anything, and every process the run forks is charged to it."""

    def __init__(self, base: str, version: int):
        self.base, self.version = base, version
        self._names = itertools.count()
        self._stale: list[str] = []
        self._lock = threading.Lock()

    @classmethod
    def find(cls) -> tuple[MemoryCgroups | None, str]:
        """(a manager, "") or (None, why not)."""
        try:
            mounts = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()]
            mine = [line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()]
        except OSError as e:
            return None, f"cannot read this process's cgroups: {e}"
        whys = []
        for version in (2, 1):
            for m in mounts:
                sep = m.index("-")
                fstype, super_opts = m[sep + 1], m[sep + 3].split(",") if len(m) > sep + 3 else []
                if not (fstype == "cgroup2" if version == 2 else fstype == "cgroup" and "memory" in super_opts):
                    continue
                paths = [
                    p for h, ctl, p in mine if (h == "0" and ctl == "" if version == 2 else "memory" in ctl.split(","))
                ]
                root, mnt = m[3], m[4]
                if not paths or not (paths[0] == root or paths[0].startswith(root.rstrip("/") + "/")):
                    whys.append(f"v{version}: this process's cgroup is outside the mount at {mnt}")
                    continue
                base = os.path.join(mnt, os.path.relpath(paths[0], root))
                try:
                    if version == 2:
                        if "memory" not in Path(base, "cgroup.controllers").read_text().split():
                            raise OSError(errno.ENOTSUP, f"{base} has no memory controller")
                        if "memory" not in Path(base, "cgroup.subtree_control").read_text().split():
                            Path(base, "cgroup.subtree_control").write_text("+memory")
                    mgr = cls(base, version)
                    mgr.remove(mgr.create(64 << 20))
                    return mgr, ""
                except (OSError, SandboxError) as e:
                    whys.append(f"v{version} at {base}: {e}")
        return None, "; ".join(
            whys
        ) or "no cgroup v2 with a memory controller and no cgroup v1 memory hierarchy is mounted"

    def create(self, limit_bytes: int) -> str:
        """A fresh cgroup with this limit on resident memory (and swap: none beyond it); its path."""
        path = os.path.join(self.base, f"agentrl-{os.getpid()}-{next(self._names)}")
        try:
            os.mkdir(path)
            if self.version == 2:
                Path(path, "memory.max").write_text(str(limit_bytes))
                for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                    if os.path.exists(os.path.join(path, name)):
                        Path(path, name).write_text(value)
            else:
                Path(path, "memory.limit_in_bytes").write_text(str(limit_bytes))
                if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                    Path(path, "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
        except OSError as e:
            self.remove(path)
            raise SandboxError(f"could not make the run's memory cgroup {path}: {e}") from e
        return path

    def remove(self, path: str) -> None:
        """Remove a cgroup whose processes are gone (retried briefly: the last ones may still be
        exiting; one that stays busy is retried at the next removal)."""
        with self._lock:
            todo, self._stale = [path, *self._stale], []
        for p in todo:
            for _ in range(20):
                try:
                    os.rmdir(p)
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY:
                        break
                    time.sleep(0.01)
            else:
                with self._lock:
                    self._stale.append(p)
