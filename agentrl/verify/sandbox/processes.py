"""A run's processes as the parent sees them: each launcher (a `subprocess.Popen`, or a `Forked` one
from the fork server), feeding its stdin, reading its output under the cap, and ending it."""

from __future__ import annotations

import os
import select
import selectors
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(eq=False)
class Proc:
    """One process of a run as we hold it: its launcher, what the launcher was given (uid, folder,
    cgroup), and what it has written so far."""

    popen: subprocess.Popen[bytes] | Forked
    role: str
    uid: int | None
    workdir: str | None
    status: int  # read end of the launcher's status pipe
    cgroup: str | None
    monitored: bool  # the Popen'd process is a monitor outside a PID namespace
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)


class Forked:
    """A launcher the fork server forked for us: what `Proc` needs of a `subprocess.Popen`. Its
    exit status comes from the server on the run's report socket; the server reaps it only once we
    close that socket (`release`), so until then signalling its pid or process group is safe."""

    def __init__(self, pid: int, report: socket.socket, stdin: int, stdout: int, stderr: int):
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)  # not reaped yet, so this is the launcher
        self.report = report
        self.returncode: int | None = None
        self.lost = False  # the server died before saying how the launcher exited
        self.stdin = open(stdin, "wb")  # noqa: SIM115 - closed by feed and LocalSandbox._reap, as Popen's
        self.stdout = open(stdout, "rb")  # noqa: SIM115
        self.stderr = open(stderr, "rb")  # noqa: SIM115

    def poll(self) -> int | None:
        self._wait(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if not self._wait(timeout):
            raise subprocess.TimeoutExpired(f"launcher {self.pid}", timeout or 0)
        return self.returncode

    def _wait(self, timeout: float | None) -> bool:
        """True once the launcher has exited (and `returncode` is set)."""
        if self.returncode is not None:
            return True
        poller = select.poll()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0, int(1000 * (deadline - time.monotonic())))
            if not self.lost:
                poller.register(self.report, select.POLLIN)
                if not poller.poll(left):
                    return False
                poller.unregister(self.report)
                try:
                    msg = self.report.recv(256)
                except OSError:
                    msg = b""
                if msg.startswith(b"exit "):
                    self.returncode = int(msg[5:])
                    return True
                if msg:
                    continue
                self.lost = True  # the server is gone; the launcher (its pidfd) is all we have left
            poller.register(self.pidfd, select.POLLIN)
            if not poller.poll(left):
                return False
            self.returncode = -signal.SIGKILL  # unknown: the run is redone anyway
            return True

    def signal(self, sig: int, group: bool) -> None:
        """Send `sig` to the launcher (by its pidfd: safe even once the server is gone) or, while the
        server holds it unreaped, to its process group."""
        try:
            if group and not self.lost:
                os.killpg(self.pid, sig)
            else:
                signal.pidfd_send_signal(self.pidfd, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def release(self, timeout: float = 5.0) -> None:
        """We are done with it: the server reaps it (stopping it first if it still runs), and we wait
        until it has, so that no zombie of the run outlives the run."""
        try:
            if not self.lost:
                self.report.shutdown(socket.SHUT_WR)  # the server reads EOF
                poller = select.poll()
                poller.register(self.report, select.POLLIN)
                deadline = time.monotonic() + timeout
                while poller.poll(max(0, int(1000 * (deadline - time.monotonic())))):
                    msg = self.report.recv(256)
                    if not msg or msg == b"reaped":
                        break
        except OSError:
            pass
        finally:
            self.report.close()
            os.close(self.pidfd)


def feed(proc: Proc, text: str) -> None:
    """Write `text` to the child's stdin and close it, from a thread (a pipe holds only 64 KiB)."""
    data = text.encode()
    stdin = proc.popen.stdin
    assert stdin is not None

    def write() -> None:
        try:
            stdin.write(data)
        except (BrokenPipeError, OSError, ValueError):
            pass  # the child exited or closed stdin: its result says so
        finally:
            try:
                stdin.close()
            except (BrokenPipeError, OSError):
                pass

    if len(data) < 32_768:
        write()
    else:
        threading.Thread(target=write, daemon=True).start()


def pump(
    procs: list[Proc], stop: Callable[[], bool], deadline: float, cap: int, capped: list[Proc]
) -> tuple[bool, bool]:
    """Read every stdout/stderr until `stop()` and the streams are done, or the deadline.
    Returns (timed_out, output_limited). The cap applies while reading: the process that
    passes it is killed at once."""
    sel = selectors.DefaultSelector()
    for p in procs:
        for stream, buf in ((p.popen.stdout, p.out), (p.popen.stderr, p.err)):
            assert stream is not None
            os.set_blocking(stream.fileno(), False)
            sel.register(stream, selectors.EVENT_READ, (p, buf))
    timed_out = limited = False
    stopped_at: float | None = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if stop():
                # the main process is done; allow a moment to drain what it wrote, but do not
                # wait for grandchildren that hold the pipes open
                stopped_at = stopped_at or now
                if now - stopped_at > 0.2:
                    break
            timeout = min(deadline - now, 0.05 if stopped_at else 0.25)
            for key, _ in sel.select(timeout):
                p, buf = key.data
                try:
                    chunk = os.read(key.fileobj.fileno(), 1 << 16)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf += chunk
                if any(p is c for c in capped) and len(p.out) + len(p.err) > cap:
                    limited = True
                    stop_launcher(p)
                    del buf[cap:]
                    sel.unregister(key.fileobj)
                    # keep reading nothing more from this process
                    for other in (p.popen.stdout, p.popen.stderr):
                        if other is not None and other in {k.fileobj for k in sel.get_map().values()}:
                            sel.unregister(other)
    finally:
        sel.close()
    return timed_out, limited


def stop_launcher(p: Proc) -> None:
    """End a run's launcher: a monitor gets SIGTERM and kills its pid 1 (the kernel then kills the
    rest of the PID namespace; SIGKILL would end the monitor alone, and a pid 1 that left the
    process group with setsid would run on); any other launcher is killed with its process group."""
    if not p.monitored:
        kill_group(p)
    elif isinstance(p.popen, Forked):
        p.popen.signal(signal.SIGTERM, group=False)
    else:
        try:
            os.kill(p.popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def kill_group(p: Proc) -> None:
    if isinstance(p.popen, Forked):
        p.popen.signal(signal.SIGKILL, group=True)
    else:
        killpg(p.popen.pid)


def killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
