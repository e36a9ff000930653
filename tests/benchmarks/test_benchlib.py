"""benchmarks/benchlib.py: where a benchmark's result goes and what it carries."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import benchlib  # noqa: E402


def test_a_result_is_written_with_its_machine_and_command_and_printed_last(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(benchlib, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["benchmarks/toy.py", "--quick"])
    out = benchlib.report("toy", {"ratio": 2.5, "machine": {"loadavg_1min_start": 0.1}}, quick=True)
    assert out == tmp_path / "toy_quick.json"  # a quick run never overwrites the committed figure
    written = json.loads(out.read_text())
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert written == printed
    assert written["benchmark"] == "toy" and written["ratio"] == 2.5 and written["command"] == (
        "python benchmarks/toy.py --quick")
    assert written["machine"]["cpus"] >= 1 and written["machine"]["loadavg_1min_start"] == 0.1
    assert benchlib.report("toy", {"ratio": 1.0}).name == "toy.json"


def test_the_parser_shows_the_docstring_and_a_quick_flag():
    ap = benchlib.parser("Line one.\n\n    python x.py   # kept as written", quick="a small run")
    assert ap.parse_args(["--quick"]).quick and "    python x.py   # kept as written" in ap.format_help()


def test_a_long_result_prints_its_summary_and_a_progress_save_prints_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["benchmarks/toy.py"])
    rows = {"ratio": 1.5, "runs": [{"seed": s} for s in range(3)]}
    benchlib.save("toy", rows, path=tmp_path / "toy.json")
    assert capsys.readouterr().out == ""  # saved after every part: only the last line is the record
    benchlib.report("toy", rows, path=tmp_path / "toy.json", summary={"ratio": 1.5})
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    written = json.loads((tmp_path / "toy.json").read_text())
    assert "runs" in written and "runs" not in printed and printed["ratio"] == 1.5
    assert printed["machine"]["cpus"] >= 1 and printed["command"] == written["command"] == "python benchmarks/toy.py"
    benchlib.announce("toy", {"ratio": 2.0, "command": "python benchmarks/toy.py --from-python"})
    said = json.loads(capsys.readouterr().out)
    assert said["benchmark"] == "toy" and said["command"] == "python benchmarks/toy.py --from-python"


BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
HELPERS = {"benchlib.py"}  # what the scripts share; a helper that is no benchmark and needs none of it goes here too


def _imports_and_parsers(path: Path) -> tuple[set[str], int]:
    """The modules a file imports (anywhere in it) and how many `ArgumentParser(...)` calls it makes, read from
    its syntax tree: nothing is executed, so this costs no torch import."""
    tree = ast.parse(path.read_text(), filename=str(path))
    modules, parsers = set(), 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
        elif isinstance(node, ast.Call):
            f = node.func
            parsers += (isinstance(f, ast.Attribute) and f.attr == "ArgumentParser") or (
                isinstance(f, ast.Name) and f.id == "ArgumentParser")
    return modules, parsers


def test_every_benchmark_takes_its_command_line_and_its_json_from_benchlib():
    scripts = sorted(p for p in BENCHMARKS.glob("*.py") if p.name not in HELPERS)
    assert len(scripts) > 20  # the glob found the folder
    missing = [p.name for p in scripts if "benchlib" not in _imports_and_parsers(p)[0]]
    own_parser = [p.name for p in scripts if _imports_and_parsers(p)[1]]
    assert not missing, f"these benchmarks do not import benchlib (parser, report): {missing}"
    assert not own_parser, f"these benchmarks build their own ArgumentParser instead of benchlib.parser: {own_parser}"


def test_the_import_check_can_fail(tmp_path):
    bare = tmp_path / "bare.py"
    bare.write_text("import argparse\n\ndef main():\n    argparse.ArgumentParser()\n")
    assert _imports_and_parsers(bare) == ({"argparse"}, 1)
    good = tmp_path / "good.py"
    good.write_text("def main():\n    from benchlib import parser, report\n    parser(None)\n")
    assert _imports_and_parsers(good) == ({"benchlib"}, 0)
