"""Element specs of a Pipeline: shapes, dtypes and nested structure, known before the first element.

A spec is a nest (tuple, list or dict) of :class:`TensorSpec` leaves, like tf.data's
``element_spec``. ``None`` in a shape is a dimension that is not known before the data is
read (an image's height and width, the size of a batch that may come out short).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["TensorSpec", "batch_spec", "leaves", "map_structure", "relax", "spec_of", "unbatch_spec"]


@dataclass(frozen=True)
class TensorSpec:
    """The shape and dtype of one array of an element.

    Attributes
    ----------
    shape : tuple of (int or None)
        None for a dimension that is unknown before the data is read.
    dtype : numpy.dtype
        ``object`` for Python values that are not numbers (strings, dicts of those).
    """

    shape: tuple
    dtype: np.dtype

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(None if d is None else int(d) for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))

    def is_compatible_with(self, value: Any) -> bool:
        """Whether an array (or spec) fits this spec (unknown dimensions match anything)."""
        other = value if isinstance(value, TensorSpec) else spec_of(value)
        if not isinstance(other, TensorSpec) or other.dtype != self.dtype or len(other.shape) != len(self.shape):
            return False
        return all(a is None or b is None or a == b for a, b in zip(self.shape, other.shape))

    def __repr__(self) -> str:
        dims = ", ".join("None" if d is None else str(d) for d in self.shape)
        if len(self.shape) == 1:
            dims += ","
        return f"TensorSpec(shape=({dims}), dtype={self.dtype.name})"


def _is_leaf(x: Any) -> bool:
    return not isinstance(x, (tuple, list, dict))


def map_structure(fn: Callable[..., Any], *nests: Any) -> Any:
    """Apply ``fn`` to the leaves of nests of the same structure (tuples, lists, dicts)."""
    first = nests[0]
    if isinstance(first, dict):
        keys = list(first)
        for n in nests[1:]:
            if not isinstance(n, dict) or list(n) != keys:
                raise ValueError(f"structures differ: a dict with keys {keys} vs {_kind(n)}")
        return {k: map_structure(fn, *(n[k] for n in nests)) for k in keys}
    if isinstance(first, (tuple, list)):
        for n in nests[1:]:
            if type(n) is not type(first) or len(n) != len(first):
                raise ValueError(f"structures differ: {_kind(first)} vs {_kind(n)}")
        out = [map_structure(fn, *parts) for parts in zip(*nests)]
        return tuple(out) if isinstance(first, tuple) else out
    for n in nests[1:]:
        if not _is_leaf(n):
            raise ValueError(f"structures differ: a single value vs {_kind(n)}")
    return fn(*nests)


def _kind(x: Any) -> str:
    if isinstance(x, dict):
        return f"a dict with keys {list(x)}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)}"
    return "a single value"


def leaves(nest: Any) -> list:
    """The leaves of a nest, depth first (dicts in key order)."""
    out: list = []
    map_structure(out.append, nest)
    return out


def spec_of(value: Any) -> Any:
    """The spec of one element (a nest of arrays and Python values)."""

    def leaf(x: Any) -> TensorSpec:
        if isinstance(x, np.ndarray):
            return TensorSpec(x.shape, x.dtype)
        if isinstance(x, np.generic):
            return TensorSpec((), x.dtype)
        if isinstance(x, bool):
            return TensorSpec((), np.bool_)
        if isinstance(x, int):
            return TensorSpec((), np.int64)
        if isinstance(x, float):
            return TensorSpec((), np.float64)
        if hasattr(x, "shape") and hasattr(x, "dtype"):   # torch tensors and the like
            try:
                return TensorSpec(tuple(x.shape), np.dtype(str(x.dtype).replace("torch.", "")))
            except TypeError:
                pass
        return TensorSpec((), object)

    return map_structure(leaf, value)


def relax(a: Any, b: Any, what: str = "") -> Any:
    """The most specific spec both ``a`` and ``b`` fit (dimensions that differ become None).

    Raises ValueError when the structures, ranks or dtypes differ (``what`` prefixes the message).
    """

    def leaf(x: TensorSpec, y: TensorSpec) -> TensorSpec:
        if x.dtype != y.dtype:
            raise ValueError(f"{what}dtypes differ: {x.dtype.name} vs {y.dtype.name}")
        if len(x.shape) != len(y.shape):
            raise ValueError(f"{what}ranks differ: shape {x.shape} vs {y.shape}")
        return TensorSpec(tuple(p if p == q else None for p, q in zip(x.shape, y.shape)), x.dtype)

    try:
        return map_structure(leaf, a, b)
    except ValueError as e:
        msg = str(e)
        raise ValueError(msg if msg.startswith(what) else f"{what}{msg}") from None


def batch_spec(spec: Any, n: int | None) -> Any:
    """The spec of a batch of elements of ``spec`` (``n`` None: a batch may be short)."""
    return map_structure(lambda s: TensorSpec((n, *s.shape), s.dtype), spec)


def unbatch_spec(spec: Any) -> Any:
    """The spec of the rows of elements of ``spec``; ValueError for a scalar component."""

    def leaf(s: TensorSpec) -> TensorSpec:
        if not s.shape:
            raise ValueError(f"cannot unbatch a scalar component ({s!r}): every component needs a leading dimension")
        return TensorSpec(s.shape[1:], s.dtype)

    return map_structure(leaf, spec)
