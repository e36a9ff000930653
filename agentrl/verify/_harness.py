"""The two programs a sandboxed test run starts: the *worker*, which runs the untrusted code, and
the *judge*, which runs the trusted tests. This file is executed as ``python -c <this source>``
inside the sandbox; it imports nothing from agentrl, and nothing in it is imported by the judge's
callers except the codec (for tests).

Why two processes: if the tests ran in the same interpreter as the candidate, the candidate could
patch ``assert`` helpers, exit with status 0 before the tests run, print a fake report or find any
secret the harness holds in memory. Here the test code never runs where the candidate runs. The
judge calls the candidate's functions through a pipe (``candidate(1, 2)`` becomes a request to the
worker) and receives only *plain data* back (ints, floats, strings, lists, tuples, dicts, sets,
bytes, None), decoded from tagged JSON, so an object whose ``__eq__`` always says True cannot cross.
The judge runs as a different unprivileged user, so the worker cannot signal, trace or read it.
Whatever the worker does, it can only influence the verdict through the values its functions return.

Frames on the pipes: 4-byte big-endian length, then UTF-8 JSON.
"""

import base64
import json
import math
import os
import select
import struct
import sys
import time

MAX_FRAME = 8 * 1024 * 1024  # a larger reply is a failed call, not a crash
MAX_DEPTH = 64


class CodecError(ValueError):
    pass


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
        return {"$d": [[encode(k, depth + 1), encode(dict.__getitem__(obj, k), depth + 1)] for k in list(dict.__iter__(obj))]}
    # numpy scalars and the like: accept only through the number protocols of exact types
    for base, conv in ((int, "__index__"), (float, "__float__")):
        if hasattr(type(obj), conv) and type(obj).__module__ == "numpy":
            return encode(base(getattr(obj, conv)()), depth)
    raise CodecError(f"cannot transfer a value of type {type(obj).__name__} (only plain data crosses the sandbox)")


def decode(val, depth=0):
    if depth > MAX_DEPTH:
        raise CodecError("value nested too deeply")
    if val is None or isinstance(val, (bool, int, float, str)):
        return val
    if isinstance(val, list):
        return [decode(x, depth + 1) for x in val]
    if isinstance(val, dict) and len(val) == 1:
        (tag, v), = val.items()
        if tag == "$f" and v in ("inf", "-inf", "nan"):
            return float(v)
        if tag == "$b":
            return base64.b64decode(v)
        if tag == "$c":
            return complex(float(v[0]), float(v[1]))
        if tag == "$t":
            return tuple(decode(x, depth + 1) for x in v)
        if tag == "$s":
            return {decode(x, depth + 1) for x in v}
        if tag == "$fs":
            return frozenset(decode(x, depth + 1) for x in v)
        if tag == "$d":
            return {decode(k, depth + 1): decode(x, depth + 1) for k, x in v}
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
    (n,) = struct.unpack(">I", _read_exact(fd, 4, deadline))
    if n > MAX_FRAME:
        raise CodecError(f"message of {n} bytes exceeds {MAX_FRAME}")
    return json.loads(_read_exact(fd, n, deadline))


# -- the worker: runs untrusted code, answers calls ------------------------------------------


def worker_main(fd_in, fd_out):
    code = sys.stdin.read()
    sys.stdin.close()
    ns = {"__name__": "__candidate__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "<candidate>", "exec"), ns)
    except BaseException as e:  # SystemExit and KeyboardInterrupt included: the program did not load
        send(fd_out, {"load_error": f"{type(e).__name__}: {e}"[:500]})
        return
    send(fd_out, {"loaded": True})
    while True:
        try:
            req = recv(fd_in)
        except EOFError:
            return
        try:
            fn = ns[req["fn"]]
            out = fn(*decode(req["args"]), **decode(req["kwargs"]))
            reply = {"value": encode(out)}
        except BaseException as e:
            reply = {"error": type(e).__name__, "message": str(e)[:300]}
        try:
            send(fd_out, reply)
        except (CodecError, ValueError) as e:  # e.g. an int too large to print
            send(fd_out, {"error": "CodecError", "message": str(e)[:300]})


# -- the judge: runs trusted tests, calls the worker -----------------------------------------


class CandidateTimeout(Exception):
    pass


class CandidateGone(Exception):
    pass


def judge_main(fd_req, fd_rep):
    import builtins

    payload = json.loads(sys.stdin.read())
    per_test = float(payload["per_test_seconds"])
    results = []
    state = {"deadline": None, "dead": None}

    def call(name):
        def proxy(*args, **kwargs):
            if state["dead"]:
                raise CandidateGone(state["dead"])
            try:
                send(fd_req, {"fn": name, "args": encode(list(args)), "kwargs": encode(kwargs)})
                reply = recv(fd_rep, state["deadline"])
            except TimeoutError:
                state["dead"] = "the candidate timed out earlier"
                raise CandidateTimeout(f"no answer within {per_test:g}s") from None
            except (EOFError, BrokenPipeError, OSError):
                state["dead"] = "the candidate process exited"
                raise CandidateGone("the candidate process exited") from None
            if "error" in reply:
                exc = getattr(builtins, str(reply["error"]), None)
                if not (isinstance(exc, type) and issubclass(exc, Exception)):
                    exc = RuntimeError
                raise exc(f"{reply['error']}: {reply.get('message', '')}")
            return decode(reply["value"])

        proxy.__name__ = name
        return proxy

    # Wait for the worker to load the program
    load_error = None
    try:
        hello = recv(fd_rep, time.monotonic() + float(payload["load_seconds"]))
        if "load_error" in hello:
            load_error = str(hello["load_error"])
        elif hello != {"loaded": True}:
            load_error = "the candidate process sent an unexpected message while loading"
    except TimeoutError:
        load_error = f"the program did not finish loading within {payload['load_seconds']}s"
    except (EOFError, OSError, CodecError, ValueError):
        load_error = "the candidate process exited while loading the program"

    ns = {"__name__": "__judge__"}
    if load_error is None:
        exec(compile(payload["preamble"], "<task>", "exec"), ns)  # trusted task code (helpers)
        proxy = call(payload["entry_point"])
        ns[payload["entry_point"]] = proxy
        ns["candidate"] = proxy
    for test in payload["tests"]:
        if load_error is not None:
            results.append({"name": test["name"], "passed": False, "timed_out": False, "error": "not run: " + load_error})
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
    out = json.dumps({"load_error": load_error, "tests": results})
    sys.stdout.write(out)
    sys.stdout.flush()


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "worker":
        worker_main(int(sys.argv[2]), int(sys.argv[3]))
    elif role == "judge":
        judge_main(int(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit(f"unknown role {role!r}")
