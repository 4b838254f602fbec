"""Image transforms with torchvision semantics, fused natively when the chain allows it.

Every transform is a frozen dataclass (configuration only, safe to share between
threads) that

* works on one HWC ``uint8`` numpy image when called (``T.Resize(256)(img)``), and
* plans shapes: ``t.plan(spec) -> spec`` propagates an :class:`ImageSpec` (height,
  width, channels, dtype, layout) so that a batch arena can be sized before the first
  sample is decoded.

A chain made only of these transforms (in the order decode, geometry, point-wise,
layout) is compiled by :func:`loaderlib._chain.compile_chain` into one native pass per
sample (see NOTE [ Fused geometry ] in ``pyx/include/ll_chain.h``) that computes what the
chain computes step by step: the same boxes and flips, and resampling within +-1 level
(bitwise equal to calling the chain here when DCT scaling is off).

Randomness
----------
A random transform draws from a counter-based generator keyed by ``(seed, epoch,
sample index, transform position)`` (NOTE [ Counter-based sample randomness ] in
``pyx/include/ll_rng.h``); ``_Rng`` below is its bit-identical Python twin. The position
of a transform is its index in the flattened chain, not counting :class:`Decode`, so
``Compose([Decode(), RandomResizedCrop(224)])`` and ``Compose([RandomResizedCrop(224)])``
draw the same boxes. Calling a transform with ``seed=None`` (the default) draws a fresh
seed, so plain calls are random like torchvision's; pass ``seed``, ``epoch`` and
``index`` to reproduce exactly what the loader computed for that sample.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ._ext import _transform
from .decoding import DEFAULT_MAX_PIXELS, fast_flag, mode_code, strict_level
from .decoding import decode as _decode_image

__all__ = [
    "AutoAugment",
    "BatchTransform",
    "Cast",
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "CutMix",
    "Decode",
    "GaussianBlur",
    "ImageSpec",
    "MixUp",
    "Normalize",
    "RandAugment",
    "RandomAffine",
    "RandomChoice",
    "RandomCrop",
    "RandomErasing",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "RandomRotation",
    "Resize",
    "ToCHW",
    "Transform",
    "TrivialAugmentWide",
    "as_bfloat16",
    "random_resized_crop_box",
]

_M64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_INIT = 0x243F6A8885A308D3
_INTERP = {"bilinear": _transform.INTERP_LINEAR, "area": _transform.INTERP_AREA,
           "nearest": _transform.INTERP_NEAREST}
_CASTS = ("uint8", "float32", "float16", "bfloat16")
#: Output dtypes of Normalize.
_NORMALIZE_DTYPES = ("float32", "float16", "bfloat16")

# NOTE [ bfloat16 as uint16 bits ]
# numpy has no bfloat16, and ml_dtypes (which adds one) is an optional dependency: an
# output dtype that changed with what else is installed would change the arena plan, the
# saved state and every downstream check. So a bfloat16 image is always a ``uint16`` array
# holding the bfloat16 bit patterns (the upper half of the float32, rounded to nearest
# even). ``output="torch"`` and ``to_device`` hand out real bfloat16 tensors
# (``tensor.view(torch.bfloat16)``, zero-copy), and :func:`as_bfloat16` gives an ml_dtypes
# view where ml_dtypes is installed. A bfloat16 image ends the point-wise steps: a later
# Normalize or Cast would read the bit patterns as integers, so it raises.


def _bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """float32 values -> bfloat16 bit patterns (uint16), rounded to nearest even; NaN stays NaN."""
    x = np.asarray(x, np.float32)
    b = np.ascontiguousarray(x).view(np.uint32)
    rounded = ((b + (np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)).astype(np.uint16)
    quiet = ((b >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)   # keep sign, force a quiet NaN
    return np.where(np.isnan(x), quiet, rounded)


def _to_dtype(x: np.ndarray, name: str) -> np.ndarray:
    """float32 ``x`` in the output dtype ``name`` (float32, float16, or bfloat16 bits)."""
    if name == "bfloat16":
        return _bfloat16_bits(x)
    return x.astype(name, copy=False)


def _reject_bfloat16_bits(img: np.ndarray, what: str) -> None:
    if img.dtype == np.uint16:
        raise ValueError(f"{what} got a uint16 image: loaderlib's uint16 images hold bfloat16 bits, which end the "
                         "point-wise steps (NOTE [ bfloat16 as uint16 bits ]): put the bfloat16 Normalize or Cast last")


def _dtype_name(dtype: Any, allowed: tuple, what: str) -> str:
    if isinstance(dtype, str) and dtype == "bfloat16":
        return dtype
    try:
        name = np.dtype(dtype).name
    except TypeError:
        raise ValueError(f"{what} supports {allowed}, got {dtype!r}") from None
    if name not in allowed:
        raise ValueError(f"{what} supports {allowed}, got {dtype!r}")
    return name


def _spec_dtype(name: str) -> np.dtype:
    """The numpy dtype of a planned array of ``name`` (bfloat16 is uint16 bits)."""
    return np.dtype(np.uint16) if name == "bfloat16" else np.dtype(name)


def as_bfloat16(bits: np.ndarray) -> np.ndarray:
    """View bfloat16 bit patterns (a ``uint16`` batch) as ml_dtypes' ``bfloat16`` (zero-copy).

    Raises
    ------
    ImportError
        ml_dtypes is not installed (``pip install ml_dtypes``; JAX depends on it).
    """
    import ml_dtypes

    if not isinstance(bits, np.ndarray) or bits.dtype != np.uint16:
        raise TypeError(f"as_bfloat16 expects a uint16 array of bfloat16 bits, got "
                        f"{getattr(bits, 'dtype', type(bits).__name__)}")
    return bits.view(ml_dtypes.bfloat16)

Size = int | tuple[int, int]


# --------------------------------------------------------------------------- randomness


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


class _Rng:
    """The generator of NOTE [ Counter-based sample randomness ] (ll_rng.h), in Python.

    Draw ``c`` of the stream is a pure function of the key and ``c``; nothing is stateful.
    """

    __slots__ = ("key",)

    def __init__(self, seed: int, epoch: int, index: int, position: int):
        k = _INIT
        for x in (seed, epoch, index, position):
            k = _mix64(((k ^ (int(x) & _M64)) + _GAMMA) & _M64)
        self.key = k

    def u64(self, c: int) -> int:
        return _mix64((self.key + (c + 1) * _GAMMA) & _M64)

    def uniform(self, c: int) -> float:
        """53 random bits as a float in [0, 1)."""
        return (self.u64(c) >> 11) * (1.0 / 9007199254740992.0)

    def below(self, c: int, n: int) -> int:
        """An integer in [0, n): the high 64 bits of the 128-bit product u64 * n."""
        return (self.u64(c) * n) >> 64


class _GeneratorDraws:
    """numpy Generator draws in the interface of :class:`_Rng` (the counter is ignored)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def uniform(self, c: int) -> float:
        return float(self.rng.random())

    def below(self, c: int, n: int) -> int:
        return int(self.rng.integers(0, n))


def random_resized_crop_box(width: int, height: int, scale: tuple = (0.08, 1.0), ratio: tuple = (3 / 4, 4 / 3),
                            rng: np.random.Generator | None = None) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params``: ``(top, left, height, width)`` of a box.

    The one definition of the random-resized-crop box. The loader draws with its
    counter-based generator keyed by ``(seed, epoch, index)`` (bit-identical to the C
    kernel's ``ll_rrc_params``); this entry point draws from a numpy ``Generator`` (a new
    ``default_rng()`` when None), for baselines and one-off use.
    """
    return _rrc_params(_GeneratorDraws(rng if rng is not None else np.random.default_rng()), width, height,
                       scale, ratio)


def _rrc_params(rng: Any, width: int, height: int, scale: tuple, ratio: tuple) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` with draws from ``rng``.

    Attempt k uses draws 4k (area fraction, uniform in ``scale``), 4k+1 (aspect ratio,
    log-uniform in ``ratio``: exp of a uniform in [log r0, log r1)), 4k+2 (top) and 4k+3
    (left); after 10 failed attempts, the central crop with the ratio clamped (at least
    one pixel on each side, where torchvision's rounding would give an empty box). The
    arithmetic (double precision, round-half-even) is the same as ll_rrc_params in C.
    """
    area = float(width) * float(height)
    s0, s1 = float(scale[0]), float(scale[1])
    lr0, lr1 = math.log(ratio[0]), math.log(ratio[1])
    for k in range(10):
        target = area * (s0 + (s1 - s0) * rng.uniform(4 * k))
        ar = math.exp(lr0 + (lr1 - lr0) * rng.uniform(4 * k + 1))
        w = round(math.sqrt(target * ar))
        h = round(math.sqrt(target / ar))
        if 0 < w <= width and 0 < h <= height:
            i = rng.below(4 * k + 2, height - h + 1)
            j = rng.below(4 * k + 3, width - w + 1)
            return i, j, h, w
    in_ratio = float(width) / float(height)
    rmin, rmax = min(ratio), max(ratio)
    if in_ratio < rmin:
        w = width
        h = round(w / rmin)
    elif in_ratio > rmax:
        h = height
        w = round(h * rmax)
    else:
        w, h = width, height
    h, w = max(h, 1), max(w, 1)  # torchvision would return an empty box (and then fail)
    return (height - h) // 2, (width - w) // 2, h, w


def _fresh_seed() -> int:
    return random.getrandbits(64)


# --------------------------------------------------------------------------- shape plans


@dataclass(frozen=True)
class ImageSpec:
    """What a transform chain produces, known before any image is decoded.

    Attributes
    ----------
    height, width : int or None
        Output size in pixels; None when it depends on the image.
    channels : int or None
        3 for RGB/BGR, 1 for grayscale.
    dtype : numpy.dtype
        ``uint8`` until Normalize or Cast changes it.
    layout : {"HWC", "CHW"}
        Axis order of the array.
    encoded : bool
        True for the input of a chain that starts with :class:`Decode` (bytes).
    """

    height: int | None = None
    width: int | None = None
    channels: int | None = 3
    dtype: np.dtype = field(default_factory=lambda: np.dtype(np.uint8))
    layout: str = "HWC"
    encoded: bool = False

    @property
    def shape(self) -> tuple | None:
        """The array shape in ``layout`` order, or None if any dimension is unknown."""
        if self.height is None or self.width is None or self.channels is None:
            return None
        if self.layout == "CHW":
            return (self.channels, self.height, self.width)
        return (self.height, self.width, self.channels)


def _pair(size: Size, what: str) -> tuple[int, int]:
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        h = w = int(size)
    else:
        try:
            h, w = (int(v) for v in size)
        except (TypeError, ValueError):
            raise ValueError(f"{what} must be an int or a (height, width) pair, got {size!r}") from None
    if h < 1 or w < 1:
        raise ValueError(f"{what} must be positive, got {size!r}")
    return h, w


def _interp(name: str) -> int:
    try:
        return _INTERP[name]
    except KeyError:
        raise ValueError(f"interpolation must be one of {sorted(_INTERP)}, got {name!r}") from None


def _check_image(img: Any, what: str) -> np.ndarray:
    if not isinstance(img, np.ndarray) or img.ndim != 3:
        raise TypeError(f"{what} expects an HWC numpy image (H, W, C), got "
                        f"{type(img).__name__}{getattr(img, 'shape', '')}")
    if img.shape[2] not in (1, 2, 3, 4) and img.shape[0] in (1, 3, 4):
        # A CHW array would otherwise be cropped along channels and silently misshaped.
        raise ValueError(f"{what} expects an HWC image (H, W, C); {img.shape} looks like CHW: pass "
                         "img.transpose(1, 2, 0), or put ToCHW() last in the chain")
    return img


def _resize(img: np.ndarray, h: int, w: int, interp: str, antialias: bool) -> np.ndarray:
    """Resize an HWC image: uint8 with the native kernel, float images with OpenCV."""
    if img.shape[0] == h and img.shape[1] == w:
        return np.ascontiguousarray(img)
    if img.dtype == np.uint8 and 1 <= img.shape[2] <= 4:
        out = np.empty((h, w, img.shape[2]), np.uint8)
        _transform.resize_into(np.ascontiguousarray(img), out, _interp(interp), bool(antialias))
        return out
    from ._opencv import cv2

    flag = {"bilinear": cv2.INTER_LINEAR, "area": cv2.INTER_AREA, "nearest": cv2.INTER_NEAREST_EXACT}[interp]
    out = cv2.resize(np.ascontiguousarray(img), (w, h), interpolation=flag)
    return out.reshape(h, w, img.shape[2])


# --------------------------------------------------------------------------- transforms


class Transform:
    """Base class of loaderlib's native transforms.

    Subclasses implement ``_apply(img, rng)`` (HWC array in, array out; ``rng`` is the
    sample's generator for this transform's position) and ``plan(spec)``.
    """

    random = False

    def __call__(self, img: Any, *, seed: int | None = None, epoch: int = 0, index: int = 0,
                 position: int = 0) -> np.ndarray:
        """Apply to one image.

        Parameters
        ----------
        img : numpy.ndarray
            HWC image (uint8 unless an earlier step changed the dtype). :class:`Decode`
            also takes encoded bytes.
        seed, epoch, index, position : int
            The key of the sample's randomness (NOTE [ Counter-based sample randomness ]);
            ``seed=None`` draws a fresh seed.
        """
        if seed is None:
            seed = _fresh_seed()
        return self._apply(img, _Rng(seed, epoch, index, position))

    def _apply(self, img: Any, rng: _Rng) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def plan(self, spec: ImageSpec) -> ImageSpec:  # pragma: no cover - abstract
        raise NotImplementedError


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


# --------------------------------------------------------------------------- augmentations
#
# NOTE [ One sampler per augmentation ]
# An augmentation's random parameters are drawn in exactly one place, ll_aug_sample in
# pyx/include/ll_augment.h, from the counter-based generator keyed by (seed, epoch, index,
# position). The fused chain calls it per sample; a transform called here on one image calls
# the same function through _transform.aug_params with the same key, then the same kernel, so
# a preview is bitwise what the loader writes. ``get_params`` returns the raw parameter
# vector (its layout is listed per op in ll_augment.h).

_INTERP_AUG = ("nearest", "bilinear")
_PAD_MODES = {"constant": 0, "edge": 1, "reflect": 2, "symmetric": 3}
_AUG_OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
            "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def _range(value: Any, name: str, center: float, bound: tuple[float, float], clip: bool) -> tuple[float, float] | None:
    """torchvision ColorJitter's ``_check_input``: a number v gives [center - v, center + v]."""
    if value is None:
        return None
    if _number(value):
        if value < 0:
            raise ValueError(f"If {name} is a single number, it must be non negative, got {value!r}")
        lo, hi = center - float(value), center + float(value)
        if clip:
            lo = max(lo, 0.0)
    elif isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2 and all(map(_number, value)):
        lo, hi = (float(v) for v in value)
    else:
        raise TypeError(f"{name}={value!r} should be a single number or a sequence with length 2")
    if not bound[0] <= lo <= hi <= bound[1]:
        raise ValueError(f"{name} values should be between {bound}, but got {(lo, hi)}")
    return None if lo == hi == center else (lo, hi)


def _fill4(fill: Any, name: str = "fill") -> tuple[float, float, float, float] | None:
    if fill is None:
        return None
    if _number(fill):
        return (float(fill),) * 4
    if isinstance(fill, Sequence) and not isinstance(fill, str) and len(fill) in (1, 3) and all(map(_number, fill)):
        vals = [float(v) for v in fill]
        return tuple((vals * 4)[:4]) if len(vals) == 1 else (*vals, 0.0)  # type: ignore[return-value]
    raise TypeError(f"{name} must be a number or a sequence of 1 or 3 numbers, got {fill!r}")


def _interp_aug(name: str) -> int:
    if name not in _INTERP_AUG:
        raise ValueError(f"interpolation must be one of {_INTERP_AUG}, got {name!r}")
    return int(name == "bilinear")


def _degrees(value: Any, name: str) -> tuple[float, float]:
    if _number(value):
        if value < 0:
            raise ValueError(f"If {name} is a single number, it must be positive, got {value!r}")
        return (-float(value), float(value))
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2 and all(map(_number, value)):
        lo, hi = (float(v) for v in value)
        if lo > hi:
            raise ValueError(f"{name} must be (min, max) with min <= max, got {value!r}")
        return (lo, hi)
    raise TypeError(f"{name} should be a number or a sequence of 2 numbers, got {value!r}")


def _unit_range(value: Any, name: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} should be a sequence of 2 numbers, got {value!r}") from None
    return lo, hi


class _Augment(Transform):
    """Base of the native augmentations: parameters from ``ll_aug_sample``, pixels from
    ``ll_aug_apply`` (NOTE [ One sampler per augmentation ]). Subclasses give ``_kind`` and
    ``_config() -> (ints, doubles)``."""

    random = True
    _kind = 0

    def _config(self) -> tuple[tuple, tuple]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _op(self, position: int) -> tuple:
        ints, dbls = self._config()
        return (self._kind, int(position), ints, dbls)

    def get_params(self, height: int, width: int, channels: int, rng: _Rng) -> np.ndarray | None:
        """The raw parameter vector the fused chain draws for an image of this size (the
        layout is documented per op in ``pyx/include/ll_augment.h``); None when the image
        cannot take the op (a RandomCrop larger than the padded image)."""
        ints, dbls = self._config()
        return _transform.aug_params(self._kind, ints, dbls, rng.key, int(height), int(width), int(channels))

    def apply_params(self, img: np.ndarray, params: np.ndarray) -> np.ndarray:
        """Apply the op with given parameters (from :meth:`get_params`) to one HWC uint8 image."""
        ints, dbls = self._config()
        return _transform.aug_apply(self._kind, ints, dbls, np.ascontiguousarray(params, np.float64),
                                    np.ascontiguousarray(img))

    def _apply(self, img: np.ndarray, rng: _Rng) -> np.ndarray:
        name = type(self).__name__
        img = _check_image(img, name)
        if img.dtype != np.uint8 or img.shape[2] not in (1, 3):
            raise TypeError(f"{name} takes an HWC uint8 image with 1 or 3 channels (before Normalize), "
                            f"got {img.dtype} {img.shape}")
        prm = self.get_params(img.shape[0], img.shape[1], img.shape[2], rng)
        if prm is None:
            raise ValueError(f"{name}: the image ({img.shape[0]}x{img.shape[1]}) is smaller than the crop; "
                             "pass pad_if_needed=True or a padding")
        return self.apply_params(img, prm)

    def plan(self, spec: ImageSpec) -> ImageSpec:
        if spec.dtype != np.uint8:
            raise ValueError(f"{type(self).__name__} runs on uint8 images: put it before Normalize/Cast")
        return spec

    def describe(self) -> str:
        """One line for ``loader.explain()``."""
        return f"{self!r}: fused after the crop on the uint8 image, parameters drawn natively per sample"


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


def _policy_fill(fill: Any, interpolation: str) -> tuple[tuple, tuple]:
    f = _fill4(fill)
    return (_interp_aug(interpolation), int(f is not None)), (f or (0.0,) * 4)


@dataclass(frozen=True)
class TrivialAugmentWide(_Augment):
    """TrivialAugment Wide (torchvision v2): one op of 14 chosen uniformly, at a magnitude
    bin chosen uniformly from ``num_magnitude_bins``, signed ops negated with probability 1/2."""

    num_magnitude_bins: int = 31
    interpolation: str = "nearest"
    fill: Any = None

    _kind = _transform.AUG_TRIVIAL

    def __post_init__(self) -> None:
        if not isinstance(self.num_magnitude_bins, (int, np.integer)) or self.num_magnitude_bins < 2:
            raise ValueError(f"num_magnitude_bins must be an int >= 2, got {self.num_magnitude_bins!r}")
        _policy_fill(self.fill, self.interpolation)

    def _config(self) -> tuple[tuple, tuple]:
        (bil, has_fill), fill = _policy_fill(self.fill, self.interpolation)
        return (int(self.num_magnitude_bins), 0, 0, 0, 0, 0, bil, has_fill), (0.0,) * 12 + tuple(fill)


@dataclass(frozen=True)
class RandAugment(_Augment):
    """RandAugment (torchvision v2): ``num_ops`` ops chosen uniformly (with repetition) from
    14, each at bin ``magnitude`` of ``num_magnitude_bins``, signed ops negated with
    probability 1/2."""

    num_ops: int = 2
    magnitude: int = 9
    num_magnitude_bins: int = 31
    interpolation: str = "nearest"
    fill: Any = None

    _kind = _transform.AUG_RANDAUG

    def __post_init__(self) -> None:
        if not isinstance(self.num_ops, (int, np.integer)) or not 0 <= self.num_ops <= 19:
            raise ValueError(f"num_ops must be an int in [0, 19], got {self.num_ops!r}")
        if not isinstance(self.num_magnitude_bins, (int, np.integer)) or self.num_magnitude_bins < 2:
            raise ValueError(f"num_magnitude_bins must be an int >= 2, got {self.num_magnitude_bins!r}")
        if not isinstance(self.magnitude, (int, np.integer)) or not 0 <= self.magnitude < self.num_magnitude_bins:
            raise ValueError(f"magnitude must be an int in [0, num_magnitude_bins), got {self.magnitude!r}")
        _policy_fill(self.fill, self.interpolation)

    def _config(self) -> tuple[tuple, tuple]:
        (bil, has_fill), fill = _policy_fill(self.fill, self.interpolation)
        return ((int(self.num_ops), int(self.magnitude), int(self.num_magnitude_bins), 0, 0, 0, bil, has_fill),
                (0.0,) * 12 + tuple(fill))


@dataclass(frozen=True)
class AutoAugment(_Augment):
    """AutoAugment with torchvision's ImageNet policy: one of 25 sub-policies chosen
    uniformly, each of its two ops applied with its probability at its magnitude bin (of 10)."""

    policy: Any = "imagenet"
    interpolation: str = "nearest"
    fill: Any = None

    _kind = _transform.AUG_AUTOAUG

    def __post_init__(self) -> None:
        name = str(getattr(self.policy, "value", self.policy)).lower()
        if name != "imagenet":
            raise ValueError(f"AutoAugment supports policy='imagenet' natively, got {self.policy!r}")
        object.__setattr__(self, "policy", "imagenet")
        _policy_fill(self.fill, self.interpolation)

    def _config(self) -> tuple[tuple, tuple]:
        (bil, has_fill), fill = _policy_fill(self.fill, self.interpolation)
        return (0, 0, 0, 0, 0, 0, bil, has_fill), (0.0,) * 12 + tuple(fill)


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
        return ((h, w, *self._pads(), int(bool(self.pad_if_needed)), 1),
                (float(_PAD_MODES[self.padding_mode]),) + (0.0,) * 11 + tuple(_fill4(self.fill)))

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


# --------------------------------------------------------------------------- batch augmentations
#
# NOTE [ Batch augmentation randomness ]
# MixUp / CutMix draw from the counter-based generator keyed by (seed, epoch, batch index,
# _BATCH_POSITION): the batch index takes the place of the sample index and the position is
# beyond any chain's, so a batch's mix is a pure function of its place in the epoch (any
# thread count, resumable) and never reuses a sample's stream. lambda ~ Beta(alpha, alpha)
# is X / (X + Y) with X, Y ~ Gamma(alpha) by Marsaglia and Tsang's method (Box-Muller
# normals; alpha < 1 boosted by U ** (1 / alpha)), on counters 0, 1, 2, ...; the CutMix
# centre uses counters _BOX_CTR and _BOX_CTR + 1; RandomChoice's pick uses _CHOICE_CTR.

_BATCH_POSITION = 1 << 32
_BOX_CTR = 1 << 20
_CHOICE_CTR = (1 << 20) + 16


def _gamma_draw(rng: _Rng, alpha: float, c: int) -> tuple[float, int]:
    """One Gamma(alpha, 1) variate from counters c, c+1, ...; returns (value, next counter)."""
    boost = 1.0
    if alpha < 1.0:
        boost = (1.0 - rng.uniform(c)) ** (1.0 / alpha)
        c += 1
        alpha += 1.0
    d = alpha - 1.0 / 3.0
    k = 1.0 / math.sqrt(9.0 * d)
    for _ in range(10000):
        u1, u2 = rng.uniform(c), rng.uniform(c + 1)
        c += 2
        x = math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)
        v = (1.0 + k * x) ** 3
        if v <= 0.0:
            continue
        u = rng.uniform(c)
        c += 1
        if math.log(1.0 - u) < 0.5 * x * x + d - d * v + d * math.log(v):
            return d * v * boost, c
    return d * boost, c  # pragma: no cover - probability below 1e-300


def _beta_draw(rng: _Rng, alpha: float) -> float:
    x, c = _gamma_draw(rng, alpha, 0)
    y, _ = _gamma_draw(rng, alpha, c)
    return x / (x + y) if x + y > 0 else 0.5


def _batch_layout(images: np.ndarray, layout: str | None) -> str:
    if layout is not None:
        if layout not in ("CHW", "HWC"):
            raise ValueError(f"layout must be 'CHW' or 'HWC', got {layout!r}")
        return layout
    if images.shape[1] in (1, 3) and images.shape[3] not in (1, 3):
        return "CHW"
    if images.shape[3] in (1, 3):
        return "HWC"
    raise ValueError(f"cannot tell the layout of a {images.shape} batch: pass layout='CHW' or 'HWC'")


class BatchTransform:
    """Base of the batch-level augmentations (MixUp, CutMix, RandomChoice of them).

    ``op(images, labels, seed=..., epoch=..., batch_index=...)`` mixes ``images`` (an
    ``(N, C, H, W)`` or ``(N, H, W, C)`` array, in place) and returns ``(images,
    soft_labels)`` with ``soft_labels`` an ``(N, num_classes)`` float32 array whose rows
    sum to 1. ``DataLoader(..., batch_transform=op)`` calls it on every batch with the
    loader's seed, the epoch and the batch's index in the epoch (NOTE [ Batch augmentation
    randomness ]).
    """

    num_classes: int

    def get_params(self, n: int, height: int, width: int, rng: _Rng) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def apply_params(self, images: np.ndarray, labels: np.ndarray, params: dict,
                     layout: str | None = None) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _check(self, images: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
        name = type(self).__name__
        if not isinstance(images, np.ndarray) or images.ndim != 4:
            raise TypeError(f"{name} takes a batch of images as an (N, C, H, W) or (N, H, W, C) numpy array, got "
                            f"{type(images).__name__}{getattr(images, 'shape', '')}")
        if not images.flags.writeable:
            raise ValueError(f"{name} mixes the batch in place: the images array must be writeable")
        labels = np.asarray(labels)
        if labels.ndim != 1 or labels.shape[0] != images.shape[0] or not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"{name} needs one integer label per image, got labels of shape {labels.shape} "
                             f"{labels.dtype} for {images.shape[0]} images")
        if labels.size and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise ValueError(f"{name}: labels must be in [0, {self.num_classes}), got {labels.min()}..{labels.max()}")
        return images, labels

    def __call__(self, images: np.ndarray, labels: Any, *, seed: int | None = None, epoch: int = 0,
                 batch_index: int = 0, layout: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Mix one batch in place; returns ``(images, soft_labels)``."""
        images, labels = self._check(images, labels)
        lay = _batch_layout(images, layout)
        h, w = (images.shape[2], images.shape[3]) if lay == "CHW" else (images.shape[1], images.shape[2])
        if seed is None:
            seed = _fresh_seed()
        rng = _Rng(seed, epoch, batch_index, _BATCH_POSITION)
        return self.apply_params(images, labels, self.get_params(images.shape[0], h, w, rng), lay)

    def _soft(self, labels: np.ndarray, lam: float) -> np.ndarray:
        """torchvision's _mixup_label: one_hot * lam + roll(one_hot, 1) * (1 - lam), float32."""
        n = labels.shape[0]
        out = np.zeros((n, self.num_classes), np.float32)
        if n == 0:
            return out
        rows = np.arange(n)
        out[rows, labels] += np.float32(lam)
        out[rows, np.roll(labels, 1)] += np.float32(1.0 - lam)
        return out

    def describe(self) -> str:
        return f"{self!r}: on each batch in place (numpy, consumer thread), keyed by (seed, epoch, batch index)"


def _check_mix(alpha: Any, num_classes: Any) -> None:
    if not _number(alpha) or not float(alpha) > 0:
        raise ValueError(f"alpha must be a positive number, got {alpha!r}")
    if not isinstance(num_classes, (int, np.integer)) or isinstance(num_classes, bool) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")


@dataclass(frozen=True)
class MixUp(BatchTransform):
    """MixUp (torchvision v2): ``x = lam * x + (1 - lam) * roll(x, 1)`` over the batch, with
    ``lam ~ Beta(alpha, alpha)``, and the labels mixed the same way.

    Parameters
    ----------
    alpha : float
    num_classes : int
    """

    alpha: float = 1.0
    num_classes: int = 1000

    def __post_init__(self) -> None:
        _check_mix(self.alpha, self.num_classes)

    def get_params(self, n: int, height: int, width: int, rng: _Rng) -> dict:
        """``{"lam": float}``."""
        return {"lam": _beta_draw(rng, float(self.alpha))}

    def apply_params(self, images: np.ndarray, labels: np.ndarray, params: dict,
                     layout: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        if not np.issubdtype(images.dtype, np.floating):
            raise TypeError(f"MixUp blends float images (after Normalize), got {images.dtype}")
        lam = float(params["lam"])
        n = images.shape[0]
        if n > 1:
            # In place, last to first: sample i blends with i - 1, which is still unmixed.
            last = images[n - 1].copy()
            tmp = np.empty_like(images[0])
            for i in range(n - 1, 0, -1):
                np.multiply(images[i - 1], images.dtype.type(1.0 - lam), out=tmp)
                images[i] *= images.dtype.type(lam)
                images[i] += tmp
            np.multiply(last, images.dtype.type(1.0 - lam), out=tmp)
            images[0] *= images.dtype.type(lam)
            images[0] += tmp
        return images, self._soft(labels, lam)


@dataclass(frozen=True)
class CutMix(BatchTransform):
    """CutMix (torchvision v2): paste a box of ``roll(x, 1)`` into each image; the box is
    centred at a uniform pixel with sides ``int(0.5 * sqrt(1 - lam) * size)`` each way,
    clipped to the image, and the labels mix with ``lam`` adjusted to the clipped area
    (``1 - box area / image area``), ``lam ~ Beta(alpha, alpha)``.
    """

    alpha: float = 1.0
    num_classes: int = 1000

    def __post_init__(self) -> None:
        _check_mix(self.alpha, self.num_classes)

    def get_params(self, n: int, height: int, width: int, rng: _Rng) -> dict:
        """``{"lam": drawn, "box": (x1, y1, x2, y2), "lam_adjusted": float}``."""
        lam = _beta_draw(rng, float(self.alpha))
        r_x = rng.below(_BOX_CTR, width)
        r_y = rng.below(_BOX_CTR + 1, height)
        r = 0.5 * math.sqrt(1.0 - lam)
        rw, rh = int(r * width), int(r * height)
        x1, y1 = max(r_x - rw, 0), max(r_y - rh, 0)
        x2, y2 = min(r_x + rw, width), min(r_y + rh, height)
        adj = float(1.0 - (x2 - x1) * (y2 - y1) / (width * height))
        return {"lam": lam, "box": (x1, y1, x2, y2), "lam_adjusted": adj}

    def apply_params(self, images: np.ndarray, labels: np.ndarray, params: dict,
                     layout: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        lay = _batch_layout(images, layout)
        x1, y1, x2, y2 = params["box"]
        n = images.shape[0]
        if n > 1 and x2 > x1 and y2 > y1:
            def box(i: int) -> np.ndarray:
                return images[i, :, y1:y2, x1:x2] if lay == "CHW" else images[i, y1:y2, x1:x2, :]
            last = box(n - 1).copy()
            for i in range(n - 1, 0, -1):
                box(i)[...] = box(i - 1)
            box(0)[...] = last
        return images, self._soft(labels, float(params["lam_adjusted"]))


@dataclass(frozen=True)
class RandomChoice(BatchTransform):
    """Apply one of ``transforms`` (MixUp / CutMix) per batch, chosen with probabilities ``p``
    (uniform when None), as torchvision's recipe does with ``RandomChoice([MixUp, CutMix])``."""

    transforms: Sequence[BatchTransform]
    p: Sequence[float] | None = None

    def __post_init__(self) -> None:
        ts = tuple(self.transforms)
        if not ts or not all(isinstance(t, (MixUp, CutMix)) for t in ts):
            raise TypeError("RandomChoice takes a non-empty list of MixUp / CutMix batch transforms, got "
                            f"{[type(t).__name__ for t in ts]}")
        if len({t.num_classes for t in ts}) != 1:
            raise ValueError("the transforms of a RandomChoice must agree on num_classes")
        p = [1.0] * len(ts) if self.p is None else [float(v) for v in self.p]
        if len(p) != len(ts) or any(v < 0 for v in p) or sum(p) <= 0:
            raise ValueError(f"p must be one non-negative weight per transform, got {self.p!r}")
        object.__setattr__(self, "transforms", ts)
        object.__setattr__(self, "p", tuple(v / sum(p) for v in p))

    @property
    def num_classes(self) -> int:  # type: ignore[override]
        return self.transforms[0].num_classes

    def get_params(self, n: int, height: int, width: int, rng: _Rng) -> dict:
        """``{"choice": index, **the chosen transform's parameters}``."""
        u = rng.uniform(_CHOICE_CTR)
        k, acc = len(self.p) - 1, 0.0
        for i, v in enumerate(self.p):
            acc += v
            if u < acc:
                k = i
                break
        return {"choice": k, **self.transforms[k].get_params(n, height, width, rng)}

    def apply_params(self, images: np.ndarray, labels: np.ndarray, params: dict,
                     layout: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        return self.transforms[int(params["choice"])].apply_params(images, labels, params, layout)
