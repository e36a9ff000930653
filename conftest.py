"""Doctests (`--doctest-modules`, pyproject.toml) that need an optional package skip, naming the extra,
where that package is not installed; an installed package that fails to import still fails them.

The tests under tests/ do the same with `pytest.importorskip` at the top of their module. The
`dev` extra installs these packages but bfcl-eval, which .ci/run adds without its dependencies, so CI runs all
of them; a user's `pip install -e ".[dev]" && pytest` skips BFCL's.
"""

from __future__ import annotations

import importlib.util

import pytest

# doctest (its module, or module.qualname) -> (the package it imports, how to install it)
NEEDS: dict[str, tuple[str, str]] = {
    "agentrl.adapters.reasoning_gym_tasks": ("reasoning_gym", "pip install 'agentrl[reasoning-gym]' or '.[dev]'"),
    # its hanoi_next_move needs nothing
    "agentrl.adapters.textarena_games": ("textarena", "pip install 'agentrl[textarena]' or '.[dev]'"),
    # bfcl-eval goes in without its declared dependencies, which no extra can say (agentrl/adapters/bfcl.py)
    "agentrl.adapters.bfcl": ("bfcl_eval", "pip install 'agentrl[bfcl]' && pip install --no-deps bfcl-eval==2026.3.23"),
}


# doctests whose examples run programs in the real sandbox (the `sandbox` marker); the tests that do are
# marked by tests/conftest.py and tests/verify/sandbox/conftest.py
SANDBOX_DOCTESTS = {"agentrl.verify.sandbox", "agentrl.verify.sandbox.SandboxPool", "agentrl.verify.code"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if isinstance(item, pytest.DoctestItem) and item.name in SANDBOX_DOCTESTS:
            item.add_marker(pytest.mark.sandbox)
        if not isinstance(item, pytest.DoctestItem) or item.name not in NEEDS:
            continue
        package, how = NEEDS[item.name]
        if importlib.util.find_spec(package) is None:
            item.add_marker(pytest.mark.skip(reason=f"{package} is not installed ({how})"))
