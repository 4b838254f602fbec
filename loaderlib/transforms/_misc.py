"""Decoding, normalization, layout and dtype steps, and the blur (torchvision v2's ``_misc`` and
``_type_conversion`` families)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .._ext import _transform
from ..decoding import DEFAULT_MAX_PIXELS, fast_flag, mode_code, strict_level
from ..decoding import decode as _decode_image
from ._base import (
    _CASTS,
    _NORMALIZE_DTYPES,
    ImageSpec,
    Transform,
    _Augment,
    _bfloat16_bits,
    _check_image,
    _dtype_name,
    _number,
    _reject_bfloat16_bits,
    _spec_dtype,
    _to_dtype,
    _unit_range,
)
from ._rng import _Rng


@dataclass(frozen=True)
class Decode(Transform):
    """Decode encoded image bytes to an HWC uint8 array.

    In a fused chain, the transforms that follow decide which region is decoded and at
    which DCT scale (NOTE [ DCT scale choice ] in ``pyx/include/ll_chain.h``).

    Parameters
    ----------
    mode : {"RGB", "BGR", "GRAY"}
        Channel order of the output (GRAY gives one channel).
    dct_scaling : bool
        Allow the fused chain to decode at 1/2, 1/4 or 1/8 scale when the output is small
        enough (the largest saving for ImageNet-style crops; pixels differ slightly from a
        full decode followed by a resize). False: always decode at full resolution.
    max_pixels : int or None
        Decompression-bomb guard (see :data:`loaderlib.decoding.DEFAULT_MAX_PIXELS`).
    strict : bool or None
        None (default): refuse truncated JPEGs, warn on other data libjpeg recovered from;
        True: refuse any such JPEG; False: keep partial images with a warning (PIL's
        ``LOAD_TRUNCATED_IMAGES``). See NOTE [ Truncated JPEG is an error ].
    fast : bool
        False (default): the exact decode, bitwise equal to OpenCV. True: libjpeg's fast
        integer IDCT and merged (non-fancy) chroma upsampling, the equivalent of tf.data's
        ``dct_method="INTEGER_FAST"`` with ``fancy_upscaling=False``: faster, with the
        error against the exact decode stated in :func:`loaderlib.decoding.decode`. With
        ``dct_scaling=False`` the fused chain equals the chain called step by step, as for
        the exact decode.

    Called on an already decoded numpy image, Decode returns it unchanged.
    """

    mode: str = "RGB"
    dct_scaling: bool = True
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    strict: bool | None = None
    fast: bool = False

    def __post_init__(self) -> None:
        mode_code(self.mode)  # the decoder's own checks: ValueError / TypeError with the choices
        strict_level(self.strict)
        object.__setattr__(self, "fast", fast_flag(self.fast))
        object.__setattr__(self, "mode", self.mode.upper())
        if self.strict is not None:
            object.__setattr__(self, "strict", bool(self.strict))

    @property
    def channels(self) -> int:
        return 1 if self.mode == "GRAY" else 3

    def _apply(self, img: Any, rng: _Rng) -> np.ndarray:
        if isinstance(img, np.ndarray) and img.ndim == 3:
            return img
        return _decode_image(img, mode=self.mode, max_pixels=self.max_pixels, strict=self.strict, fast=self.fast)

    def plan(self, spec: ImageSpec) -> ImageSpec:
        return ImageSpec(None, None, self.channels, np.dtype(np.uint8), "HWC")


@dataclass(frozen=True)
class Normalize(Transform):
    """``(x / 255 - mean) / std`` per channel, in float32 (``x`` of any dtype, values 0-255).

    Parameters
    ----------
    mean, std : sequence of float
        In 0-1 units (torchvision's ImageNet values work as they are), one per channel
        or a single value for all.
    dtype : {"float32", "float16", "bfloat16"}
        Output dtype. The arithmetic is float32 either way, rounded once to the output
        dtype (nearest even), so values equal ``Normalize(...)(x).astype(dtype)``. bfloat16
        comes as ``uint16`` bit patterns (NOTE [ bfloat16 as uint16 bits ]). Fused into
        the native chain like float32.
    """

    mean: tuple[float, ...]
    std: tuple[float, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _dtype_name(self.dtype, _NORMALIZE_DTYPES, "Normalize dtype"))
        mean = tuple(float(v) for v in np.atleast_1d(self.mean))
        std = tuple(float(v) for v in np.atleast_1d(self.std))
        if len(mean) != len(std):
            raise ValueError(f"mean and std need the same length, got {len(mean)} and {len(std)}")
        if any(s == 0 for s in std):
            raise ValueError("std must not contain zeros")
        if any(abs(m) > 1.5 for m in mean) or any(abs(s) > 1.5 for s in std):
            # torchvision's convention: x / 255 first, so mean and std are in 0-1 scale.
            raise ValueError(f"Normalize takes 0-1 scale mean and std (as torchvision: x / 255, then (x - mean) / "
                             f"std), got mean={mean}, std={std}: divide them by 255")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)

    def _apply(self, img: np.ndarray, rng: _Rng) -> np.ndarray:
        img = _check_image(img, "Normalize")
        _reject_bfloat16_bits(img, "Normalize")
        if len(self.mean) not in (1, img.shape[2]):
            raise ValueError(f"Normalize has {len(self.mean)} means for an image with {img.shape[2]} channels")
        mean = np.asarray(self.mean, np.float32)
        std = np.asarray(self.std, np.float32)
        return _to_dtype((img.astype(np.float32) / np.float32(255.0) - mean) / std, self.dtype)

    def plan(self, spec: ImageSpec) -> ImageSpec:
        if spec.channels is not None and len(self.mean) not in (1, spec.channels):
            raise ValueError(f"Normalize has {len(self.mean)} means for {spec.channels} channels")
        _reject_bfloat16_plan(spec, "Normalize")
        return replace(spec, dtype=_spec_dtype(self.dtype))


def _reject_bfloat16_plan(spec: ImageSpec, what: str) -> None:
    if spec.dtype == np.uint16:
        raise ValueError(f"{what} after a bfloat16 step: bfloat16 output ends the point-wise steps "
                         "(NOTE [ bfloat16 as uint16 bits ]); put the bfloat16 Normalize or Cast last")


@dataclass(frozen=True)
class ToCHW(Transform):
    """HWC to CHW (a layout change only: values and dtype are kept)."""

    def _apply(self, img: np.ndarray, rng: _Rng) -> np.ndarray:
        img = _check_image(img, "ToCHW")
        return np.ascontiguousarray(img.transpose(2, 0, 1))

    def plan(self, spec: ImageSpec) -> ImageSpec:
        if spec.layout == "CHW":
            raise ValueError("ToCHW applied twice")
        return replace(spec, layout="CHW")


@dataclass(frozen=True)
class Cast(Transform):
    """Convert the dtype, keeping values (``uint8`` from float rounds half to even and
    saturates to 0-255; no rescaling).

    ``float16`` and ``bfloat16`` round to nearest even (via float32 for bfloat16, which
    comes as ``uint16`` bit patterns: NOTE [ bfloat16 as uint16 bits ])."""

    dtype: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _dtype_name(self.dtype, _CASTS, "Cast"))

    def _apply(self, img: np.ndarray, rng: _Rng) -> np.ndarray:
        if not isinstance(img, np.ndarray):
            raise TypeError(f"Cast expects a numpy array, got {type(img).__name__}")
        _reject_bfloat16_bits(img, "Cast")
        if self.dtype == "uint8" and img.dtype != np.uint8:
            return np.clip(np.rint(img), 0, 255).astype(np.uint8)
        if self.dtype == "bfloat16":
            return _bfloat16_bits(img.astype(np.float32, copy=False))
        return img.astype(self.dtype)

    def plan(self, spec: ImageSpec) -> ImageSpec:
        _reject_bfloat16_plan(spec, "Cast")
        return replace(spec, dtype=_spec_dtype(self.dtype))


@dataclass(frozen=True)
class GaussianBlur(_Augment):
    """Gaussian blur with sigma uniform in ``sigma`` (torchvision v2 semantics).

    Parameters
    ----------
    kernel_size : int or (kx, ky)
        Odd and positive; ``(width, height)`` order as in torchvision.
    sigma : float or (min, max)
    """

    kernel_size: Any
    sigma: Any = (0.1, 2.0)

    _kind = _transform.AUG_BLUR

    def __post_init__(self) -> None:
        ks = (self.kernel_size, self.kernel_size) if _number(self.kernel_size) else self.kernel_size
        try:
            kx, ky = (int(v) for v in ks)
        except (TypeError, ValueError):
            raise TypeError(f"kernel_size should be an int or a sequence of 2 ints, got {self.kernel_size!r}") from None
        if kx <= 0 or ky <= 0 or kx % 2 == 0 or ky % 2 == 0:
            raise ValueError(f"kernel_size values should be odd and positive, got {self.kernel_size!r}")
        if _number(self.sigma):
            if self.sigma <= 0:
                raise ValueError(f"If sigma is a single number, it must be positive, got {self.sigma!r}")
            s0 = s1 = float(self.sigma)
        else:
            s0, s1 = _unit_range(self.sigma, "sigma")
            if not 0.0 < s0 <= s1:
                raise ValueError(f"sigma values should be positive and of the form (min, max), got {self.sigma!r}")
        object.__setattr__(self, "kernel_size", (kx, ky))
        object.__setattr__(self, "sigma", (s0, s1))

    def _config(self) -> tuple[tuple, tuple]:
        return tuple(self.kernel_size), tuple(self.sigma)
