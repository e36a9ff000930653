"""The sandbox as most people run it: as an ordinary user, not root.

CI runs as root, so these tests drop to a throwaway uid in a subprocess (on a user's machine they
run as that user). That process drives a copy of the sandbox package (`agentrl/verify/sandbox/`
uses the standard library and relative imports only) with an interpreter the throwaway uid can read: root's own may live
under ``/root`` (pyenv), which no other uid can open.

Each hostile candidate is a HumanEval/53-style ``add(x, y)`` that returns ``x + y`` only if its
attack worked (it read a file in the user's home, found a package in site-packages, wrote outside
its folder, reached a loopback listener, ...), so it *scores 1.0 exactly when the sandbox failed*.
Every attack also runs once without the sandbox, as the same uid: there it must score 1.0, which
proves that the attack is real and that the test can fail.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ROOT = os.geteuid() == 0

# Each attack is the body of `attack()`: it returns normally when the attack worked.
ATTACKS = {
    "read_home": "open(S['home_secret']).read()",
    "read_checkout": "open(S['checkout_file']).read()",
    "list_site_packages": "assert any(os.path.exists(p) for p in S['site_entries'])",
    "write_outside": "open(os.path.join(S['write_dir'], S['token']), 'w').write('escaped')",
    "loopback_tcp": "socket.create_connection(('127.0.0.1', S['port']), timeout=2).close()",
    "unix_socket": "u = socket.socket(socket.AF_UNIX); u.settimeout(2); u.connect(S['unix_path']); u.close()",
    "abstract_unix_socket": "u = socket.socket(socket.AF_UNIX); u.settimeout(2); u.connect(S['abstract']); u.close()",
    "nested_user_namespace": "assert ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0",
    "signal_the_driver": "os.kill(S['driver_pid'], 0)",
}

CANDIDATE = """
import ctypes, json, os, socket
S = json.loads({spec!r})
def attack():
{body}
def add(x, y):
    try:
        attack()
    except BaseException:
        return None
    return x + y
"""

# Runs as the throwaway uid: every attack in the sandbox (run_tests, the path the verifiers take)
# and, as the control, in a plain process of the same uid.
DRIVER = r"""
import json, os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
import sandbox as S
spec = json.loads(sys.stdin.read())
spec["driver_pid"] = os.getpid()
t0 = time.monotonic()
sb = S.LocalSandbox(S.Limits(wall_seconds=10, per_test_seconds=4))
out = {"isolation": sb.isolation.summary(), "method": sb.isolation.method, "reasons": list(sb.isolation.reasons),
       "sufficient": sb.isolation.sufficient, "probe_seconds": time.monotonic() - t0, "uid": os.getuid(),
       "sandboxed": {}, "control": {}}
test = [S.TestCase("t0", "assert add(2, 3) == 5")]
for name, body in spec["attacks"].items():
    program = spec["candidate"].format(spec=json.dumps({**spec["secrets"], "driver_pid": os.getpid(),
                                                        "token": name}),
                                       body="    " + body)
    if sb.isolation.sufficient:
        out["sandboxed"][name] = sb.run_tests(program, test, "add").passed
    plain = subprocess.run([sys.executable, "-c", program + "\nassert add(2, 3) == 5\n"], capture_output=True,
                           timeout=30, cwd=spec["secrets"]["write_dir"])
    out["control"][name] = plain.returncode == 0
print(json.dumps(out))
"""


def _interpreters() -> list[str]:
    seen = []
    for p in (os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(p) and os.path.realpath(p) not in seen:
            seen.append(os.path.realpath(p))
    return seen


def _free_uid() -> int:
    while True:
        uid = 300_000 + secrets.randbelow(100_000)
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid


class OrdinaryUser:
    """A uid that is not root (a fresh one when we are root, else ours), a python it can run,
    and folders it owns: a home, a checkout (a copy of the sandbox), a world-writable folder."""

    def __init__(self, base: Path):
        self.uid = _free_uid() if ROOT else os.getuid()
        self.base = base
        os.chmod(base, 0o755)
        self.home = base / "home"
        self.checkout = base / "checkout"
        self.shared = base / "shared"
        for d in (self.home, self.checkout, self.shared):
            d.mkdir()
        os.chmod(self.shared, 0o1777)
        shutil.copytree(REPO / "agentrl" / "verify" / "sandbox", self.checkout / "sandbox",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for p in [self.checkout, *self.checkout.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        (self.home / "secret.txt").write_text("the user's own files\n")
        if ROOT:
            os.chown(self.home, self.uid, self.uid)
            os.chown(self.home / "secret.txt", self.uid, self.uid)
        self.python = next((p for p in _interpreters() if self._can_run(p)), None)

    def _can_run(self, python: str) -> bool:
        try:
            r = self.run([python, "-S", "-c", "import json, ctypes, socket, subprocess"], timeout=60)
        except PermissionError:  # e.g. under /root, which only root may enter
            return False
        return r.returncode == 0

    def run(self, argv: list[str], stdin: str = "", timeout: float = 300) -> subprocess.CompletedProcess[str]:
        kw = {"user": self.uid, "group": self.uid, "extra_groups": []} if ROOT else {}
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.home), "LANG": "C.UTF-8"}
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=str(self.shared), **kw)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    # not under /tmp: each sandbox run replaces /tmp, so nothing there would be a fair secret
    base = Path("/var/tmp") if os.access("/var/tmp", os.W_OK) else None
    if base is None:
        pytest.skip("needs a writable /var/tmp for folders outside the run's private /tmp")
    folder = base / f"agentrl-unprivileged-{secrets.token_hex(4)}"
    folder.mkdir()
    try:
        u = OrdinaryUser(folder)
        if u.python is None:
            pytest.skip(f"no interpreter among {_interpreters()} can be run by uid {u.uid}")
        yield u
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _site_entries(python: str) -> list[str]:
    """One entry of every non-empty site-packages of `python` (what a candidate would look for)."""
    code = "import site, sysconfig, json\nprint(json.dumps([*site.getsitepackages(), sysconfig.get_path('purelib')]))"
    dirs = json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)
    entries = []
    for d in dict.fromkeys(dirs):
        if os.path.isdir(d):
            names = sorted(n for n in os.listdir(d) if not n.startswith("."))
            if names:
                entries.append(os.path.join(d, names[0]))
    return entries


@pytest.fixture(scope="module")
def attacked(user):
    """Run every attack as the ordinary user, in the sandbox and without it, with listeners up."""
    tcp = socket.create_server(("127.0.0.1", 0))
    tcp.settimeout(0.5)
    unix_path = str(user.shared / "listener.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(unix_path)
    os.chmod(unix_path, 0o777)
    unix.listen(16)
    unix.settimeout(0.5)
    abstract = "\0agentrl-test-" + secrets.token_hex(6)
    abs_sock = socket.socket(socket.AF_UNIX)
    abs_sock.bind(abstract)
    abs_sock.listen(16)
    abs_sock.settimeout(0.5)
    spec = {
        "attacks": ATTACKS,
        "candidate": CANDIDATE,
        "secrets": {
            "home_secret": str(user.home / "secret.txt"),
            "checkout_file": str(user.checkout / "sandbox" / "__init__.py"),
            "site_entries": _site_entries(user.python),
            "write_dir": str(user.shared),
            "port": tcp.getsockname()[1],
            "unix_path": unix_path,
            "abstract": abstract,
        },
    }
    driver = user.checkout / "driver.py"
    driver.write_text(DRIVER)
    os.chmod(driver, 0o644)
    try:
        r = user.run([user.python, "-S", str(driver), str(user.checkout)], stdin=json.dumps(spec))
        assert r.returncode == 0, r.stderr[-3000:]
        out = json.loads(r.stdout.splitlines()[-1])

        def accepted(sock: socket.socket) -> int:
            n = 0
            while True:
                try:
                    conn, _ = sock.accept()
                except (TimeoutError, BlockingIOError):
                    return n
                conn.close()
                n += 1

        # the controls connected once each; anything more came from a sandboxed run
        out["accepted"] = {"tcp": accepted(tcp), "unix": accepted(unix), "abstract": accepted(abs_sock)}
        out["written"] = sorted(p.name for p in user.shared.iterdir() if p.is_file())
        return out
    finally:
        for s in (tcp, unix, abs_sock):
            s.close()


def test_every_attack_works_without_the_sandbox(attacked):
    """The control: as the same ordinary uid, with no sandbox, each attack scores 1.0."""
    failed = {k: v for k, v in attacked["control"].items() if not v}
    if "nested_user_namespace" in failed and not attacked["sufficient"]:
        failed.pop("nested_user_namespace")  # no user namespaces on this machine at all
    assert failed == {}, attacked


def test_an_ordinary_user_is_isolated(attacked):
    """As a non-root uid the sandbox isolates through a user namespace, and every attack scores 0:
    no home, checkout or site-packages in view, no writes outside, no loopback, no Unix sockets of
    the host (file or abstract), no nested user namespace, no process of the user's in reach."""
    if not attacked["sufficient"]:
        pytest.skip("this machine gives ordinary users no user namespaces: " + "; ".join(attacked["reasons"]))
    assert attacked["method"] == "user-namespace", attacked
    assert attacked["sandboxed"] == {name: False for name in ATTACKS}, attacked
    # what the listeners and the file system saw: exactly the controls' visits, no more
    assert attacked["accepted"] == {"tcp": 1, "unix": 1, "abstract": 1}, attacked
    assert attacked["written"] == ["write_outside"], attacked  # the control's file only (its name is the token)


def test_isolation_is_said_and_probed_fast(attacked):
    assert attacked["isolation"].startswith("sandbox isolation: "), attacked
    assert attacked["probe_seconds"] < 1.0, attacked


# Makes user namespaces unavailable to this process and what it runs, then execs argv: what an
# ordinary user meets on a kernel that refuses them (a limit of 0 in a namespace of our own,
# with every capability dropped, so that not even this process's "root" can set up anything).
NO_USERNS = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.getuid(), os.getgid()
if libc.unshare(0x10000000) != 0:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])  # none here to begin with
for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
    open(f"/proc/self/{name}", "w").write(text)
open("/proc/sys/user/max_user_namespaces", "w").write("0")
cap = 0
while libc.prctl(24, ctypes.c_ulong(cap), 0, 0, 0) == 0:
    cap += 1
class H(ctypes.Structure):
    _fields_ = [("v", ctypes.c_uint32), ("pid", ctypes.c_int)]
class D(ctypes.Structure):
    _fields_ = [("e", ctypes.c_uint32), ("p", ctypes.c_uint32), ("i", ctypes.c_uint32)]
assert libc.capset(ctypes.byref(H(0x20080522, 0)), (D * 2)()) == 0
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""

REFUSE = r"""
import json, time
t0 = time.monotonic()
from agentrl.verify.sandbox import SandboxError, probe_capabilities
caps = probe_capabilities()
try:
    from agentrl.envs.code import CodeEnv
    t1 = time.monotonic()
    CodeEnv()
    print(json.dumps({"method": caps.method, "refused": None}))
except SandboxError as e:
    print(json.dumps({"method": caps.method, "refused": str(e), "seconds": time.monotonic() - t1}))
"""


def _without_user_namespaces(code: str, extra_env: dict[str, str] | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "AGENTRL_UNSAFE_UNISOLATED_SANDBOX"} | (extra_env or {})
    r = subprocess.run([sys.executable, "-c", NO_USERNS, "-c", code], capture_output=True, text=True, timeout=300,
                       env=env, cwd=str(REPO))
    assert r.returncode == 0, r.stderr[-3000:]
    return {**json.loads(r.stdout.splitlines()[-1]), "stderr": r.stderr}


def test_code_env_refuses_without_isolation_and_says_what_to_do():
    got = _without_user_namespaces(REFUSE)
    assert got["method"] == "none", got
    msg = got["refused"]
    assert msg, got
    assert "user namespaces" in msg and "AGENTRL_UNSAFE_UNISOLATED_SANDBOX=1" in msg and "E2B" in msg, msg
    assert got["seconds"] < 1.0, got


def test_the_unsafe_opt_out_is_explicit_and_loud():
    got = _without_user_namespaces(REFUSE, {"AGENTRL_UNSAFE_UNISOLATED_SANDBOX": "1"})
    assert got["method"] == "none" and got["refused"] is None, got
    assert "WITHOUT isolation" in got["stderr"], got["stderr"][-2000:]


def test_nested_user_namespaces_are_refused_as_root_too():
    """The root path (namespaces + a fresh uid) also leaves the candidate no user namespace."""
    from agentrl.verify.sandbox import LocalSandbox, probe_capabilities

    if probe_capabilities().method != "root":
        pytest.skip("needs root with the host's namespaces")
    r = LocalSandbox().run_program(
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.unshare(0x10000000), open('/proc/self/status').read().split('CapEff:')[1].split()[0])"
    )
    assert r.stdout.split() == ["-1", "0000000000000000"], (r.stdout, r.stderr)
