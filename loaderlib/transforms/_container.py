"""Compose: a chain of transforms (torchvision v2's ``_container``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._base import ImageSpec, Transform
from ._misc import Decode, ToCHW
from ._rng import _fresh_seed, _Rng


def _flatten(items: Sequence[Any]) -> list:
    out: list = []
    for t in items:
        if isinstance(t, Compose):
            out.extend(t.steps)
        else:
            out.append(t)
    return out


@dataclass(frozen=True)
class Compose(Transform):
    """Apply transforms in order; nested Composes are flattened.

    Any Python callable ``f(img) -> img`` may appear in the list: the chain then still
    works (and plans the steps it knows), but a loader runs it in Python instead of
    fusing it.

    Calling a Compose applies the steps one by one (each with its own position's
    randomness): this is the reference the fused native chain is tested against.
    """

    transforms: Sequence[Callable]

    def __post_init__(self) -> None:
        steps = tuple(_flatten(list(self.transforms)))
        for t in steps:
            if not callable(t):
                raise TypeError(f"Compose items must be callable, got {type(t).__name__}")
        object.__setattr__(self, "transforms", steps)

    @property
    def steps(self) -> tuple:
        """The flattened list of transforms."""
        return tuple(self.transforms)

    @property
    def random(self) -> bool:  # type: ignore[override]
        return any(getattr(t, "random", False) for t in self.steps)

    def positions(self) -> list[int]:
        """Each step's transform position (its index, not counting Decode)."""
        pos, out = 0, []
        for t in self.steps:
            out.append(pos)
            if not isinstance(t, Decode):
                pos += 1
        return out

    def __call__(self, img: Any, *, seed: int | None = None, epoch: int = 0, index: int = 0,
                 position: int = 0) -> Any:
        """Apply every step; ``position`` offsets the steps' positions."""
        if seed is None:
            seed = _fresh_seed()
        chw = False  # after ToCHW, later native steps see the image as HWC again
        for t, pos in zip(self.steps, self.positions()):
            rng = _Rng(seed, epoch, index, position + pos)
            if isinstance(t, ToCHW):
                if chw:
                    raise ValueError("ToCHW applied twice")
                img, chw = t._apply(img, rng), True
            elif isinstance(t, Transform) and chw:
                img = np.ascontiguousarray(t._apply(img.transpose(1, 2, 0), rng).transpose(2, 0, 1))
            elif isinstance(t, Transform):
                img = t._apply(img, rng)
            else:
                img = t(img)
        return img

    def _apply(self, img: Any, rng: _Rng) -> Any:  # pragma: no cover - Compose is flattened
        raise TypeError("a Compose is applied through __call__")

    def plan(self, spec: ImageSpec) -> ImageSpec:
        """Plan every step; a Python callable makes every dimension unknown."""
        for t in self.steps:
            if isinstance(t, Transform):
                spec = t.plan(spec)
            else:
                spec = ImageSpec(None, None, None, np.dtype(np.uint8), "HWC")
        return spec
