"""The file view: what exists inside a run, planned here (the harness's `mounts` builds it).

The plan binds read-only the interpreter, its standard library and the shared libraries they load,
covers every site-packages among them with an empty directory, adds a few devices and the host's
symlinks on the way, and the host paths a sandbox was told to ``expose``.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from .contract import SandboxError

_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_DEV_LINKS = (
    ("/dev/fd", "/proc/self/fd"),
    ("/dev/stdin", "/proc/self/fd/0"),
    ("/dev/stdout", "/proc/self/fd/1"),
    ("/dev/stderr", "/proc/self/fd/2"),
)

_VIEW_PROBE = r"""
import json, os, site, sys, sysconfig
paths = sysconfig.get_paths()
cv = sysconfig.get_config_var
print(json.dumps({
    "stdlib": [paths["stdlib"], paths["platstdlib"]] + [p for p in sys.path if p],
    "site": site.getsitepackages() + [paths["purelib"], paths["platlib"], site.getusersitepackages()],
    "libpython": os.path.join(cv("LIBDIR") or "/", cv("INSTSONAME") or "") if cv("Py_ENABLE_SHARED") else "",
    "dynload": cv("DESTSHARED") or "",
}))
"""

_views: dict[tuple[str, tuple[str, ...]], tuple[tuple[Any, ...], ...]] = {}
_views_lock = threading.Lock()


def file_view(python: str, expose: tuple[str, ...]) -> tuple[tuple[Any, ...], ...]:
    """The steps that build a run's file system for `python` (cached per interpreter): bind
    read-only the interpreter, its standard library and the directories of the shared libraries
    it and its extension modules load (as ``ldd`` finds them), recreate the host's symlinks on the
    way to them (``/lib -> usr/lib``), cover every site-packages they contain with an empty
    directory, and add a few devices."""
    key = (python, expose)
    with _views_lock:
        if key in _views:
            return _views[key]
    try:
        out = subprocess.run(
            [python, "-S", "-s", "-P", "-c", _VIEW_PROBE],
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        info = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        raise SandboxError(f"the sandbox could not start {python}: {type(e).__name__}: {e}") from e
    binds: dict[str, bool] = {}  # real path -> is a directory
    links: dict[str, str] = {}
    binds[_resolve(python, links)] = False
    for p in info["stdlib"]:
        if os.path.exists(p):
            real = _resolve(p, links)
            binds[real] = os.path.isdir(real)
    objects = [python] + ([info["libpython"]] if info["libpython"] and os.path.exists(info["libpython"]) else [])
    if info["dynload"] and os.path.isdir(info["dynload"]):
        objects += sorted(str(f) for f in Path(info["dynload"]).glob("*.so"))
    for lib in _shared_libraries(objects):
        binds[os.path.dirname(_resolve(lib, links))] = True
    if os.path.isfile("/etc/ld.so.cache"):
        binds[_resolve("/etc/ld.so.cache", links)] = False
    exposed: dict[str, bool] = {}
    for p in expose:
        if not os.path.exists(p):
            raise SandboxError(f"expose: {p} does not exist")
        real = _resolve(p, links)
        exposed[real] = os.path.isdir(real)

    def inside(p: str, d: str) -> bool:
        return p == d or p.startswith(d.rstrip("/") + "/")

    def outermost(paths: dict[str, bool]) -> list[str]:
        dirs = [d for d, is_dir in paths.items() if is_dir]
        return [p for p in sorted(paths) if not any(inside(p, d) and p != d for d in dirs)]

    kept = outermost(binds)
    steps: list[tuple[Any, ...]] = [("bind", p, binds[p]) for p in kept]
    sites = {os.path.realpath(s) for s in info["site"] if os.path.isdir(s)}
    steps += [("cover", s) for s in sorted(sites) if any(inside(s, d) for d in kept if binds[d])]
    # after the covers, so that a package exposed from inside a site-packages shows through its cover
    steps += [("bind", p, exposed[p]) for p in outermost(exposed) if p not in binds]
    steps += [("dev", d) for d in _DEVICES if os.path.exists(d)]
    # a host symlink on the way to something bound is recreated, unless a bound directory shows it already
    shown = [d for d in kept if binds[d]] + [d for d, is_dir in exposed.items() if is_dir]
    steps += [("link", p, t) for p, t in sorted(links.items()) if not any(inside(p, d) for d in shown)]
    steps += [("link", p, t) for p, t in _DEV_LINKS]
    plan = tuple(steps)
    with _views_lock:
        _views[key] = plan
    return plan


def _resolve(path: str, links: dict[str, str], depth: int = 0) -> str:
    """The real path of `path`, recording each symlink met on the way (path -> target), so that
    the run's file system can have the same links and every path resolves there as here."""
    if depth > 40:
        raise SandboxError(f"too many levels of symbolic links at {path}")
    cur = "/"
    for part in Path(os.path.abspath(path)).parts[1:]:
        nxt = os.path.join(cur, part)
        if os.path.islink(nxt):
            target = os.readlink(nxt)
            links[nxt] = target
            cur = _resolve(os.path.normpath(os.path.join(cur, target)), links, depth + 1)
        else:
            cur = nxt
    return cur


def _shared_libraries(objects: list[str]) -> list[str]:
    """The shared libraries (and the dynamic loader) that these ELF files load, from ``ldd``;
    without ldd, the usual library directories."""
    try:
        out = subprocess.run(
            ["ldd", *objects], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return [d + "/." for d in ("/lib", "/lib64", "/usr/lib", "/usr/lib64") if os.path.isdir(d)]
    libs = set()
    for line in out.splitlines():
        line = line.strip()
        if "=>" in line:
            line = line.split("=>", 1)[1].strip()
        path = line.split(" (", 1)[0]
        if path.startswith("/") and " (" in line and os.path.exists(path):
            libs.add(path)
    return sorted(libs)


_root_lock = threading.Lock()
_root_dir: str | None = None


def staging_root() -> str:
    """An empty directory of ours on the host where each launcher mounts its run's root tmpfs (in
    its own mount namespace: the host sees only an empty directory)."""
    global _root_dir
    with _root_lock:
        if _root_dir is None or not os.path.isdir(_root_dir):
            _root_dir = tempfile.mkdtemp(prefix="agentrl-sandbox-root-")
            atexit.register(_remove_dir, _root_dir)
        return _root_dir


def _remove_dir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass
