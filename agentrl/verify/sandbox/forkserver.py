"""The fork server, the parent's side: one warm interpreter per interpreter and run environment that
forks each run's launchers (the harness's ``server`` is the other side). Why a launcher it forks is
isolated as well as a fresh one: the package's docstring, "The fork server"."""

from __future__ import annotations

import atexit
import logging
import marshal
import os
import select
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

from .contract import SandboxError
from .harness import argv as harness_argv
from .processes import Forked, killpg


class ForkServerTrouble(SandboxError):
    """A run through the fork server could not be had (the server died, or a launcher it forked
    could not set itself up): the run is redone with fresh launchers. ``setup``: the set-up itself
    failed, so the server is not used again for that interpreter."""

    def __init__(self, text: str, setup: bool = False):
        super().__init__(text)
        self.setup = setup


class ForkServer:
    """One warm interpreter running the harness's `serve_main` for one interpreter and environment. It
    forks a launcher per run, which sets itself up exactly as a fresh one does (see the package's
    docstring); started with the environment every run gets (which the interpreter reads at
    start-up: ``PYTHONHASHSEED=0`` above all), with fds 0-2 pipes like a run's."""

    def __init__(self, python: str, env: dict[str, str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                harness_argv(python, "serve", str(theirs.fileno())),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd="/",
                pass_fds=(theirs.fileno(),),
                close_fds=True,
                start_new_session=True,
            )
        except (OSError, subprocess.SubprocessError) as e:
            ours.close()
            raise SandboxError(f"the fork server could not start {python}: {type(e).__name__}: {e}") from e
        finally:
            theirs.close()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()  # it never reads stdin (a forked launcher gets the run's)
        self.proc.stdout.close()
        self.sock = ours
        self._lock = threading.Lock()
        self._last_words = ""
        self.pid = self.proc.pid
        ours.settimeout(30)
        try:
            hello = ours.recv(64)
        except OSError as e:
            hello = f"{type(e).__name__}: {e}".encode()
        finally:
            ours.settimeout(10)  # a request that cannot be sent by then means a server that is stuck
        if hello != b"ready":
            self.close()
            raise SandboxError(f"the fork server did not start: {self.diagnosis() or hello.decode(errors='replace')}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def diagnosis(self) -> str:
        """Once the server has exited: the end of what it wrote to stderr (only a failure writes there)."""
        assert self.proc.stderr is not None
        if not self.proc.stderr.closed and not self.alive():
            os.set_blocking(self.proc.stderr.fileno(), False)
            try:
                self._last_words = (self.proc.stderr.read() or b"").decode(errors="replace")[-500:].strip()
            except OSError:
                pass
            self.proc.stderr.close()
        return self._last_words

    def launcher(self, cfg: dict[str, Any], fds: list[int], deadline: float) -> Forked:
        """A launcher forked for a run, with fresh stdio pipes (as Popen would make) and `fds` (the
        status pipe's write end, then the role's pipes)."""
        ends = [os.pipe() for _ in range(3)]  # stdin, stdout, stderr: (read, write)
        theirs = [ends[0][0], ends[1][1], ends[2][1]]
        ours = [ends[0][1], ends[1][0], ends[2][0]]
        try:
            pid, report = self.spawn({**cfg, "status_fd": -1, "fds": []}, [*theirs, *fds], deadline)
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        return Forked(pid, report, *ours)

    def spawn(self, cfg: dict[str, Any], fds: list[int], deadline: float) -> tuple[int, socket.socket]:
        """Ask for a launcher with `cfg` and these descriptors (stdin, stdout, stderr, status pipe,
        role pipes); its pid and the run's report socket. `ForkServerTrouble` if the server is gone."""
        report, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            try:
                with self._lock:
                    socket.send_fds(self.sock, [marshal.dumps(cfg)], [theirs.fileno(), *fds])
            finally:
                theirs.close()
            poller = select.poll()
            poller.register(report, select.POLLIN)
            msg = b"" if not poller.poll(max(0, int(1000 * (deadline - time.monotonic())))) else report.recv(256)
        except OSError as e:
            report.close()
            raise ForkServerTrouble(f"the fork server is gone ({type(e).__name__}: {e})") from e
        except BaseException:
            report.close()
            raise
        if msg.startswith(b"pid "):
            return int(msg[4:]), report
        report.close()
        if msg.startswith(b"error "):
            raise SandboxError(f"the fork server could not start a launcher: {msg[6:].decode(errors='replace')}")
        raise ForkServerTrouble(f"the fork server did not answer ({self.diagnosis() or 'no word from it'})")

    def close(self, kill: bool = False) -> None:
        """End the server: it stops whatever runs it still has, then exits (``kill``: now; its
        launchers then get SIGTERM from the kernel, which a monitor passes on to its pid 1)."""
        self.sock.close()
        if kill:
            killpg(self.proc.pid)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            killpg(self.proc.pid)
            self.proc.wait()
        self.diagnosis()  # and closes its stderr

    def cpu_seconds(self) -> float:
        """CPU the server and the launchers it has reaped used (/proc/PID/stat: utime, stime,
        cutime, cstime). Our own ``os.times()`` counts it only once the server is reaped."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class ForkServers:
    """The fork servers of this process, one per interpreter and run environment: started on first
    use, restarted when one has died, given up on (with a log line; runs then start fresh
    launchers) when one cannot start, keeps dying, or forks launchers that cannot set up."""

    MAX_RESTARTS = 5
    shared: ClassVar[ForkServers]  # this process's registry, the one every LocalSandbox uses

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._servers: dict[tuple[str, tuple[tuple[str, str], ...]], ForkServer] = {}
        self._off: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
        self._starts: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        self._atexit = False

    def get(self, python: str, env: dict[str, str]) -> ForkServer | None:
        key = (python, tuple(sorted(env.items())))
        with self._lock:
            if key in self._off:
                return None
            server = self._servers.get(key)
            if server is not None and server.alive():
                return server
            if server is not None:
                del self._servers[key]
                server.close()
            if self._starts.get(key, 0) > self.MAX_RESTARTS:
                self._give_up(key, f"it died {self._starts[key]} times")
                return None
            self._starts[key] = self._starts.get(key, 0) + 1
            try:
                server = ForkServer(python, env)
            except SandboxError as e:
                self._give_up(key, str(e))
                return None
            if not self._atexit:
                atexit.register(self.close_all)
                self._atexit = True
            self._servers[key] = server
            return server

    def trouble(self, server: ForkServer, e: ForkServerTrouble) -> None:
        """A run through `server` failed for the server's sake (and is being redone with fresh launchers)."""
        with self._lock:
            key = next((k for k, s in self._servers.items() if s is server), None)
            if key is None:
                return
            del self._servers[key]  # dead or stuck: the next run starts another (or none, below)
            server.close(kill=True)
            if e.setup:
                self._give_up(key, str(e))
            else:
                logging.getLogger("agentrl.sandbox").warning("%s; the run is redone with fresh launchers", e)

    def _give_up(self, key: tuple[str, tuple[tuple[str, str], ...]], why: str) -> None:
        self._off[key] = why
        logging.getLogger("agentrl.sandbox").warning(
            "no fork server for %s (%s): each run starts fresh interpreters, with the same isolation", key[0], why
        )

    def close_all(self) -> None:
        with self._lock:
            running, self._servers = list(self._servers.values()), {}
        for s in running:
            s.close()

    def cpu_seconds(self) -> float:
        with self._lock:
            return sum(s.cpu_seconds() for s in self._servers.values())

    def forget(self) -> None:
        """In a child forked from this process: its servers are its parent's (it starts its own)."""
        self._lock = threading.Lock()
        self._servers, self._starts = {}, {}


ForkServers.shared = ForkServers()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=ForkServers.shared.forget)


def fork_server_cpu_seconds() -> float:
    """CPU seconds used so far by this process's live fork servers and the runs they have reaped.
    Runs started without a server count in ``os.times()``'s children (as does a server once it has
    exited and been reaped); a benchmark adds the two."""
    return ForkServers.shared.cpu_seconds()
