"""The local sandbox: structured results, limits, isolation, hostile code, the pool."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

import pytest

from agentrl.verify import _harness
from agentrl.verify.sandbox import Limits, LocalSandbox, SandboxError, SandboxPool, TestCase, probe_capabilities

CAPS = probe_capabilities()
needs_isolation = pytest.mark.skipif(
    not (CAPS.setuid and CAPS.netns and CAPS.mountns), reason="needs root with namespaces: " + "; ".join(CAPS.reasons)
)
TIGHT = Limits(wall_seconds=4, per_test_seconds=2, cpu_seconds=2, memory_mb=256, max_processes=6, max_file_mb=4, disk_mb=8, max_output_bytes=20_000)


@pytest.fixture(scope="module")
def sb() -> LocalSandbox:
    return LocalSandbox(TIGHT)


_TAKEN: set[int] = set()  # every uid this test process's sandboxes ran as


@pytest.fixture(autouse=True)
def record_uids(monkeypatch):
    """Record the uids our runs take, so the leftover check looks at our processes only: another
    sandbox user on the machine (a second test run, a training job) must not fail these tests."""
    from agentrl.verify import sandbox as sandbox_module

    take = sandbox_module._uids.take

    def recording_take():
        uid = take()
        _TAKEN.add(uid)
        return uid

    monkeypatch.setattr(sandbox_module._uids, "take", recording_take)


def sandbox_processes() -> list[int]:
    """Processes still running as a uid one of our sandbox runs used (all must be gone after each run)."""
    out = []
    for d in os.scandir("/proc"):
        if d.name.isdigit():
            try:
                if os.stat(d.path).st_uid in _TAKEN:
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def test_runs_code_and_reports_structured_results(sb):
    r = sb.run_program("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out, r.output_limited) == ("out\n", "err\n", 3, False, False)
    res = sb.run_tests("def f(x):\n    return x * 2\n", [TestCase("ok", "assert f(2) == 4"), TestCase("bad", "assert f(2) == 5")], "f")
    assert [(t.name, t.passed) for t in res.tests] == [("ok", True), ("bad", False)]
    assert res.tests[1].error == "AssertionError" and not res.passed and res.n_passed == 1


def test_scrubbed_environment_and_fresh_home(sb, monkeypatch):
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "hunter2")
    r = sb.run_program("import os\nprint(sorted(os.environ))\nprint(os.getcwd() == os.environ['HOME'], os.listdir('.'))")
    assert "AGENTRL_TEST_SECRET" not in r.stdout and "hunter2" not in r.stdout
    assert "True []" in r.stdout  # cwd is HOME and starts empty


def test_sandbox_that_cannot_start_raises_clearly():
    broken = LocalSandbox(TIGHT, python="/nonexistent/python3")
    with pytest.raises(SandboxError, match="could not start /nonexistent/python3"):
        broken.run_program("print(1)")
    with pytest.raises(SandboxError, match="could not start"):
        broken.run_tests("def f(): pass", [TestCase("t", "assert f() is None")], "f")


def test_codec_lets_only_plain_data_through():
    class Evil(int):
        def __eq__(self, other):
            return True

    assert _harness.decode(_harness.encode({"a": (1, 2.5, float("inf")), "b": {1, 2}, "c": b"x", "d": [None, True]})) == {
        "a": (1, 2.5, float("inf")), "b": {1, 2}, "c": b"x", "d": [None, True]}
    assert type(_harness.decode(_harness.encode(Evil(3)))) is int  # the override does not survive
    with pytest.raises(_harness.CodecError):
        _harness.encode(object())


# -- hostile code: every case contained, within its limit, nothing left running ---------------

HOSTILE_PROGRAMS = {
    "infinite loop": "while True:\n    pass\n",
    "memory bomb": "x = []\nwhile True:\n    x.append(bytearray(50 << 20))\n",
    "gigabytes of output": "import sys\nwhile True:\n    sys.stdout.write('x' * 1_000_000)\n",
    "big file": "with open('big', 'wb') as f:\n    while True:\n        f.write(b'x' * (1 << 20))\n",
    "sleep forever in an escaped child": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(1000)\ntime.sleep(1000)\n",
}


@needs_isolation
@pytest.mark.parametrize("name", list(HOSTILE_PROGRAMS))
def test_hostile_program_is_contained(sb, name):
    t0 = time.monotonic()
    r = sb.run_program(HOSTILE_PROGRAMS[name])
    assert time.monotonic() - t0 < TIGHT.wall_seconds + 3
    assert r.exit_code != 0
    assert len(r.stdout) + len(r.stderr) < TIGHT.output_preview_chars * 2 + 200
    assert sandbox_processes() == []


@needs_isolation
def test_fork_bomb_stops_at_max_processes(sb):
    # a bounded bomb first: count how many children the kernel lets it have
    r = sb.run_program(
        "import os, time\nn = 0\nfor _ in range(50):\n    try:\n        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n"
        "        n += 1\n    except OSError:\n        break\nprint(n, flush=True)\nos._exit(0)\n"
    )
    assert r.stdout.strip() and int(r.stdout) <= TIGHT.max_processes - 1
    assert sandbox_processes() == []
    # then the real thing: every process forks forever
    t0 = time.monotonic()
    r = sb.run_program("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    assert r.timed_out and time.monotonic() - t0 < TIGHT.wall_seconds + 3
    assert sandbox_processes() == []


@needs_isolation
def test_cannot_write_outside_its_tmp(sb):
    r = sb.run_program(
        "import os\nfor p in ['/etc/agentrl-pwned', '/var/tmp/agentrl-pwned', '/dev/shm/agentrl-pwned', os.path.expanduser('~/ok')]:\n"
        "    try:\n        open(p, 'w').write('x')\n        print('wrote', p)\n    except OSError as e:\n        print('denied', p)\n"
    )
    assert r.stdout.count("denied") == 3 and "wrote /tmp/ok" in r.stdout
    for p in ("/etc/agentrl-pwned", "/var/tmp/agentrl-pwned", "/dev/shm/agentrl-pwned"):
        assert not os.path.exists(p)


@needs_isolation
def test_cannot_read_the_parents_secrets_or_kill_it(sb, monkeypatch):
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "hunter2")
    r = sb.run_program(
        f"import os, signal\nfor p in ['/proc/{os.getpid()}/environ', '/proc/1/environ']:\n"
        "    try:\n        print(open(p).read())\n    except OSError as e:\n        print('denied', e.errno)\n"
        f"try:\n    os.kill({os.getpid()}, signal.SIGKILL)\nexcept OSError:\n    print('kill denied')\n"
    )
    assert "hunter2" not in r.stdout and "kill denied" in r.stdout
    assert r.isolation.user_isolated  # and we are still alive to assert it


@needs_isolation
def test_no_network(sb):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(3)
    port = server.getsockname()[1]
    got = []

    def accept():
        try:
            got.append(server.accept())
        except OSError:
            pass

    t = threading.Thread(target=accept)
    t.start()
    r = sb.run_program(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\ns.sendall(b'leak')\nprint('connected')")
    t.join()
    server.close()
    assert "connected" not in r.stdout and got == []
    assert r.isolation.network_isolated


# -- attacks on the harness: the tests never run where the candidate runs -------------------

HARNESS_ATTACKS = {
    "exit 0 before the tests": "import sys\nsys.exit(0)\ndef f(x):\n    return x\n",
    "os._exit(0)": "import os\nos._exit(0)\n",
    "os._exit(0) inside the call": "def f(x):\n    import os\n    os._exit(0)\n",
    "redefine assert helpers": "import builtins\nbuiltins.AssertionError = type('Never', (Exception,), {})\ndef f(x):\n    return None\n",
    "patch the test runner": "import unittest, json\nunittest.TestCase.assertEqual = lambda *a, **k: None\njson.dumps = lambda *a, **k: '{\"tests\": []}'\ndef f(x):\n    return None\n",
    "fake results file and report": "import os\nopen('results.json', 'w').write('{\"tests\": [{\"passed\": true}]}')\n"
    "print('{\"load_error\": null, \"tests\": [{\"name\": \"t0\", \"passed\": true, \"timed_out\": false, \"error\": null}]}')\n"
    "os.write(4, b'\\x00\\x00\\x00\\x10{\"loaded\": true}')\ndef f(x):\n    return None\n",
    "always-equal object": "class A:\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return A()\n",
    "int subclass equal to everything": "class A(int):\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return A(0)\n",
    "kill the judge": "import os, signal\nfor pid in os.listdir('/proc'):\n    if pid.isdigit():\n        try: os.kill(int(pid), signal.SIGKILL)\n        except OSError: pass\ndef f(x):\n    return None\n",
    "hang in the call": "def f(x):\n    while True:\n        pass\n",
}


@pytest.mark.parametrize("name", list(HARNESS_ATTACKS))
def test_harness_attack_scores_nothing(sb, name):
    tests = [TestCase("t0", "assert f(2) == 4"), TestCase("t1", "assert f(3) == 6")]
    t0 = time.monotonic()
    res = sb.run_tests(HARNESS_ATTACKS[name], tests, "f")
    assert res.n_passed == 0 and not res.passed, res
    assert time.monotonic() - t0 < TIGHT.wall_seconds + 3
    if CAPS.setuid:
        assert sandbox_processes() == []


def test_a_correct_program_still_passes_after_the_attacks(sb):
    res = sb.run_tests("def f(x):\n    return 2 * x\n", [TestCase("t0", "assert f(2) == 4")], "f")
    assert res.passed


def test_pool_runs_concurrently_and_in_order():
    sb = LocalSandbox(Limits(wall_seconds=5))
    codes = [f"import time\ntime.sleep(0.5)\nprint({i})" for i in range(4)]
    with SandboxPool(sb, workers=4) as pool:
        t0 = time.monotonic()
        out = pool.map(lambda s, c: s.run_program(c).stdout.strip(), codes)
        elapsed = time.monotonic() - t0
    assert out == ["0", "1", "2", "3"]
    assert elapsed < 1.6  # four 0.5 s sleeps, concurrently (serially: > 2 s)


def test_a_virtualenv_interpreter_resolves_to_the_real_one(tmp_path):
    """A venv's bin/python is a link; under /tmp the run's private /tmp would hide it."""
    link = tmp_path / "python"
    link.symlink_to(sys.executable)
    if os.path.realpath(sys.executable).startswith("/tmp/"):
        pytest.skip("this interpreter itself lives under /tmp")
    sandbox = LocalSandbox(python=str(link))
    assert sandbox.python == os.path.realpath(sys.executable)
    assert sandbox.run_program("print(6 * 7)").stdout == "42\n"
