"""The two moves every registry here makes: add an entry under its name, and find one by name with an
error that lists what is known. The registries stay plain dicts (ENGINES, ASSIGNERS, FORMATS, ...), so
reading them needs nothing from here.

>>> table = {}
>>> register(table, "torch", 1, what="engine")
1
>>> register(table, "torch", 2, what="engine")
Traceback (most recent call last):
...
ValueError: an engine named 'torch' is already registered (pass replace=True to override it)
>>> lookup(table, "vllm", what="engine")
Traceback (most recent call last):
...
ValueError: unknown engine 'vllm'; known: torch
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def register(table: dict[str, T], name: str, item: T, *, what: str, replace: bool = False) -> T:
    """`table[name] = item`, refused when the name is taken unless `replace`; returns `item`."""
    if name in table and not replace:
        article = "an" if what[:1].lower() in "aeiou" else "a"
        raise ValueError(f"{article} {what} named {name!r} is already registered (pass replace=True to override it)")
    table[name] = item
    return item


def lookup(table: dict[str, T], name: str, *, what: str) -> T:
    """`table[name]`, or a ValueError naming what is known."""
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(sorted(table))}") from None
