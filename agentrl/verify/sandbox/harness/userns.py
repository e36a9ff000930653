"""User namespaces: the ordinary user's way to own fresh namespaces, the uid/gid maps that make
one, and the limit that keeps a role from making one of its own."""

import os

if __name__ != "__main__":  # imported as a module; in the joined program the parts above define these
    from .syscalls import _CLONE_NEWUSER, _MAX_USERNS, _PR_SET_DUMPABLE


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
