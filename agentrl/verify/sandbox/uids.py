"""Fresh uids: under root each run's processes get a uid of their own, drawn here, and after the
run every process of that uid is killed."""

from __future__ import annotations

import os
import secrets
import subprocess
import threading
import time

from .harness import argv as harness_argv

UID_LO, UID_SPAN = 200_000, 1 << 20  # fresh uids are drawn from [200000, 200000 + 2**20)


class FreshUids:
    """Fresh uids for concurrent runs in this process (random, so other processes rarely collide)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used: set[int] = set()

    def take(self) -> int:
        import pwd

        with self._lock:
            while True:
                uid = UID_LO + secrets.randbelow(UID_SPAN)
                if uid in self._used:
                    continue
                # never a real account, never a uid with processes: the cleanup kills all of them
                try:
                    pwd.getpwuid(uid)
                    continue
                except KeyError:
                    pass
                if count_processes(uid):
                    continue
                self._used.add(uid)
                return uid

    def give(self, uid: int) -> None:
        with self._lock:
            self._used.discard(uid)


fresh_uids = FreshUids()


def count_processes(uid: int) -> int:
    n = 0
    for d in os.scandir("/proc"):
        if d.name.isdigit():
            try:
                if os.stat(d.path).st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n


def kill_uid(uid: int, python: str, settle: float = 3.0) -> None:
    """SIGKILL every process of `uid`, including children that left the process group: a helper
    process drops to that uid and calls kill(-1), which reaches exactly the processes of that uid.
    Cheap when nothing is left (checked first by scanning /proc), which with a PID namespace is
    the usual case."""
    if uid == 0:
        raise ValueError("refusing to kill every process of root")
    if count_processes(uid) == 0:
        return
    # a killed process stays in /proc until it is reaped, which on a loaded machine can take a
    # while: kill again and wait, for up to `settle` seconds
    deadline = time.monotonic() + settle
    while True:
        subprocess.run(
            harness_argv(python, "kill", str(uid)),
            env={},
            cwd="/",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=10,
            check=False,
        )
        for _ in range(10):
            time.sleep(0.02)
            if count_processes(uid) == 0:
                return
        if time.monotonic() >= deadline:
            return
