"""Every test here spawns the real sandbox: `pytest -m sandbox` selects them, `-m "not sandbox"` leaves them out."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # this hook sees the whole session's items, not only this folder's
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.sandbox)
