"""What every benchmark here does the same way: its command line (the module docstring as `--help`, a
`--quick` mode), the machine it ran on, and its result: one JSON object written to `results/<name>.json`
(a quick run to `results/<name>_quick.json`, so it never overwrites the committed figures) and printed as
the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def parser(doc: str | None, quick: str | None = None) -> argparse.ArgumentParser:
    """The benchmark's argument parser, its docstring shown as written; with `quick`, a `--quick` flag so described."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if quick:
        ap.add_argument("--quick", action="store_true", help=quick)
    return ap


def machine() -> dict[str, Any]:
    """The machine, and its load when asked: a timing taken under load is not a figure."""
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg_1min": round(os.getloadavg()[0], 2)}


def _record(name: str, result: dict[str, Any]) -> dict[str, Any]:
    """`result` with the benchmark's name first and the machine and the command that ran it added. A result may
    name its own command (a `main(argv)` called from Python was not run with `sys.argv`)."""
    return {"benchmark": name, **result, "machine": {**machine(), **result.get("machine", {})},
            "command": result.get("command") or " ".join(["python", f"benchmarks/{Path(sys.argv[0]).name}",
                                                         *sys.argv[1:]])}


def save(name: str, result: dict[str, Any], quick: bool = False, path: str | Path | None = None) -> Path:
    """Write `result` with the machine and the command (to `path`, else `results/<name>[_quick].json`) and print
    nothing: a long benchmark saves its figures after every part, so that a run cut short keeps them."""
    out = Path(path) if path else RESULTS / f"{name}{'_quick' if quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_record(name, result), indent=1) + "\n")
    return out


def announce(name: str, result: dict[str, Any]) -> None:
    """Print `result` with the machine and the command as one JSON line, the benchmark's last, and write nothing:
    for a run whose figures go to a file only when asked."""
    print(json.dumps(_record(name, result)))


def report(name: str, result: dict[str, Any], quick: bool = False, path: str | Path | None = None,
           summary: dict[str, Any] | None = None) -> Path:
    """`save` the result and print it as one JSON line, the benchmark's last; returns where it was written.
    A result too long to read on one line (every run's rows) gives a `summary` of its figures: that line is
    printed instead, with the same machine and command, and the file keeps the whole."""
    out = save(name, result, quick, path)
    announce(name, result if summary is None else summary)
    return out
