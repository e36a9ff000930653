"""The two roles of a `run_tests`: the *worker* runs the candidate's program and answers calls;
the *judge* runs the trusted tests and calls the candidate through the pipes.

**Why two processes.** If the tests ran in the same interpreter as the candidate, the candidate
could patch ``assert`` helpers, exit with status 0 before the tests run, print a fake report or
find any secret the harness holds in memory. Here the test code never runs where the candidate
runs. The judge calls the candidate's functions through a pipe (``candidate(1, 2)`` becomes a
request to the worker) and receives only plain data back (see `codec`). The judge runs as a
different unprivileged user (as root) or outside the worker's PID namespace (as an ordinary user),
so the worker cannot signal, trace or read it.

**The candidate owns its end of the pipes.** It shares the worker's process, so it can always find
and write to the reply pipe (fd 4), whatever number it has. So the judge trusts nothing it
reads: every frame is checked for shape, types and the sequence number of the request it answers.
Anything else is a *protocol violation*: the judge stops calling the candidate and reports it,
and the run scores 0. It never crashes the judge.
"""

import json
import os
import select
import sys
import time

if __name__ != "__main__":  # imported as a module; in the joined program the parts above define these
    from .codec import FD_REPLIES, FD_REQUESTS, CodecError, ProtocolViolation, decode, encode, recv, send


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
