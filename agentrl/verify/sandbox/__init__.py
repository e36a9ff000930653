"""The local sandbox: untrusted Python in a fresh, limited, unprivileged process, and a pool.

>>> sb = LocalSandbox(Limits(wall_seconds=10))
>>> r = sb.run_program("print(6 * 7)")
>>> r.stdout, r.exit_code, r.timed_out
('42\\n', 0, False)
>>> res = sb.run_tests("def add(a, b):\\n    return a + b\\n", [TestCase("t0", "assert add(2, 3) == 5")],
...                    entry_point="add")
>>> res.passed, res.n_passed
(True, 1)

**The threat.** The code is the policy's: it may read what it can find (a task's hidden tests, the
trainer's secrets), write where it can, reach the network, fork, allocate, loop, signal or trace
other processes, and lie to whatever grades it. Each run gets, and why:

- **a file system of its own** (a mount namespace whose root is a read-only tmpfs): the
  interpreter, its standard library and the shared libraries they load, bound read-only; an empty
  directory over every ``site-packages`` among them; ``/dev/null``, ``zero``, ``full``,
  ``random``, ``urandom``; its own ``/proc``; a fresh size-limited tmpfs as ``/tmp`` (its cwd and
  ``HOME``), the only place it can write. Nothing else exists there: not site-packages (where
  HumanEval's data file, with the hidden tests, lives), not the project checkout, not ``$HOME``,
  not ``/run`` or the host's ``/tmp`` (so no host Unix socket can be reached). ``expose=`` adds
  host paths read-only for tasks that need them (numpy, say); one under the host's ``/tmp`` (a
  virtualenv there) is bound read-only on top of the private ``/tmp``.
- **a process of its own**, started by the *launcher* (``harness.launcher``: ``vfork`` + ``exec``,
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
- **a judge it cannot reach**: tests (`run_tests`) run in a second process, the *judge*, in the same
  kind of file view, under another uid (as root; as an ordinary user, outside the candidate's PID
  namespace); it calls the candidate through a pipe and takes back plain data only
  (``harness.roles``). Whatever the candidate writes to the pipes that is not a valid reply is a
  *protocol violation* (``result.protocol_violation``): the run scores 0, never an error.

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

**What it does not defend against.** The kernel is the host's: namespaces, cgroups and rlimits are
only as strong as it is, and a kernel exploit escapes them (for a boundary of its own, use the E2B
sandbox, ``agentrl.verify.e2b``, a micro-VM). What is bound into the view is readable: the
directories of the interpreter, its standard library and its shared libraries, and every path
given to ``expose``. A run competes with others for CPU (its CPU seconds and processes are bounded,
not its share of the cores), so it can slow its neighbours and time them. Where the OS allows
neither way in (no root and no user namespaces), nothing is isolated: `LocalSandbox` still runs
code, warns in the log, and says in ``isolation`` exactly what was not isolated and why;
`default_sandbox`, which the code environments and verifiers use, refuses instead and says what to
do, unless ``AGENTRL_UNSAFE_UNISOLATED_SANDBOX=1`` accepts the risk out loud.

**The fork server.** Starting interpreters was most of a run's CPU (figures: docs/benchmarks.md,
"The real sandbox: Code-v0"), so where runs are isolated each interpreter gets one warm *fork
server* (``harness.server``, started lazily, one per interpreter and run environment): a launcher
that has paid the start-up and the imports once and then forks, per process of a run, a child that
runs the very same `launch` a fresh launcher runs (cgroup, namespaces, pid 1, file view, rlimits,
uid or capabilities, ``no_new_privs``), so the isolation is applied after the fork, per run. The
server itself is an ordinary process of ours outside any namespace; sharing one namespace between
runs was not worth a weaker argument. Why a child inherits nothing that matters: the server is
started with exactly the environment every run gets (``PYTHONHASHSEED=0`` included, which only
start-up reads) and stdio pipes like a run's; it is single-threaded and never changes a signal
disposition; the child's first acts are to close every descriptor but the run's own (the control
socket and other runs' sockets included), become a session leader and tie its life to the server's
(``PR_SET_PDEATHSIG``); and nothing secret ever enters the server: programs and tests go from us
straight into the run's pipes, so the memory a child inherits holds the harness and earlier runs'
cfgs (uids, paths, limits). ``random`` is not imported there, so each run seeds its own. A
candidate cannot reach the server: it is outside the run's PID namespace (and under root, another
uid), and its control socket is an unnamed socketpair only we hold. The server reports each
launcher's exit and reaps it only when we are done with the run, so our signals by pid and process
group stay safe; a run whose server died is redone with fresh launchers (the next run starts a new
server), and where a server cannot start, or its launchers cannot set up, runs start fresh
interpreters, with a log line: never weaker isolation. ``fork_server=False`` turns it off. Without
isolation there is no server (a candidate of our uid could signal it).

**Where things are**, each module one job: `contract` (the `Sandbox` protocol, limits, results),
`capabilities` (what this machine allows, probed once), `view` (the plan of a run's file system),
`cgroups` (a memory cgroup per run), `uids` (a fresh uid per run, and killing what it left),
`processes` (a run's launchers as the parent sees them), `forkserver` (the parent's side of the
fork server), `local` (`LocalSandbox`, `default_sandbox`), `pool` (`SandboxPool`), and `harness`:
the code that runs inside a run, sent to the fresh interpreter as one program.
"""

from .capabilities import probe_capabilities
from .contract import (
    Isolation,
    Limits,
    RunResult,
    Sandbox,
    SandboxError,
    TestCase,
    TestOutcome,
    TestRunResult,
    isolation_of,
)
from .forkserver import fork_server_cpu_seconds
from .local import LocalSandbox, default_sandbox
from .pool import SandboxPool

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
    "probe_capabilities",
]
