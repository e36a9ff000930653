"""Plain data over the pipes between the judge and the worker, framed and bounded.

Frames: a 4-byte big-endian length, then UTF-8 JSON. Requests ``{"id", "fn", "args", "kwargs"}``;
replies ``{"id", "value"}`` or ``{"id", "error", "message"}``; the worker's first frame is
``{"id": 0, "loaded": true}`` or ``{"id": 0, "load_error": str}``. Values are *plain data* only
(ints, floats, strings, lists, tuples, dicts, sets, bytes, None), as tagged JSON, so an object
whose ``__eq__`` always says True cannot cross. The reader trusts nothing: a frame is bounded in
size, parsed with the parser's recursion caught, and decoded with nesting capped.
"""

import base64
import binascii
import json
import math
import os
import select
import struct
import time

MAX_FRAME = 8 * 1024 * 1024  # a larger reply is a protocol violation, not a crash
MAX_DEPTH = 64
# In the worker and in the judge alike, fd 3 is that process's end of the request pipe and fd 4 its
# end of the reply pipe: fixed numbers, so that no descriptor number travels in argv
FD_REQUESTS, FD_REPLIES = 3, 4


class CodecError(ValueError):
    pass


class ProtocolViolation(Exception):
    """The candidate's end of the pipe sent something that is not a valid message."""


def encode(obj, depth=0):
    """Plain data -> JSON-able value. Subclasses are converted to their exact base type with the
    base type's own methods, so an overridden ``__eq__``/``__str__`` cannot travel."""
    if depth > MAX_DEPTH:
        raise CodecError("value nested too deeply")
    if obj is None or obj is True or obj is False:
        return obj
    if isinstance(obj, bool):
        return bool(int.__int__(obj))
    if isinstance(obj, int):
        return int.__int__(obj)
    if isinstance(obj, float):
        x = float.__float__(obj)
        if math.isfinite(x):
            return x
        return {"$f": repr(x)}
    if isinstance(obj, str):
        return str.__getitem__(obj, slice(None))
    if isinstance(obj, (bytes, bytearray)):
        return {"$b": base64.b64encode(bytes(obj)).decode()}
    if isinstance(obj, complex):
        return {"$c": [complex.__getattribute__(obj, "real"), complex.__getattribute__(obj, "imag")]}
    if isinstance(obj, list):
        return [encode(x, depth + 1) for x in list.__iter__(obj)]
    if isinstance(obj, tuple):
        return {"$t": [encode(x, depth + 1) for x in tuple.__iter__(obj)]}
    if isinstance(obj, frozenset):
        return {"$fs": [encode(x, depth + 1) for x in frozenset.__iter__(obj)]}
    if isinstance(obj, set):
        return {"$s": [encode(x, depth + 1) for x in set.__iter__(obj)]}
    if isinstance(obj, dict):
        return {
            "$d": [
                [encode(k, depth + 1), encode(dict.__getitem__(obj, k), depth + 1)] for k in list(dict.__iter__(obj))
            ]
        }
    # numpy scalars and the like: accept only through the number protocols of exact types
    for base, conv in ((int, "__index__"), (float, "__float__")):
        if hasattr(type(obj), conv) and type(obj).__module__ == "numpy":
            return encode(base(getattr(obj, conv)()), depth)
    raise CodecError(f"cannot transfer a value of type {type(obj).__name__} (only plain data crosses the sandbox)")


def decode(val):
    """Tagged JSON -> plain data. Anything that `encode` cannot have produced is a `CodecError`
    (never a TypeError, a RecursionError or an unhashable set member escaping)."""
    try:
        return _decode(val, 0)
    except CodecError:
        raise
    except (TypeError, ValueError, binascii.Error, RecursionError, MemoryError, OverflowError) as e:
        raise CodecError(f"malformed value ({type(e).__name__})") from None


def _number(x):
    if type(x) not in (int, float):
        raise CodecError("malformed complex number")
    return float(x)


def _items(v, depth):
    if type(v) is not list:
        raise CodecError("malformed container")
    return [_decode(x, depth + 1) for x in v]


def _decode(val, depth):
    if depth > MAX_DEPTH:
        raise CodecError("value nested too deeply")
    if val is None or type(val) in (bool, int, float, str):
        return val
    if type(val) is list:
        return _items(val, depth)
    if type(val) is dict and len(val) == 1:
        ((tag, v),) = val.items()
        if tag == "$f" and v in ("inf", "-inf", "nan"):
            return float(v)
        if tag == "$b" and type(v) is str:
            return base64.b64decode(v, validate=True)
        if tag == "$c" and type(v) is list and len(v) == 2:
            return complex(_number(v[0]), _number(v[1]))
        if tag == "$t":
            return tuple(_items(v, depth))
        if tag == "$s":
            return set(_items(v, depth))
        if tag == "$fs":
            return frozenset(_items(v, depth))
        if tag == "$d" and type(v) is list:
            out = {}
            for pair in v:
                if type(pair) is not list or len(pair) != 2:
                    raise CodecError("malformed dict item")
                out[_decode(pair[0], depth + 1)] = _decode(pair[1], depth + 1)
            return out
    raise CodecError("malformed value")


def send(fd, obj):
    data = json.dumps(obj, allow_nan=False).encode()
    if len(data) > MAX_FRAME:
        raise CodecError(f"message of {len(data)} bytes exceeds {MAX_FRAME}")
    buf = struct.pack(">I", len(data)) + data
    while buf:
        n = os.write(fd, buf)
        buf = buf[n:]


def _read_exact(fd, n, deadline):
    chunks = []
    while n > 0:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv(fd, deadline=None):
    """One frame, parsed. Bytes that are not a bounded, well-formed JSON frame are a
    `ProtocolViolation` (the parser's RecursionError on ``[[[[...`` included)."""
    (n,) = struct.unpack(">I", _read_exact(fd, 4, deadline))
    if n > MAX_FRAME:
        raise ProtocolViolation(f"a message of {n} bytes (the limit is {MAX_FRAME})")
    data = _read_exact(fd, n, deadline)
    try:
        return json.loads(data)
    except (ValueError, RecursionError, MemoryError) as e:  # ValueError: bad UTF-8/JSON, a 5,000-digit int
        raise ProtocolViolation(f"a message that is not valid JSON ({type(e).__name__})") from None

