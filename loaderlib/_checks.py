"""Argument validation shared by every public entry point.

One helper per shape of argument, so a bad value gets the same message wherever it is
passed: ``check_int(0, "batch_size", minimum=1)`` raises ``ValueError: batch_size must be a
positive integer, got 0``.
"""

from __future__ import annotations

import re
from typing import Any, Literal, overload

import numpy as np


def _bound(minimum: int) -> str:
    if minimum == 1:
        return "a positive integer"
    if minimum == 0:
        return "a non-negative integer"
    return f"an integer >= {minimum}"


@overload
def check_int(value: Any, name: str, *, minimum: int = 0, maximum: int | None = None,
              allow_none: Literal[False] = False) -> int: ...
@overload
def check_int(value: Any, name: str, *, minimum: int = 0, maximum: int | None = None,
              allow_none: bool) -> int | None: ...
def check_int(value: Any, name: str, *, minimum: int = 0, maximum: int | None = None,
              allow_none: bool = False) -> int | None:
    """``value`` as a Python ``int`` when it is an integer (``bool`` is not) in
    ``[minimum, maximum]``; ``None`` passes through when ``allow_none``. Otherwise a
    ``ValueError`` naming the argument, the bound and the value given."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be {_bound(minimum)}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be {_bound(minimum)} <= {maximum}, got {value!r}")
    return int(value)


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value: Any, name: str = "size") -> int:
    """Bytes from a positive integer or a string such as ``"2GB"``, ``"512 MiB"``, ``"1.5g"``:
    KB/MB/GB/TB (and k/m/g/t) are powers of 1000, KiB/MiB/GiB/TiB powers of 1024, as
    ``ram_budget``, ``cache_limit`` and ``shard_size`` all read them. Anything else raises a
    ``ValueError`` naming the argument."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if value > 0:
            return int(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS:
            n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
            if n > 0:
                return n
    raise ValueError(f"{name} must be a positive number of bytes (an int) or a string such as '2GB' or "
                     f"'512MiB', got {value!r}")
