"""The harness: the code that runs inside a run's processes and the fork server, sent to a fresh
interpreter as one program.

A run's interpreter sees no site-packages and no checkout, so it cannot import agentrl. The parts
below are joined, in this order, into one program that imports only the standard library, run as
``python -S -s -P -c <program> ROLE ...`` (the roles: `main`); the E2B backend uploads the same
program as a script. Each part also imports as a module of this package (the tests call the codec
and the judge's checks directly): a part's imports of another part sit under
``if __name__ != "__main__"``, because in the joined program the parts above it have defined those
names already. So no part may use ``from __future__`` (it would land mid-program), and a name is
defined in one part only.

- `codec`: plain data over the pipes, framed and bounded
- `roles`: the worker (runs the candidate) and the judge (runs the tests)
- `syscalls`: the few syscalls `os` lacks, dropping capabilities included
- `userns`: user namespaces and their uid/gid maps
- `mounts`: the run's file system, built from the plan the parent made (``sandbox.view``)
- `launcher`: a fresh process set up as one run's launcher, then its role
- `server`: the fork server, a warm launcher that forks one launcher per run
- `probe`: what this machine allows, tried step by step
- `main`: the entry points, by role

This module is the parent's side: the joined `SOURCE` and the command line that runs it (`argv`).
"""

from __future__ import annotations

import functools
import marshal
import os
import sys
from pathlib import Path

PARTS = ("codec", "roles", "syscalls", "userns", "mounts", "launcher", "server", "probe", "main")
SOURCE = "\n\n".join(Path(__file__).with_name(f"{part}.py").read_text() for part in PARTS)


@functools.lru_cache(maxsize=1)
def compiled() -> str | None:
    """The harness compiled once, in this process, as a ``-c`` program that runs it, so that a run's
    processes need not compile the source each. The same code runs the same way (``exec`` in
    ``__main__``, file name "<string>" as for ``-c``); marshal's format belongs to this interpreter,
    so only it is given the compiled form. None where the argument would come near the kernel's
    limit on one argument (128 KiB): then the source goes instead. Today's harness has outgrown
    that limit, so every run gets the source (docs/benchmarks.md, "The real sandbox: Code-v0")."""
    code = marshal.dumps(compile(SOURCE, "<string>", "exec")).hex()
    boot = f"import marshal\nexec(marshal.loads(bytes.fromhex({code!r})))\n"
    return boot if len(boot) < 120_000 else None


def argv(python: str, *args: str) -> list[str]:
    """The command line that runs the harness as `python` with these arguments (a role first)."""
    # -S: site (and every .pth file in site-packages) would run before the launcher has hidden them
    program = compiled() if python == os.path.realpath(sys.executable) else None
    return [python, "-S", "-s", "-P", "-c", program or SOURCE, *args]
