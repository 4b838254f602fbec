"""Element specs: :class:`TensorSpec` and :func:`spec_of`.

A leaf module (numpy and ``_tree`` only), so the datasets can describe their elements
(``Dataset.element_spec``) without importing the Pipeline wing, which imports them.
``loaderlib.pipeline`` exports ``TensorSpec``; ``_pipeline/spec.py`` builds the specs of
the pipeline's steps on these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ._tree import tree_map

__all__ = ["TensorSpec", "spec_of"]


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

    shape: tuple[int | None, ...]
    dtype: np.dtype

    # Written out (the dataclass keeps it) so that the parameters say what they take, any
    # dtype-like and any sequence of dimensions, while the fields hold the normalised values.
    def __init__(self, shape: Sequence[int | None], dtype: npt.DTypeLike) -> None:
        object.__setattr__(self, "shape", tuple(None if d is None else int(d) for d in shape))
        object.__setattr__(self, "dtype", np.dtype(dtype))

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

    return tree_map(leaf, value)
