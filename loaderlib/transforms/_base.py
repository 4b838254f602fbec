"""The transform interface (:class:`Transform`, :class:`ImageSpec`), the output dtypes and the
base of the native augmentations, shared by every family module."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._ext import _transform
from ._rng import _fresh_seed, _Rng

_INTERP = {"bilinear": _transform.INTERP_LINEAR, "area": _transform.INTERP_AREA,
           "nearest": _transform.INTERP_NEAREST}
#: Output dtypes of Cast.
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


def _pair(size: Any, what: str) -> tuple[int, int]:
    # ``size`` is checked here, so any value may come in (a ``Size`` when the caller is right).
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
    from .._opencv import cv2

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


def _policy_fill(fill: Any, interpolation: str) -> tuple[tuple, tuple]:
    f = _fill4(fill)
    return (_interp_aug(interpolation), int(f is not None)), (f or (0.0,) * 4)
