"""The local sandbox: untrusted Python in a fresh, limited, unprivileged process, and a pool.

>>> sb = LocalSandbox(Limits(wall_seconds=10))
>>> r = sb.run_program("print(6 * 7)")
>>> r.stdout, r.exit_code, r.timed_out
('42\\n', 0, False)
>>> res = sb.run_tests("def add(a, b):\\n    return a + b\\n", [TestCase("t0", "assert add(2, 3) == 5")], entry_point="add")
>>> res.passed, res.n_passed
(True, 1)

What each run gets, and why:

- **a process of its own** (``python -s -P``: no user site, no script dir on ``sys.path``) with a
  scrubbed environment that we write ourselves (no variable of the parent is inherited). We do not
  use ``-I`` because its ``-E`` would also ignore ``PYTHONHASHSEED=0``, which keeps set order, and so
  verdicts, deterministic.
- **resource limits** (``setrlimit`` before exec): CPU seconds, address space, file size, open files,
  processes, no core dumps; plus a wall-clock deadline after which the whole process group is killed.
- **an unprivileged user of its own** when the parent is root: a fresh uid per run. Root ignores
  ``RLIMIT_NPROC``; a fresh uid does not, and it starts with zero processes, so a fork bomb stops at
  ``max_processes``. After the run every process of that uid is killed (``kill(-1)`` from that uid),
  which also catches children that left the process group with ``setsid``.
- **its own network namespace** (no interfaces but a downed loopback): no connection can be made.
- **its own PID namespace** (and /proc): it sees no other process, and when its first process
  exits the kernel kills and reaps every process it left behind (no zombies, no orphans).
- **its own mount namespace** with a fresh, size-limited tmpfs as ``/tmp`` (its cwd and ``HOME``) and
  the other world-writable directories (``/var/tmp``, ``/dev/shm``, ``/run/lock``) covered read-only,
  so that the tmpfs is the only place it can write (everything else belongs to other users).
- **output capped while reading**: past ``max_output_bytes`` the process is killed, not drained.

Where the OS refuses a namespace (not root, no ``CAP_SYS_ADMIN``), the run still happens, and
``result.isolation`` says exactly what was not isolated and why.

Tests (`run_tests`) run in a second process, the *judge*, under another uid; see ``_harness.py``.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import ctypes.util
import json
import os
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

__all__ = [
    "Isolation",
    "Limits",
    "LocalSandbox",
    "RunResult",
    "Sandbox",
    "SandboxError",
    "SandboxPool",
    "TestCase",
    "TestOutcome",
    "TestRunResult",
    "default_sandbox",
]

_HARNESS = (Path(__file__).with_name("_harness.py")).read_text()
_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_CLONE_NEWPID = 0x20000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 1 << 18
_SHARED_WRITABLE = ("/var/tmp", "/dev/shm", "/run/lock", "/var/lock", "/dev/mqueue")
_UID_LO, _UID_SPAN = 200_000, 1 << 20  # fresh uids are drawn from [200000, 200000 + 2**20)


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, harness crashed): never a score of 0."""


@dataclass(frozen=True)
class Limits:
    """Per-run limits. Defaults fit HumanEval-sized functions with a wide margin."""

    wall_seconds: float = 10.0  # the whole run, load + all tests
    per_test_seconds: float = 3.0  # one test's calls into the candidate
    cpu_seconds: int = 10  # RLIMIT_CPU, per process
    memory_mb: int = 1024  # RLIMIT_AS, per process (virtual memory)
    max_processes: int = 8  # RLIMIT_NPROC for the run's own uid (threads count)
    max_file_mb: int = 16  # RLIMIT_FSIZE: largest file it can write
    disk_mb: int = 32  # size of its private /tmp
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_output_bytes: int = 64_000  # stdout + stderr kept; past this the process is killed
    output_preview_chars: int = 2_000  # what RunResult keeps of each stream for logs


@dataclass(frozen=True)
class Isolation:
    """What the OS let us isolate for this run, with the reason for anything missing."""

    network_isolated: bool
    filesystem_isolated: bool
    user_isolated: bool
    reasons: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return self.network_isolated and self.filesystem_isolated and self.user_isolated


@dataclass(frozen=True)
class RunResult:
    """The outcome of `run_program`."""

    exit_code: int | None  # None when killed by the deadline; negative: killed by that signal
    stdout: str
    stderr: str
    timed_out: bool
    output_limited: bool  # killed for writing more than max_output_bytes
    wall_seconds: float
    isolation: Isolation


@dataclass(frozen=True)
class TestCase:
    """One test: Python source run by the judge, where ``candidate`` and the entry point name call
    into the sandboxed program. ``setup`` cases (imports, fixtures) run in order and are not scored
    on their own; a setup that fails is reported like a failed test."""

    name: str
    code: str
    setup: bool = False
    __test__: ClassVar[bool] = False  # not a pytest class


@dataclass(frozen=True)
class TestOutcome:
    name: str
    passed: bool
    timed_out: bool = False
    error: str | None = None


@dataclass(frozen=True)
class TestRunResult:
    """The outcome of `run_tests`: per-test results, load error, the candidate's trimmed output."""

    tests: tuple[TestOutcome, ...]
    load_error: str | None
    stdout: str
    stderr: str
    timed_out: bool
    output_limited: bool
    wall_seconds: float
    isolation: Isolation

    @property
    def n_passed(self) -> int:
        return sum(t.passed for t in self.tests)

    @property
    def passed(self) -> bool:
        """Every test passed (and there was at least one)."""
        return bool(self.tests) and all(t.passed for t in self.tests)

    def first_failure(self) -> TestOutcome | None:
        return next((t for t in self.tests if not t.passed), None)


class Sandbox(Protocol):
    """What verifiers need from a sandbox (local and E2B backends implement it)."""

    limits: Limits

    def run_program(self, code: str) -> RunResult: ...

    def run_tests(self, program: str, tests: Sequence[TestCase], entry_point: str, preamble: str = "") -> TestRunResult: ...


# --------------------------------------------------------------------------------------------
# What the OS allows: probed once per process


@dataclass(frozen=True)
class _Caps:
    root: bool
    setuid: bool
    netns: bool
    mountns: bool
    pidns: bool
    reasons: tuple[str, ...]


_caps_lock = threading.Lock()
_caps: _Caps | None = None
_libc: Any = None


def _load_libc() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return _libc


def _try_child(preexec: Callable[[], None]) -> str | None:
    """Run `true` with `preexec`; None if it worked, else why not."""
    try:
        subprocess.run(["true"], preexec_fn=preexec, check=True, timeout=10, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return None
    except (subprocess.SubprocessError, OSError) as e:
        return f"{type(e).__name__}: {e}"


def probe_capabilities(refresh: bool = False) -> _Caps:
    """Which isolation this process can set up (cached)."""
    global _caps
    with _caps_lock:
        if _caps is not None and not refresh:
            return _caps
        reasons = []
        root = os.geteuid() == 0
        if not sys.platform.startswith("linux"):
            _caps = _Caps(root, False, False, False, False, (f"namespaces need Linux, this is {sys.platform}",))
            return _caps
        libc = _load_libc()

        def unshare(flags: int) -> Callable[[], None]:
            def fn() -> None:
                if libc.unshare(flags) != 0:
                    raise OSError(ctypes.get_errno(), "unshare failed")

            return fn

        why = _try_child(unshare(_CLONE_NEWNET))
        netns = why is None
        if why:
            reasons.append(f"no network namespace (unshare(CLONE_NEWNET) failed: {why})")
        why = _try_child(unshare(_CLONE_NEWNS))
        mountns = why is None
        if why:
            reasons.append(f"no mount namespace (unshare(CLONE_NEWNS) failed: {why})")
        why = _try_child(unshare(_CLONE_NEWPID))
        pidns = why is None
        if why:
            reasons.append(f"no PID namespace (unshare(CLONE_NEWPID) failed: {why}); orphans are killed by uid instead")
        setuid = False
        if root:
            uid = _UID_LO

            def drop() -> None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)

            why = _try_child(drop)
            setuid = why is None
            if why:
                reasons.append(f"cannot switch to an unprivileged uid ({why})")
        else:
            reasons.append("not running as root: the run shares this user's uid, so RLIMIT_NPROC counts all its processes")
        _caps = _Caps(root, setuid, netns, mountns, pidns, tuple(reasons))
        return _caps


# --------------------------------------------------------------------------------------------
# The local sandbox


class _Uids:
    """Fresh uids for concurrent runs in this process (random, so other processes rarely collide)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used: set[int] = set()

    def take(self) -> int:
        import pwd

        with self._lock:
            while True:
                uid = _UID_LO + secrets.randbelow(_UID_SPAN)
                if uid in self._used:
                    continue
                # never a real account, never a uid with processes: the cleanup kills all of them
                try:
                    pwd.getpwuid(uid)
                    continue
                except KeyError:
                    pass
                if _count_processes(uid):
                    continue
                self._used.add(uid)
                return uid

    def give(self, uid: int) -> None:
        with self._lock:
            self._used.discard(uid)


_uids = _Uids()


@dataclass(eq=False)
class _Proc:
    popen: subprocess.Popen[bytes]
    uid: int | None
    workdir: str | None
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)


class LocalSandbox:
    """A sandbox on this machine; see the module docstring for what it isolates.

    ``require_isolation=True`` makes a run raise `SandboxError` instead of running with less
    isolation than this OS could give when privileged (use it in production training).
    """

    def __init__(self, limits: Limits | None = None, python: str | None = None, require_isolation: bool = False):
        self.limits = limits or Limits()
        # the real interpreter, not a virtualenv's link to it: a venv under /tmp would be hidden by
        # the run's private /tmp (the sandboxed code and the judge need only the standard library)
        self.python = os.path.realpath(python or sys.executable)
        self.caps = probe_capabilities()
        if self.caps.mountns and self.caps.setuid and Path(self.python).is_relative_to("/tmp"):
            raise SandboxError(f"the sandbox's interpreter {self.python} lives under /tmp, which each run replaces with a private "
                               "tmpfs; pass python= an interpreter outside /tmp")
        self.isolation = Isolation(
            network_isolated=self.caps.netns,
            filesystem_isolated=self.caps.mountns and self.caps.setuid,
            user_isolated=self.caps.setuid,
            reasons=self.caps.reasons,
        )
        if require_isolation and not self.isolation.complete:
            raise SandboxError("the local sandbox cannot isolate this run: " + "; ".join(self.isolation.reasons))

    def with_limits(self, **changes: Any) -> LocalSandbox:
        """A copy with some limits changed: ``sb.with_limits(wall_seconds=2)``."""
        sb = LocalSandbox.__new__(LocalSandbox)
        sb.__dict__.update(self.__dict__)
        sb.limits = replace(self.limits, **changes)
        return sb

    # -- public API ----------------------------------------------------------------------------

    def run_program(self, code: str) -> RunResult:
        """Run `code` as a script (fed to ``python -`` on stdin, so the script itself reads an empty stdin)."""
        t0 = time.monotonic()
        lim = self.limits
        proc = self._spawn([self.python, "-s", "-P", "-"], pass_fds=(), untrusted=True)
        try:
            self._feed(proc, code)
            timed_out, limited = self._pump([proc], stop=lambda: proc.popen.poll() is not None, deadline=t0 + lim.wall_seconds, cap=lim.max_output_bytes, capped=[proc])
        finally:
            self._reap([proc])
        return RunResult(
            exit_code=None if timed_out else proc.popen.returncode,
            stdout=self._preview(proc.out),
            stderr=self._preview(proc.err),
            timed_out=timed_out,
            output_limited=limited,
            wall_seconds=time.monotonic() - t0,
            isolation=self.isolation,
        )

    def run_tests(self, program: str, tests: Sequence[TestCase], entry_point: str, preamble: str = "") -> TestRunResult:
        """Load `program` in a worker and run `tests` in a judge that calls `entry_point` in it.

        `preamble` is trusted task code the judge runs first (helpers the tests use, such as
        HumanEval's ``poly``); the candidate's own definitions never reach the judge.
        """
        if not tests:
            raise ValueError("run_tests: no tests given; a task without tests cannot be verified")
        t0 = time.monotonic()
        lim = self.limits
        req_r, req_w = os.pipe()  # judge -> worker
        rep_r, rep_w = os.pipe()  # worker -> judge
        procs: list[_Proc] = []
        try:
            worker = self._spawn([self.python, "-s", "-P", "-c", _HARNESS, "worker", str(req_r), str(rep_w)], pass_fds=(req_r, rep_w), untrusted=True)
            procs.append(worker)
            judge = self._spawn([self.python, "-s", "-P", "-c", _HARNESS, "judge", str(req_w), str(rep_r)], pass_fds=(req_w, rep_r), untrusted=False)
            procs.append(judge)
        except BaseException:
            self._reap(procs)
            raise
        finally:
            for fd in (req_r, req_w, rep_r, rep_w):
                os.close(fd)
        payload = {
            "tests": [{"name": t.name, "code": t.code} for t in tests],
            "entry_point": entry_point,
            "preamble": preamble,
            "per_test_seconds": lim.per_test_seconds,
            "load_seconds": max(1.0, lim.wall_seconds / 2),
        }
        try:
            self._feed(worker, program)
            self._feed(judge, json.dumps(payload))
            timed_out, limited = self._pump(
                procs, stop=lambda: judge.popen.poll() is not None, deadline=t0 + lim.wall_seconds, cap=lim.max_output_bytes, capped=[worker]
            )
        finally:
            self._reap(procs)
        wall = time.monotonic() - t0
        try:
            report = json.loads(bytes(judge.out).decode())
            outcomes = tuple(TestOutcome(r["name"], bool(r["passed"]), bool(r["timed_out"]), r["error"]) for r in report["tests"])
            load_error = report["load_error"]
        except (ValueError, KeyError, TypeError):
            if timed_out:
                # the judge waits at most per_test_seconds per test, so a wall timeout means the
                # tests together were too slow: a failure of the candidate, reported as such
                outcomes = tuple(TestOutcome(t.name, False, True, "not finished: wall-clock limit") for t in tests)
                load_error = None
            else:
                raise SandboxError(
                    f"the judge process failed (exit {judge.popen.returncode}) without a report; "
                    f"stderr: {bytes(judge.err).decode(errors='replace')[-800:]}"
                ) from None
        return TestRunResult(
            tests=outcomes,
            load_error=load_error,
            stdout=self._preview(worker.out),
            stderr=self._preview(worker.err),
            timed_out=timed_out,
            output_limited=limited,
            wall_seconds=wall,
            isolation=self.isolation,
        )

    # -- internals -----------------------------------------------------------------------------

    def _preview(self, data: bytearray) -> str:
        n = self.limits.output_preview_chars
        text = bytes(data).decode(errors="replace")
        return text if len(text) <= n else text[:n] + f"\n... [truncated {len(text) - n} more characters]"

    def _spawn(self, argv: list[str], pass_fds: tuple[int, ...], untrusted: bool) -> _Proc:
        lim, caps = self.limits, self.caps
        uid = _uids.take() if caps.setuid else None
        private_fs = untrusted and caps.mountns and uid is not None
        workdir = None
        if not private_fs:
            workdir = tempfile.mkdtemp(prefix="agentrl-sandbox-")
            if uid is not None:
                os.chown(workdir, uid, uid)
        home = "/tmp" if private_fs else workdir
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
               "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8"}
        nproc = lim.max_processes
        if uid is None:
            # sharing our uid: NPROC counts all our processes, so allow that many more
            nproc += _count_processes(os.getuid())
        rlimits = [
            (resource.RLIMIT_CPU, (lim.cpu_seconds, lim.cpu_seconds + 1)),
            (resource.RLIMIT_AS, (lim.memory_mb << 20,) * 2),
            (resource.RLIMIT_FSIZE, (lim.max_file_mb << 20,) * 2),
            (resource.RLIMIT_NOFILE, (lim.max_open_files,) * 2),
            (resource.RLIMIT_NPROC, (nproc,) * 2),
            (resource.RLIMIT_CORE, (0, 0)),
        ]
        mount_ns = caps.mountns and uid is not None  # both roles: the interpreter must be reachable
        pid_ns = untrusted and mount_ns and caps.pidns
        flags = (_CLONE_NEWNET if (untrusted and caps.netns) else 0) | (_CLONE_NEWNS if mount_ns else 0) | (_CLONE_NEWPID if pid_ns else 0)
        libc = _load_libc() if flags else None
        tmpfs_opts = f"size={lim.disk_mb}m,mode=0700,uid={uid},gid={uid}".encode()
        covered = [p.encode() for p in _SHARED_WRITABLE if os.path.isdir(p) and not os.path.islink(p)] if private_fs else []
        reveal = _hidden_ancestors(self.python) if mount_ns else {}

        def mount(src: bytes | None, dst: bytes, fstype: bytes | None, mflags: int, opts: bytes | None, what: str) -> None:
            if libc.mount(src, dst, fstype, mflags, opts) != 0:
                raise OSError(ctypes.get_errno(), f"{what} ({dst.decode()})")

        def preexec() -> None:
            # Runs in the forked child before exec: keep it to syscalls (no imports, no locks).
            if flags and libc.unshare(flags) != 0:
                raise OSError(ctypes.get_errno(), f"unshare({flags:#x})")
            if mount_ns:
                mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None, "make mounts private")
                # The interpreter may live under a directory others cannot enter (/root/.pyenv):
                # cover that directory with an empty tmpfs and bind back only the interpreter's
                # part of it, which also hides the rest (keys, configs) from the run.
                for parent, children in reveal.items():
                    fds = [os.open(c, os.O_PATH | os.O_CLOEXEC) for c in children]
                    mount(b"tmpfs", parent.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=64k,mode=0755", "cover a private directory")
                    for c, fd in zip(children, fds):
                        os.mkdir(c, 0o755)
                        mount(f"/proc/self/fd/{fd}".encode(), c.encode(), None, _MS_BIND | _MS_REC, None, "bind the interpreter back")
                        os.close(fd)
            if private_fs:
                mount(b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV, tmpfs_opts, "mount a private /tmp")
                for path in covered:
                    mount(b"tmpfs", path, b"tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, b"size=4k,mode=0755", "cover a shared writable directory")
            if pid_ns:
                # The process Popen started stays outside as a small monitor; its child is pid 1 of a
                # fresh PID namespace and runs the code. When pid 1 dies the kernel kills and reaps
                # everything else in the namespace: no orphan or zombie outlives the run.
                child = os.fork()
                if child:
                    _monitor(child)
                mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None, "mount /proc of the new PID namespace")
            for res, val in rlimits:
                resource.setrlimit(res, val)
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            os.chdir(home)
            os.umask(0o077)

        try:
            popen = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd="/",
                pass_fds=pass_fds, close_fds=True, start_new_session=True, preexec_fn=preexec,
            )
        except (OSError, subprocess.SubprocessError) as e:
            if uid is not None:
                _uids.give(uid)
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
            raise SandboxError(f"the sandbox could not start {argv[0]} (uid {uid}, namespaces {flags:#x}): {type(e).__name__}: {e}") from e
        return _Proc(popen, uid, workdir)

    @staticmethod
    def _feed(proc: _Proc, text: str) -> None:
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

    @staticmethod
    def _pump(procs: list[_Proc], stop: Callable[[], bool], deadline: float, cap: int, capped: list[_Proc]) -> tuple[bool, bool]:
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
                        _killpg(p.popen.pid)
                        del buf[cap:]
                        sel.unregister(key.fileobj)
                        # keep reading nothing more from this process
                        for other in (p.popen.stdout, p.popen.stderr):
                            if other is not None and other in {k.fileobj for k in sel.get_map().values()}:
                                sel.unregister(other)
        finally:
            sel.close()
        return timed_out, limited

    @staticmethod
    def _reap(procs: list[_Proc]) -> None:
        """Kill every process the run started: first every process of its uid (which, with a PID
        namespace, is its pid 1: the kernel then kills the rest), then the process group; then
        wait, so that the monitor reaps pid 1 and nothing is left, not even a zombie."""
        for p in procs:
            if p.uid is not None:
                _kill_uid(p.uid, settle=0)  # our own child is among them until we wait for it below
            _killpg(p.popen.pid)
        for p in procs:
            try:
                p.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            if p.uid is not None:
                _kill_uid(p.uid)
                _uids.give(p.uid)
            for stream in (p.popen.stdin, p.popen.stdout, p.popen.stderr):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass
            if p.workdir:
                shutil.rmtree(p.workdir, ignore_errors=True)


def _monitor(child: int) -> None:
    """In the forked monitor: wait for `child`, then exit the same way it did. Never returns."""
    try:
        os.closerange(3, 1 << 16)  # incl. subprocess's exec-error pipe: the child reports for itself
        while True:
            try:
                _, status = os.waitpid(child, 0)
                break
            except InterruptedError:
                continue
        code = os.waitstatus_to_exitcode(status)
        if code < 0:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(code if code >= 0 else 128 - code)
    finally:
        os._exit(1)


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _hidden_ancestors(python: str) -> dict[str, list[str]]:
    """Directories others cannot enter on the way to the interpreter and its libraries, mapped to
    the child directory each run must see: ``{"/root": ["/root/.pyenv"]}``."""
    out: dict[str, list[str]] = {}
    for target in {os.path.realpath(python), os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}:
        parts = Path(target).parts
        for i in range(2, len(parts)):
            parent = str(Path(*parts[:i]))
            try:
                mode = os.stat(parent).st_mode
            except OSError:
                break  # a missing interpreter is reported when the run starts
            if not mode & 0o001:
                child = str(Path(*parts[: i + 1]))
                if child not in out.setdefault(parent, []):
                    out[parent].append(child)
                break
    return out


def _count_processes(uid: int) -> int:
    n = 0
    for d in os.scandir("/proc"):
        if d.name.isdigit():
            try:
                if os.stat(d.path).st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n


def _kill_uid(uid: int, settle: float = 3.0) -> None:
    """SIGKILL every process of `uid`, including children that left the process group: a forked
    helper drops to that uid and calls kill(-1), which reaches exactly the processes of that uid.
    Cheap when nothing is left (checked first by scanning /proc)."""
    if uid == 0:
        raise ValueError("refusing to kill every process of root")
    if _count_processes(uid) == 0:
        return

    def preexec() -> None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        # checked again because kill(-1) from root would signal every process on the machine
        if os.getuid() != uid or os.geteuid() != uid:
            os._exit(1)
        os.kill(-1, signal.SIGKILL)  # every process of this uid except the caller

    # a killed process stays in /proc until it is reaped (by the namespace's pid 1, or the kernel once
    # that is gone), which on a loaded machine can take a while: kill again and wait, for up to
    # `settle` seconds (0: one kill, for callers that have not reaped their own child yet)
    deadline = time.monotonic() + settle
    while True:
        subprocess.run(["true"], preexec_fn=preexec, env={}, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10, check=False)
        if settle <= 0:
            return
        for _ in range(10):
            time.sleep(0.02)
            if _count_processes(uid) == 0:
                return
        if time.monotonic() >= deadline:
            return


# --------------------------------------------------------------------------------------------
# The pool

T = TypeVar("T")
R = TypeVar("R")


class SandboxPool:
    """Run many sandbox jobs at once. Threads only wait on child processes, so `workers` may
    exceed the core count a little (process start-up is partly I/O).

    >>> pool = SandboxPool(LocalSandbox(), workers=2)
    >>> [r.stdout for r in pool.map(lambda sb, c: sb.run_program(c), ["print(1)", "print(2)"])]
    ['1\\n', '2\\n']
    >>> pool.close()
    """

    def __init__(self, sandbox: Sandbox | None = None, workers: int | None = None):
        self.sandbox = sandbox or LocalSandbox()
        self.workers = workers or max(2, os.cpu_count() or 2)
        self._ex = cf.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="agentrl-sandbox")

    def submit(self, fn: Callable[..., R], *args: Any) -> cf.Future[R]:
        """``fn(sandbox, *args)`` on a pool thread."""
        return self._ex.submit(fn, self.sandbox, *args)

    def map(self, fn: Callable[..., R], *iterables: Iterable[Any]) -> list[R]:
        """``[fn(sandbox, *xs) for xs in zip(*iterables)]``, concurrently, in order. The first
        job that raises (a sandbox failure) raises here."""
        futures = [self._ex.submit(fn, self.sandbox, *xs) for xs in zip(*iterables)]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._ex.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_default: LocalSandbox | None = None


def default_sandbox() -> LocalSandbox:
    """A shared `LocalSandbox` with default limits."""
    global _default
    if _default is None:
        _default = LocalSandbox()
    return _default
