"""The local sandbox: untrusted Python in a fresh, limited, unprivileged process, and a pool.

>>> sb = LocalSandbox(Limits(wall_seconds=10))
>>> r = sb.run_program("print(6 * 7)")
>>> r.stdout, r.exit_code, r.timed_out
('42\\n', 0, False)
>>> res = sb.run_tests("def add(a, b):\\n    return a + b\\n", [TestCase("t0", "assert add(2, 3) == 5")],
...                    entry_point="add")
>>> res.passed, res.n_passed
(True, 1)

What each run gets, and why:

- **a file system of its own** (a mount namespace whose root is a read-only tmpfs): the
  interpreter, its standard library and the shared libraries they load, bound read-only; an empty
  directory over every ``site-packages`` among them; ``/dev/null``, ``zero``, ``full``,
  ``random``, ``urandom``; its own ``/proc``; a fresh size-limited tmpfs as ``/tmp`` (its cwd and
  ``HOME``), the only place it can write. Nothing else exists there: not site-packages (where
  HumanEval's data file, with the hidden tests, lives), not the project checkout, not ``$HOME``,
  not ``/run`` or the host's ``/tmp`` (so no host Unix socket can be reached). ``expose=`` adds
  host paths read-only for tasks that need them (numpy, say); one under the host's ``/tmp`` (a
  virtualenv there) is bound read-only on top of the private ``/tmp``.
- **a process of its own**, started by the *launcher* in `_harness.py` (``vfork`` + ``exec``,
  then the set-up in the fresh single-threaded process; no ``preexec_fn``, which is unsafe in a
  thread pool), with a scrubbed environment that we write ourselves. ``-s -P``: no user site, no
  script dir on ``sys.path``; not ``-I``, whose ``-E`` would also ignore ``PYTHONHASHSEED=0``,
  which keeps set order, and so verdicts, deterministic.
- **resource limits**: CPU seconds, address space, file size, open files, processes, no core
  dumps per process; a **memory limit for the whole run** (a cgroup, v2 or v1: a run that forks
  cannot multiply its memory); and a wall-clock deadline after which everything is killed.
- **an unprivileged user of its own** when the parent is root: a fresh uid per run. Root ignores
  ``RLIMIT_NPROC``; a fresh uid does not, and it starts with zero processes, so a fork bomb stops at
  ``max_processes``. After the run every process of that uid is killed (``kill(-1)`` from that uid),
  which also catches children that left the process group with ``setsid``.
- **its own network namespace** (no interfaces but a downed loopback): no connection can be made.
- **its own PID namespace** (and /proc): it sees no other process, and when its first process
  exits the kernel kills and reaps every process it left behind (no zombies, no orphans).
- **output capped while reading**: past ``max_output_bytes`` the process is killed, not drained.

**Without root** the same namespaces are had through a *user namespace*: the launcher makes one that
maps only its own uid and gid, owns the mount, network and PID namespaces from there, builds the
same file view, then drops every capability (bounding set included) and sets ``no_new_privs``
before the role starts. What differs: the run keeps the user's uid on the host (it still cannot see
or signal the user's other processes, which are outside its PID namespace), so ``max_processes``
is counted on top of the user's own processes; and without a writable memory cgroup (an ordinary
user rarely has one) memory is limited per process. ``isolation.method`` says which way was taken
(``"root"``, ``"user-namespace"`` or ``"none"``).

**No nested user namespaces.** Either way the untrusted process stands in a user namespace of ours
whose ``max_user_namespaces`` is 0, so it cannot make one of its own (a door to kernel code that
otherwise needs root); where ordinary users cannot make user namespaces at all, it cannot either.

Where the OS allows neither way (no root and no user namespaces), `LocalSandbox` still runs code,
warns in the log, and says in ``isolation`` exactly what was not isolated and why;
`default_sandbox`, which the code environments and verifiers use, refuses instead and says what
to do, unless ``AGENTRL_UNSAFE_UNISOLATED_SANDBOX=1`` accepts the risk out loud.

**The fork server.** Starting interpreters was most of a run's CPU (a `run_tests` took ~90 ms of CPU
with fresh ones, ~40 ms forked, on the 2-core development machine), so where runs are isolated each
interpreter gets one warm *fork server* (``_harness.serve_main``, started lazily, one per
interpreter and run environment): a launcher that has paid the start-up and the imports once and
then forks, per process of a run, a child that runs the very same `launch` a fresh launcher runs
(cgroup, namespaces, pid 1, file view, rlimits, uid or capabilities, ``no_new_privs``), so the
isolation is applied after the fork, per run, as before. The server itself is an ordinary process of
ours outside any namespace; sharing one namespace between runs was not worth a weaker argument. Why
a child inherits nothing that matters: the server is started with exactly the environment every run
gets (``PYTHONHASHSEED=0`` included, which only start-up reads) and stdio pipes like a run's; it is
single-threaded and never changes a signal disposition; the child's first acts are to close every
descriptor but the run's own (the control socket and other runs' sockets included), become a session
leader and tie its life to the server's (``PR_SET_PDEATHSIG``); and nothing secret ever enters the
server: programs and tests go from us straight into the run's pipes, so the memory a child inherits
holds the harness and earlier runs' cfgs (uids, paths, limits). ``random`` is not imported there, so
each run seeds its own. A candidate cannot reach the server: it is outside the run's PID namespace
(and under root, another uid), and its control socket is an unnamed socketpair only we hold. The
server reports each launcher's exit and reaps it only when we are done with the run, so our signals
by pid and process group stay safe; a run whose server died is redone with fresh launchers (the next
run starts a new server), and where a server cannot start, or its launchers cannot set up, runs
start fresh interpreters as before, with a log line: never weaker isolation. ``fork_server=False``
turns it off. Without isolation there is no server (a candidate of our uid could signal it).

Tests (`run_tests`) run in a second process, the *judge*, under another uid and in the same kind
of file view; see ``_harness.py``. Whatever the candidate writes to the pipes that is not a valid
reply is a *protocol violation* (``result.protocol_violation``): the run scores 0, never an error.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import errno
import functools
import itertools
import json
import logging
import marshal
import os
import resource
import secrets
import select
import selectors
import shutil
import signal
import socket
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
    "fork_server_cpu_seconds",
    "isolation_of",
]

_HARNESS = (Path(__file__).with_name("_harness.py")).read_text()
_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_CLONE_NEWPID = 0x20000000
_UID_LO, _UID_SPAN = 200_000, 1 << 20  # fresh uids are drawn from [200000, 200000 + 2**20)
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_DEV_LINKS = (
    ("/dev/fd", "/proc/self/fd"),
    ("/dev/stdin", "/proc/self/fd/0"),
    ("/dev/stdout", "/proc/self/fd/1"),
    ("/dev/stderr", "/proc/self/fd/2"),
)


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, harness crashed): never a score of 0."""


@dataclass(frozen=True)
class Limits:
    """Per-run limits. Defaults fit HumanEval-sized functions with a wide margin."""

    wall_seconds: float = 10.0  # the whole run, load + all tests
    per_test_seconds: float = 3.0  # one test's calls into the candidate
    cpu_seconds: int = 10  # RLIMIT_CPU, per process
    memory_mb: int = 1024  # RLIMIT_AS, per process (virtual memory)
    run_memory_mb: int = 1024  # memory cgroup: resident memory of all the run's processes together
    max_processes: int = 8  # RLIMIT_NPROC for the run's own uid (threads count)
    max_file_mb: int = 16  # RLIMIT_FSIZE: largest file it can write
    disk_mb: int = 32  # size of its private /tmp
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_output_bytes: int = 64_000  # stdout + stderr kept; past this the process is killed
    output_preview_chars: int = 2_000  # what RunResult keeps of each stream for logs


@dataclass(frozen=True)
class Isolation:
    """What the OS let us isolate for this run, with the reason for anything missing.

    ``filesystem_isolated``: the run sees only the minimal file view (see the module docstring);
    ``user_isolated``: it cannot see, signal or trace this user's other processes (a fresh uid
    under root; a user and PID namespace of its own otherwise);
    ``memory_per_run``: one memory limit holds for all of the run's processes together (else
    ``memory_mb`` holds per process, and a run that forks can use that much per process);
    ``method``: how: ``"root"`` (namespaces and a fresh uid), ``"user-namespace"`` (the same
    namespaces, owned by an ordinary user), ``"e2b"``, or ``"none"``.

    >>> Isolation(True, True, True, method="user-namespace").sufficient
    True
    >>> Isolation(False, False, False).summary()
    'sandbox isolation: none (network, files and processes are NOT isolated)'
    """

    network_isolated: bool
    filesystem_isolated: bool
    user_isolated: bool
    memory_per_run: bool = False
    reasons: tuple[str, ...] = ()
    method: str = "none"

    @property
    def sufficient(self) -> bool:
        """What training on policy-written code needs: no network, no view of the host's files,
        no reach into the host's processes. (Memory per run is a bonus: without it each process
        is capped, so a run holds at most ``max_processes * memory_mb``.)"""
        return self.network_isolated and self.filesystem_isolated and self.user_isolated

    @property
    def complete(self) -> bool:
        return self.sufficient and self.memory_per_run

    def summary(self) -> str:
        """One line for a log or a console: the method, and what is not isolated."""
        missing = [name for name, ok in (("network", self.network_isolated), ("files", self.filesystem_isolated),
                                         ("processes", self.user_isolated)) if not ok]
        line = f"sandbox isolation: {self.method}"
        if missing:
            line += f" ({', '.join(missing[:-1]) + ' and ' + missing[-1] if len(missing) > 1 else missing[0]}"
            line += f" {'are' if len(missing) > 1 else 'is'} NOT isolated)"
        elif not self.memory_per_run:
            line += " (memory limited per process, not per run)"
        return line


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
    __test__: ClassVar[bool] = False  # not a pytest class


@dataclass(frozen=True)
class TestRunResult:
    """The outcome of `run_tests`: per-test results, load error, the candidate's trimmed output.

    ``protocol_violation`` says what the candidate wrote to the judge's pipe that was not a valid
    reply (a forged frame, a message nested 100,000 deep); then no result can be trusted and the
    run counts as failed, whatever the tests say."""

    tests: tuple[TestOutcome, ...]
    load_error: str | None
    stdout: str
    stderr: str
    timed_out: bool
    output_limited: bool
    wall_seconds: float
    isolation: Isolation
    protocol_violation: str | None = None
    __test__: ClassVar[bool] = False  # not a pytest class

    @property
    def n_passed(self) -> int:
        return 0 if self.protocol_violation else sum(t.passed for t in self.tests)

    @property
    def passed(self) -> bool:
        """Every test passed (and there was at least one), and the candidate kept to the protocol."""
        return bool(self.tests) and not self.protocol_violation and all(t.passed for t in self.tests)

    def first_failure(self) -> TestOutcome | None:
        return next((t for t in self.tests if not t.passed), None)


class Sandbox(Protocol):
    """What verifiers need from a sandbox (local and E2B backends implement it)."""

    limits: Limits

    def run_program(self, code: str) -> RunResult: ...

    def run_tests(
        self, program: str, tests: Sequence[TestCase], entry_point: str, preamble: str = ""
    ) -> TestRunResult: ...


# --------------------------------------------------------------------------------------------
# What the OS allows: probed once per process


@dataclass(frozen=True)
class _Caps:
    root: bool
    setuid: bool
    netns: bool
    mountns: bool
    pidns: bool
    memcg: _MemoryCgroups | None
    reasons: tuple[str, ...]
    userns: bool = False  # an ordinary user's way: user + mount + network + PID namespaces, all tried

    @property
    def method(self) -> str:
        """How runs are isolated here: as root when we are root and may; else by a user namespace."""
        if self.root and self.mountns and self.setuid:
            return "root"
        return "user-namespace" if self.userns else "none"


_caps_lock = threading.Lock()
_caps: _Caps | None = None


@functools.lru_cache(maxsize=1)
def _compiled_harness() -> str | None:
    """The harness compiled once, in this process, as a `-c` program that runs it: each run starts
    two processes, and compiling the harness's source took ~8 ms of each one's CPU (a tenth of a
    Code-v0 turn). The same code runs the same way (`exec` in `__main__`, file name "<string>" as
    for `-c`); marshal's format belongs to this interpreter, so only it is given the compiled form.
    None where the argument would come near the kernel's limit on one argument (128 KiB)."""
    code = marshal.dumps(compile(_HARNESS, "<string>", "exec")).hex()
    boot = f"import marshal\nexec(marshal.loads(bytes.fromhex({code!r})))\n"
    return boot if len(boot) < 120_000 else None


def _harness_argv(python: str, *args: str) -> list[str]:
    # -S: site (and every .pth file in site-packages) would run before the launcher has hidden them
    program = _compiled_harness() if python == os.path.realpath(sys.executable) else None
    return [python, "-S", "-s", "-P", "-c", program or _HARNESS, *args]


def probe_capabilities(refresh: bool = False) -> _Caps:
    """Which isolation this process can set up (cached): one launcher run tries each step."""
    global _caps
    with _caps_lock:
        if _caps is not None and not refresh:
            return _caps
        root = os.geteuid() == 0
        if not sys.platform.startswith("linux"):
            why = f"namespaces and cgroups need Linux, this is {sys.platform}"
            _caps = _Caps(root, False, False, False, False, None, (why, _HOW_TO_ISOLATE))
            return _caps
        found: dict[str, str] = {}
        try:
            out = subprocess.run(
                _harness_argv(os.path.realpath(sys.executable), "probe", str(_UID_LO)),
                env={},
                cwd="/",
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            found = dict(line.split("\t", 1) for line in out.stdout.splitlines() if "\t" in line)
            failed = "" if found else f"the probe printed nothing (exit {out.returncode}): {out.stderr[-300:]}"
        except (OSError, subprocess.SubprocessError) as e:
            failed = f"{type(e).__name__}: {e}"
        steps = ("netns", "mountns", "pidns", "setuid", "userns")
        ok = {k: found.get(k, failed or "not probed") == "ok" for k in steps}
        setuid = root and ok["setuid"]
        memcg, memcg_why = _MemoryCgroups.find()
        reasons = []
        if root and ok["mountns"] and setuid:
            if not ok["netns"]:
                reasons.append(f"no network namespace (unshare(CLONE_NEWNET) failed: {found.get('netns', failed)})")
            if not ok["pidns"]:
                reasons.append(
                    f"no PID namespace (unshare(CLONE_NEWPID) failed: {found.get('pidns', failed)}); orphans are "
                    "killed by uid instead"
                )
        elif ok["userns"]:
            if not root:
                reasons.append(
                    "isolated by a user namespace (not root): the run keeps your uid on the host, so RLIMIT_NPROC "
                    "counts your other processes too (the run is allowed that many more)"
                )
            else:
                reasons.append(
                    "root without the privileges of the host's namespaces (a container?): isolated by a user "
                    f"namespace instead (unshare(CLONE_NEWNS) failed: {found.get('mountns', failed)})"
                )
        else:
            why = found.get("userns", failed)
            if root:
                reasons.append(
                    f"root, but neither the host's namespaces (mount: {found.get('mountns', failed)}; "
                    f"switching uid: {found.get('setuid', failed)}) nor a user namespace ({why}) can be had"
                )
            else:
                reasons.append(
                    f"not root, and no user namespace could be made ({why}): the run shares this user's uid, files "
                    "and network"
                )
            reasons.append(_HOW_TO_ISOLATE)
        if memcg is None:
            reasons.append(f"no memory cgroup ({memcg_why}): memory is limited per process (RLIMIT_AS), not per run")
        _caps = _Caps(root, setuid, ok["netns"], ok["mountns"], ok["pidns"], memcg, tuple(reasons), ok["userns"])
        return _caps


_HOW_TO_ISOLATE = (
    "to isolate as an ordinary user, allow unprivileged user namespaces (`sysctl user.max_user_namespaces` above "
    "0; Debian's older kernels: `sysctl kernel.unprivileged_userns_clone=1`; Ubuntu 24.04+: "
    "`sysctl kernel.apparmor_restrict_unprivileged_userns=0` or an AppArmor profile for this python), run as "
    "root, or use the E2B sandbox (agentrl.verify.e2b)"
)
_UNSAFE_ENV = "AGENTRL_UNSAFE_UNISOLATED_SANDBOX"


class _MemoryCgroups:
    """One memory cgroup per run, made under this process's own cgroup: cgroup v2 where its memory
    controller is ours to use, else cgroup v1's memory hierarchy. The launcher joins it before it
    runs anything, and every process the run forks is charged to it."""

    def __init__(self, base: str, version: int):
        self.base, self.version = base, version
        self._names = itertools.count()
        self._stale: list[str] = []
        self._lock = threading.Lock()

    @classmethod
    def find(cls) -> tuple[_MemoryCgroups | None, str]:
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


# --------------------------------------------------------------------------------------------
# The file view: what exists inside a run


_VIEW_PROBE = r"""
import json, os, site, sys, sysconfig
paths = sysconfig.get_paths()
cv = sysconfig.get_config_var
print(json.dumps({
    "stdlib": [paths["stdlib"], paths["platstdlib"]] + [p for p in sys.path if p],
    "site": site.getsitepackages() + [paths["purelib"], paths["platlib"], site.getusersitepackages()],
    "libpython": os.path.join(cv("LIBDIR") or "/", cv("INSTSONAME") or "") if cv("Py_ENABLE_SHARED") else "",
    "dynload": cv("DESTSHARED") or "",
}))
"""

_views: dict[tuple[str, tuple[str, ...]], tuple[tuple[Any, ...], ...]] = {}
_views_lock = threading.Lock()


def _file_view(python: str, expose: tuple[str, ...]) -> tuple[tuple[Any, ...], ...]:
    """The steps that build a run's file system for `python` (cached per interpreter): bind
    read-only the interpreter, its standard library and the directories of the shared libraries
    it and its extension modules load (as ``ldd`` finds them), recreate the host's symlinks on the
    way to them (``/lib -> usr/lib``), cover every site-packages they contain with an empty
    directory, and add a few devices."""
    key = (python, expose)
    with _views_lock:
        if key in _views:
            return _views[key]
    try:
        out = subprocess.run(
            [python, "-S", "-s", "-P", "-c", _VIEW_PROBE],
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        info = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        raise SandboxError(f"the sandbox could not start {python}: {type(e).__name__}: {e}") from e
    binds: dict[str, bool] = {}  # real path -> is a directory
    links: dict[str, str] = {}
    binds[_resolve(python, links)] = False
    for p in info["stdlib"]:
        if os.path.exists(p):
            real = _resolve(p, links)
            binds[real] = os.path.isdir(real)
    objects = [python] + ([info["libpython"]] if info["libpython"] and os.path.exists(info["libpython"]) else [])
    if info["dynload"] and os.path.isdir(info["dynload"]):
        objects += sorted(str(f) for f in Path(info["dynload"]).glob("*.so"))
    for lib in _shared_libraries(objects):
        binds[os.path.dirname(_resolve(lib, links))] = True
    if os.path.isfile("/etc/ld.so.cache"):
        binds[_resolve("/etc/ld.so.cache", links)] = False
    exposed: dict[str, bool] = {}
    for p in expose:
        if not os.path.exists(p):
            raise SandboxError(f"expose: {p} does not exist")
        real = _resolve(p, links)
        exposed[real] = os.path.isdir(real)

    def inside(p: str, d: str) -> bool:
        return p == d or p.startswith(d.rstrip("/") + "/")

    def outermost(paths: dict[str, bool]) -> list[str]:
        dirs = [d for d, is_dir in paths.items() if is_dir]
        return [p for p in sorted(paths) if not any(inside(p, d) and p != d for d in dirs)]

    kept = outermost(binds)
    steps: list[tuple[Any, ...]] = [("bind", p, binds[p]) for p in kept]
    sites = {os.path.realpath(s) for s in info["site"] if os.path.isdir(s)}
    steps += [("cover", s) for s in sorted(sites) if any(inside(s, d) for d in kept if binds[d])]
    # after the covers, so that a package exposed from inside a site-packages shows through its cover
    steps += [("bind", p, exposed[p]) for p in outermost(exposed) if p not in binds]
    steps += [("dev", d) for d in _DEVICES if os.path.exists(d)]
    # a host symlink on the way to something bound is recreated, unless a bound directory shows it already
    shown = [d for d in kept if binds[d]] + [d for d, is_dir in exposed.items() if is_dir]
    steps += [("link", p, t) for p, t in sorted(links.items()) if not any(inside(p, d) for d in shown)]
    steps += [("link", p, t) for p, t in _DEV_LINKS]
    plan = tuple(steps)
    with _views_lock:
        _views[key] = plan
    return plan


def _resolve(path: str, links: dict[str, str], depth: int = 0) -> str:
    """The real path of `path`, recording each symlink met on the way (path -> target), so that
    the run's file system can have the same links and every path resolves there as here."""
    if depth > 40:
        raise SandboxError(f"too many levels of symbolic links at {path}")
    cur = "/"
    for part in Path(os.path.abspath(path)).parts[1:]:
        nxt = os.path.join(cur, part)
        if os.path.islink(nxt):
            target = os.readlink(nxt)
            links[nxt] = target
            cur = _resolve(os.path.normpath(os.path.join(cur, target)), links, depth + 1)
        else:
            cur = nxt
    return cur


def _shared_libraries(objects: list[str]) -> list[str]:
    """The shared libraries (and the dynamic loader) that these ELF files load, from ``ldd``;
    without ldd, the usual library directories."""
    try:
        out = subprocess.run(
            ["ldd", *objects], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return [d + "/." for d in ("/lib", "/lib64", "/usr/lib", "/usr/lib64") if os.path.isdir(d)]
    libs = set()
    for line in out.splitlines():
        line = line.strip()
        if "=>" in line:
            line = line.split("=>", 1)[1].strip()
        path = line.split(" (", 1)[0]
        if path.startswith("/") and " (" in line and os.path.exists(path):
            libs.add(path)
    return sorted(libs)


_root_lock = threading.Lock()
_root_dir: str | None = None


def _staging_root() -> str:
    """An empty directory of ours on the host where each launcher mounts its run's root tmpfs (in
    its own mount namespace: the host sees only an empty directory)."""
    global _root_dir
    with _root_lock:
        if _root_dir is None or not os.path.isdir(_root_dir):
            _root_dir = tempfile.mkdtemp(prefix="agentrl-sandbox-root-")
            atexit.register(_remove_dir, _root_dir)
        return _root_dir


def _remove_dir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


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
    popen: subprocess.Popen[bytes] | _Forked
    role: str
    uid: int | None
    workdir: str | None
    status: int  # read end of the launcher's status pipe
    cgroup: str | None
    monitored: bool  # the Popen'd process is a monitor outside a PID namespace
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)


# --------------------------------------------------------------------------------------------
# The fork server


class _ForkServerTrouble(SandboxError):
    """A run through the fork server could not be had (the server died, or a launcher it forked
    could not set itself up): the run is redone with fresh launchers. ``setup``: the set-up itself
    failed, so the server is not used again for that interpreter."""

    def __init__(self, text: str, setup: bool = False):
        super().__init__(text)
        self.setup = setup


class _Forked:
    """A launcher the fork server forked for us: what `_Proc` needs of a `subprocess.Popen`. Its
    exit status comes from the server on the run's report socket; the server reaps it only once we
    close that socket (`release`), so until then signalling its pid or process group is safe."""

    def __init__(self, pid: int, report: socket.socket, stdin: int, stdout: int, stderr: int):
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)  # not reaped yet, so this is the launcher
        self.report = report
        self.returncode: int | None = None
        self.lost = False  # the server died before saying how the launcher exited
        self.stdin = open(stdin, "wb")  # noqa: SIM115 - closed by _feed and _reap, as Popen's
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


class _ForkServer:
    """One warm interpreter running `_harness.serve_main` for one interpreter and environment. It
    forks a launcher per run, which sets itself up exactly as a fresh one does (see the module
    docstring); started with the environment every run gets (which the interpreter reads at
    start-up: ``PYTHONHASHSEED=0`` above all), with fds 0-2 pipes like a run's."""

    def __init__(self, python: str, env: dict[str, str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                _harness_argv(python, "serve", str(theirs.fileno())),
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
            ours.settimeout(10)  # a request that cannot be sent in 10 s means a server that is stuck
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

    def spawn(self, cfg: dict[str, Any], fds: list[int], deadline: float) -> tuple[int, socket.socket]:
        """Ask for a launcher with `cfg` and these descriptors (stdin, stdout, stderr, status pipe,
        role pipes); its pid and the run's report socket. `_ForkServerTrouble` if the server is gone."""
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
            raise _ForkServerTrouble(f"the fork server is gone ({type(e).__name__}: {e})") from e
        except BaseException:
            report.close()
            raise
        if msg.startswith(b"pid "):
            return int(msg[4:]), report
        report.close()
        if msg.startswith(b"error "):
            raise SandboxError(f"the fork server could not start a launcher: {msg[6:].decode(errors='replace')}")
        raise _ForkServerTrouble(f"the fork server did not answer ({self.diagnosis() or 'no word from it'})")

    def close(self, kill: bool = False) -> None:
        """End the server: it stops whatever runs it still has, then exits (``kill``: now; its
        launchers then get SIGTERM from the kernel, which a monitor passes on to its pid 1)."""
        self.sock.close()
        if kill:
            _killpg(self.proc.pid)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _killpg(self.proc.pid)
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


class _ForkServers:
    """The fork servers of this process, one per interpreter and run environment: started on first
    use, restarted when one has died, given up on (with a log line; runs then start fresh
    launchers) when one cannot start, keeps dying, or forks launchers that cannot set up."""

    MAX_RESTARTS = 5

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._servers: dict[tuple[str, tuple[tuple[str, str], ...]], _ForkServer] = {}
        self._off: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
        self._starts: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        self._atexit = False

    def get(self, python: str, env: dict[str, str]) -> _ForkServer | None:
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
                server = _ForkServer(python, env)
            except SandboxError as e:
                self._give_up(key, str(e))
                return None
            if not self._atexit:
                atexit.register(self.close_all)
                self._atexit = True
            self._servers[key] = server
            return server

    def trouble(self, server: _ForkServer, e: _ForkServerTrouble) -> None:
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
            servers, self._servers = list(self._servers.values()), {}
        for s in servers:
            s.close()

    def cpu_seconds(self) -> float:
        with self._lock:
            return sum(s.cpu_seconds() for s in self._servers.values())

    def forget(self) -> None:
        """In a child forked from this process: its servers are its parent's (it starts its own)."""
        self._lock = threading.Lock()
        self._servers, self._starts = {}, {}


_fork_servers = _ForkServers()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fork_servers.forget)


def fork_server_cpu_seconds() -> float:
    """CPU seconds used so far by this process's live fork servers and the runs they have reaped.
    Runs started without a server count in ``os.times()``'s children (as does a server once it has
    exited and been reaped); a benchmark adds the two."""
    return _fork_servers.cpu_seconds()


class LocalSandbox:
    """A sandbox on this machine; see the module docstring for what it isolates.

    Root isolates with namespaces and a fresh uid per run; an ordinary user gets the same file
    view, network and PID namespaces through a user namespace (``isolation.method`` says which).
    Where neither can be had, runs still happen, with a warning in the log and
    ``isolation.sufficient`` False; ``require_isolation=True`` makes construction raise
    `SandboxError` instead (`default_sandbox`, which the code environments use, requires it unless
    ``AGENTRL_UNSAFE_UNISOLATED_SANDBOX=1`` is set).
    ``expose`` names host paths (files or directories) every run sees read-only, beyond the
    interpreter and its standard library: a task's data, a package its tests import.
    ``fork_server`` (on by default where runs are isolated) starts each run's processes from a warm
    interpreter instead of fresh ones: the same isolation, a fraction of the CPU (module docstring).
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
        server = _fork_servers.get(self.python, self._env("/tmp")) if self.fork_server else None
        if server is not None:
            try:
                return run(*args, server=server)
            except _ForkServerTrouble as e:
                _fork_servers.trouble(server, e)
        return run(*args, server=None)

    def _run_program(self, code: str, server: _ForkServer | None) -> RunResult:
        t0 = time.monotonic()
        lim = self.limits
        proc = self._spawn("program", (), untrusted=True, server=server, deadline=t0 + lim.wall_seconds)
        try:
            self._feed(proc, code)
            self._await_started([proc], t0 + lim.wall_seconds)
            timed_out, limited = self._pump(
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
        self, program: str, tests: Sequence[TestCase], entry_point: str, preamble: str, server: _ForkServer | None
    ) -> TestRunResult:
        t0 = time.monotonic()
        lim = self.limits
        req_r, req_w = os.pipe()  # judge -> worker
        rep_r, rep_w = os.pipe()  # worker -> judge
        procs: list[_Proc] = []
        try:
            # each side gets its ends as fds 3 (requests) and 4 (replies); see _harness.py
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
            self._feed(worker, program)
            self._feed(judge, json.dumps(payload))
            self._await_started(procs, t0 + lim.wall_seconds)
            timed_out, limited = self._pump(
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
    def _check_server(procs: list[_Proc]) -> None:
        """A run whose fork server died under it is not a result: it is redone (`_through_fork_server`)."""
        if any(isinstance(p.popen, _Forked) and p.popen.lost for p in procs):
            raise _ForkServerTrouble("the fork server died during a run")

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
        self, role: str, pipes: tuple[int, ...], untrusted: bool, server: _ForkServer | None = None,
        deadline: float = 0.0,
    ) -> _Proc:
        """Start the launcher for `role` (forked by `server`, or a fresh interpreter); it sets itself
        up (see `_harness.launch`) while we go on."""
        lim, caps = self.limits, self.caps
        view = _file_view(self.python, self.expose) if self._view else None
        uid = _uids.take() if caps.setuid and not self._userns else None
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
                nproc += _count_processes(os.getuid())
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
                "root": _staging_root() if view is not None else "",
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
                popen: subprocess.Popen[bytes] | _Forked = self._fork(server, cfg, [status_w, *pipes], deadline)
            else:
                popen = subprocess.Popen(
                    _harness_argv(self.python, "launch", marshal.dumps(cfg).hex()),
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
                _uids.give(uid)
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
        return _Proc(popen, role, uid, workdir, status_r, cgroup, monitored=pid_ns)

    @staticmethod
    def _fork(server: _ForkServer, cfg: dict[str, Any], fds: list[int], deadline: float) -> _Forked:
        """A launcher forked by `server`, with fresh stdio pipes (as Popen would make) and `fds`
        (the status pipe's write end, then the role's pipes)."""
        ends = [os.pipe() for _ in range(3)]  # stdin, stdout, stderr: (read, write)
        theirs = [ends[0][0], ends[1][1], ends[2][1]]
        ours = [ends[0][1], ends[1][0], ends[2][0]]
        try:
            pid, report = server.spawn({**cfg, "status_fd": -1, "fds": []}, [*theirs, *fds], deadline)
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        return _Forked(pid, report, *ours)

    def _await_started(self, procs: list[_Proc], deadline: float) -> None:
        """Wait until each launcher has finished setting up: its status pipe says "ok" (a role in
        the harness) or closes empty (exec'd the interpreter). Anything else is the sandbox's own
        failure. The candidate never holds this pipe, so it cannot fake either answer."""
        for p in procs:
            data = b""
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SandboxError(f"the sandbox's {p.role} did not finish setting up before the wall-clock limit")
                ready, _, _ = _select([p.status], left)
                if not ready:
                    continue
                chunk = os.read(p.status, 4096)
                if not chunk:
                    break
                data += chunk
            if data != (b"" if p.role == "program" else b"ok"):
                if isinstance(p.popen, _Forked):
                    raise _ForkServerTrouble(
                        f"a launcher forked by the fork server could not set up the {p.role}: "
                        f"{data.decode(errors='replace') or 'it exited without a word'}", setup=True)
                raise SandboxError(
                    f"the sandbox could not set up the {p.role} ({self.python}, uid {p.uid}): "
                    f"{data.decode(errors='replace') or 'the launcher exited without a word'}"
                )

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
    def _pump(
        procs: list[_Proc], stop: Callable[[], bool], deadline: float, cap: int, capped: list[_Proc]
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
                        _stop(p)
                        del buf[cap:]
                        sel.unregister(key.fileobj)
                        # keep reading nothing more from this process
                        for other in (p.popen.stdout, p.popen.stderr):
                            if other is not None and other in {k.fileobj for k in sel.get_map().values()}:
                                sel.unregister(other)
        finally:
            sel.close()
        return timed_out, limited

    def _reap(self, procs: list[_Proc]) -> None:
        """Kill every process the run started and wait until none is left, not even a zombie.
        A monitor (outside a PID namespace) gets SIGTERM and kills its pid 1 itself, which makes
        the kernel kill the rest of the namespace; any other launcher is killed with its process
        group. Then whatever still runs as the run's uid (a child that left the group with setsid,
        where there is no PID namespace) is killed from that uid."""
        for p in procs:
            _stop(p)  # before waiting: until the leader is reaped its group id cannot be reused
        for p in procs:
            try:
                p.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _kill_group(p)
                try:
                    p.popen.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            if isinstance(p.popen, _Forked):
                p.popen.release()  # waited for: the server may reap it now
            if p.uid is not None:
                _kill_uid(p.uid, self.python)
                _uids.give(p.uid)
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


def _select(fds: list[int], timeout: float) -> tuple[list[int], list[int], list[int]]:
    import select

    return select.select(fds, [], [], timeout)


def _stop(p: _Proc) -> None:
    """End a run's launcher: a monitor gets SIGTERM and kills its pid 1 (the kernel then kills the
    rest of the PID namespace; SIGKILL would end the monitor alone, and a pid 1 that left the
    process group with setsid would run on); any other launcher is killed with its process group."""
    if not p.monitored:
        _kill_group(p)
    elif isinstance(p.popen, _Forked):
        p.popen.signal(signal.SIGTERM, group=False)
    else:
        try:
            os.kill(p.popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def _kill_group(p: _Proc) -> None:
    if isinstance(p.popen, _Forked):
        p.popen.signal(signal.SIGKILL, group=True)
    else:
        _killpg(p.popen.pid)


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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


def _kill_uid(uid: int, python: str, settle: float = 3.0) -> None:
    """SIGKILL every process of `uid`, including children that left the process group: a helper
    process drops to that uid and calls kill(-1), which reaches exactly the processes of that uid.
    Cheap when nothing is left (checked first by scanning /proc), which with a PID namespace is
    the usual case."""
    if uid == 0:
        raise ValueError("refusing to kill every process of root")
    if _count_processes(uid) == 0:
        return
    # a killed process stays in /proc until it is reaped, which on a loaded machine can take a
    # while: kill again and wait, for up to `settle` seconds
    deadline = time.monotonic() + settle
    while True:
        subprocess.run(
            _harness_argv(python, "kill", str(uid)),
            env={},
            cwd="/",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=10,
            check=False,
        )
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


def isolation_of(env: Any) -> Isolation | None:
    """The isolation of the sandbox an environment runs policy-written code in (its ``sandbox``, or
    its verifier's), or None for an environment that runs none. What check-env and a run's first
    lines report."""
    env = getattr(env, "unwrapped", env)
    for holder in (env, getattr(env, "verifier", None)):
        iso = getattr(getattr(holder, "sandbox", None), "isolation", None)
        if isinstance(iso, Isolation):
            return iso
    return None


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
