"""A run's folder, and what keeps it whole: config.yaml and the decisions made before the run, the console and
metrics.jsonl (the monitor), checkpoints, what a resume reads back, the signals that end a run with a
checkpoint, and summary.json.

    <run>/config.yaml            the resolved config (with a header saying what was decided before the run)
    <run>/decisions.json         the same decisions, read back exactly by a run resumed before its first checkpoint
    <run>/metrics.jsonl          one row per update (agentrl.monitor)
    <run>/store/*.parquet        every rollout (agentrl.store), cut back to the checkpoint on a resume
    <run>/checkpoints/update_*   what --resume continues from (agentrl.checkpoint: atomic, checksummed)
    <run>/checkpoint/            the trained model as an ordinary Hugging Face folder
    <run>/summary.json           written last, atomically

Several processes: the main process writes every file; the others wait where it matters (`Ranks.barrier`).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentrl.checkpoint import clear_run, latest
from agentrl.checkpoint import write as write_checkpoint
from agentrl.config import TrainConfig
from agentrl.distributed import Ranks
from agentrl.monitor import Monitor, SilentMonitor
from agentrl.store import truncate_store

CHECKPOINTS = "checkpoints"  # <run>/checkpoints/update_XXXXX: what --resume continues from
DECISIONS = "decisions.json"  # <run>/decisions.json: what was decided before the run (e.g. --algo auto's pick)
SHARDED = ("FSDP", "DEEPSPEED")  # accelerate's distributed types whose optimizer state is sharded over the ranks


class ResumeUnsupported(ValueError):
    """This run cannot be resumed here (its optimizer state is sharded over the ranks: FSDP, DeepSpeed ZeRO)."""


class RunFolder:
    """Opens `cfg.out` (default `runs/<algo>-<time>`, one name for every rank: the main process's clock decides),
    refusing a folder that holds another run unless `resume` or `overwrite`; `monitor` is the console and
    metrics.jsonl (built here when None, silent on the other ranks)."""

    def __init__(self, cfg: TrainConfig, ranks: Ranks, decisions: dict[str, Any], resume: bool = False,
                 overwrite: bool = False, monitor: Monitor | None = None):
        self.ranks = ranks
        self.out = Path(ranks.broadcast(cfg.out or f"runs/{cfg.algo}-{time.strftime('%Y%m%d-%H%M%S')}"))
        ranks.together(f"opening the run folder {self.out}",
                       lambda: self._open(cfg, decisions, resume, overwrite) if ranks.main else None)
        if ranks.main:
            self.monitor = monitor or Monitor(self.out, total=cfg.updates, tensorboard=cfg.log.tensorboard,
                                              wandb=cfg.log.wandb, wandb_project=cfg.log.wandb_project,
                                              config=cfg.model_dump(mode="json"))
        else:
            self.monitor = SilentMonitor(self.out, cfg.updates)
        self.signal: int | None = None  # SIGTERM / SIGINT received: finish the update, save, exit

    def _open(self, cfg: TrainConfig, decisions: dict[str, Any], resume: bool, overwrite: bool) -> None:
        """(The main process) make the folder and write config.yaml, refusing a folder with another run."""
        if overwrite:
            clear_run(self.out)
        elif not resume and holds_run(self.out):
            raise FileExistsError(f"{self.out} holds a run already (metrics.jsonl); resume it (agentrl train --resume "
                                  f"{self.out}), overwrite it (--overwrite), or choose another --out")
        self.out.mkdir(parents=True, exist_ok=True)
        if not resume or not (self.out / "config.yaml").exists():  # a resumed run keeps its own (and its header)
            (self.out / "config.yaml").write_text(_decisions_header(decisions) + cfg.to_yaml())
            if decisions:  # and, read back exactly, for a run resumed before its first checkpoint
                _write_atomic(self.out / DECISIONS, json.dumps(decisions, indent=1))

    @property
    def store(self) -> Path:
        return self.out / "store"

    # -- checkpoints --------------------------------------------------------------------------------

    def latest(self) -> tuple[Path, dict[str, Any]] | None:
        """The newest checkpoint that verifies (the main process looks; every rank gets its answer)."""
        found = None
        if self.ranks.main:
            found = latest(self.out / CHECKPOINTS, warn=lambda m: self.monitor.say(f"[yellow]warning[/yellow]: {m}"))
        return self.ranks.broadcast(found)

    def save(self, update: int, files: dict[str, Any], keep: int) -> Path:
        """(The main process) write `update`'s checkpoint of `files` (agentrl.checkpoint.write)."""
        return write_checkpoint(self.out / CHECKPOINTS, update, files, keep=keep)

    def saved_decisions(self) -> dict[str, Any]:
        """What the first start of this run decided (decisions.json), for a resume that finds no checkpoint."""
        path = self.out / DECISIONS
        return json.loads(path.read_text()) if path.is_file() else {}

    def cut_store(self, update: int) -> None:
        """(The main process) drop the rollouts of updates after `update`: a resumed run rolls them out again."""
        if self.ranks.main:
            truncate_store(self.store, update)

    def write_summary(self, summary: dict[str, Any]) -> None:
        if self.ranks.main:  # atomically: a kill leaves the old file or the new, never half
            _write_atomic(self.out / "summary.json", json.dumps(summary, indent=2))

    # -- signals: finish the update, save a checkpoint, exit as the signal would -------------------------

    @contextmanager
    def catching_signals(self, main_thread: bool) -> Iterator[None]:
        """SIGTERM and SIGINT set `self.signal` (a second one stops at once) while the run is in here."""
        handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)} \
            if main_thread else {}
        try:
            yield
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.signal is not None:  # a second Ctrl-C: stop now, without the checkpoint
            raise KeyboardInterrupt
        self.signal = signum
        self.monitor.say(f"[yellow]{signal.Signals(signum).name}[/yellow]: finishing this update, then saving a "
                         "checkpoint (again to stop at once)")

    def agree_on_signal(self) -> None:
        """A signal that reached one rank stops every rank after this update (they save one checkpoint)."""
        if self.ranks.world > 1:
            self.signal = max(self.ranks.gather(self.signal or 0)) or None

    def exit_on_signal(self, done: int) -> None:
        """After a signal: the checkpoint is saved; say how to go on and exit as the signal would (128 + its number)."""
        if self.signal is None:
            return
        name = signal.Signals(self.signal).name
        self.monitor.say(f"{name} at update {done}: checkpoint saved; resume with: agentrl train --resume {self.out}")
        self.monitor.close()
        raise SystemExit(128 + self.signal)


def refuse_sharded(kind: str, out: Any, saved: str | None = None) -> None:
    """Refuse a resume under FSDP / DeepSpeed (`kind`, accelerate's distributed type), or of a checkpoint
    (`saved`, its folder's name) that was written under one."""
    if kind not in SHARDED:
        return
    what = f"its checkpoint {saved} was saved under {kind}" if saved else f"this launch trains under {kind}"
    raise ResumeUnsupported(
        f"--resume {out}: {what}, and resuming a sharded run is not supported: the optimizer's state is sharded over "
        "the ranks and a checkpoint holds only the main process's share, so the resumed run would not continue the "
        "one saved (docs/distributed.md, 'Checkpoints'). Start a new run; runs trained with DDP (no FSDP or "
        "DeepSpeed config) resume")


def distributed_kind(distributed_type: Any) -> str:
    """accelerate's distributed type as a name ("NO", "MULTI_CPU", "FSDP", ...)."""
    return str(getattr(distributed_type, "value", distributed_type)).upper()


def holds_run(out: Path) -> bool:
    """Whether `out` holds (part of) a run: a second run's rows appended to its metrics.jsonl would mix two runs."""
    metrics = out / "metrics.jsonl"  # empty: a Monitor opened for this run by the caller, no rows yet
    return (metrics.exists() and metrics.stat().st_size > 0) or (out / CHECKPOINTS).exists() \
        or (out / "summary.json").exists()


def read_json(path: Path) -> Any:
    """A JSON file's content, or None where there is none (or it does not parse)."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _decisions_header(decisions: dict[str, Any]) -> str:
    """YAML comments (the file stays a loadable config) that say what the run decided before it began."""
    lines = ""
    auto = decisions.get("algo_auto")
    if auto:
        stats = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in auto["statistics"].items())
        lines += (f"# algo: {auto['algo']}, picked by --algo auto (the horizon probe), rule {auto['rule']}: "
                  f"{auto['reason']}\n# probe statistics: {stats}\n# thresholds: {auto['thresholds']}\n")
    fitted = decisions.get("pretrained_defaults")
    if fitted:  # agentrl.config.PRETRAINED, filled in by agentrl train for a pretrained --model
        filled = ", ".join(f"{k} {v}" for k, v in fitted["filled"].items()) or "none"
        lines += f"# a pretrained model's defaults (docs/models.md): {filled}; set by the user: {fitted['yours']}\n"
    return lines


__all__ = ["CHECKPOINTS", "DECISIONS", "ResumeUnsupported", "RunFolder", "holds_run", "refuse_sharded"]
