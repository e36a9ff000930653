"""The run's file system, built inside its mount namespace from the plan the parent made (see the
sandbox's ``view`` module): what is bound, covered and linked, and the pivot into it."""

import os

if __name__ != "__main__":  # imported as a module; in the joined program the parts above define these
    from .syscalls import (
        _MNT_DETACH,
        _MS_BIND,
        _MS_NOATIME,
        _MS_NODEV,
        _MS_NODIRATIME,
        _MS_NOEXEC,
        _MS_NOSUID,
        _MS_PRIVATE,
        _MS_RDONLY,
        _MS_REC,
        _MS_RELATIME,
        _MS_REMOUNT,
    )


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
