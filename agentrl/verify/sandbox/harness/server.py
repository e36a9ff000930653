"""The *fork server* (`serve_main`): the launcher started once and kept warm. Per request it
forks, and the child, after closing everything but the run's descriptors, returns to the
program's entry point (`main`), which calls `launch` exactly as for a fresh launcher (same frames,
same interpreter exit). Why that child inherits nothing that matters: the sandbox package's docstring.
"""

import os
import select
import struct
import sys
import time

if __name__ != "__main__":  # imported as a module; in the joined program the parts above define these
    from .syscalls import _CLONE_NEWPID, _PR_SET_PDEATHSIG, _report, _Sys


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

