"""The few syscalls `os` does not offer, called through ctypes, and their constants."""

import os

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



def _report(fd, text):
    try:
        os.write(fd, text.encode(errors="replace")[:4000])
    except OSError:
        pass
