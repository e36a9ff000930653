"""Every figure the README, docs/benchmarks.md and docs/models.md quote from a committed JSON says which, and agrees
with it.

The convention: a quoted figure is followed at once by a marker that names its JSON (under benchmarks/results/)
and the key it comes from, a dotted path whose integer parts index lists, optionally scaled:

    **3.71×**<!-- figure: vs_trl_smollm2.json ratio -->
    13%<!-- figure: multi_turn.json horizons.2.engine_padding_fraction*100 -->

The marker renders as nothing. The figure is the number written just before it (markup and a unit between
them are allowed: `**`, `×`, `%`, ` s`), and it agrees when it equals the JSON's value within the rounding it
is shown with (half a unit of its last digit; in e-notation, `2.7e-14`, of its mantissa's last digit). A hyphen
just before a number reads as its minus sign, so a marked range is written `313 to 1,261 s`. A section of
docs/benchmarks.md that links a committed JSON (a markdown link to it) carries at least one marker, or is named
in `UNMARKED` (sections not yet brought under the convention: the list only shrinks, and is empty now).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ("README.md", "docs/benchmarks.md", "docs/models.md")
MARKER = re.compile(r"<!-- figure: (?P<file>\S+\.json) (?P<key>[^\s*]+)(?:\*(?P<scale>[\d.]+))? -->")
# the number just before a marker; between them only markup and a unit
LINK = re.compile(r"\]\((?:\.\./)?benchmarks/results/[\w/]+\.json\)")  # a markdown link to a committed JSON
NUMBER_BEFORE = re.compile(r"(?P<num>-?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?)(?:\*\*|×|x|%| s|\)|`)*$")

# docs/benchmarks.md sections that link a committed JSON but carry no marker yet (issue 49: the list only shrinks)
UNMARKED: set[str] = set()


def lookup(data: object, key: str) -> object:
    """`data` at a dotted path: dict keys by name, list items by index. A dict key that holds dots itself (a
    learning rate, `lr=1e-3.5`-like names) is matched whole: at a dict, the longest run of parts that names a
    key wins.

    >>> lookup({"a": [{"lr=0.5": {"b": 2}}]}, "a.0.lr=0.5.b")
    2
    """
    parts = key.split(".")
    i = 0
    while i < len(parts):
        if isinstance(data, list):
            data, i = data[int(parts[i])], i + 1
        elif isinstance(data, dict):
            j = next((j for j in range(len(parts), i, -1) if ".".join(parts[i:j]) in data), None)
            if j is None:
                raise KeyError(parts[i])
            data, i = data[".".join(parts[i:j])], j
        else:
            raise KeyError(parts[i])
    return data


def check_figures(text: str, where: str, results: Path = RESULTS) -> tuple[int, list[str]]:
    """How many marked figures `text` holds, and a sentence for each one that disagrees with its JSON (or names a
    file, a key or a number that is not there)."""
    problems, count = [], 0
    for m in MARKER.finditer(text):
        count += 1
        line = text.count("\n", 0, m.start()) + 1
        label = f"{where}:{line} ({m['file']} {m['key']})"
        before = NUMBER_BEFORE.search(text[max(0, m.start() - 40):m.start()])
        if before is None:
            problems.append(f"{label}: no figure written just before the marker")
            continue
        shown = before["num"].replace(",", "")
        path = results / m["file"]
        if not path.is_file():
            problems.append(f"{label}: no such JSON under benchmarks/results/")
            continue
        try:
            value = lookup(json.loads(path.read_text()), m["key"])
        except (KeyError, IndexError, ValueError):
            problems.append(f"{label}: the JSON has no key {m['key']}")
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            problems.append(f"{label}: {m['key']} is {value!r}, not a number")
            continue
        value *= float(m["scale"] or 1)
        mantissa, _, exponent = shown.partition("e")
        half_unit = 0.5 * 10 ** (int(exponent or 0) - len(mantissa.partition(".")[2]))
        # relative slack for binary rounding only: an absolute one would pass any figure near zero (1e-14)
        if abs(float(shown) - value) > half_unit * (1 + 1e-9):
            problems.append(f"{label}: the text says {shown}, the JSON {value:g}")
    return count, problems


def sections(text: str) -> dict[str, str]:
    """docs/benchmarks.md's `##` and `###` sections by title, each up to the next heading."""
    parts = re.split(r"(?m)^#{2,3} (.*)$", text)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


@pytest.mark.parametrize("doc", DOCS)
def test_every_marked_figure_agrees_with_its_json(doc):
    count, problems = check_figures((ROOT / doc).read_text(), doc)
    assert count > 0, f"{doc} marks no figure"
    assert problems == []


def test_a_planted_mismatch_fails():
    text = (ROOT / "docs/benchmarks.md").read_text()
    m = re.search(r"(\d+\.\d+)(\*\*)?×?(\*\*)?<!-- figure: multi_turn\.json ratio -->", text)
    assert m is not None, "docs/benchmarks.md marks multi_turn.json's ratio"
    shown = m[1]
    planted = text.replace(m[0], m[0].replace(shown, f"{float(shown) + 0.02:.2f}", 1), 1)
    count, problems = check_figures(planted, "planted")
    ratio = json.loads((RESULTS / "multi_turn.json").read_text())["ratio"]
    assert len(problems) == 1 and "multi_turn.json ratio" in problems[0] and f"the JSON {ratio}" in problems[0]
    # within the rounding shown is agreement; one digit fewer shown widens it
    assert check_figures(f"{ratio:.1f}×<!-- figure: multi_turn.json ratio -->", "x")[1] == []
    assert check_figures(f"{ratio:.0f}×<!-- figure: multi_turn.json ratio -->", "x")[1] == []
    assert len(check_figures(f"{ratio + 0.1:.1f}×<!-- figure: multi_turn.json ratio -->", "x")[1]) == 1
    # e-notation rounds at its mantissa's last digit, however small the figure (engine_mismatch.json: 2.717e-14)
    assert check_figures("2.7e-14<!-- figure: engine_mismatch.json arms.fp32.mismatch_kl_k3 -->", "x")[1] == []
    assert len(check_figures("2.8e-14<!-- figure: engine_mismatch.json arms.fp32.mismatch_kl_k3 -->", "x")[1]) == 1
    assert len(check_figures("2.7e-13<!-- figure: engine_mismatch.json arms.fp32.mismatch_kl_k3 -->", "x")[1]) == 1
    # a key or a file that is not there, or a marker with no figure before it, is reported, not skipped
    assert "no key" in check_figures("1.0<!-- figure: multi_turn.json no_such_key -->", "x")[1][0]
    assert "no such JSON" in check_figures("1.0<!-- figure: nothing.json ratio -->", "x")[1][0]
    assert "no figure" in check_figures("the ratio<!-- figure: multi_turn.json ratio -->", "x")[1][0]


def test_a_key_that_holds_dots_is_found_whole(tmp_path):
    (tmp_path / "lrs.json").write_text(json.dumps({"runs": [{"lr=0.5": {"pass": 0.25}, "lr": {"0": {"5": 9}}}]}))
    assert lookup(json.loads((tmp_path / "lrs.json").read_text()), "runs.0.lr=0.5.pass") == 0.25
    assert lookup({"lr": {"0": {"5": 9}}, "lr.0": {"5": 7}}, "lr.0.5") == 7  # the longest key that exists wins
    assert check_figures("0.25<!-- figure: lrs.json runs.0.lr=0.5.pass -->", "x", results=tmp_path)[1] == []
    assert "no key" in check_figures("0.25<!-- figure: lrs.json runs.0.lr=0.6.pass -->", "x", results=tmp_path)[1][0]


def test_the_readmes_headline_figures_are_marked():
    text = (ROOT / "README.md").read_text()
    for key in ("vs_trl_smollm2.json ratio", "vs_trl_multiturn_smollm2.json ratio", "real_model.json grpo_final_mean",
                "probe_lofo.json probe_mean_regret", "history/probe_lofo_before_gate_change.json probe_mean_regret",
                "multi_turn.json horizons.2.ratio_carry_cache", "multi_turn_smollm2.json ratio",
                "vs_trl_sweep.json ratio_min", "vs_trl_sweep.json ratio_max",
                "decode_bound.json decode.1.fraction_of_bound*100"):
        assert f"<!-- figure: {key} -->" in text, key


def test_every_section_that_links_a_json_marks_a_figure():
    found = sections((ROOT / "docs/benchmarks.md").read_text())
    linking = {title for title, body in found.items() if LINK.search(body)}
    unmarked = {title for title in linking if not MARKER.search(found[title])}
    assert unmarked - UNMARKED == set(), "sections that link a JSON and mark no figure"
    assert UNMARKED - unmarked == set(), "sections now marked: take them out of UNMARKED"
