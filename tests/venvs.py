"""A fresh venv for a test that sees the packages of the interpreter running pytest.

`python -m venv --system-site-packages` run from a venv's interpreter sees the BASE interpreter's
site-packages, not that venv's: with `pip install -e ".[dev]"` in a venv (the README's route) the
inner venv would find neither torch nor agentrl. So when pytest runs in a venv, a .pth file in the
new venv's site-packages adds the running interpreter's site-packages with `site.addsitedir`, which
also runs their own .pth files (an editable install's import hook among them). The new venv's own
site-packages stays first on sys.path, so what is installed into it wins.
"""

from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path

PTH = "agentrl-tests-outer-site.pth"


def in_a_venv() -> bool:
    return sys.prefix != sys.base_prefix


def make_venv(path: Path) -> Path:
    """A venv at `path` (no pip of its own: `python -m pip` there runs the outer pip, which installs
    into the venv it is run from) that sees the system site-packages and, when pytest runs in a
    venv, that venv's too; returns its python."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(path)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    python = path / "bin" / "python"
    if in_a_venv():
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout.strip()
        Path(purelib).mkdir(parents=True, exist_ok=True)
        base = set(site.getsitepackages([sys.base_prefix, sys.base_exec_prefix]))  # seen already
        outer = [d for d in site.getsitepackages() if Path(d).is_dir() and d not in base]
        # one line starting with `import`: site.py executes it at start-up, with exec() inside a function, where
        # a comprehension cannot see the line's own `import site` before Python 3.12: one call per folder instead
        calls = "".join(f"; site.addsitedir({d!r})" for d in outer)
        (Path(purelib) / PTH).write_text(f"import site{calls}\n")
    return python
