"""Run metrics: `metrics.jsonl` (one JSON object per update, alarm states included), the live
console, and optional TensorBoard / Weights & Biases (offline) loggers.

The console table has the dashboard's shape (docs/algorithms.md), step | pass_rate | entropy | KL | ... | status,
with the status coloured (green healthy, yellow a notice, red an alarm); an alarm that turns on or
clears, and every intervention, is also printed as a line of its own. When output is not a terminal
(CI, a log file) the same rows print as plain lines.

A resumed run rewinds the record to its checkpoint (`rewind`): metrics.jsonl is cut there, and the
loggers, opened at the first row after the rewind, continue from it instead of adding a second value
at the steps the killed process had logged past it. TensorBoard's writer gets `purge_step` (its reader
drops every older event from that step on); W&B continues the same run (its id is kept in
`<run>/wandb/run_id`) with `resume_from="<id>?_step=<step>"`, W&B's rewind, which truncates the run's
history there when the offline run is synced. The step purged from is the checkpoint's own, whose row
is logged again, so a final evaluation logged at that step by the killed process is dropped too.

>>> import tempfile, io
>>> from rich.console import Console
>>> d = tempfile.mkdtemp()
>>> m = Monitor(d, total=1, console=Console(file=io.StringIO(), width=200))
>>> m.log({"step": 1, "rollout/pass_rate": 0.5, "health/status": "healthy", "health/level": "healthy"})
>>> m.close()
>>> open(d + "/metrics.jsonl").read().count("pass_rate")
1
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from agentrl.health.alarms import ALARMS
from agentrl.log import duration

# (header, metric key, format); the first four and the last follow docs/algorithms.md's dashboard
COLUMNS = [
    ("step", "step", "{:.0f}"),
    ("pass_rate", "rollout/pass_rate", "{:.2f}"),
    ("entropy", "train/entropy", "{:.3f}"),
    ("KL", "train/kl", "{:.4f}"),
    ("held-out", "eval/pass_rate", "{:.2f}"),
    ("zero-adv", "credit/zero_adv_frac", "{:.2f}"),
    ("turns", "rollout/turns_mean", "{:.1f}"),
    ("tok/s", "rollout/tokens_per_s", "{:.0f}"),
]
# shown only in a run that logs them, after the column named: on-policy distillation's reverse KL to the teacher
# per action token, beside the pass rate it should lift
OPTIONAL_COLUMNS = [("pass_rate", ("teacher-KL", "credit/teacher_kl", "{:.3f}"))]
STATUS_STYLE = {"healthy": "green", "notice": "yellow", "alarm": "bold red"}
SKIP_SCALARS = {"step", "time", "final"}


def columns(row: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The console's columns for a run whose rows look like `row`: `COLUMNS`, with each optional column the row
    logs placed after its neighbour."""
    out = list(COLUMNS)
    for after, column in OPTIONAL_COLUMNS:
        if column[1] in row:
            out.insert(next(i for i, c in enumerate(out) if c[0] == after) + 1, column)
    return out


def _fmt(row: dict[str, Any], key: str, fmt: str) -> str:
    v = row.get(key)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return fmt.format(v)


def status_text(row: dict[str, Any]) -> Text:
    """The status cell: the row's `health/status`, coloured by `health/level`."""
    status = row.get("health/status", "-")
    return Text(str(status), style=STATUS_STYLE.get(str(row.get("health/level")), ""))


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The numeric metrics of a row (what TensorBoard and W&B get): strings and lists stay in the jsonl."""
    return {k: float(v) for k, v in row.items() if k not in SKIP_SCALARS and isinstance(v, (int, float))
            and not isinstance(v, bool)}


def source_change(source: dict[str, Any]) -> str:
    """An evaluation source's metrics from step 0 to the end, as summary.json's `eval_sources` entry holds them.

    >>> source_change({"start": {"pass@2": 0.25, "avg@2": 0.125, "tasks": 8.0, "k": 2.0},
    ...                "final": {"pass@2": 0.5, "avg@2": 0.25, "tasks": 8.0, "k": 2.0}})
    'pass@2 0.250 -> 0.500, avg@2 0.125 -> 0.250'
    """
    start, final = source.get("start") or {}, source.get("final") or {}
    keys = [k for k in final if k not in ("tasks", "k", "score_mean")]
    return ", ".join(f"{k} {start.get(k, float('nan')):.3f} -> {final[k]:.3f}" for k in keys)


class TensorBoardLogger:
    """Scalars into <run>/tensorboard. The final evaluation goes under `final/...`, so that its step
    (the last update's) does not hold two values for `eval/pass_rate`. `purge_step` (a resumed run):
    TensorBoard drops the events an earlier process wrote at that step and after."""

    def __init__(self, folder: Path, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package

        self.folder = folder
        self.writer = SummaryWriter(log_dir=str(folder), purge_step=purge_step)

    def log(self, row: dict[str, Any]) -> None:
        prefix = "final/" if row.get("final") else ""
        for k, v in scalars(row).items():
            self.writer.add_scalar(prefix + k, v, global_step=int(row["step"]))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """Weights & Biases in offline mode (no network here); `wandb sync <run>/wandb/...` uploads later.
    One W&B run per agentrl run: its id is drawn once and kept in `<folder>/run_id`, and a resumed run
    (`resume_step`) continues it with W&B's rewind, `resume_from="<id>?_step=<resume_step>"`."""

    ID_FILE = "run_id"

    def __init__(self, folder: Path, project: str, config: dict[str, Any] | None, resume_step: int | None = None):
        import wandb

        folder.mkdir(parents=True, exist_ok=True)
        self.wandb = wandb
        id_file = folder / self.ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else None
        kwargs: dict[str, Any] = {}
        if run_id and resume_step is not None:
            kwargs["resume_from"] = f"{run_id}?_step={resume_step}"
        else:  # a new run (or one whose first process never opened W&B): a new W&B run
            run_id = uuid.uuid4().hex[:12]
            id_file.write_text(run_id + "\n")
        self.run = wandb.init(mode="offline", dir=str(folder), project=project, config=config or {}, id=run_id,
                              **kwargs)

    def log(self, row: dict[str, Any]) -> None:
        if row.get("final"):
            self.run.summary.update({f"final/{k}": v for k, v in scalars(row).items()})
            return
        self.run.log(scalars(row), step=int(row["step"]))

    def close(self) -> None:
        self.run.finish()


class Monitor:
    """Writes metrics.jsonl, drives the console and feeds the optional loggers for one run."""

    def __init__(self, out: Path | str, total: int, console: Console | None = None, rows_shown: int = 12,
                 tensorboard: bool = False, wandb: bool = False, wandb_project: str = "agentrl",
                 config: dict[str, Any] | None = None):
        self.out = Path(out)
        self.console = console or Console()
        self.total = total
        self.rows: list[dict[str, Any]] = []
        self.rows_shown = rows_shown
        self._file = open(self.out / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115 (kept open for the run)
        self._live: Live | None = None
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
        )
        self._task = None
        self._sft_task = None
        self._t0 = time.time()
        self._alarms_on: set[str] = set()
        self._eta_said = False  # the ETA is said once, after the first update this process runs
        # the optional loggers, opened at the first row: after a resumed run's rewind, which says where they go on
        self.loggers: list[Any] = []
        self._makers: list[tuple[str, Any]] = []
        if tensorboard:
            self._makers.append(("tensorboard", lambda step: TensorBoardLogger(self.out / "tensorboard", step)))
        if wandb:
            self._makers.append(("wandb", lambda step: WandbLogger(self.out / "wandb", wandb_project, config, step)))
        self._pending = bool(self._makers)
        self._resume_step: int | None = None  # set by rewind: the step the loggers purge from
        self._relog: list[dict[str, Any]] = []  # the kept rows at that step, logged again after the purge

    def _open_loggers(self) -> None:
        self._pending = False
        for name, make in self._makers:
            try:
                logger = make(self._resume_step)
            except ImportError as e:  # optional: say so once and go on with metrics.jsonl
                self.say(f"[yellow]{name} logging skipped[/yellow]: {e} (pip install {name})")
                continue
            for row in self._relog:
                logger.log(row)
            self.loggers.append(logger)

    def say(self, text: str) -> None:
        self.console.print(text)

    def sft_progress(self, m: dict[str, Any]) -> None:
        if not self.console.is_terminal:
            if m["sft/step"] % 100 == 0 or m["sft/step"] == m["sft/steps"]:
                self.console.print(f"  sft step {m['sft/step']}/{m['sft/steps']}  loss {m['sft/loss']:.4f}")
            return
        if self._sft_task is None:
            self._progress.start()
            self._sft_task = self._progress.add_task("SFT warm start", total=m["sft/steps"])
        self._progress.update(self._sft_task, completed=m["sft/step"], description="SFT warm start  loss "
                              f"{m['sft/loss']:.3f}")
        if m["sft/step"] >= m["sft/steps"]:
            self._progress.stop()
            self._progress.remove_task(self._sft_task)

    def table(self) -> Table:
        """The dashboard: the last `rows_shown` updates, status coloured."""
        table = Table(box=None, header_style="bold")
        cols = columns(self.rows[-1]) if self.rows else COLUMNS
        for name, _, _ in cols:
            table.add_column(name, justify="right")
        table.add_column("status", justify="left")
        for row in self.rows[-self.rows_shown :]:
            table.add_row(*(_fmt(row, k, f) for _, k, f in cols), status_text(row))
        return table

    def _announce(self, record: dict[str, Any]) -> None:
        """A line when an alarm turns on or clears, and one per intervention: the table scrolls away, these stay."""
        step = record.get("step", 0)
        # reasons read "NAME: why"; only registered alarm names count, so a notice with a colon is no alarm
        on = {name: r for r in record.get("health/reasons", []) if (name := r.split(":", 1)[0]) in ALARMS}
        for name in sorted(set(on) - self._alarms_on):
            self._print(f"[bold red]ALARM[/bold red] step {step:.0f}  {on[name]}")
        for name in sorted(self._alarms_on - set(on)):
            self._print(f"[green]cleared[/green] step {step:.0f}  {name}")
        self._alarms_on = set(on)
        for action in record.get("health/actions", []):
            self._print(f"[cyan]intervene[/cyan] step {step:.0f}  {action}")

    def _print(self, text: str) -> None:
        (self._live.console if self._live is not None else self.console).print(text, highlight=False)

    def log(self, metrics: dict[str, Any]) -> None:
        """Record one update's metrics (must hold `step`)."""
        record = {"time": round(time.time() - self._t0, 3), **metrics}
        self._file.write(json.dumps(record) + "\n")
        if self._pending:
            self._open_loggers()
        for logger in self.loggers:
            logger.log(record)
        if metrics.get("final"):
            self.console.print(f"final held-out pass rate {metrics.get('eval/pass_rate', float('nan')):.3f}")
            return
        self.rows.append(record)
        if metrics.get("step", 0) == 0:
            return
        self._announce(record)
        if not self._eta_said and metrics.get("time/update_s") and metrics["step"] < self.total:
            self._eta_said = True
            left = self.total - int(metrics["step"])
            self._print(f"  ETA {duration(metrics['time/update_s'] * left)} for the {left} update{'s' * (left > 1)} "
                        f"left (an estimate from update {metrics['step']:.0f}'s time; held-out evaluations not "
                        "counted)")
        if not self.console.is_terminal:
            line = "  ".join(f"{name} {_fmt(record, k, f)}" for name, k, f in columns(record))
            self.console.print(Text(line + "  status ") + status_text(record))
            return
        if self._live is None:
            self._task = self._progress.add_task("RL", total=self.total)
            self._live = Live(Group(self.table(), self._progress), console=self.console, refresh_per_second=4)
            self._live.start()
        self._progress.update(self._task, completed=metrics["step"])
        self._live.update(Group(self.table(), self._progress))

    def position(self) -> dict[str, Any]:
        """Where the run's record stands, for a checkpoint: metrics.jsonl's length in bytes (on disk, fsync'ed)
        and the alarms the console last showed as on."""
        self._file.flush()
        os.fsync(self._file.fileno())
        return {"bytes": self._file.tell(), "alarms_on": sorted(self._alarms_on)}

    def rewind(self, position: dict[str, Any]) -> None:
        """Go back to `position` (a resumed run): metrics.jsonl is cut to it, so the rows written after the
        checkpoint are written once, again, by the resumed run; the console's table shows the rows kept."""
        path = self.out / "metrics.jsonl"
        self._file.flush()
        size, keep = path.stat().st_size, int(position["bytes"])
        if size < keep:
            raise ValueError(f"{path} holds {size} bytes, fewer than the {keep} the checkpoint recorded: the run "
                             "folder was changed after the checkpoint was written")
        os.truncate(path, keep)  # the file is open for appending: the next row lands at the new end
        self._alarms_on = set(position["alarms_on"])
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        self.rows = [r for r in rows if not r.get("final")]
        # the loggers purge from the checkpoint's step and get its row again (the killed process may have logged
        # a final evaluation at that step); from step 0 when nothing is kept
        self._resume_step = int(self.rows[-1]["step"]) if self.rows else 0
        self._relog = [r for r in self.rows if int(r["step"]) == self._resume_step]
        for logger in self.loggers:  # opened before the rewind (rows logged first): open them again, purging
            logger.close()
        self.loggers = []
        self._pending = bool(self._makers)

    def close(self, summary: dict[str, Any] | None = None) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        self._file.close()
        for logger in self.loggers:
            logger.close()
        self.loggers = []
        if summary:
            stopped = f"; stopped early: {summary['stopped']}" if summary.get("stopped") else ""
            self.console.print(
                f"[bold]done[/bold]: held-out pass rate {summary['warm_start_pass_rate']:.3f} -> "
                f"{summary['final_pass_rate']:.3f} in {summary['wall_s']:.0f}s; summary in "
                f"{self.out / 'summary.json'}{stopped}"
            )
            for name, source in (summary.get("eval_sources") or {}).items():
                self.console.print(f"  {name}: {source_change(source)}")



class SilentMonitor:
    """The monitor of a process that is not the main one in a multi-process run: the main process
    alone writes metrics.jsonl and draws the console, so this one says and writes nothing."""

    def __init__(self, out: Path | str, total: int = 0):
        self.out, self.total, self.rows = Path(out), total, []

    def say(self, text: str) -> None:
        pass

    def sft_progress(self, m: dict[str, Any]) -> None:
        pass

    def log(self, metrics: dict[str, Any]) -> None:
        pass

    def position(self) -> dict[str, Any]:
        return {}

    def rewind(self, position: dict[str, Any]) -> None:
        pass

    def close(self, summary: dict[str, Any] | None = None) -> None:
        pass
