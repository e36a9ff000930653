"""Run metrics: `metrics.jsonl` (one JSON object per update), and the live console.

The console shows one row per update (update | pass rate | reward | entropy | KL | zero-adv |
tokens/s) under a progress bar; when output is not a terminal (CI, a log file) it prints the
same rows as plain lines.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

COLUMNS = [
    ("update", "step", "{:.0f}"),
    ("pass", "rollout/pass_rate", "{:.2f}"),
    ("held-out", "eval/pass_rate", "{:.2f}"),
    ("reward", "rollout/reward_mean", "{:.2f}"),
    ("entropy", "train/entropy", "{:.3f}"),
    ("KL", "train/kl", "{:.4f}"),
    ("zero-adv", "credit/zero_adv_frac", "{:.2f}"),
    ("turns", "rollout/turns_mean", "{:.1f}"),
    ("tok/s", "rollout/tokens_per_s", "{:.0f}"),
]


def _fmt(row: dict[str, Any], key: str, fmt: str) -> str:
    v = row.get(key)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return fmt.format(v)


class Monitor:
    """Writes metrics.jsonl and drives the console for one run."""

    def __init__(self, out: Path, total: int, console: Console | None = None, rows_shown: int = 12):
        self.out = Path(out)
        self.console = console or Console()
        self.total = total
        self.rows: list[dict[str, Any]] = []
        self.rows_shown = rows_shown
        self._file = open(self.out / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115 (kept open for the run)
        self._live: Live | None = None
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
            console=self.console,
        )
        self._task = None
        self._sft_task = None
        self._t0 = time.time()

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
        self._progress.update(self._sft_task, completed=m["sft/step"], description=f"SFT warm start  loss {m['sft/loss']:.3f}")
        if m["sft/step"] >= m["sft/steps"]:
            self._progress.stop()
            self._progress.remove_task(self._sft_task)

    def _table(self) -> Table:
        table = Table(box=None, header_style="bold")
        for name, _, _ in COLUMNS:
            table.add_column(name, justify="right")
        for row in self.rows[-self.rows_shown :]:
            table.add_row(*(_fmt(row, k, f) for _, k, f in COLUMNS))
        return table

    def log(self, metrics: dict[str, Any]) -> None:
        """Record one update's metrics (must hold `step`)."""
        record = {"time": round(time.time() - self._t0, 3), **metrics}
        self._file.write(json.dumps(record) + "\n")
        if metrics.get("final"):
            self.console.print(f"final held-out pass rate {metrics.get('eval/pass_rate', float('nan')):.3f}")
            return
        self.rows.append(record)
        if metrics.get("step", 0) == 0:
            return
        if not self.console.is_terminal:
            line = "  ".join(f"{name} {_fmt(record, k, f)}" for name, k, f in COLUMNS)
            self.console.print(line, highlight=False)
            return
        if self._live is None:
            self._task = self._progress.add_task("RL", total=self.total)
            self._live = Live(Group(self._table(), self._progress), console=self.console, refresh_per_second=4)
            self._live.start()
        self._progress.update(self._task, completed=metrics["step"])
        self._live.update(Group(self._table(), self._progress))

    def close(self, summary: dict[str, Any] | None = None) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        self._file.close()
        if summary:
            self.console.print(
                f"[bold]done[/bold]: held-out pass rate {summary['warm_start_pass_rate']:.3f} -> {summary['final_pass_rate']:.3f} "
                f"in {summary['wall_s']:.0f}s; summary in {self.out / 'summary.json'}"
            )
