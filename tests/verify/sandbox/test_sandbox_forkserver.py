"""The sandbox's fork server: the same results as fresh launchers, nothing a candidate does reaches
the server or the next run, a dead server is noticed and replaced without losing the run, a pool
shares it safely, and an ordinary user gets it too."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading

import pytest
from test_sandbox_unprivileged import user  # noqa: F401, F811  the throwaway-uid fixture

from agentrl.verify.sandbox import Limits, LocalSandbox, SandboxPool, TestCase, forkserver, probe_capabilities

CAPS = probe_capabilities()
pytestmark = pytest.mark.skipif(CAPS.method == "none", reason="no isolation here, so no fork server: " +
                                "; ".join(CAPS.reasons))
LIMITS = Limits(wall_seconds=4, per_test_seconds=2, cpu_seconds=2, memory_mb=256, max_processes=6,
                max_output_bytes=20_000)
ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = [TestCase("t0", "assert add(2, 3) == 5"), TestCase("t1", "assert add(2, 2) == 5")]


@pytest.fixture
def servers(monkeypatch):
    """A registry of fork servers of this test's own, closed after it (others are not disturbed)."""
    registry = forkserver.ForkServers()
    monkeypatch.setattr(forkserver.ForkServers, "shared", registry)
    yield registry
    registry.close_all()


def server_of(sb: LocalSandbox) -> forkserver.ForkServer:
    server = forkserver.ForkServers.shared.get(sb.python, sb._env("/tmp"))
    assert server is not None, "the fork server did not start"
    return server


def children_of(pid: int) -> list[int]:
    return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]


def fields(r) -> tuple:
    """A result without its timing. A flood cut at the output cap exits 0 or 1 (a write into the closed pipe) as
    the timing of the cut falls, from a fresh interpreter and the server alike (seen under load): its exit code is
    timing too."""
    timing = {"wall_seconds"} | ({"exit_code"} if r.output_limited else set())
    return tuple(v for k, v in vars(r).items() if k not in timing)


PROGRAMS = {
    "output and exit code": "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)",
    "traceback": "def f():\n    raise ValueError('boom')\nf()",
    "hash seed and set order": "print(hash('abc'), list({'x', 'y', 'z', 'w'}))",
    "what a process sees": (
        "import os, sys\nprint(sorted(os.listdir('/proc/self/fd')), os.getpid(), os.getppid(), sys.argv, sys.flags,\n"
        "      sys.path, sorted(os.environ.items()), os.getcwd(), os.umask(0), sorted(sys.modules))\n"
        "import signal\nprint([signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE)])\n"
        "import resource\nprint([resource.getrlimit(r) for r in (resource.RLIMIT_NOFILE, resource.RLIMIT_AS)])\n"
        "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0], os.listdir('/'))"
    ),
    "reads its stdin": "import sys\nprint(repr(sys.stdin.read()))",
    "output past the cap": "print('x' * 100_000)",
    "loops past the deadline": "while True:\n    pass",
}


@pytest.mark.parametrize("name", PROGRAMS)
def test_run_program_gives_what_a_fresh_interpreter_gives(servers, name):
    fresh = LocalSandbox(LIMITS, fork_server=False).run_program(PROGRAMS[name])
    sb = LocalSandbox(LIMITS)
    assert sb.fork_server
    got = sb.run_program(PROGRAMS[name])
    assert server_of(sb).alive()
    assert fields(got) == fields(fresh)


WORKER_PROGRAMS = {
    "passes one of two": ADD,
    "does not load": "def add(a, b):\n    return a +\n",
    "exits while loading": "import sys\nsys.exit(0)\n" + ADD,
    "forges a reply": "import os, struct\nos.write(4, struct.pack('>I', 2) + b'{}')\n" + ADD,
    "prints what a worker sees": (
        "import os, sys, signal\nprint(sorted(os.listdir('/proc/self/fd')), os.getpid(), os.getppid(), sys.argv,\n"
        "      sys.path, sorted(os.environ.items()), sorted(sys.modules), signal.getsignal(signal.SIGTERM))\n"
        "print('random' in sys.modules, hash('abc'), file=sys.stderr)\n" + ADD
    ),
}


@pytest.mark.parametrize("name", WORKER_PROGRAMS)
def test_run_tests_gives_what_fresh_interpreters_give(servers, name):
    fresh = LocalSandbox(LIMITS, fork_server=False).run_tests(WORKER_PROGRAMS[name], ADD_TESTS, "add")
    got = LocalSandbox(LIMITS).run_tests(WORKER_PROGRAMS[name], ADD_TESTS, "add")
    assert fields(got) == fields(fresh)


def test_forked_runs_share_no_random_state(servers):
    sb = LocalSandbox(LIMITS)
    draws = {sb.run_program("import random, os\nprint(random.random(), os.urandom(8).hex())").stdout for _ in range(3)}
    assert len(draws) == 3


def test_the_server_is_single_threaded_and_has_the_runs_environment(servers):
    sb = LocalSandbox(LIMITS)
    server = server_of(sb)
    status = open(f"/proc/{server.pid}/status").read()
    assert status.split("Threads:")[1].split()[0] == "1"
    environ = dict(e.split("=", 1) for e in open(f"/proc/{server.pid}/environ").read().split("\0") if e)
    assert environ == sb._env("/tmp") and environ["PYTHONHASHSEED"] == "0"


TAMPERING = {
    "kills its parent and the server": "os.kill(os.getppid(), signal.SIGKILL)\ntry_kill(SERVER)",
    "signals every pid it can name": "for pid in range(1, 400):\n    try_kill(pid)",
    "writes to every descriptor it holds": (
        "for fd in map(int, os.listdir('/proc/self/fd')):\n"
        "    try:\n        os.write(fd, b'\\0\\0\\0\\x05garbage' * 100)\n    except OSError:\n        pass"
    ),
    "leaves a process behind": "if os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('x' * 30_000)",
    "forks as often as it can": "for _ in range(50):\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "exhausts memory": "x = []\nwhile True:\n    x.append(bytearray(1 << 24))",
    "loops forever": "while True:\n    pass",
    "closes stdout and stderr": "os.close(1)\nos.close(2)",
    "exits at once": "os._exit(7)",
    "ignores the signals that end it": (
        "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):\n"
        "    signal.signal(s, signal.SIG_IGN)\nos.setsid()\nwhile True:\n    time.sleep(0.1)"
    ),
}
TAMPER_PRELUDE = (
    "import os, signal, sys, time\nSERVER = {server}\n"
    "def try_kill(pid):\n    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
)


@pytest.mark.parametrize("how", ["run_program", "run_tests"])
@pytest.mark.parametrize("name", TAMPERING)
def test_a_tampering_candidate_reaches_neither_the_server_nor_the_next_run(servers, name, how):
    sb = LocalSandbox(LIMITS)
    server = server_of(sb)
    code = TAMPER_PRELUDE.format(server=server.pid) + TAMPERING[name] + "\n" + ADD
    if how == "run_program":
        sb.run_program(code)
    else:
        assert sb.run_tests(code, ADD_TESTS[:1], "add").n_passed in (0, 1)
    assert server_of(sb) is server and server.alive()
    assert children_of(server.pid) == []  # the run's processes are gone, not merely orphaned
    ok = sb.run_tests(ADD, ADD_TESTS, "add")
    assert [t.passed for t in ok.tests] == [True, False] and ok.stderr == ""
    assert sb.run_program("print(6 * 7)").stdout == "42\n"
    assert server_of(sb) is server and children_of(server.pid) == []


def test_a_dead_server_is_replaced(servers):
    sb = LocalSandbox(LIMITS)
    first = server_of(sb)
    os.kill(first.pid, signal.SIGKILL)
    first.proc.wait()
    assert sb.run_program("print(1)").stdout == "1\n"
    second = server_of(sb)
    assert second is not first and second.alive()


def test_a_server_dying_during_a_run_loses_not_the_run(servers, caplog):
    sb = LocalSandbox(LIMITS)
    server = server_of(sb)
    slow = "import time\ndef add(a, b):\n    time.sleep(0.8)\n    return a + b\n"
    killer = threading.Timer(0.4, os.kill, (server.pid, signal.SIGKILL))
    killer.start()
    with caplog.at_level(logging.WARNING, logger="agentrl.sandbox"):
        res = sb.run_tests(slow, ADD_TESTS, "add")
    killer.join()
    assert [t.passed for t in res.tests] == [True, False], res
    assert "fork server died during a run" in caplog.text and "redone with fresh launchers" in caplog.text
    assert not server.alive() and server_of(sb) is not server


def test_a_server_that_cannot_start_falls_back_with_a_log_line(servers, monkeypatch, caplog):
    real = forkserver.harness_argv

    def broken(python, *args):
        return real(python, *args) if args[0] != "serve" else [python, "-c", "import sys; sys.exit('no server here')"]

    monkeypatch.setattr(forkserver, "harness_argv", broken)
    sb = LocalSandbox(LIMITS)
    with caplog.at_level(logging.WARNING, logger="agentrl.sandbox"):
        res = sb.run_tests(ADD, ADD_TESTS, "add")
    assert [t.passed for t in res.tests] == [True, False]
    assert "no fork server" in caplog.text and "no server here" in caplog.text
    assert forkserver.ForkServers.shared.get(sb.python, sb._env("/tmp")) is None  # not retried each run


def test_a_pool_shares_one_server(servers):
    sb = LocalSandbox(LIMITS)
    jobs = [(ADD if i % 3 else ADD.replace("+", "-"), i) for i in range(24)]

    def one(s, program, i):
        if i % 4 == 0:
            return s.run_program(f"print({i})").stdout
        return [t.passed for t in s.run_tests(program, ADD_TESTS, "add").tests]

    with SandboxPool(sb, workers=8) as pool:
        got = pool.map(one, *zip(*jobs))
    want = [f"{i}\n" if i % 4 == 0 else ([True, False] if i % 3 else [False, False]) for _, i in jobs]
    assert got == want
    server = server_of(sb)
    assert children_of(server.pid) == []


def test_runs_through_the_server_start_no_process_here(servers, monkeypatch):
    """Our process (a thread pool's) neither forks nor Popens per run: the single-threaded server forks."""
    sb = LocalSandbox(LIMITS)
    server_of(sb)
    sb.run_tests(ADD, ADD_TESTS, "add")  # the file view and the rest, cached
    started = []
    real = subprocess.Popen

    class Recording(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            started.append(kwargs.get("preexec_fn"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", Recording)
    monkeypatch.setattr(os, "fork", lambda: started.append("fork"))
    with SandboxPool(sb, workers=3) as pool:
        results = pool.map(lambda s, i: s.run_tests(ADD, ADD_TESTS[:1], "add").passed, range(6))
    assert results == [True] * 6 and started == []


def test_switched_off_no_server_starts(servers):
    sb = LocalSandbox(LIMITS, fork_server=False)
    assert sb.run_program("print(1)").stdout == "1\n"
    assert servers._servers == {}


# As an ordinary user (most people): the server is used (no fallback), gives the fresh launchers'
# results, and is out of a candidate's reach like the driver is.
DRIVER = r"""
import json, logging, os, sys, time
sys.path.insert(0, sys.argv[1])
logging.basicConfig(level=logging.WARNING)
import sandbox as S
lim = S.Limits(wall_seconds=6, per_test_seconds=3, max_output_bytes=20_000)
sb, fresh = S.LocalSandbox(lim), S.LocalSandbox(lim, fork_server=False)
out = {"method": sb.isolation.method, "fork_server": sb.fork_server, "same": {}, "reached": {}}
server = S.forkserver.ForkServers.shared.get(sb.python, sb._env("/tmp"))
out["server"] = server is not None
tests = [S.TestCase("t0", "assert add(2, 3) == 5"), S.TestCase("t1", "assert add(2, 2) == 5")]
add = "def add(a, b):\n    return a + b\n"
def strip(r):  # a flood cut at the cap exits 0 or 1 as the cut's timing falls (see fields())
    timing = {"wall_seconds"} | ({"exit_code"} if r.output_limited else set())
    return {k: v for k, v in vars(r).items() if k not in timing}
def verdict(r):  # a flood cut at the cap while the judge reads: how far it got depends on timing, the verdict not
    return (r.passed, r.n_passed)
for name, prog in json.loads(sys.stdin.read()).items():
    judged = verdict if name == "output past the cap" else strip
    out["same"][name] = [strip(sb.run_program(prog)) == strip(fresh.run_program(prog)),
                         judged(sb.run_tests(prog + "\n" + add, tests, "add")) ==
                         judged(fresh.run_tests(prog + "\n" + add, tests, "add"))]
for name, pid in (("server", server.pid), ("driver", os.getpid())):
    probe = f"import os\ntry:\n    os.kill({pid}, 0)\n    print('reached')\nexcept OSError:\n    print('no')"
    out["reached"][name] = sb.run_program(probe).stdout.strip()
def ours():  # this uid's processes; run as an ordinary user, the suite's own (pytest, its helpers) are among them
    pids = set()
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and os.stat(f"/proc/{p}").st_uid == os.getuid():
                pids.add(int(p))
        except FileNotFoundError:  # ended while we looked
            pass
    return pids
flood = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nos.setsid()\nprint('x' * 50_000)"
before = ours()
sb.run_program(flood)
time.sleep(0.2)
out["server_alive"] = server.alive() and S.forkserver.ForkServers.shared.get(sb.python, sb._env("/tmp")) is server
out["left"] = sorted(ours() - before - {server.pid})  # what the flood's run left behind (its detached child)
print(json.dumps(out))
"""


def test_an_ordinary_user_gets_the_server_with_the_same_results(user):  # noqa: F811
    driver = user.checkout / "forkserver_driver.py"
    driver.write_text(DRIVER)
    os.chmod(driver, 0o644)
    programs = {k: v for k, v in PROGRAMS.items() if k != "loops past the deadline"}
    r = user.run([user.python, "-S", str(driver), str(user.checkout)], stdin=json.dumps(programs))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    if out["method"] != "user-namespace":
        pytest.skip(f"no user namespaces for an ordinary user here ({out['method']})")
    assert out["fork_server"] and out["server"], r.stderr[-2000:]
    assert "no fork server" not in r.stderr and "redone" not in r.stderr, r.stderr[-2000:]
    assert out["same"] == {name: [True, True] for name in programs}, out
    assert out["reached"] == {"server": "no", "driver": "no"}, out
    assert out["server_alive"] and out["left"] == [], out
