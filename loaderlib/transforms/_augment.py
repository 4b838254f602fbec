"""RandomErasing (torchvision v2's ``_augment``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._ext import _transform
from ._base import ImageSpec, _Augment, _check_image, _number, _unit_range
from ._rng import _Rng


@dataclass(frozen=True)
class RandomErasing(_Augment):
    """Erase a random rectangle with probability ``p`` (torchvision v2 semantics), on the
    normalised float image: put it after Normalize (and ToCHW), as torchvision's recipe does.

    Parameters
    ----------
    p : float
    scale : (float, float)
        Erased area as a fraction of the image.
    ratio : (float, float)
        Aspect ratio range (log-uniform).
    value : number, sequence or "random"
        Fill value (per channel), or "random" for standard normal values.
    """

    p: float = 0.5
    scale: tuple[float, float] = (0.02, 0.33)
    ratio: tuple[float, float] = (0.3, 3.3)
    value: Any = 0.0

    _kind = _transform.AUG_ERASE

    def __post_init__(self) -> None:
        if not _number(self.p) or not 0.0 <= float(self.p) <= 1.0:
            raise ValueError(f"Random erasing probability should be between 0 and 1, got {self.p!r}")
        s0, s1 = _unit_range(self.scale, "scale")
        r0, r1 = _unit_range(self.ratio, "ratio")
        if s0 > s1 or r0 > r1:
            raise ValueError(f"Scale and ratio should be of kind (min, max), got {self.scale!r} and {self.ratio!r}")
        if s0 < 0 or s1 > 1:
            raise ValueError(f"Scale should be between 0 and 1, got {self.scale!r}")
        if r0 <= 0:
            raise ValueError(f"ratio must be positive, got {self.ratio!r}")
        v = self.value
        if isinstance(v, str):
            if v != "random":
                raise ValueError(f"If value is str, it should be 'random', got {v!r}")
        elif _number(v):
            v = (float(v),)
        elif isinstance(v, Sequence) and len(v) in (1, 3) and all(map(_number, v)):
            v = tuple(float(x) for x in v)
        else:
            raise TypeError(f"value should be a number, a sequence of 1 or 3 numbers or 'random', got {v!r}")
        object.__setattr__(self, "value", v)
        object.__setattr__(self, "scale", (s0, s1))
        object.__setattr__(self, "ratio", (r0, r1))

    def _config(self) -> tuple[tuple, tuple]:
        rnd = self.value == "random"
        vals = () if rnd else tuple(self.value)
        return ((int(rnd), len(vals)),
                (float(self.p), *self.scale, math.log(self.ratio[0]), math.log(self.ratio[1]),
                 *(vals + (0.0,) * (4 - len(vals)))))

    def _apply(self, img: np.ndarray, rng: _Rng) -> np.ndarray:
        img = _check_image(img, "RandomErasing")
        if img.dtype not in (np.float32, np.uint8):
            raise TypeError(f"RandomErasing takes float32 (after Normalize) or uint8 images, got {img.dtype}")
        if self.value != "random" and len(self.value) not in (1, img.shape[2]):
            raise ValueError(f"RandomErasing has {len(self.value)} values for an image with {img.shape[2]} channels")
        prm = self.get_params(img.shape[0], img.shape[1], img.shape[2], rng)
        out = np.array(img, copy=True, order="C")
        ints, dbls = self._config()
        return _transform.aug_erase(self._kind, ints, dbls, prm, rng.key, out, False)

    def apply_params(self, img: np.ndarray, params: np.ndarray, key: int = 0) -> np.ndarray:
        """Erase with given parameters (``key`` draws the values of ``value="random"``)."""
        ints, dbls = self._config()
        out = np.array(img, copy=True, order="C")
        return _transform.aug_erase(self._kind, ints, dbls, np.ascontiguousarray(params, np.float64), int(key), out,
                                    False)

    def plan(self, spec: ImageSpec) -> ImageSpec:
        if spec.channels is not None and self.value != "random" and len(self.value) not in (1, spec.channels):
            raise ValueError(f"RandomErasing has {len(self.value)} values for {spec.channels} channels")
        return spec

    def describe(self) -> str:
        return f"{self!r}: on the finished output (after Normalize), parameters drawn natively per sample"
