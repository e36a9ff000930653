"""Comments and docstrings in the package state decisions; measurements live in docs/benchmarks.md beside the
JSON they come from. A timing figure in a comment (a duration in ms/us/ns, "3x faster", "18% slower", a
bandwidth, tokens/s, "0.6 s a step") goes stale the day the code around it changes, and no test notices: this
one does. The allow-list holds the few figures that are not measurements (a bound, an error message shown in a
doctest), each with its reason.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agentrl", "envs", "algorithms")

TIMING = re.compile(
    r"\d[\d.,]*\s*(?:ms|us|µs|ns)\b"                        # 1.85 ms, 44 us, 7 ns
    r"|\d[\d.]*\s*[x×]\s*(?:faster|slower)"                  # 1.04x faster
    r"|\d[\d.]*\s*%\s*(?:faster|slower)"                     # 18% slower
    r"|\d[\d.]*\s*[GMK]B/s"                                  # 30 GB/s
    r"|\d[\d.,]*\s*tokens?/s"                                # 120 tokens/s
    r"|\d[\d.]*\s*[GT]FLOP/s"                                # 110 GFLOP/s
    r"|\b\d+(?:\.\d+)?\s*s\s+(?:a|an|per|each)\s"            # 0.6 s a step
    r"|\b\d+\.\d+\s*s\b")                                    # 0.08 s

# (path, the figure as matched): why it is not a measurement
ALLOWED = {
    ("agentrl/chat/template.py", "0.05 s"): "the render deadline in an error message the doctest shows",
}


def passages(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring in `path`."""
    src = path.read_text()
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(src).readline)
           if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((node.body[0].lineno if node.body else 1, doc))
    return out


def timing_figures(paths: list[Path], root: Path) -> list[str]:
    """`path:line: figure` for every timing figure in the comments and docstrings of `paths` not allowed."""
    found = []
    for path in paths:
        rel = path.relative_to(root).as_posix()
        for line, text in passages(path):
            for m in TIMING.finditer(text):
                if (rel, m.group(0)) not in ALLOWED:
                    found.append(f"{rel}:{line}: {m.group(0)!r} in {text.strip()[:80]!r}")
    return found


def package_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_package_comments_hold_no_timing_figures():
    found = timing_figures(package_files(), ROOT)
    assert not found, ("timing figures in package comments or docstrings (state the decision; move the figure to "
                       "docs/benchmarks.md with its JSON):\n" + "\n".join(found))


def test_the_check_finds_a_planted_timing_comment(tmp_path):
    planted = tmp_path / "agentrl" / "planted.py"
    planted.parent.mkdir()
    planted.write_text('"""A module."""\n\nSTEP = 4  # the fused step: 0.60 -> 0.08 s, 7x faster, 44 us a row\n\n\n'
                       'def f():\n    """Decode attention in 0.95 ms at 500 positions."""\n')
    found = timing_figures([planted], tmp_path)
    assert [f.split(": ", 1)[1].split(" in ")[0] for f in found] == ["'0.08 s'", "'7x faster'", "'44 us'",
                                                                     "'0.95 ms'"]
    assert found[0].startswith("agentrl/planted.py:3: ")


def test_the_allow_list_names_figures_that_are_still_there():
    present = {(p.relative_to(ROOT).as_posix(), m.group(0)) for p in package_files()
               for _, text in passages(p) for m in TIMING.finditer(text)}
    assert set(ALLOWED) <= present, f"allowed but gone (drop them from ALLOWED): {set(ALLOWED) - present}"
