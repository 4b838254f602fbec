"""Argument validation shared by every public entry point.

One helper per shape of argument, so a bad value gets the same message wherever it is
passed: ``check_int(0, "batch_size", minimum=1)`` raises ``ValueError: batch_size must be a
positive integer, got 0``.
"""

from __future__ import annotations

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
