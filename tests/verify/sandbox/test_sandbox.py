"""The local sandbox: structured results, limits, isolation, hostile code, the pool."""

from __future__ import annotations

import ast
import json
import os
import socket
import struct
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.verify.sandbox import (
    Limits,
    LocalSandbox,
    SandboxError,
    SandboxPool,
    TestCase,
    harness,
    probe_capabilities,
)
from agentrl.verify.sandbox.harness import codec, roles

CAPS = probe_capabilities()
needs_isolation = pytest.mark.skipif(
    not (CAPS.setuid and CAPS.netns and CAPS.mountns), reason="needs root with namespaces: " + "; ".join(CAPS.reasons)
)
TIGHT = Limits(
    wall_seconds=4,
    per_test_seconds=2,
    cpu_seconds=2,
    memory_mb=256,
    max_processes=6,
    max_file_mb=4,
    disk_mb=8,
    max_output_bytes=20_000,
)


@pytest.fixture(scope="module")
def sb() -> LocalSandbox:
    return LocalSandbox(TIGHT)


_TAKEN: set[int] = set()  # every uid this test process's sandboxes ran as


@pytest.fixture(autouse=True)
def record_uids(monkeypatch):
    """Record the uids our runs take, so the leftover check looks at our processes only: another
    sandbox user on the machine (a second test run, a training job) must not fail these tests."""
    from agentrl.verify.sandbox import uids

    take = uids.fresh_uids.take

    def recording_take():
        uid = take()
        _TAKEN.add(uid)
        return uid

    monkeypatch.setattr(uids.fresh_uids, "take", recording_take)


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
    res = sb.run_tests(
        "def f(x):\n    return x * 2\n", [TestCase("ok", "assert f(2) == 4"), TestCase("bad", "assert f(2) == 5")], "f"
    )
    assert [(t.name, t.passed) for t in res.tests] == [("ok", True), ("bad", False)]
    assert res.tests[1].error == "AssertionError" and not res.passed and res.n_passed == 1


def test_scrubbed_environment_and_fresh_home(sb, monkeypatch):
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "hunter2")
    r = sb.run_program(
        "import os\nprint(sorted(os.environ))\nprint(os.getcwd() == os.environ['HOME'], os.listdir('.'))"
    )
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

    assert codec.decode(
        codec.encode({"a": (1, 2.5, float("inf")), "b": {1, 2}, "c": b"x", "d": [None, True]})
    ) == {"a": (1, 2.5, float("inf")), "b": {1, 2}, "c": b"x", "d": [None, True]}
    assert type(codec.decode(codec.encode(Evil(3)))) is int  # the override does not survive
    with pytest.raises(codec.CodecError):
        codec.encode(object())


def test_the_harness_parts_join_into_one_program():
    """The harness reaches a run as one program, its parts joined in order (harness/__init__.py): a
    name defined in two parts would silently be the later one's, a ``from __future__`` would land
    mid-program, and a program past the kernel's limit on one argument (128 KiB) could not start."""
    defined: dict[str, str] = {}
    for part in harness.PARTS:
        tree = ast.parse((Path(harness.__file__).parent / f"{part}.py").read_text())
        for node in tree.body:
            assert not (isinstance(node, ast.ImportFrom) and node.module == "__future__"), part
            targets = node.targets if isinstance(node, ast.Assign) else []
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.append(node.name)
            for name in names:
                assert name not in defined, f"{name} is defined in {defined[name]} and in {part}"
                defined[name] = part
    assert "serve_main" in defined and "launch" in defined
    assert len(harness.SOURCE.encode()) < 128 * 1024
    compile(harness.SOURCE, "<harness>", "exec")


# -- hostile code: every case contained, within its limit, nothing left running ---------------

HOSTILE_PROGRAMS = {
    "infinite loop": "while True:\n    pass\n",
    "memory bomb": "x = []\nwhile True:\n    x.append(bytearray(50 << 20))\n",
    "gigabytes of output": "import sys\nwhile True:\n    sys.stdout.write('x' * 1_000_000)\n",
    "big file": "with open('big', 'wb') as f:\n    while True:\n        f.write(b'x' * (1 << 20))\n",
    "sleep forever in an escaped child": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(1000)\n"
    "time.sleep(1000)\n",
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
        "import os, time\nn = 0\nfor _ in range(50):\n    try:\n        if os.fork() == 0:\n"
        "            time.sleep(30)\n            os._exit(0)\n"
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
        "import os\n"
        "for p in ['/etc/agentrl-pwned', '/var/tmp/agentrl-pwned', '/dev/shm/agentrl-pwned',\n"
        "          os.path.expanduser('~/ok')]:\n"
        "    try:\n        open(p, 'w').write('x')\n        print('wrote', p)\n    except OSError as e:\n"
        "        print('denied', p)\n"
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
    r = sb.run_program(
        f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\ns.sendall(b'leak')\n"
        f"print('connected')"
    )
    t.join()
    server.close()
    assert "connected" not in r.stdout and got == []
    assert r.isolation.network_isolated


# -- attacks on the harness: the tests never run where the candidate runs -------------------

HARNESS_ATTACKS = {
    "exit 0 before the tests": "import sys\nsys.exit(0)\ndef f(x):\n    return x\n",
    "os._exit(0)": "import os\nos._exit(0)\n",
    "os._exit(0) inside the call": "def f(x):\n    import os\n    os._exit(0)\n",
    "redefine assert helpers": "import builtins\nbuiltins.AssertionError = type('Never', (Exception,), {})\n"
    "def f(x):\n    return None\n",
    "patch the test runner": "import unittest, json\nunittest.TestCase.assertEqual = lambda *a, **k: None\n"
    "json.dumps = lambda *a, **k: '{\"tests\": []}'\ndef f(x):\n    return None\n",
    "fake results file and report": "import os\nopen('results.json', 'w').write('{\"tests\": [{\"passed\": true}]}')\n"
    'print(\'{"load_error": null, "tests": [{"name": "t0", "passed": true, "timed_out": false, "error": null}]}\')\n'
    "os.write(4, b'\\x00\\x00\\x00\\x10{\"loaded\": true}')\ndef f(x):\n    return None\n",
    "always-equal object": "class A:\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return A()\n",
    "int subclass equal to everything": "class A(int):\n    def __eq__(self, o):\n        return True\ndef f(x):\n"
    "    return A(0)\n",
    "kill the judge": "import os, signal\nfor pid in os.listdir('/proc'):\n    if pid.isdigit():\n"
    "        try: os.kill(int(pid), signal.SIGKILL)\n        except OSError: pass\ndef f(x):\n"
    "    return None\n",
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


# -- the protocol: whatever the candidate writes to the pipes is its failure, never the judge's

FRAME_5 = "struct.pack('>I', 1) + b'5'"  # the forged message: a frame holding the JSON `5`


def _to_every_fd(frame: str) -> str:
    """Candidate code writing `frame` to every descriptor it holds: it can always find the reply pipe."""
    return f"for fd in range(3, 64):\n    try:\n        os.write(fd, {frame})\n    except OSError:\n        pass\n"


FORGERIES = {
    "forged frame at load": "import os, struct\n" + _to_every_fd(FRAME_5) + "def f(x):\n    return 2 * x\n",
    "forged frame inside the call": "import os, struct\ndef f(x):\n    "
    + _to_every_fd(FRAME_5).replace("\n", "\n    ")
    + "return 2 * x\n",
    "100,000 nested [": "import os, struct\nm = b'[' * 100_000\n"
    + _to_every_fd("struct.pack('>I', len(m)) + m")
    + "def f(x):\n    return 2 * x\n",
    "a length over the frame limit": "import os\n"
    + _to_every_fd("b'\\xff\\xff\\xff\\xff'")
    + "def f(x):\n    return 2 * x\n",
    "an int of 5,000 digits": "import os, struct\nm = b'{\"id\": 1, \"value\": ' + b'7' * 5000 + b'}'\ndef f(x):\n    "
    + _to_every_fd("struct.pack('>I', len(m)) + m").replace("\n", "\n    ")
    + "return 2 * x\n",
    "a set of lists": "import os, struct, json\nm = json.dumps({'id': 1, 'value': {'$s': [[1]]}}).encode()\n"
    "def f(x):\n    " + _to_every_fd("struct.pack('>I', len(m)) + m").replace("\n", "\n    ") + "os._exit(0)\n",
    "the right answer ahead of time": "import os, struct, json\ndef f(x):\n"
    "    m = json.dumps({'id': 1, 'value': 4}).encode()\n    "
    + _to_every_fd("struct.pack('>I', len(m)) + m").replace("\n", "\n    ")
    + "return 2 * x\n",
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_forged_messages_are_protocol_violations(sb, name):
    res = sb.run_tests(FORGERIES[name], [TestCase("t0", "assert f(2) == 4"), TestCase("t1", "assert f(3) == 6")], "f")
    assert res.protocol_violation, res
    assert res.n_passed == 0 and not res.passed
    if CAPS.setuid:
        assert sandbox_processes() == []


def test_no_descriptor_number_in_argv(sb):
    """The issue's attack read the reply pipe's number from argv; there is none to read now."""
    r = sb.run_program("import sys\nprint(sys.argv)")
    assert r.stdout == "['-']\n"
    literal = (
        "import os, struct, sys\nos.write(int(sys.argv[3]), struct.pack('>I', 1) + b'5')\ndef f(x):\n    return 2 * x\n"
    )
    res = sb.run_tests(literal, [TestCase("t0", "assert f(2) == 4")], "f")
    assert not res.passed and "IndexError" in (res.load_error or "")  # argv has no fourth item: the write never happens
    res = sb.run_tests(
        "import sys\nARGV = sys.argv\ndef f(x):\n    return ARGV\n", [TestCase("t0", "assert f(0) == ['']")], "f"
    )
    assert res.passed  # the worker's argv, as the candidate sees it: nothing


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=5)
    | st.sampled_from(["$t", "$s", "$d", "$b", "$c", "$f", "$fs"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["$t", "$s", "$d", "$b", "$c", "$f", "$fs", "id", "value", "error", "message", "x"]),
            inner,
            max_size=3,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(JSON_VALUES)
def test_any_json_reply_is_a_value_or_a_violation(msg):
    """The judge's view of one frame: a decoded value, the candidate's exception, or a
    ProtocolViolation; never TypeError, KeyError or an unhashable set member escaping."""
    try:
        out = roles._check_reply(msg, 1)
    except codec.ProtocolViolation:
        return
    assert out[0] in ("value", "error")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_on_the_pipe_are_a_frame_a_violation_or_eof(data):
    r, w = os.pipe()
    try:
        os.write(w, struct.pack(">I", len(data)) + data)
        os.close(w)
        w = -1
        try:
            codec.recv(r, time.monotonic() + 1)
        except (codec.ProtocolViolation, EOFError):
            pass
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_decoder_rejects_what_the_encoder_cannot_produce():
    for bad in (
        {"$s": [[1]]},
        {"$d": [[[1], 2]]},
        {"$b": "!!"},
        {"$c": ["a", 1]},
        {"$t": 3},
        {"$d": [[1]]},
        {"a": 1, "b": 2},
        {"$f": "1e9"},
        json.loads("[" * 70 + "1" + "]" * 70),
    ):
        with pytest.raises(codec.CodecError):
            codec.decode(bad)
    for wrong in (
        {"id": 2, "value": 1},
        {"id": True, "value": 1},
        {"id": 1, "value": 1, "x": 0},
        {"id": 1, "error": 3, "message": ""},
        5,
        [1],
    ):
        with pytest.raises(codec.ProtocolViolation):
            roles._check_reply(wrong, 1)
    assert roles._check_reply({"id": 1, "value": {"$t": [1, {"$s": [2]}]}}, 1) == ("value", (1, {2}))
