"""Colour: ColorJitter and RandomGrayscale (torchvision v2's ``_color``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._ext import _transform
from ._base import _Augment, _number, _range


@dataclass(frozen=True)
class ColorJitter(_Augment):
    """Randomly change brightness, contrast, saturation and hue (torchvision v2 semantics).

    A number ``v`` gives the factor range ``[max(0, 1 - v), 1 + v]`` (hue: ``[-v, v]``, at
    most 0.5); a pair is the range itself; None or 0 leaves that property alone. The
    enabled adjustments run in a random order (``torch.randperm(4)``), each factor uniform
    in its range.
    """

    brightness: Any = None
    contrast: Any = None
    saturation: Any = None
    hue: Any = None

    _kind = _transform.AUG_COLOR_JITTER

    def __post_init__(self) -> None:
        for name in ("brightness", "contrast", "saturation"):
            object.__setattr__(self, name, _range(getattr(self, name), name, 1.0, (0.0, float("inf")), True))
        object.__setattr__(self, "hue", _range(self.hue, "hue", 0.0, (-0.5, 0.5), False))

    def _config(self) -> tuple[tuple, tuple]:
        rs = (self.brightness, self.contrast, self.saturation, self.hue)
        dbls: list[float] = []
        for r in rs:
            dbls.extend(r if r is not None else (0.0, 0.0))
        return tuple(int(r is not None) for r in rs), tuple(dbls)


@dataclass(frozen=True)
class RandomGrayscale(_Augment):
    """Convert to grayscale (kept with as many channels) with probability ``p``."""

    p: float = 0.1

    _kind = _transform.AUG_GRAYSCALE

    def __post_init__(self) -> None:
        if not _number(self.p) or not 0.0 <= float(self.p) <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {self.p!r}")

    def _config(self) -> tuple[tuple, tuple]:
        return (), (float(self.p),)
