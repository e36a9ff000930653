"""What a parser makes of the policy's text: `ToolCall`, and the never-raising readers every family shares.

This module imports nothing from agentrl: `agentrl.core` imports it, never the other way round.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call; `error` is set when the policy wrote it wrong (the text explains the mistake
    to the policy: it becomes the observation).

    >>> ToolCall("open", {"lock": 1})
    ToolCall(name='open', arguments={'lock': 1}, error=None)
    """

    name: str | None
    arguments: dict[str, Any]
    error: str | None = None


def _loads(raw: str) -> tuple[Any, str | None]:
    """`json.loads` that never raises: (value, None) or (None, why it is not a value we can use).

    A policy writes these strings, so every way the decoder can fail is an answer, not a crash:
    bad JSON, nesting deeper than the interpreter's recursion limit (RecursionError), an integer
    longer than Python's 4,300-digit conversion limit (ValueError).
    """
    try:
        return json.loads(raw), None
    except json.JSONDecodeError as e:
        return None, f"the tool call is not valid JSON ({e.msg} at char {e.pos})"
    except RecursionError:
        return None, "the tool call is nested too deeply to read"
    except ValueError as e:  # int() refuses more than sys.get_int_max_str_digits() digits
        return None, f"the tool call holds a number too long to read ({str(e)[:80]})"


def _clip(text: str, n: int = 80) -> str:
    """The policy's own text echoed back in an error, cut short: a 1 MB tool name must not make a 1 MB observation."""
    return text if len(text) <= n else text[:n] + f"... ({len(text) - n} more characters)"


def _as_arguments(value: Any) -> dict[str, Any] | None:
    """Arguments as an object, decoding a JSON string of one (some models write them so); None if not an object."""
    if isinstance(value, str):
        decoded, error = _loads(value)
        if error is None:
            value = decoded
    return value if isinstance(value, dict) else None
