"""Doctests (`--doctest-modules`, pyproject.toml) that need an optional package skip, naming the extra,
where that package is not installed; an installed package that fails to import still fails them.

The tests under tests/ do the same with `pytest.importorskip` at the top of their module. The
`dev` extra installs these packages, so CI runs all of them.
"""

from __future__ import annotations

import importlib.util

import pytest

# doctest (its module, or module.qualname) -> (the package it imports, the extra that installs it)
NEEDS: dict[str, tuple[str, str]] = {
    "agentrl.adapters.reasoning_gym_tasks": ("reasoning_gym", "reasoning-gym"),
    "agentrl.adapters.textarena_games": ("textarena", "textarena"),  # its hanoi_next_move needs nothing
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not isinstance(item, pytest.DoctestItem) or item.name not in NEEDS:
            continue
        package, extra = NEEDS[item.name]
        if importlib.util.find_spec(package) is None:
            item.add_marker(
                pytest.mark.skip(reason=f"{package} is not installed (pip install 'agentrl[{extra}]' or '.[dev]')")
            )
