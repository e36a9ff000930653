"""The probe: which isolation this machine allows, each step tried in a forked child."""

import os
import sys

if __name__ != "__main__":  # imported as a module; in the joined program the parts above define these
    from .syscalls import (
        _CLONE_NEWNET,
        _CLONE_NEWNS,
        _CLONE_NEWPID,
        _MAX_USERNS,
        _MS_NODEV,
        _MS_NOEXEC,
        _MS_NOSUID,
        _MS_PRIVATE,
        _MS_REC,
        _report,
        _Sys,
    )
    from .userns import _enter_user_namespace


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

