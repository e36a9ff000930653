"""`LocalSandbox`: runs policy-written code on this machine, isolated as the package's docstring
says, and `default_sandbox`, the shared one the code environments use."""

from __future__ import annotations

import json
import logging
import marshal
import os
import resource
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from .capabilities import probe_capabilities
from .contract import Isolation, Limits, RunResult, SandboxError, TestCase, TestOutcome, TestRunResult
from .forkserver import ForkServer, ForkServers, ForkServerTrouble
from .harness import argv as harness_argv
from .processes import Forked, Proc, feed, kill_group, pump, stop_launcher
from .uids import count_processes, fresh_uids, kill_uid
from .view import file_view, staging_root

_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_CLONE_NEWPID = 0x20000000
_UNSAFE_ENV = "AGENTRL_UNSAFE_UNISOLATED_SANDBOX"

T = TypeVar("T")


class LocalSandbox:
    """A sandbox on this machine; see the package's docstring for what it isolates.

    Root isolates with namespaces and a fresh uid per run; an ordinary user gets the same file
    view, network and PID namespaces through a user namespace (``isolation.method`` says which).
    Where neither can be had, runs still happen, with a warning in the log and
    ``isolation.sufficient`` False; ``require_isolation=True`` makes construction raise
    `SandboxError` instead (`default_sandbox`, which the code environments use, requires it unless
    ``AGENTRL_UNSAFE_UNISOLATED_SANDBOX=1`` is set).
    ``expose`` names host paths (files or directories) every run sees read-only, beyond the
    interpreter and its standard library: a task's data, a package its tests import.
    ``fork_server`` (on by default where runs are isolated) starts each run's processes from a warm
    interpreter instead of fresh ones: the same isolation, a fraction of the CPU (the package's
    docstring).
    """

    def __init__(
        self,
        limits: Limits | None = None,
        python: str | None = None,
        require_isolation: bool = False,
        expose: Sequence[str] = (),
        fork_server: bool = True,
    ):
        self.limits = limits or Limits()
        # the real interpreter, not a virtualenv's link to it: the run sees neither the venv nor
        # its site-packages
        self.python = os.path.realpath(python or sys.executable)
        self.expose = tuple(os.path.abspath(p) for p in expose)
        # the folders an exposed package or module is imported from: the sandbox runs the base interpreter,
        # whose sys.path lacks a virtualenv's site-packages
        self._import_roots = tuple(dict.fromkeys(
            os.path.dirname(p) for p in self.expose
            if os.path.isfile(os.path.join(p, "__init__.py")) or p.endswith((".py", ".so"))))
        self.caps = caps = probe_capabilities()
        self.method = caps.method
        self._view = self.method != "none"
        self._userns = self.method == "user-namespace"
        net = caps.netns if self.method == "root" else self._userns
        self.isolation = Isolation(
            network_isolated=net,
            filesystem_isolated=self._view,
            user_isolated=self.method == "root" or self._userns,
            memory_per_run=caps.memcg is not None,
            reasons=caps.reasons,
            method=self.method,
        )
        if not self.isolation.sufficient:
            if require_isolation:
                raise SandboxError(
                    "the local sandbox cannot isolate policy-written code on this machine: "
                    + "; ".join(self.isolation.reasons)
                )
            _warn_once(f"{self.isolation.summary()}: " + "; ".join(self.isolation.reasons))
        # only for isolated runs: unisolated, a candidate could signal or trace the server (same uid)
        self.fork_server = fork_server and self._view and hasattr(os, "pidfd_open")

    def with_limits(self, **changes: Any) -> LocalSandbox:
        """A copy with some limits changed: ``sb.with_limits(wall_seconds=2)``."""
        sb = LocalSandbox.__new__(LocalSandbox)
        sb.__dict__.update(self.__dict__)
        sb.limits = replace(self.limits, **changes)
        return sb

    # -- public API ----------------------------------------------------------------------------

    def run_program(self, code: str) -> RunResult:
        """Run `code` as a script (fed to ``python -`` on stdin, so the script itself reads an empty stdin)."""
        return self._through_fork_server(self._run_program, code)

    def run_tests(self, program: str, tests: Sequence[TestCase], entry_point: str, preamble: str = "") -> TestRunResult:
        """Load `program` in a worker and run `tests` in a judge that calls `entry_point` in it.

        `preamble` is trusted task code the judge runs first (helpers the tests use, such as
        HumanEval's ``poly``); the candidate's own definitions never reach the judge.
        """
        if not tests:
            raise ValueError("run_tests: no tests given; a task without tests cannot be verified")
        return self._through_fork_server(self._run_tests, program, tests, entry_point, preamble)

    # -- internals -----------------------------------------------------------------------------

    def _through_fork_server(self, run: Callable[..., T], *args: Any) -> T:
        """`run(*args, server=...)` through this interpreter's fork server where there is one; a run
        the server failed (it died, or its launcher could not set up) is redone with fresh launchers."""
        server = ForkServers.shared.get(self.python, self._env("/tmp")) if self.fork_server else None
        if server is not None:
            try:
                return run(*args, server=server)
            except ForkServerTrouble as e:
                ForkServers.shared.trouble(server, e)
        return run(*args, server=None)

    def _run_program(self, code: str, server: ForkServer | None) -> RunResult:
        t0 = time.monotonic()
        lim = self.limits
        proc = self._spawn("program", (), untrusted=True, server=server, deadline=t0 + lim.wall_seconds)
        try:
            feed(proc, code)
            self._await_started([proc], t0 + lim.wall_seconds)
            timed_out, limited = pump(
                [proc],
                stop=lambda: proc.popen.poll() is not None,
                deadline=t0 + lim.wall_seconds,
                cap=lim.max_output_bytes,
                capped=[proc],
            )
        finally:
            self._reap([proc])
        self._check_server([proc])
        return RunResult(
            exit_code=None if timed_out else proc.popen.returncode,
            stdout=self._preview(proc.out),
            stderr=self._preview(proc.err),
            timed_out=timed_out,
            output_limited=limited,
            wall_seconds=time.monotonic() - t0,
            isolation=self.isolation,
        )

    def _run_tests(
        self, program: str, tests: Sequence[TestCase], entry_point: str, preamble: str, server: ForkServer | None
    ) -> TestRunResult:
        t0 = time.monotonic()
        lim = self.limits
        req_r, req_w = os.pipe()  # judge -> worker
        rep_r, rep_w = os.pipe()  # worker -> judge
        procs: list[Proc] = []
        try:
            # each side gets its ends as fds 3 (requests) and 4 (replies); see harness/codec.py
            deadline = t0 + lim.wall_seconds
            worker = self._spawn("worker", (req_r, rep_w), untrusted=True, server=server, deadline=deadline)
            procs.append(worker)
            judge = self._spawn("judge", (req_w, rep_r), untrusted=False, server=server, deadline=deadline)
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
            feed(worker, program)
            feed(judge, json.dumps(payload))
            self._await_started(procs, t0 + lim.wall_seconds)
            timed_out, limited = pump(
                procs,
                stop=lambda: judge.popen.poll() is not None,
                deadline=t0 + lim.wall_seconds,
                cap=lim.max_output_bytes,
                capped=[worker],
            )
        finally:
            self._reap(procs)
        self._check_server(procs)
        wall = time.monotonic() - t0
        violation = None
        try:
            report = json.loads(bytes(judge.out).decode())
            outcomes = tuple(
                TestOutcome(r["name"], bool(r["passed"]), bool(r["timed_out"]), r["error"]) for r in report["tests"]
            )
            load_error = report["load_error"]
            violation = report.get("protocol_violation")
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
            protocol_violation=violation,
        )

    @staticmethod
    def _check_server(procs: list[Proc]) -> None:
        """A run whose fork server died under it is not a result: it is redone (`_through_fork_server`)."""
        if any(isinstance(p.popen, Forked) and p.popen.lost for p in procs):
            raise ForkServerTrouble("the fork server died during a run")

    def _env(self, home: str) -> dict[str, str]:
        """The whole environment of a run's processes (nothing of ours leaks in)."""
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": home,
            "TMPDIR": home,
            "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8",
        }
        if self._import_roots:  # an exposed package imports from where it lies, also from a venv's site-packages
            env["PYTHONPATH"] = ":".join(self._import_roots)
        return env

    def _preview(self, data: bytearray) -> str:
        n = self.limits.output_preview_chars
        text = bytes(data).decode(errors="replace")
        return text if len(text) <= n else text[:n] + f"\n... [truncated {len(text) - n} more characters]"

    def _spawn(
        self, role: str, pipes: tuple[int, ...], untrusted: bool, server: ForkServer | None = None,
        deadline: float = 0.0,
    ) -> Proc:
        """Start the launcher for `role` (forked by `server`, or a fresh interpreter); it sets itself
        up (see `harness.launcher`) while we go on."""
        lim, caps = self.limits, self.caps
        view = file_view(self.python, self.expose) if self._view else None
        uid = fresh_uids.take() if caps.setuid and not self._userns else None
        workdir = cgroup = None
        status_r = status_w = -1
        try:
            if view is None:
                workdir = tempfile.mkdtemp(prefix="agentrl-sandbox-")
                if uid is not None:
                    os.chown(workdir, uid, uid)
            home = "/tmp" if view is not None else workdir
            assert home is not None
            env = self._env(home)
            nproc = lim.max_processes
            if uid is None:
                # sharing our uid: NPROC counts all our processes, so allow that many more
                nproc += count_processes(os.getuid())
            # the judge's CPU is bounded by the wall clock (the candidate must not be able to make it
            # run out of CPU seconds decoding replies: that would be our failure, not its)
            cpu = lim.cpu_seconds if untrusted else max(lim.cpu_seconds, int(lim.wall_seconds) + 5)
            rlimits = [
                (resource.RLIMIT_CPU, cpu, cpu + 1),
                (resource.RLIMIT_AS, lim.memory_mb << 20, lim.memory_mb << 20),
                (resource.RLIMIT_FSIZE, lim.max_file_mb << 20, lim.max_file_mb << 20),
                (resource.RLIMIT_NOFILE, lim.max_open_files, lim.max_open_files),
                (resource.RLIMIT_NPROC, nproc, nproc),
                (resource.RLIMIT_CORE, 0, 0),
            ]
            pid_ns = untrusted and view is not None and (caps.pidns or self._userns)
            flags = (
                (_CLONE_NEWNET if (untrusted and self.isolation.network_isolated) else 0)
                | (_CLONE_NEWNS if view is not None else 0)
                | (_CLONE_NEWPID if pid_ns else 0)
            )
            if untrusted and caps.memcg is not None:
                cgroup = caps.memcg.create(lim.run_memory_mb << 20)
            status_r, status_w = os.pipe()
            cfg = {
                "role": role,
                "python": self.python,
                "status_fd": status_w,
                "fds": list(pipes),
                "cgroup": os.path.join(cgroup, "cgroup.procs") if cgroup else "",
                "unshare": flags,
                "root": staging_root() if view is not None else "",
                "view": list(view or ()),
                "proc": pid_ns,  # pid 1 mounts a /proc of its own namespace
                "nested": pid_ns,  # forbid user namespaces inside (needs that /proc)
                "userns": [os.getuid(), os.getgid()] if self._userns else [],
                "tmp": f"size={lim.disk_mb}m,mode=0700,uid={_or(uid, os.getuid())},gid={_or(uid, os.getgid())}",
                "rlimits": rlimits,
                "uid": -1 if uid is None else uid,
                "home": home,
            }
            if server is not None:  # its environment is `env` already: the same for every run with a view
                popen: subprocess.Popen[bytes] | Forked = server.launcher(cfg, [status_w, *pipes], deadline)
            else:
                popen = subprocess.Popen(
                    harness_argv(self.python, "launch", marshal.dumps(cfg).hex()),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=env,
                    cwd="/",
                    pass_fds=(*pipes, status_w),
                    close_fds=True,
                    start_new_session=True,
                )
        except BaseException as e:
            for fd in (status_r, status_w):
                if fd >= 0:
                    os.close(fd)
            if uid is not None:
                fresh_uids.give(uid)
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
            if cgroup and caps.memcg is not None:
                caps.memcg.remove(cgroup)
            if isinstance(e, (OSError, subprocess.SubprocessError)) and not isinstance(e, SandboxError):
                raise SandboxError(
                    f"the sandbox could not start {self.python} (uid {uid}): {type(e).__name__}: {e}"
                ) from e
            raise
        os.close(status_w)
        return Proc(popen, role, uid, workdir, status_r, cgroup, monitored=pid_ns)

    def _await_started(self, procs: list[Proc], deadline: float) -> None:
        """Wait until each launcher has finished setting up: its status pipe says "ok" (a role in
        the harness) or closes empty (exec'd the interpreter). Anything else is the sandbox's own
        failure. The candidate never holds this pipe, so it cannot fake either answer."""
        for p in procs:
            data = b""
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SandboxError(f"the sandbox's {p.role} did not finish setting up before the wall-clock limit")
                ready, _, _ = select.select([p.status], [], [], left)
                if not ready:
                    continue
                chunk = os.read(p.status, 4096)
                if not chunk:
                    break
                data += chunk
            if data != (b"" if p.role == "program" else b"ok"):
                if isinstance(p.popen, Forked):
                    raise ForkServerTrouble(
                        f"a launcher forked by the fork server could not set up the {p.role}: "
                        f"{data.decode(errors='replace') or 'it exited without a word'}", setup=True)
                raise SandboxError(
                    f"the sandbox could not set up the {p.role} ({self.python}, uid {p.uid}): "
                    f"{data.decode(errors='replace') or 'the launcher exited without a word'}"
                )

    def _reap(self, procs: list[Proc]) -> None:
        """Kill every process the run started and wait until none is left, not even a zombie.
        A monitor (outside a PID namespace) gets SIGTERM and kills its pid 1 itself, which makes
        the kernel kill the rest of the namespace; any other launcher is killed with its process
        group. Then whatever still runs as the run's uid (a child that left the group with setsid,
        where there is no PID namespace) is killed from that uid."""
        for p in procs:
            stop_launcher(p)  # before waiting: until the leader is reaped its group id cannot be reused
        for p in procs:
            try:
                p.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                kill_group(p)
                try:
                    p.popen.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            if isinstance(p.popen, Forked):
                p.popen.release()  # waited for: the server may reap it now
            if p.uid is not None:
                kill_uid(p.uid, self.python)
                fresh_uids.give(p.uid)
            if p.cgroup and self.caps.memcg is not None:
                self.caps.memcg.remove(p.cgroup)
            for stream in (p.popen.stdin, p.popen.stdout, p.popen.stderr):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass
            try:
                os.close(p.status)
            except OSError:
                pass
            if p.workdir:
                shutil.rmtree(p.workdir, ignore_errors=True)


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


_warned: set[str] = set()


def _warn_once(text: str) -> None:
    if text not in _warned:
        _warned.add(text)
        logging.getLogger("agentrl.sandbox").warning(text)


_default: LocalSandbox | None = None
_default_lock = threading.Lock()


def default_sandbox() -> LocalSandbox:
    """The shared `LocalSandbox` with default limits that the code environments and verifiers use.

    It refuses to exist (`SandboxError`, saying why and what to do) where policy-written code cannot
    be isolated, unless ``AGENTRL_UNSAFE_UNISOLATED_SANDBOX=1`` says that you accept candidates
    reading and writing whatever your user can, and reaching the network."""
    global _default
    with _default_lock:
        if _default is None:
            unsafe = os.environ.get(_UNSAFE_ENV, "") not in ("", "0")
            try:
                _default = LocalSandbox(require_isolation=not unsafe)
            except SandboxError as e:
                raise SandboxError(
                    f"{e}. Refusing to run policy-written code unisolated. To run it anyway, accepting that it can "
                    f"read and write whatever your user can and reach the network, set {_UNSAFE_ENV}=1"
                ) from None
            if unsafe and not _default.isolation.sufficient:
                logging.getLogger("agentrl.sandbox").warning(
                    "%s=1: policy-written code runs WITHOUT isolation (%s)", _UNSAFE_ENV, _default.isolation.summary()
                )
        return _default
