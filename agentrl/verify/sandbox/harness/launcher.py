"""The *launcher*: the first thing a run's fresh process does, single-threaded, before it
becomes its role.

It joins the run's memory cgroup, unshares namespaces (owned by a user namespace of its own when
not root), forks pid 1 of a new PID namespace, builds the minimal file view with its /proc and
pivots into it, sets rlimits, drops to the run's uid (root) or drops every capability (user
namespace), forbids nested user namespaces, sets ``no_new_privs``, closes the status pipe, and only
then becomes its role (or ``exec``s the interpreter for `run_program`).

Why here and not in a ``preexec_fn``: the sandbox is called from a thread pool, and CPython
documents ``preexec_fn`` as unsafe with threads (the forked child inherits locks other threads
held); it also rules out ``vfork``, so every run would copy the page tables of a large parent. The
parent only ``vfork``s and ``exec``s. Bubblewrap would also work, but it cannot switch to a fresh
host uid, join a cgroup or set rlimits without such a wrapper anyway, and it is one more package
that CI and every user would need; the set-up is ours instead (this module, `mounts`, `userns`,
`syscalls`), and tested.
"""

import os
import sys

if __name__ != "__main__":  # imported as a module; in the joined program the parts above define these
    from .codec import FD_REPLIES, FD_REQUESTS
    from .mounts import _build_view
    from .roles import judge_main, worker_main
    from .syscalls import _CLONE_NEWPID, _PR_SET_NO_NEW_PRIVS, _report, _Sys
    from .userns import _enter_user_namespace, _no_nested_user_namespaces


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
