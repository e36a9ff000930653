"""What runs inside a sandboxed process: the *launcher*, then the *worker* (untrusted code) or the
*judge* (trusted tests). This file is executed as ``python -S -s -P -c <this source> launch <cfg>``;
it imports nothing from agentrl, and nothing in it is imported by the judge's callers except the
codec (for tests).

**The launcher** (`launch`) is the first thing the fresh process does, single-threaded: join the
run's memory cgroup, unshare namespaces (owned by a user namespace of its own when not root), fork
pid 1 of a new PID namespace, build the minimal file view with its /proc and pivot into it, set
rlimits, drop to the run's uid (root) or drop every capability (user namespace), forbid nested user
namespaces, set ``no_new_privs``, close the status pipe, and only then become its role (or
``exec`` the interpreter for `run_program`). Doing this here rather
than in a ``preexec_fn`` matters because the sandbox is called from a thread pool: CPython
documents ``preexec_fn`` as unsafe with threads (the forked child inherits locks other threads
held), and it rules out ``vfork``, so every run copied the page tables of a large parent. The
parent now only ``vfork``s and ``exec``s. (Bubblewrap would also work, but it cannot switch to a
fresh host uid, join a cgroup or set rlimits without such a wrapper anyway, and it is one more
package that CI and every user would need; this is ~200 lines of syscalls we can test.)

**The fork server** (`serve_main`) is this same launcher started once and kept warm: per request it
forks, and the child, after closing everything but the run's descriptors, returns to the bottom
of this file and calls `launch` exactly as a fresh launcher does (same frames, same interpreter
exit). See the sandbox's module docstring for why that child inherits nothing that matters.

**Why two processes** (worker and judge): if the tests ran in the same interpreter as the
candidate, the candidate could patch ``assert`` helpers, exit with status 0 before the tests run,
print a fake report or find any secret the harness holds in memory. Here the test code never runs
where the candidate runs. The judge calls the candidate's functions through a pipe
(``candidate(1, 2)`` becomes a request to the worker) and receives only *plain data* back (ints,
floats, strings, lists, tuples, dicts, sets, bytes, None), decoded from tagged JSON, so an object
whose ``__eq__`` always says True cannot cross. The judge runs as a different unprivileged user,
so the worker cannot signal, trace or read it.

**The candidate owns its end of the pipes.** It shares the worker's process, so it can always find
and write to the reply pipe (fd 4), whatever number it has. So the judge trusts nothing it
reads: every frame is bounded in size, parsed with the parser's recursion caught, checked for
shape, types and the sequence number of the request it answers, and decoded with nesting capped.
Anything else is a *protocol violation*: the judge stops calling the candidate and reports it,
and the run scores 0. It never crashes the judge.

Frames on the pipes: 4-byte big-endian length, then UTF-8 JSON. Requests ``{"id", "fn", "args",
"kwargs"}``; replies ``{"id", "value"}`` or ``{"id", "error", "message"}``; the worker's first
frame is ``{"id": 0, "loaded": true}`` or ``{"id": 0, "load_error": str}``.
"""

import base64
import binascii
import json
import math
import os
import select
import struct
import sys
import time

MAX_FRAME = 8 * 1024 * 1024  # a larger reply is a protocol violation, not a crash
MAX_DEPTH = 64
# In the worker and in the judge alike, fd 3 is that process's end of the request pipe and fd 4 its
# end of the reply pipe: fixed numbers, so that no descriptor number travels in argv
FD_REQUESTS, FD_REPLIES = 3, 4


class CodecError(ValueError):
    pass


class ProtocolViolation(Exception):
    """The candidate's end of the pipe sent something that is not a valid message."""


# -- codec: plain data only ------------------------------------------------------------------


def encode(obj, depth=0):
    """Plain data -> JSON-able value. Subclasses are converted to their exact base type with the
    base type's own methods, so an overridden ``__eq__``/``__str__`` cannot travel."""
    if depth > MAX_DEPTH:
        raise CodecError("value nested too deeply")
    if obj is None or obj is True or obj is False:
        return obj
    if isinstance(obj, bool):
        return bool(int.__int__(obj))
    if isinstance(obj, int):
        return int.__int__(obj)
    if isinstance(obj, float):
        x = float.__float__(obj)
        if math.isfinite(x):
            return x
        return {"$f": repr(x)}
    if isinstance(obj, str):
        return str.__getitem__(obj, slice(None))
    if isinstance(obj, (bytes, bytearray)):
        return {"$b": base64.b64encode(bytes(obj)).decode()}
    if isinstance(obj, complex):
        return {"$c": [complex.__getattribute__(obj, "real"), complex.__getattribute__(obj, "imag")]}
    if isinstance(obj, list):
        return [encode(x, depth + 1) for x in list.__iter__(obj)]
    if isinstance(obj, tuple):
        return {"$t": [encode(x, depth + 1) for x in tuple.__iter__(obj)]}
    if isinstance(obj, frozenset):
        return {"$fs": [encode(x, depth + 1) for x in frozenset.__iter__(obj)]}
    if isinstance(obj, set):
        return {"$s": [encode(x, depth + 1) for x in set.__iter__(obj)]}
    if isinstance(obj, dict):
        return {
            "$d": [
                [encode(k, depth + 1), encode(dict.__getitem__(obj, k), depth + 1)] for k in list(dict.__iter__(obj))
            ]
        }
    # numpy scalars and the like: accept only through the number protocols of exact types
    for base, conv in ((int, "__index__"), (float, "__float__")):
        if hasattr(type(obj), conv) and type(obj).__module__ == "numpy":
            return encode(base(getattr(obj, conv)()), depth)
    raise CodecError(f"cannot transfer a value of type {type(obj).__name__} (only plain data crosses the sandbox)")


def decode(val):
    """Tagged JSON -> plain data. Anything that `encode` cannot have produced is a `CodecError`
    (never a TypeError, a RecursionError or an unhashable set member escaping)."""
    try:
        return _decode(val, 0)
    except CodecError:
        raise
    except (TypeError, ValueError, binascii.Error, RecursionError, MemoryError, OverflowError) as e:
        raise CodecError(f"malformed value ({type(e).__name__})") from None


def _number(x):
    if type(x) not in (int, float):
        raise CodecError("malformed complex number")
    return float(x)


def _items(v, depth):
    if type(v) is not list:
        raise CodecError("malformed container")
    return [_decode(x, depth + 1) for x in v]


def _decode(val, depth):
    if depth > MAX_DEPTH:
        raise CodecError("value nested too deeply")
    if val is None or type(val) in (bool, int, float, str):
        return val
    if type(val) is list:
        return _items(val, depth)
    if type(val) is dict and len(val) == 1:
        ((tag, v),) = val.items()
        if tag == "$f" and v in ("inf", "-inf", "nan"):
            return float(v)
        if tag == "$b" and type(v) is str:
            return base64.b64decode(v, validate=True)
        if tag == "$c" and type(v) is list and len(v) == 2:
            return complex(_number(v[0]), _number(v[1]))
        if tag == "$t":
            return tuple(_items(v, depth))
        if tag == "$s":
            return set(_items(v, depth))
        if tag == "$fs":
            return frozenset(_items(v, depth))
        if tag == "$d" and type(v) is list:
            out = {}
            for pair in v:
                if type(pair) is not list or len(pair) != 2:
                    raise CodecError("malformed dict item")
                out[_decode(pair[0], depth + 1)] = _decode(pair[1], depth + 1)
            return out
    raise CodecError("malformed value")


def send(fd, obj):
    data = json.dumps(obj, allow_nan=False).encode()
    if len(data) > MAX_FRAME:
        raise CodecError(f"message of {len(data)} bytes exceeds {MAX_FRAME}")
    buf = struct.pack(">I", len(data)) + data
    while buf:
        n = os.write(fd, buf)
        buf = buf[n:]


def _read_exact(fd, n, deadline):
    chunks = []
    while n > 0:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv(fd, deadline=None):
    """One frame, parsed. Bytes that are not a bounded, well-formed JSON frame are a
    `ProtocolViolation` (the parser's RecursionError on ``[[[[...`` included)."""
    (n,) = struct.unpack(">I", _read_exact(fd, 4, deadline))
    if n > MAX_FRAME:
        raise ProtocolViolation(f"a message of {n} bytes (the limit is {MAX_FRAME})")
    data = _read_exact(fd, n, deadline)
    try:
        return json.loads(data)
    except (ValueError, RecursionError, MemoryError) as e:  # ValueError: bad UTF-8/JSON, a 5,000-digit int
        raise ProtocolViolation(f"a message that is not valid JSON ({type(e).__name__})") from None


# -- the worker: runs untrusted code, answers calls ------------------------------------------


def worker_main(fd_in=FD_REQUESTS, fd_out=FD_REPLIES):
    code = sys.stdin.read()
    sys.stdin.close()
    ns = {"__name__": "__candidate__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "<candidate>", "exec"), ns)
    except BaseException as e:  # SystemExit and KeyboardInterrupt included: the program did not load
        send(fd_out, {"id": 0, "load_error": f"{type(e).__name__}: {e}"[:500]})
        return
    send(fd_out, {"id": 0, "loaded": True})
    while True:
        try:
            req = recv(fd_in)
        except EOFError:
            return
        try:
            fn = ns[req["fn"]]
            out = fn(*decode(req["args"]), **decode(req["kwargs"]))
            reply = {"id": req["id"], "value": encode(out)}
        except BaseException as e:
            reply = {"id": req["id"], "error": type(e).__name__, "message": str(e)[:300]}
        try:
            send(fd_out, reply)
        except (CodecError, ValueError) as e:  # e.g. an int too large to print
            send(fd_out, {"id": req["id"], "error": "CodecError", "message": str(e)[:300]})


# -- the judge: runs trusted tests, calls the worker -----------------------------------------


class CandidateTimeout(Exception):
    pass


class CandidateGone(Exception):
    pass


def _raised_in_candidate(name, message):
    """The exception a candidate's call raised, rebuilt in the judge: a builtin class by name when
    one exists and takes a message, else RuntimeError (the name is candidate data)."""
    import builtins

    exc = getattr(builtins, name, None) if name.isidentifier() else None
    if not (isinstance(exc, type) and issubclass(exc, Exception)):
        exc = RuntimeError
    try:
        return exc(f"{name}: {message}")
    except Exception:  # UnicodeDecodeError and friends need five arguments
        return RuntimeError(f"{name}: {message}")


def _check_hello(msg):
    """The worker's first frame: None when loaded, else the load error."""
    if type(msg) is dict and msg.get("id") == 0 and type(msg.get("id")) is int:
        if msg.keys() == {"id", "loaded"} and msg["loaded"] is True:
            return None
        if msg.keys() == {"id", "load_error"} and type(msg["load_error"]) is str:
            return msg["load_error"][:500]
    raise ProtocolViolation("an unexpected message while the program loaded")


def _check_reply(msg, want):
    """A reply to request `want`: ("value", plain data) or ("error", name, message)."""
    if not (type(msg) is dict and type(msg.get("id")) is int and msg["id"] == want):
        raise ProtocolViolation(f"a message that is not the reply to call {want}")
    if msg.keys() == {"id", "value"}:
        try:
            return ("value", decode(msg["value"]))
        except CodecError as e:
            raise ProtocolViolation(f"a reply whose value is malformed: {e}") from None
    if msg.keys() == {"id", "error", "message"} and type(msg["error"]) is str and type(msg["message"]) is str:
        return ("error", msg["error"][:100], msg["message"][:300])
    raise ProtocolViolation(f"a reply to call {want} of the wrong shape")


def _unread(fd):
    """Whether the candidate wrote to the reply pipe out of turn (EOF is not a write)."""
    try:
        if not select.select([fd], [], [], 0)[0]:
            return False
        return bool(os.read(fd, 1))
    except OSError:
        return False


def judge_main(fd_req=FD_REQUESTS, fd_rep=FD_REPLIES):
    payload = json.loads(sys.stdin.read())
    per_test = float(payload["per_test_seconds"])
    results = []
    state = {"deadline": None, "dead": None, "violation": None, "id": 0}

    def violated(why):
        state["violation"] = why
        state["dead"] = "protocol violation"
        return CandidateGone("protocol violation: the candidate wrote " + why)

    def call(name):
        def proxy(*args, **kwargs):
            if state["dead"]:
                raise CandidateGone(state["dead"])
            if _unread(fd_rep):
                raise violated("to the reply pipe between calls")
            state["id"] += 1
            try:
                send(fd_req, {"id": state["id"], "fn": name, "args": encode(list(args)), "kwargs": encode(kwargs)})
                reply = _check_reply(recv(fd_rep, state["deadline"]), state["id"])
            except TimeoutError:
                state["dead"] = "the candidate timed out earlier"
                raise CandidateTimeout(f"no answer within {per_test:g}s") from None
            except (EOFError, BrokenPipeError, OSError):
                state["dead"] = "the candidate process exited"
                raise CandidateGone("the candidate process exited") from None
            except ProtocolViolation as e:
                raise violated(str(e)) from None
            if reply[0] == "error":
                raise _raised_in_candidate(reply[1], reply[2])
            return reply[1]

        proxy.__name__ = name
        return proxy

    # Wait for the worker to load the program
    load_error = None
    try:
        load_error = _check_hello(recv(fd_rep, time.monotonic() + float(payload["load_seconds"])))
    except TimeoutError:
        load_error = f"the program did not finish loading within {payload['load_seconds']}s"
    except (EOFError, OSError):
        load_error = "the candidate process exited while loading the program"
    except ProtocolViolation as e:
        violated(str(e))
        load_error = "protocol violation"

    ns = {"__name__": "__judge__"}
    if load_error is None:
        exec(compile(payload["preamble"], "<task>", "exec"), ns)  # trusted task code (helpers)
        proxy = call(payload["entry_point"])
        ns[payload["entry_point"]] = proxy
        ns["candidate"] = proxy
    for test in payload["tests"]:
        if load_error is not None:
            results.append(
                {"name": test["name"], "passed": False, "timed_out": False, "error": "not run: " + load_error}
            )
            continue
        state["deadline"] = time.monotonic() + per_test
        try:
            exec(compile(test["code"], f"<test {test['name']}>", "exec"), ns)
            results.append({"name": test["name"], "passed": True, "timed_out": False, "error": None})
        except CandidateTimeout as e:
            results.append({"name": test["name"], "passed": False, "timed_out": True, "error": f"timeout: {e}"})
        except CandidateGone as e:
            results.append({"name": test["name"], "passed": False, "timed_out": False, "error": f"not run: {e}"})
        except BaseException as e:
            msg = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            results.append({"name": test["name"], "passed": False, "timed_out": False, "error": msg[:300]})
    if state["violation"] is None and load_error is None and _unread(fd_rep):
        violated("to the reply pipe after the last call")
    out = json.dumps({"load_error": load_error, "tests": results, "protocol_violation": state["violation"]})
    sys.stdout.write(out)
    sys.stdout.flush()


# -- the launcher ----------------------------------------------------------------------------

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 0x1000, 0x4000, 1 << 18
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME = 1024, 2048, 1 << 21
_MNT_DETACH = 2
_CLONE_NEWNS, _CLONE_NEWPID, _CLONE_NEWNET, _CLONE_NEWUSER = 0x00020000, 0x20000000, 0x40000000, 0x10000000
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
_MAX_USERNS = "/proc/sys/user/max_user_namespaces"
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}


class _Sys:
    """The few syscalls os does not offer (unshare only arrives in 3.12)."""

    def __init__(self):
        import ctypes

        self.ctypes = ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)  # the interpreter's own libc: no ctypes.util lookup
        self.libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]

    def check(self, ret, what):
        if ret != 0:
            e = self.ctypes.get_errno()
            raise OSError(e, f"{what}: {os.strerror(e)}")

    def unshare(self, flags):
        self.check(self.libc.unshare(flags), f"unshare({flags:#x})")

    def mount(self, src, dst, fstype, flags, opts=None):
        def enc(s):
            return None if s is None else s.encode()

        self.check(self.libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(opts)), f"mount {dst}")

    def pivot_root(self, new, old):
        nr = _SYS_PIVOT_ROOT.get(os.uname().machine)
        if nr is None:
            raise OSError(0, f"pivot_root: unknown syscall number on {os.uname().machine}")
        self.check(self.libc.syscall(nr, new.encode(), old.encode()), "pivot_root")

    def umount2(self, path, flags):
        self.check(self.libc.umount2(path.encode(), flags), f"umount {path}")

    def prctl(self, option, arg):
        ct = self.ctypes
        zero = ct.c_ulong(0)
        self.check(self.libc.prctl(option, ct.c_ulong(arg), zero, zero, zero), f"prctl({option})")

    def drop_capabilities(self):
        """Empty the bounding set, then the effective, permitted and inheritable sets: what a user
        namespace gave us for the set-up is gone before the role starts, and no exec brings it
        back (``no_new_privs`` is set after)."""
        ct = self.ctypes
        cap = 0
        while self.libc.prctl(_PR_CAPBSET_DROP, ct.c_ulong(cap), ct.c_ulong(0), ct.c_ulong(0), ct.c_ulong(0)) == 0:
            cap += 1  # EINVAL past the last capability this kernel knows
        if cap == 0:
            self.check(-1, "prctl(PR_CAPBSET_DROP)")

        class Header(ct.Structure):
            _fields_ = [("version", ct.c_uint32), ("pid", ct.c_int)]

        class Data(ct.Structure):
            _fields_ = [("effective", ct.c_uint32), ("permitted", ct.c_uint32), ("inheritable", ct.c_uint32)]

        data = (Data * 2)()  # all zero
        self.check(self.libc.capset(ct.byref(Header(0x20080522, 0)), data), "capset")  # _LINUX_CAPABILITY_VERSION_3


def _enter_user_namespace(sysc, flags, uid, gid):
    """unshare(CLONE_NEWUSER | flags) and map our own uid and gid to themselves: an ordinary user
    becomes the owner of fresh namespaces, with the capabilities to build the file view in them and
    none over anything of the host's."""
    sysc.unshare(_CLONE_NEWUSER | flags)
    _write_id_maps(uid, gid)


def _write_id_maps(uid, gid):
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        try:
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        except OSError as e:
            raise OSError(e.errno, f"writing {text!r} to /proc/self/{name}: {e.strerror}") from None


def _no_nested_user_namespaces(sysc, inside):
    """Make sure the role cannot create a user namespace of its own (a gate to kernel code that
    otherwise needs root). Limits on user namespaces are per namespace and checked up the chain,
    so we stand in a user namespace of ours (`inside`, or a fresh one now) and set its
    ``max_user_namespaces`` to 0. Where we cannot make one at all, the kernel refuses ordinary
    users user namespaces, and the role cannot make one either."""
    if not inside:
        uid, gid = os.getuid(), os.getgid()  # before: unmapped ids read as the overflow id after
        try:
            sysc.unshare(_CLONE_NEWUSER)
        except OSError:
            return False
        # after setuid the kernel made us undumpable, which gives /proc/self/* to root: take it back
        sysc.prctl(_PR_SET_DUMPABLE, 1)
        _write_id_maps(uid, gid)
    with open(_MAX_USERNS, "w") as f:
        f.write("0")
    return True


def _kept_flags(path):
    """The mount flags of the mount holding `path` that a read-only bind of it must keep: inside a
    user namespace the kernel locks them (a remount that would drop ``noexec`` or change the atime
    mode fails), and outside one keeping them is right anyway."""
    f = os.statvfs(path).f_flag
    out = 0
    for st, ms in (("ST_NOEXEC", _MS_NOEXEC), ("ST_NOATIME", _MS_NOATIME), ("ST_NODIRATIME", _MS_NODIRATIME),
                   ("ST_RELATIME", _MS_RELATIME)):
        if f & getattr(os, st, 0):
            out |= ms
    return out


def _under_tmp(path):
    return path == "/tmp" or path.startswith("/tmp/")


def _build_view(sysc, cfg):
    """Mount the run's whole file system: a read-only tmpfs root holding only what the plan
    names (the interpreter, its standard library and shared libraries, a few devices), an empty
    cover over every site-packages inside them, a private /tmp, its own /proc (pid 1 of a fresh
    PID namespace mounts it here, while the host's /proc is still in sight: a user namespace may
    mount a proc only then), then pivot into it. What the plan binds under /tmp (a virtualenv
    there, an exposed package) is bound on top of the private /tmp, read-only like the rest."""
    root = cfg["root"]
    sysc.mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing we mount reaches the host
    sysc.mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    covers = []

    def apply(op):
        kind, path = op[0], op[1]
        at = root + path
        if kind == "bind":  # ("bind", path, is_dir): read-only, nosuid, nodev
            os.makedirs(os.path.dirname(at), 0o755, exist_ok=True)
            if op[2]:
                os.makedirs(at, 0o755, exist_ok=True)
            else:
                os.close(os.open(at, os.O_WRONLY | os.O_CREAT, 0o644))
            kept = _kept_flags(path)
            sysc.mount(path, at, None, _MS_BIND)
            sysc.mount(None, at, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | kept)
        elif kind == "dev":  # a character device: read-write, nosuid, noexec
            os.makedirs(os.path.dirname(at), 0o755, exist_ok=True)
            os.close(os.open(at, os.O_WRONLY | os.O_CREAT, 0o644))
            kept = _kept_flags(path)
            sysc.mount(path, at, None, _MS_BIND)
            sysc.mount(None, at, None, _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NOEXEC | kept)
        elif kind == "cover":  # an empty directory over what the path held (read-only once built)
            sysc.mount("tmpfs", at, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "size=64k,mode=0755")
            covers.append(at)
        elif kind == "link":  # ("link", path, target): the host's symlink, so that paths resolve the same
            os.makedirs(os.path.dirname(at), 0o755, exist_ok=True)
            os.symlink(op[2], at)
        else:
            raise ValueError(f"unknown view step {kind!r}")

    for op in cfg["view"]:
        if not _under_tmp(op[1]):
            apply(op)
    os.makedirs(root + "/tmp", 0o755, exist_ok=True)
    os.makedirs(root + "/proc", 0o555, exist_ok=True)
    sysc.mount("tmpfs", root + "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, cfg["tmp"])
    for op in cfg["view"]:
        if _under_tmp(op[1]):
            apply(op)
    if cfg["proc"]:
        sysc.mount("proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    for at in covers:
        sysc.mount(None, at, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    sysc.mount(None, root, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    # pivot_root(".", ".") stacks the old root under the new one; detaching it leaves no path back
    os.chdir(root)
    sysc.pivot_root(".", ".")
    sysc.umount2(".", _MNT_DETACH)
    os.chdir("/")


def _monitor(child):
    """The launcher's half outside the PID namespace: wait for pid 1, exit the way it did; on
    SIGTERM (the sandbox ending the run) kill it first. Never returns."""
    import signal

    try:
        os.closerange(3, 1 << 16)  # the pipes included: the judge must see EOF when pid 1 dies
        signal.signal(signal.SIGTERM, lambda *_: os.kill(child, signal.SIGKILL))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # blocked across the fork: see launch
        while True:
            try:
                _, status = os.waitpid(child, 0)
                break
            except InterruptedError:
                continue
        code = os.waitstatus_to_exitcode(status)
        if code < 0:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(code if code >= 0 else 128 - code)
    finally:
        os._exit(1)


def launch(cfg):
    """Set this fresh process up as `cfg` says, then become ``cfg["role"]``. A failure before the
    role starts is written to the status pipe (which the candidate never sees) and exits 121.

    Two ways in. As root: unshare the namespaces, build the view, drop to the run's fresh uid. As
    an ordinary user (``cfg["userns"]`` = our uid and gid): the same namespaces owned by a fresh
    user namespace of ours, whose capabilities build the view and are then dropped. Either way
    an untrusted role ends with no capabilities, ``no_new_privs``, and no way to make a user
    namespace of its own."""
    import fcntl
    import resource
    import signal

    def lift(fd):  # above 10, so that moving the pipes to 3 and 4 cannot overwrite one of them
        new = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
        os.close(fd)
        return new

    status = lift(cfg["status_fd"])
    step = "start"
    try:
        # until the monitor knows its child, SIGTERM from the sandbox must simply end us
        signal.signal(signal.SIGTERM, lambda *_: os._exit(121))
        pipes = [lift(fd) for fd in cfg["fds"]]
        if cfg["cgroup"]:
            step = "join the run's memory cgroup"
            with open(cfg["cgroup"], "w") as f:
                f.write(str(os.getpid()))
        userns = bool(cfg["userns"])
        sysc = _Sys() if (cfg["unshare"] or cfg["root"] or userns or cfg["nested"]) else None
        if userns:
            step = "enter a user namespace"
            _enter_user_namespace(sysc, cfg["unshare"], *cfg["userns"])
        elif cfg["unshare"]:
            step = "unshare namespaces"
            sysc.unshare(cfg["unshare"])
        if cfg["unshare"] & _CLONE_NEWPID:
            # The process the sandbox started stays outside as a small monitor; its child is pid 1
            # of the fresh PID namespace and runs the role. When pid 1 dies the kernel kills and
            # reaps everything else in the namespace: no orphan or zombie outlives the run.
            step = "fork pid 1"
            # SIGTERM stays blocked until the monitor's handler (which kills pid 1) is in place: one
            # arriving in between would otherwise end the monitor and leave pid 1 running
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            child = os.fork()
            if child:
                _monitor(child)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        if cfg["root"]:
            step = "build the file view"
            _build_view(sysc, cfg)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if pipes:
            os.dup2(pipes[0], FD_REQUESTS)
            os.dup2(pipes[1], FD_REPLIES)
            for fd in pipes:
                os.close(fd)
        step = "set limits"
        for res, soft, hard in cfg["rlimits"]:
            resource.setrlimit(res, (soft, hard))
        if cfg["uid"] >= 0:
            step = "switch user"
            os.setgroups([])
            os.setgid(cfg["uid"])
            os.setuid(cfg["uid"])
            if os.getuid() != cfg["uid"] or os.geteuid() != cfg["uid"]:
                raise OSError(0, "the uid did not change")
        in_userns = userns
        if cfg["nested"]:
            step = "forbid nested user namespaces"
            in_userns = _no_nested_user_namespaces(sysc, userns) or in_userns
        if in_userns:
            step = "drop capabilities"
            sysc.drop_capabilities()
        if sysc is not None:
            step = "set no_new_privs"
            sysc.prctl(_PR_SET_NO_NEW_PRIVS, 1)
        step = "enter home"
        os.chdir(cfg["home"])
        os.umask(0o077)
    except BaseException as e:
        _report(status, f"{step}: {type(e).__name__}: {e}")
        os._exit(121)
    sys.argv[:] = [""]
    role = cfg["role"]
    if role == "program":
        os.set_inheritable(status, False)  # closed by a successful exec: EOF means started
        try:
            os.execv(cfg["python"], [cfg["python"], "-s", "-P", "-"])
        except OSError as e:
            _report(status, f"exec {cfg['python']}: {e}")
            os._exit(121)
    os.write(status, b"ok")
    os.close(status)
    if role in ("worker", "judge"):
        import site  # the normal start-up, deferred to now: in the view every site-packages is empty

        site.main()
        worker_main() if role == "worker" else judge_main()
    else:
        _report(2, f"unknown role {role!r}")
        os._exit(2)


# -- the fork server -------------------------------------------------------------------------


class _Child:
    """A launcher the fork server forked, until the sandbox has released it and it is reaped."""

    def __init__(self, pid, pidfd, report, monitored):
        self.pid, self.pidfd, self.report, self.monitored = pid, pidfd, report, monitored
        self.exited = self.released = False
        self.kill_at = None  # when a launcher asked to stop is killed outright

    def stop(self):
        """What the sandbox does to end a run: SIGTERM to a monitor (which kills its pid 1 first),
        SIGKILL to any other launcher's process group. Safe by pid: we have not reaped it."""
        import signal

        try:
            if self.monitored:
                os.kill(self.pid, signal.SIGTERM)
            else:
                os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self):
        import signal

        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def serve_main(ctl_fd):
    """The fork server: a warm interpreter that forks a launcher per request. Returns only in a
    forked child, with that run's `cfg` (its file descriptors renumbered), which the caller then
    passes to `launch` exactly as a fresh launcher would; the server itself loops until the
    sandbox closes the control socket, then ends its runs and exits.

    A request is one message on the control socket (a SOCK_SEQPACKET pair; only the sandbox holds
    the other end): the marshalled cfg, and as SCM_RIGHTS the run's report socket, stdin, stdout,
    stderr, status pipe and role pipes. On the report socket the server answers ``pid N`` after the
    fork (or ``error ...``) and ``exit N`` when the launcher has exited; it reaps the launcher
    only once the sandbox closes its end of the report socket, so that until then the pid (and
    the process group id) cannot be reused and the sandbox may signal it by number. A launcher
    whose report socket closes before it exits is stopped the way the sandbox stops one.

    Single-threaded by construction (no thread is ever started here), and nothing a run sends
    its processes passes through here: the candidate's program and the tests go from the sandbox
    straight into the run's stdin pipes, so a forked child's copy of this process's memory holds
    the harness and earlier runs' cfgs (uids, paths, limits), nothing secret."""
    import _socket
    import fcntl  # noqa: F401  what launch imports, paid for once here
    import marshal
    import resource
    import site  # noqa: F401  imported only: site.main() runs in each role, once its file view is built

    sysc = _Sys()  # ctypes and libc loaded once
    server = os.getpid()
    ctl = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET, 0, ctl_fd)
    os.close(os.pidfd_open(server))  # the sandbox falls back to fresh launchers where this kernel lacks pidfds
    ctl.send(b"ready")
    poller = select.poll()
    poller.register(ctl_fd, select.POLLIN)
    by_pidfd, by_report = {}, {}
    max_fd = max(1 << 16, resource.getrlimit(resource.RLIMIT_NOFILE)[0])

    def reap(child):
        child.kill()  # whatever is left of its process group (the leader is not reaped yet)
        os.waitpid(child.pid, 0)
        os.close(child.pidfd)
        try:
            child.report.send(b"reaped")  # the sandbox waits for this before the run returns
        except OSError:
            pass
        child.report.close()

    while True:
        now = time.monotonic()
        due = [c.kill_at for c in by_pidfd.values() if c.kill_at is not None]
        timeout = None if not due else max(0, int(1000 * (min(due) - now)) + 1)
        events = poller.poll(timeout)
        for c in by_pidfd.values():
            if c.kill_at is not None and time.monotonic() >= c.kill_at:
                c.kill()
                c.kill_at = None
        for fd, _ in events:
            if fd in by_pidfd:  # a launcher exited: report how, keep it unreaped until released
                child = by_pidfd.pop(fd)
                poller.unregister(fd)
                child.exited = True
                info = os.waitid(os.P_PIDFD, child.pidfd, os.WEXITED | os.WNOWAIT)
                code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
                try:
                    child.report.send(f"exit {code}".encode())
                except OSError:
                    pass
                if child.released:
                    reap(child)
            elif fd in by_report:  # the sandbox is done with a run (or gone): stop it, reap it
                child = by_report.pop(fd)
                poller.unregister(fd)
                child.released = True
                if child.exited:
                    reap(child)
                else:
                    child.stop()
                    child.kill_at = time.monotonic() + 5
            elif fd == ctl_fd:
                try:
                    msg, anc, _, _ = ctl.recvmsg(1 << 20, _socket.CMSG_SPACE(16 * 4))
                except InterruptedError:
                    continue
                fds = []
                for level, kind, data in anc:
                    if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                        fds += struct.unpack(f"{len(data) // 4}i", data[: len(data) // 4 * 4])
                if not msg:  # the sandbox closed the server (or exited): end every run, then ourselves
                    _serve_end(list({id(c): c for c in (*by_pidfd.values(), *by_report.values())}.values()))
                    os._exit(0)
                report = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET, 0, fds[0])
                stdio, status, pipes = fds[1:4], fds[4], fds[5:]
                cfg = marshal.loads(msg)
                try:
                    pid = os.fork()
                except OSError as e:
                    pid = -1
                    report.send(f"error fork: {e}".encode())
                if pid == 0:
                    # the child: nothing of the server's may stay open in it, and socket objects
                    # must not close their numbers later (launch reuses low numbers)
                    for s in (ctl, report, *[c.report for c in (*by_pidfd.values(), *by_report.values())]):
                        s.detach()
                    return _serve_child(sysc, server, cfg, stdio, status, pipes, max_fd)
                for f in fds[1:]:
                    os.close(f)
                if pid < 0:
                    report.close()
                    continue
                child = _Child(pid, os.pidfd_open(pid), report, bool(cfg["unshare"] & _CLONE_NEWPID))
                by_pidfd[child.pidfd] = child
                by_report[report.fileno()] = child
                poller.register(child.pidfd, select.POLLIN)
                poller.register(report.fileno(), select.POLLIN)
                try:
                    report.send(f"pid {pid}".encode())
                except OSError:
                    pass  # the sandbox already closed its end: the next poll stops the run


def _serve_child(sysc, server, cfg, stdio, status, pipes, max_fd):
    """In a child the fork server just forked: tie its life to the server's, become a session
    leader (as ``start_new_session`` makes a fresh launcher), take the run's stdio and close every
    other descriptor. Then `launch` takes over, exactly as in a fresh launcher."""
    import signal

    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        sysc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # the server gone: a monitor ends its pid 1, others end
        if os.getppid() != server:
            os._exit(121)
        os.setsid()
        for i, fd in enumerate(stdio):
            os.dup2(fd, i)
        low = 0
        for fd in sorted({0, 1, 2, status, *pipes}):
            if low < fd:  # closerange(n, n) would close everything from n up (close_range(n, n - 1))
                os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, max_fd)
        sys.modules.pop("_socket", None)  # the server's alone: a role's modules are then a fresh launcher's
    except BaseException as e:
        _report(status, f"fork server child: {type(e).__name__}: {e}")
        os._exit(121)
    return {**cfg, "status_fd": status, "fds": pipes}


def _serve_end(children):
    """The sandbox closed the server: stop every run it still has, give them a moment, kill what
    is left, reap them all."""
    for c in children:
        if not c.exited:
            c.stop()
    deadline = time.monotonic() + 2
    for c in children:
        if not c.exited:
            waiting = select.poll()
            waiting.register(c.pidfd, select.POLLIN)
            waiting.poll(max(0, int(1000 * (deadline - time.monotonic()))))
        c.kill()
        try:
            os.waitpid(c.pid, 0)
        except ChildProcessError:
            pass


def _report(fd, text):
    try:
        os.write(fd, text.encode(errors="replace")[:4000])
    except OSError:
        pass


def _probe_userns():
    """The ordinary user's way in, tried whole: a user namespace with mount, network and PID
    namespaces, a tmpfs, pid 1 mounting its own /proc and forbidding nested user namespaces."""
    sysc = _Sys()
    _enter_user_namespace(sysc, _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID, os.getuid(), os.getgid())
    sysc.mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    sysc.mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64k")
    pid = os.fork()
    if pid == 0:
        try:
            os.mkdir("/tmp/proc")
            sysc.mount("proc", "/tmp/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
            with open("/tmp/proc" + _MAX_USERNS[len("/proc"):], "w") as f:
                f.write("0")
            sysc.drop_capabilities()
            os._exit(0)
        except BaseException as e:
            _report(2, f"{type(e).__name__}: {e}")
            os._exit(1)
    _, st = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(st) != 0:
        raise OSError(0, "pid 1 of the new namespaces could not mount /proc or limit user namespaces")


def probe_main():
    """Which isolation this machine allows: each step tried in a forked child, one line each."""
    steps = (("netns", _CLONE_NEWNET), ("mountns", _CLONE_NEWNS), ("pidns", _CLONE_NEWPID), ("setuid", 0),
             ("userns", -1))
    for name, flags in steps:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.dup2(w, 2)  # a failure's words, from here or from a grandchild, reach the pipe
            try:
                if flags == -1:
                    _probe_userns()
                elif flags:
                    _Sys().unshare(flags)
                else:
                    os.setgroups([])
                    os.setgid(int(sys.argv[2]))
                    os.setuid(int(sys.argv[2]))
                os._exit(0)
            except BaseException as e:
                _report(w, f"{type(e).__name__}: {e}")
                os._exit(1)
        os.close(w)
        why = b""
        while chunk := os.read(r, 4096):
            why += chunk
        os.close(r)
        _, st = os.waitpid(pid, 0)
        ok = os.waitstatus_to_exitcode(st) == 0
        text = " ".join(why.decode(errors="replace").split())
        sys.stdout.write(f"{name}\t{'ok' if ok else text or 'failed'}\n")


def kill_main(uid):
    """As `uid`, SIGKILL every process of `uid` (kill(-1) reaches exactly those)."""
    import signal

    if uid <= 0:
        sys.exit("refusing to kill every process of root")
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:  # kill(-1) from root would signal everything
        sys.exit("the uid did not change")
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "launch":
        import marshal

        launch(marshal.loads(bytes.fromhex(sys.argv[2])))
    elif role == "serve":
        launch(serve_main(int(sys.argv[2])))  # returns only in a forked child, as a launcher
    elif role == "probe":
        probe_main()
    elif role == "kill":
        kill_main(int(sys.argv[2]))
    elif role in ("worker", "judge"):
        # as a plain script (the E2B VM): the pipes given by number are moved to 3 and 4
        # and the numbers closed, so the candidate cannot read a usable one from argv
        a, b = int(sys.argv[2]), int(sys.argv[3])
        a2, b2 = os.dup(a), os.dup(b)
        os.close(a)
        os.close(b)
        os.dup2(a2, FD_REQUESTS)
        os.dup2(b2, FD_REPLIES)
        os.close(a2)
        os.close(b2)
        sys.argv[:] = [sys.argv[0]]
        worker_main() if role == "worker" else judge_main()
    else:
        sys.exit(f"unknown role {role!r}")
