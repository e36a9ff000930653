"""Loading a user's module by name or by file, the way `agentrl ... --env my_env.py:MyEnv` names it.

Imports nothing from agentrl, so that the registry (`agentrl.registry`) and the adapters that load user
code (`agentrl.adapters.gym_text`) can both use it without importing each other.
"""

from __future__ import annotations

from typing import Any


def import_from_cwd(module: str) -> Any:
    """Import `module`, also from the current folder (as `python -m` would; console scripts don't),
    or from a file when `module` is a path ending in .py (`path/to/my_env.py`)."""
    import importlib
    import importlib.util
    import os
    import sys
    from pathlib import Path

    if module.endswith(".py"):
        path = Path(module).resolve()
        if not path.is_file():
            raise ModuleNotFoundError(f"no file {module} (from {os.getcwd()})", name=module)
        name = path.stem
        loaded = sys.modules.get(name)
        if loaded is not None:
            if Path(getattr(loaded, "__file__", "") or "").resolve() == path:
                return loaded
            raise ImportError(f"{module}: a different module named {name!r} is already imported "
                              f"({getattr(loaded, '__file__', 'built in')}); rename the file")
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"{module}: not a Python module")
        mod = importlib.util.module_from_spec(spec)
        # registered under its name so that its classes pickle by reference (worker pools) and a
        # second make() returns the same classes
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]
            raise
        return mod
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if os.getcwd() in sys.path or not (e.name and module.startswith(e.name)):
            raise
        sys.path.insert(0, os.getcwd())
        return importlib.import_module(module)


IMPORT_HINT = ("the module must be importable from here: run from the folder that holds it, add that folder to "
               "PYTHONPATH, install its package (pip install -e .), or name the file instead: path/to/my_env.py:MyEnv")
