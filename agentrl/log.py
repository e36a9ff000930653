"""agentrl's logging: one `logging` logger tree under "agentrl", shown through rich by the CLI.

Library code logs (`log = logging.getLogger(__name__)`; `log.info(...)`) and never configures
logging on import; `agentrl` on the command line calls `setup()` once, which installs a rich
handler on the "agentrl" logger and quiets transformers' per-file progress bars (noise for a
few-MB model). A program that imports agentrl keeps its own logging configuration.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

LOGGER = "agentrl"


def say(name: str = LOGGER) -> Callable[[str], None]:
    """An `info` function for code that reports progress through a `say` callback."""
    return logging.getLogger(name).info


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
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers is a core dependency
        pass
