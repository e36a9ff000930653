"""agentrl's logging: one `logging` logger tree under "agentrl", shown through rich by the CLI.

Library code logs (`log = logging.getLogger(__name__)`; `log.info(...)`) and never configures
logging on import; `agentrl` on the command line calls `setup()` once, which installs a rich
handler on the "agentrl" logger and quiets transformers' per-file progress bars (noise for a
few-MB model). A program that imports agentrl keeps its own logging configuration.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

LOGGER = "agentrl"


def say(name: str = LOGGER) -> Callable[[str], None]:
    """An `info` function for code that reports progress through a `say` callback."""
    return logging.getLogger(name).info


def duration(secs: float) -> str:
    """Seconds as a person reads an ETA.

    >>> duration(42.4), duration(640)
    ('42s', '10m40s')
    """
    secs = int(round(secs))
    return f"{secs // 60}m{secs % 60:02d}s" if secs >= 60 else f"{secs}s"


def setup(level: int = logging.INFO) -> None:
    """Rich console output for agentrl's loggers (the CLI's first step); idempotent."""
    from rich.logging import RichHandler

    root = logging.getLogger(LOGGER)
    if not any(isinstance(h, RichHandler) for h in root.handlers):
        handler = RichHandler(show_path=False, markup=True, rich_tracebacks=False, log_time_format="%H:%M:%S")
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
    # transformers reads this when it is first imported (later, by the command that needs it): importing it
    # here would cost a bad flag its sub-second answer
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.disable_progress_bar()
