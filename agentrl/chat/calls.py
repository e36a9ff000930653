"""What a parser makes of the policy's text: `ToolCall`, and the never-raising readers every family shares.

This module imports nothing from agentrl: `agentrl.core` imports it, never the other way round.
"""

from __future__ import annotations

import json
from collections.abc import Collection
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


def _stray_key(obj: dict[str, Any], name: str, arguments_key: str, allowed: Collection[str] = ()) -> str | None:
    """Why a call object is malformed when it holds a key besides "name", `arguments_key` and the family's
    `allowed` ones (Mistral's "id"), or None when it holds none.

    Such a key is most often the arguments written under another family's key ("parameters" where the
    family writes "arguments"): read as a call without arguments, it would hide the mistake from the policy.

    >>> _stray_key({"name": "f", "parameters": {"x": 1}}, "f", "arguments")
    "call to 'f' has key 'parameters'; this format writes its arguments under 'arguments'"
    """
    for key in obj:
        if key != "name" and key != arguments_key and key not in allowed:
            if arguments_key in obj:
                return (f"call to {_clip(name)!r} has key {_clip(key)!r} beside {arguments_key!r}, "
                        "which this format does not write")
            return (f"call to {_clip(name)!r} has key {_clip(key)!r}; this format writes its arguments "
                    f"under {arguments_key!r}")
    return None
