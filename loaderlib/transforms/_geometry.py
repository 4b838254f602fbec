"""Geometry: crops, resizes, flips, rotations and affine warps (torchvision v2's ``_geometry``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .._ext import _transform
from ._base import (
    _PAD_MODES,
    ImageSpec,
    Size,
    Transform,
    _Augment,
    _check_image,
    _degrees,
    _fill4,
    _interp,
    _number,
    _pair,
    _policy_fill,
    _resize,
    _unit_range,
)
from ._rng import _Rng, _rrc_params


@dataclass(frozen=True)
class RandomResizedCrop(Transform):
    """Crop a random box and resize it to ``size`` (torchvision semantics).

    The box has an area fraction uniform in ``scale`` and an aspect ratio log-uniform in
    ``ratio``; up to 10 attempts, then the central crop (torchvision's ``get_params``,
    with this library's generator).

    Parameters
    ----------
    size : int or (height, width)
    scale : (float, float)
    ratio : (float, float)
    interpolation : {"bilinear", "area", "nearest"}
    antialias : bool
        True (default, as torchvision v2): bilinear downscaling by a factor ``a > 1`` uses
        the triangle filter of half-width ``a`` (Pillow's BILINEAR, torchvision's
        ``antialias=True``), so a small crop of a large image does not alias, and the fused
        chain (which decodes DCT-scaled, NOTE [ DCT scale choice ]) and the same chain
        called on a decoded image agree within 1 level on average. False: plain two-tap
        bilinear (``cv2.INTER_LINEAR``), cheaper, aliases on strong reductions. Ignored for
        "area" (already a box average) and "nearest".
    """

    size: Size
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    interpolation: str = "bilinear"
    antialias: bool = True

    random = True

    def __post_init__(self) -> None:
        _pair(self.size, "size")
        _interp(self.interpolation)
        s0, s1 = (float(v) for v in self.scale)
        r0, r1 = (float(v) for v in self.ratio)
        if not (0 < s0 <= s1):
            raise ValueError(f"scale must satisfy 0 < min <= max, got {self.scale!r}")
        if not (0 < r0 <= r1):
            raise ValueError(f"ratio must satisfy 0 < min <= max, got {self.ratio!r}")

    @property
    def hw(self) -> tuple[int, int]:
        return _pair(self.size, "size")

    def get_params(self, width: int, height: int, rng: _Rng) -> tuple[int, int, int, int]:
        """The box ``(top, left, height, width)`` for an image of this size."""
        return _rrc_params(rng, width, height, self.scale, self.ratio)

    def _apply(self, img: np.ndarray, rng: _Rng) -> np.ndarray:
        img = _check_image(img, "RandomResizedCrop")
        i, j, h, w = self.get_params(img.shape[1], img.shape[0], rng)
        oh, ow = self.hw
        return _resize(img[i:i + h, j:j + w], oh, ow, self.interpolation, self.antialias)

    def plan(self, spec: ImageSpec) -> ImageSpec:
        oh, ow = self.hw
        return replace(spec, height=oh, width=ow)


@dataclass(frozen=True)
class Resize(Transform):
    """Resize (torchvision semantics).

    ``Resize(int)`` matches the shorter side keeping the aspect ratio (the longer side
    becomes ``int(size * long / short)``); ``Resize((h, w))`` is exact.

    Parameters
    ----------
    size : int or (height, width)
    interpolation : {"bilinear", "area", "nearest"}
        Bilinear (with ``antialias=False``, or when upscaling) and area agree with
        ``cv2.INTER_LINEAR`` / ``cv2.INTER_AREA`` within +-1;
        nearest takes the pixel under each output pixel's centre, index
        ``floor((o + 0.5) * in / out)`` (torchvision's "nearest-exact").
    antialias : bool
        As in :class:`RandomResizedCrop` (on by default, as torchvision v2).
    """

    size: Size
    interpolation: str = "bilinear"
    antialias: bool = True

    def __post_init__(self) -> None:
        _pair(self.size, "size")
        _interp(self.interpolation)

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        if isinstance(self.size, (int, np.integer)):
            s = int(self.size)
            if width <= height:
                return int(s * height / width), s
            return s, int(s * width / height)
        return _pair(self.size, "size")

    def _apply(self, img: np.ndarray, rng: _Rng) -> np.ndarray:
        img = _check_image(img, "Resize")
        oh, ow = self.output_size(img.shape[0], img.shape[1])
        return _resize(img, oh, ow, self.interpolation, self.antialias)

    def plan(self, spec: ImageSpec) -> ImageSpec:
        if not isinstance(self.size, (int, np.integer)):
            oh, ow = _pair(self.size, "size")
        elif spec.height is not None and spec.width is not None:
            oh, ow = self.output_size(spec.height, spec.width)
        else:
            oh = ow = None
        return replace(spec, height=oh, width=ow)


def _center_offset(n: int, length: int) -> int:
    """torchvision's CenterCrop offset; negative when it pads."""
    if length > n:
        return -((length - n) // 2)
    return round((n - length) / 2.0)


@dataclass(frozen=True)
class CenterCrop(Transform):
    """Crop the centre (torchvision semantics: an int gives a square; a crop larger than
    the image pads it with zeros)."""

    size: Size

    def __post_init__(self) -> None:
        _pair(self.size, "size")

    def _apply(self, img: np.ndarray, rng: _Rng) -> np.ndarray:
        img = _check_image(img, "CenterCrop")
        ch, cw = _pair(self.size, "size")
        H, W = img.shape[:2]
        top, left = _center_offset(H, ch), _center_offset(W, cw)
        if top >= 0 and left >= 0:
            return np.ascontiguousarray(img[top:top + ch, left:left + cw])
        out = np.zeros((ch, cw, img.shape[2]), img.dtype)
        y0, x0 = max(top, 0), max(left, 0)
        y1, x1 = min(top + ch, H), min(left + cw, W)
        out[y0 - top:y1 - top, x0 - left:x1 - left] = img[y0:y1, x0:x1]
        return out

    def plan(self, spec: ImageSpec) -> ImageSpec:
        ch, cw = _pair(self.size, "size")
        return replace(spec, height=ch, width=cw)


@dataclass(frozen=True)
class RandomHorizontalFlip(Transform):
    """Mirror left-right with probability ``p`` (draw 0 of the transform's stream < p)."""

    p: float = 0.5

    random = True

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.p) <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {self.p!r}")

    def flips(self, rng: _Rng) -> bool:
        return rng.uniform(0) < self.p

    def _apply(self, img: np.ndarray, rng: _Rng) -> np.ndarray:
        img = _check_image(img, "RandomHorizontalFlip")
        return np.ascontiguousarray(img[:, ::-1]) if self.flips(rng) else img

    def plan(self, spec: ImageSpec) -> ImageSpec:
        return spec


@dataclass(frozen=True)
class RandomCrop(_Augment):
    """Crop a random ``size`` window after optional padding (torchvision v2 semantics).

    Parameters
    ----------
    size : int or (height, width)
    padding : int or sequence, optional
        One value for all sides, ``(left/right, top/bottom)`` or ``(left, top, right, bottom)``.
    pad_if_needed : bool
        Pad an image smaller than ``size`` (on both sides by the shortfall, as torchvision).
    fill : number or sequence
        Value of constant padding.
    padding_mode : {"constant", "edge", "reflect", "symmetric"}
    """

    size: Size
    padding: Any = None
    pad_if_needed: bool = False
    fill: Any = 0
    padding_mode: str = "constant"

    _kind = _transform.AUG_RANDOM_CROP

    def __post_init__(self) -> None:
        _pair(self.size, "size")
        if self.padding_mode not in _PAD_MODES:
            raise ValueError(f"padding_mode must be one of {sorted(_PAD_MODES)}, got {self.padding_mode!r}")
        if _fill4(self.fill) is None:
            raise TypeError("fill must be a number or a sequence of 1 or 3 numbers, got None")
        self._pads()

    def _pads(self) -> tuple[int, int, int, int]:
        """(left, right, top, bottom)."""
        p = self.padding
        if p is None:
            return (0, 0, 0, 0)
        if isinstance(p, (int, np.integer)) and not isinstance(p, bool):
            vals = [int(p)] * 4
        elif isinstance(p, Sequence) and not isinstance(p, str) and len(p) in (1, 2, 4) and all(
                isinstance(v, (int, np.integer)) for v in p):
            q = [int(v) for v in p]
            vals = q * 4 if len(q) == 1 else ([q[0], q[0], q[1], q[1]] if len(q) == 2 else [q[0], q[2], q[1], q[3]])
        else:
            raise TypeError(f"padding must be an int or a sequence of 1, 2 or 4 ints, got {p!r}")
        if any(v < 0 for v in vals):
            raise ValueError(f"padding must be non-negative, got {p!r}")
        return tuple(vals)  # type: ignore[return-value]

    def _config(self) -> tuple[tuple, tuple]:
        h, w = _pair(self.size, "size")
        fill = _fill4(self.fill)
        assert fill is not None   # __post_init__ refused None
        return ((h, w, *self._pads(), int(bool(self.pad_if_needed)), 1),
                (float(_PAD_MODES[self.padding_mode]),) + (0.0,) * 11 + fill)

    def plan(self, spec: ImageSpec) -> ImageSpec:
        h, w = _pair(self.size, "size")
        return replace(super().plan(spec), height=h, width=w)


@dataclass(frozen=True)
class RandomRotation(_Augment):
    """Rotate by an angle uniform in ``degrees`` (counter-clockwise, torchvision v2 semantics;
    ``expand=False`` only, so the size is kept)."""

    degrees: Any
    interpolation: str = "nearest"
    expand: bool = False
    center: Any = None
    fill: Any = 0

    _kind = _transform.AUG_ROTATION

    def __post_init__(self) -> None:
        object.__setattr__(self, "degrees", _degrees(self.degrees, "degrees"))
        if self.expand:
            raise ValueError("RandomRotation(expand=True) changes the image size per sample; only expand=False "
                             "is supported")
        if self.center is not None:
            _unit_range(self.center, "center")
        _policy_fill(self.fill, self.interpolation)

    def _config(self) -> tuple[tuple, tuple]:
        (bil, has_fill), fill = _policy_fill(self.fill, self.interpolation)
        c = (0.0, 0.0) if self.center is None else _unit_range(self.center, "center")
        return ((int(self.center is not None), 0, 0, 0, 0, 0, bil, has_fill),
                (*self.degrees, *c) + (0.0,) * 8 + tuple(fill))


@dataclass(frozen=True)
class RandomAffine(_Augment):
    """Random affine map (torchvision v2 semantics): angle uniform in ``degrees`` (clockwise,
    as torchvision's affine), translation uniform in ``+-translate * size`` rounded, scale
    uniform in ``scale``, shear uniform in ``shear`` (a number s: x in (-s, s); 2 values: x
    range; 4 values: x and y ranges)."""

    degrees: Any
    translate: Any = None
    scale: Any = None
    shear: Any = None
    interpolation: str = "nearest"
    fill: Any = 0
    center: Any = None

    _kind = _transform.AUG_AFFINE

    def __post_init__(self) -> None:
        object.__setattr__(self, "degrees", _degrees(self.degrees, "degrees"))
        if self.translate is not None:
            tx, ty = _unit_range(self.translate, "translate")
            if not (0.0 <= tx <= 1.0 and 0.0 <= ty <= 1.0):
                raise ValueError(f"translation values should be between 0 and 1, got {self.translate!r}")
            object.__setattr__(self, "translate", (tx, ty))
        if self.scale is not None:
            s0, s1 = _unit_range(self.scale, "scale")
            if not 0.0 < s0 <= s1:
                raise ValueError(f"scale values should be positive and (min, max), got {self.scale!r}")
            object.__setattr__(self, "scale", (s0, s1))
        if self.shear is not None:
            if _number(self.shear):
                sh: tuple = _degrees(self.shear, "shear")
            elif isinstance(self.shear, Sequence) and len(self.shear) in (2, 4) and all(map(_number, self.shear)):
                sh = tuple(float(v) for v in self.shear)
                if sh[0] > sh[1] or (len(sh) == 4 and sh[2] > sh[3]):
                    raise ValueError(f"shear ranges must be (min, max), got {self.shear!r}")
            else:
                raise TypeError(f"shear should be a number or a sequence of 2 or 4 numbers, got {self.shear!r}")
            object.__setattr__(self, "shear", sh)
        if self.center is not None:
            _unit_range(self.center, "center")
        _policy_fill(self.fill, self.interpolation)

    def _config(self) -> tuple[tuple, tuple]:
        (bil, has_fill), fill = _policy_fill(self.fill, self.interpolation)
        sh = tuple(self.shear or ())
        c = (0.0, 0.0) if self.center is None else _unit_range(self.center, "center")
        dbls = (*self.degrees, *(self.translate or (0.0, 0.0)), *(self.scale or (1.0, 1.0)),
                *(sh + (0.0,) * (4 - len(sh))), *c, *fill)
        return ((int(self.translate is not None), int(self.scale is not None), len(sh), int(self.center is not None),
                 0, 0, bil, has_fill), dbls)
