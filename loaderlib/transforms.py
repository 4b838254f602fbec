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
from .decoding import DEFAULT_MAX_PIXELS, mode_code, strict_level
from .decoding import decode as _decode_image

__all__ = [
    "Cast",
    "CenterCrop",
    "Compose",
    "Decode",
    "ImageSpec",
    "Normalize",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "ToCHW",
    "Transform",
    "random_resized_crop_box",
]

_M64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_INIT = 0x243F6A8885A308D3
_INTERP = {"bilinear": _transform.INTERP_LINEAR, "area": _transform.INTERP_AREA,
           "nearest": _transform.INTERP_NEAREST}
_CASTS = ("uint8", "float32")

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

    Called on an already decoded numpy image, Decode returns it unchanged.
    """

    mode: str = "RGB"
    dct_scaling: bool = True
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    strict: bool | None = None

    def __post_init__(self) -> None:
        mode_code(self.mode)  # the decoder's own checks: ValueError / TypeError with the choices
        strict_level(self.strict)
        object.__setattr__(self, "mode", self.mode.upper())
        if self.strict is not None:
            object.__setattr__(self, "strict", bool(self.strict))

    @property
    def channels(self) -> int:
        return 1 if self.mode == "GRAY" else 3

    def _apply(self, img: Any, rng: _Rng) -> np.ndarray:
        if isinstance(img, np.ndarray) and img.ndim == 3:
            return img
        return _decode_image(img, mode=self.mode, max_pixels=self.max_pixels, strict=self.strict)

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
    """

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
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
        if len(self.mean) not in (1, img.shape[2]):
            raise ValueError(f"Normalize has {len(self.mean)} means for an image with {img.shape[2]} channels")
        mean = np.asarray(self.mean, np.float32)
        std = np.asarray(self.std, np.float32)
        return (img.astype(np.float32) / np.float32(255.0) - mean) / std

    def plan(self, spec: ImageSpec) -> ImageSpec:
        if spec.channels is not None and len(self.mean) not in (1, spec.channels):
            raise ValueError(f"Normalize has {len(self.mean)} means for {spec.channels} channels")
        return replace(spec, dtype=np.dtype(np.float32))


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
    saturates to 0-255; no rescaling)."""

    dtype: str = "float32"

    def __post_init__(self) -> None:
        name = np.dtype(self.dtype).name
        if name not in _CASTS:
            raise ValueError(f"Cast supports {_CASTS}, got {self.dtype!r}")
        object.__setattr__(self, "dtype", name)

    def _apply(self, img: np.ndarray, rng: _Rng) -> np.ndarray:
        if not isinstance(img, np.ndarray):
            raise TypeError(f"Cast expects a numpy array, got {type(img).__name__}")
        if self.dtype == "uint8" and img.dtype != np.uint8:
            return np.clip(np.rint(img), 0, 255).astype(np.uint8)
        return img.astype(self.dtype)

    def plan(self, spec: ImageSpec) -> ImageSpec:
        return replace(spec, dtype=np.dtype(self.dtype))


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
