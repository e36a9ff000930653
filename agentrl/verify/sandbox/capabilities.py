"""What this machine lets us isolate, probed once per process: root with the host's namespaces, a
user namespace of our own, or neither, with the reason for whatever is missing."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass

from .cgroups import MemoryCgroups
from .harness import argv as harness_argv
from .uids import UID_LO


@dataclass(frozen=True)
class Capabilities:
    root: bool
    setuid: bool
    netns: bool
    mountns: bool
    pidns: bool
    memcg: MemoryCgroups | None
    reasons: tuple[str, ...]
    userns: bool = False  # an ordinary user's way: user + mount + network + PID namespaces, all tried

    @property
    def method(self) -> str:
        """How runs are isolated here: as root when we are root and may; else by a user namespace."""
        if self.root and self.mountns and self.setuid:
            return "root"
        return "user-namespace" if self.userns else "none"


_caps_lock = threading.Lock()
_caps: Capabilities | None = None


def probe_capabilities(refresh: bool = False) -> Capabilities:
    """Which isolation this process can set up (cached): one launcher run tries each step."""
    global _caps
    with _caps_lock:
        if _caps is not None and not refresh:
            return _caps
        root = os.geteuid() == 0
        if not sys.platform.startswith("linux"):
            why = f"namespaces and cgroups need Linux, this is {sys.platform}"
            _caps = Capabilities(root, False, False, False, False, None, (why, _HOW_TO_ISOLATE))
            return _caps
        found: dict[str, str] = {}
        try:
            out = subprocess.run(
                harness_argv(os.path.realpath(sys.executable), "probe", str(UID_LO)),
                env={},
                cwd="/",
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            found = dict(line.split("\t", 1) for line in out.stdout.splitlines() if "\t" in line)
            failed = "" if found else f"the probe printed nothing (exit {out.returncode}): {out.stderr[-300:]}"
        except (OSError, subprocess.SubprocessError) as e:
            failed = f"{type(e).__name__}: {e}"
        steps = ("netns", "mountns", "pidns", "setuid", "userns")
        ok = {k: found.get(k, failed or "not probed") == "ok" for k in steps}
        setuid = root and ok["setuid"]
        memcg, memcg_why = MemoryCgroups.find()
        reasons = []
        if root and ok["mountns"] and setuid:
            if not ok["netns"]:
                reasons.append(f"no network namespace (unshare(CLONE_NEWNET) failed: {found.get('netns', failed)})")
            if not ok["pidns"]:
                reasons.append(
                    f"no PID namespace (unshare(CLONE_NEWPID) failed: {found.get('pidns', failed)}); orphans are "
                    "killed by uid instead"
                )
        elif ok["userns"]:
            if not root:
                reasons.append(
                    "isolated by a user namespace (not root): the run keeps your uid on the host, so RLIMIT_NPROC "
                    "counts your other processes too (the run is allowed that many more)"
                )
            else:
                reasons.append(
                    "root without the privileges of the host's namespaces (a container?): isolated by a user "
                    f"namespace instead (unshare(CLONE_NEWNS) failed: {found.get('mountns', failed)})"
                )
        else:
            why = found.get("userns", failed)
            if root:
                reasons.append(
                    f"root, but neither the host's namespaces (mount: {found.get('mountns', failed)}; "
                    f"switching uid: {found.get('setuid', failed)}) nor a user namespace ({why}) can be had"
                )
            else:
                reasons.append(
                    f"not root, and no user namespace could be made ({why}): the run shares this user's uid, files "
                    "and network"
                )
            reasons.append(_HOW_TO_ISOLATE)
        if memcg is None:
            reasons.append(f"no memory cgroup ({memcg_why}): memory is limited per process (RLIMIT_AS), not per run")
        _caps = Capabilities(root, setuid, ok["netns"], ok["mountns"], ok["pidns"], memcg, tuple(reasons), ok["userns"])
        return _caps


_HOW_TO_ISOLATE = (
    "to isolate as an ordinary user, allow unprivileged user namespaces (`sysctl user.max_user_namespaces` above "
    "0; Debian's older kernels: `sysctl kernel.unprivileged_userns_clone=1`; Ubuntu 24.04+: "
    "`sysctl kernel.apparmor_restrict_unprivileged_userns=0` or an AppArmor profile for this python), run as "
    "root, or use the E2B sandbox (agentrl.verify.e2b)"
)
