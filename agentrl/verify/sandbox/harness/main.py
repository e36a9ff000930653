"""The harness program's entry points, by the role in ``sys.argv[1]``: ``launch`` (a run's
launcher), ``serve`` (the fork server), ``probe``, ``kill`` (every process of a uid), and
``worker`` / ``judge`` as plain scripts (the E2B VM)."""

import os
import sys

if __name__ != "__main__":  # imported as a module; in the joined program the parts above define these
    from .codec import FD_REPLIES, FD_REQUESTS
    from .launcher import launch
    from .probe import probe_main
    from .roles import judge_main, worker_main
    from .server import serve_main


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
