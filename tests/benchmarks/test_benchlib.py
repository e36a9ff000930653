"""benchmarks/benchlib.py: where a benchmark's result goes and what it carries."""

from __future__ import annotations

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
