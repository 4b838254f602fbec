"""Image decoding: libjpeg-turbo kernels for JPEG, OpenCV for everything else.

This module owns ``loaderlib._ext._jpeg``: it validates arguments, resolves the thread
count, owns the output buffers and the decoder pools, and turns per-item status codes
into :class:`~loaderlib.errors.DecodeError` (naming the item and its source) or
:class:`~loaderlib.errors.DecodeWarning`.

Output convention for every decoder: a C-contiguous ``uint8`` array of shape
``(H, W, 3)`` for ``mode="RGB"`` / ``"BGR"`` and ``(H, W, 1)`` for ``mode="GRAY"``.
JPEG output is bitwise equal to ``cv2.imdecode(buf, IMREAD_COLOR | IMREAD_IGNORE_ORIENTATION)``
(converted to RGB); EXIF orientation is not applied.
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

import numpy as np

from . import _threads
from ._checks import check_int
from ._ext import _jpeg
from ._ext._jpeg import Status
from .errors import DecodeError, DecodeWarning

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "BatchDecodeResult",
    "JpegInfo",
    "decode",
    "decode_batch",
    "jpeg_info",
    "scale_denominator",
]

#: Images declaring more pixels than this are refused before any pixel is decoded.
#: The same threshold at which Pillow raises DecompressionBombError (2 x its
#: MAX_IMAGE_PIXELS of 89,478,485): about 179 megapixels, 537 MB as RGB.
DEFAULT_MAX_PIXELS = 2 * 89_478_485

#: The first bytes of a raw record (NOTE [ Packed records ] in pyx/include/ll_record.h).
RAW_MAGIC = b"LLRAW\x01\x00\x00"
_RAW_HEADER = 32

_SUBSAMPLING = {444: "4:4:4", 422: "4:2:2", 420: "4:2:0", 440: "4:4:0", 411: "4:1:1", 410: "4:1:0", 0: "gray"}
_INFO_COL = {name: k for k, name in enumerate(_jpeg.INFO_FIELDS)}


def strict_level(strict: bool | None) -> int:
    """The kernels' strictness for ``strict`` (NOTE [ Truncated JPEG is an error ] in ll_jpeg.h):
    None (default) refuses truncated data and warns on other damage, True refuses any damage,
    False keeps partial images with a warning."""
    if strict is not None and not isinstance(strict, (bool, np.bool_)):
        raise TypeError(f"strict must be True, False or None, got {strict!r}")
    return _jpeg.STRICT_LEVELS[None if strict is None else bool(strict)]


def fast_flag(fast: bool) -> bool:
    """Check ``fast`` (NOTE [ Fast decode ] in ll_jpeg.h): True or False, nothing else."""
    if not isinstance(fast, (bool, np.bool_)):
        raise TypeError(f"fast must be True or False, got {fast!r}")
    return bool(fast)


def mode_code(mode: str) -> int:
    """The kernels' code for ``mode`` ("RGB", "BGR" or "GRAY", any case)."""
    try:
        return _jpeg.MODES[mode.upper()]
    except (KeyError, AttributeError):
        raise ValueError(f"mode must be one of {sorted(_jpeg.MODES)}, got {mode!r}") from None


def status_tables(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The per-item ``status`` codes and ``msgs`` rows every kernel call over ``n`` items fills
    (NOTE [ Status codes ] in ll_common.h); read a row with :func:`status_message`."""
    return np.zeros(n, np.int32), np.zeros((n, _jpeg.MSG_LEN), np.uint8)


def status_message(msgs: np.ndarray, i: int) -> str:
    """The reason the kernel wrote for item ``i`` (a NUL-terminated row of ``msgs``)."""
    raw = msgs[i].tobytes()
    end = raw.find(b"\0")
    return raw[: end if end >= 0 else len(raw)].decode("utf-8", "replace")


Crop = tuple[int, int, int, int] | None


@dataclass(frozen=True)
class JpegInfo:
    """What a JPEG's headers say, read without decoding any pixel."""

    width: int
    height: int
    channels: int
    color_space: str
    subsampling: str
    progressive: bool
    arithmetic: bool
    precision: int


@dataclass
class BatchDecodeResult:
    """What :func:`decode_batch` returns.

    Attributes
    ----------
    images : list of numpy.ndarray or None
        One HWC uint8 array per item (views of ``out`` when it was given); ``None`` for
        items that failed.
    status : numpy.ndarray
        int32 status code per item: 0 decoded, 1 decoded after libjpeg recovered from
        corrupt data (a :class:`DecodeWarning` was issued), negative: failed.
    errors : dict
        ``{index: DecodeError}`` for the failed items.
    """

    images: list
    status: np.ndarray
    errors: dict = field(default_factory=dict)

    @property
    def ok(self) -> np.ndarray:
        """Boolean mask of the items that were decoded."""
        return self.status >= 0

    def raise_first(self) -> None:
        """Raise the error of the first failed item, if any."""
        if self.errors:
            raise self.errors[min(self.errors)]


def scale_denominator(scale: Any) -> int:
    """Map ``scale`` (1, 1/2, 1/4 or 1/8, as a number or Fraction) to libjpeg's denominator."""
    try:
        f = Fraction(scale).limit_denominator(64)
    except (TypeError, ValueError):
        raise ValueError(f"scale must be 1, 1/2, 1/4 or 1/8, got {scale!r}") from None
    if f.numerator != 1 or f.denominator not in (1, 2, 4, 8):
        raise ValueError(f"scale must be 1, 1/2, 1/4 or 1/8, got {scale!r}")
    return f.denominator


def _crop_row(crop: Any, what: str = "crop") -> tuple[int, int, int, int]:
    if crop is None:
        return (0, 0, 0, 0)
    try:
        x, y, w, h = (int(v) for v in crop)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be None or (x, y, w, h), got {crop!r}") from None
    if x < 0 or y < 0 or w <= 0 or h <= 0:
        raise ValueError(f"{what} must have x, y >= 0 and w, h > 0, got {crop!r}")
    return (x, y, w, h)


_pool_lock = threading.Lock()
_free_pools: list = []
_MAX_FREE_POOLS = 16


@contextmanager
def _borrow_pool(size: int):
    """A decoder pool with at least ``size`` decompressors, used by one call at a time."""
    pool = None
    with _pool_lock:
        for k, p in enumerate(_free_pools):
            if p.size >= size:
                pool = _free_pools.pop(k)
                break
    if pool is None:
        pool = _jpeg.Workers(size)
    try:
        yield pool
    finally:
        with _pool_lock:
            if len(_free_pools) < _MAX_FREE_POOLS:
                _free_pools.append(pool)


def _as_bytes_like(data: Any, index: int | None = None):
    if isinstance(data, (bytes, bytearray, memoryview)):
        return data
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8:
            raise TypeError(f"{_item(index)}numpy input must be uint8, got {data.dtype}")
        if not data.flags.c_contiguous:
            raise TypeError(f"{_item(index)}numpy input must be C-contiguous")
        return data
    try:
        return memoryview(data)
    except TypeError:
        raise TypeError(
            f"{_item(index)}expected bytes, bytearray, memoryview, mmap or a uint8 numpy array, "
            f"got {type(data).__name__}"
        ) from None


def _item(index: int | None) -> str:
    return "" if index is None else f"item {index}: "


# --------------------------------------------------------------------------- OpenCV path

_OPENCV_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"BM", "BMP"),
    (b"RIFF", "WebP"),
    (b"GIF8", "GIF"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
)


def _declared_size(kind: str, buf: memoryview | np.ndarray) -> tuple[int, int] | None:
    """``(width, height)`` as the image's header declares it, read before any pixel is decoded
    (the decompression-bomb guard for the formats OpenCV decodes); None if the header is cut off
    or malformed."""
    head = bytes(buf[:64])
    le = int.from_bytes
    try:
        if kind == "PNG":
            if head[12:16] != b"IHDR":
                return None
            return le(head[16:20], "big"), le(head[20:24], "big")
        if kind == "BMP":
            if le(head[14:18], "little") == 12:   # BITMAPCOREHEADER: 16-bit sizes
                return le(head[18:20], "little"), le(head[20:22], "little")
            w = le(head[18:22], "little", signed=True)
            h = le(head[22:26], "little", signed=True)   # negative: stored top-down
            return abs(w), abs(h)
        if kind == "GIF":
            return le(head[6:8], "little"), le(head[8:10], "little")
        if kind == "WebP":
            chunk = head[12:16]
            if chunk == b"VP8 " and head[23:26] == b"\x9d\x01\x2a":
                return le(head[26:28], "little") & 0x3FFF, le(head[28:30], "little") & 0x3FFF
            if chunk == b"VP8L" and head[20] == 0x2F:
                bits = le(head[21:25], "little")
                return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
            if chunk == b"VP8X":
                return le(head[24:27], "little") + 1, le(head[27:30], "little") + 1
            return None
        if kind == "TIFF":
            order: Literal["little", "big"] = "little" if head[:2] == b"II" else "big"
            ifd = le(bytes(buf[4:8]), order)
            count = le(bytes(buf[ifd:ifd + 2]), order)
            size = {}
            for k in range(min(count, 512)):
                e = bytes(buf[ifd + 2 + 12 * k: ifd + 14 + 12 * k])
                if len(e) < 12:
                    return None
                tag, typ = le(e[0:2], order), le(e[2:4], order)
                if tag in (256, 257):
                    size[tag] = le(e[8:10], order) if typ == 3 else le(e[8:12], order)
            return (size[256], size[257]) if len(size) == 2 else None
    except (IndexError, ValueError, KeyError):
        return None
    return None


def _imdecode(cv2: Any, arr: np.ndarray, flags: int) -> np.ndarray | None:
    """``cv2.imdecode(arr, flags)`` holding one decoded image at a time, not two.

    NOTE [ No full-size colour copy ]
    OpenCV's Python binding returns a Mat its decoder allocated as a *copy* in numpy memory,
    so ``cv2.imdecode`` peaks at twice the image (and reversing BGR to RGB then making it
    contiguous would add a third). Functions with an output argument write into numpy memory
    directly, and ``cv2.imread(path, dst, flags)`` is one: given an empty ``dst`` it allocates
    the result with numpy's allocator and returns it, no copy. So the encoded bytes (small)
    go to an anonymous in-memory file (memfd) that imread reads by its /proc path, and RGB
    comes straight from the decoder (IMREAD_COLOR_RGB, OpenCV >= 4.10; older builds swap the
    channels in place, a few rows at a time: cvtColor with dst=img copies its input). imread
    leaves ``dst`` empty when the header is bad and returns None when the data is: both are
    failures. Without memfd (not Linux) this falls back to imdecode. Not for WebP: OpenCV's
    WebP reader loads the whole file and decodes through its own full-size buffer anyway
    (about 2.5x the image either way), so imdecode on the bytes in hand is cheaper there.
    """
    memfd = getattr(os, "memfd_create", None)
    if memfd is None or not os.path.isdir("/proc/self/fd"):
        return cv2.imdecode(arr, flags)
    fd = memfd("loaderlib-decode", getattr(os, "MFD_CLOEXEC", 0))
    try:
        view = arr.data   # a memoryview of the array's bytes
        done = 0
        while done < len(view):
            done += os.write(fd, view[done:])
        img = cv2.imread(f"/proc/self/fd/{fd}", np.empty(0, np.uint8), flags)
    finally:
        os.close(fd)
    return None if img is None or img.size == 0 else img


def _decode_opencv(data: Any, mode: int, denom: int, crop: tuple, max_pixels: int) -> np.ndarray:
    """Decode a non-JPEG image with OpenCV (which releases the GIL) to the same convention.

    Scaling matches the JPEG path's geometry: the full image is resized with INTER_AREA to
    ``ceil(W/denom) x ceil(H/denom)`` and the crop box's scaled region is sliced from it.
    Raises DecodeError (without index/source; the caller adds them).
    """
    buf = memoryview(data).cast("B") if not isinstance(data, np.ndarray) else data.reshape(-1)
    head = bytes(buf[:12])
    if head.startswith(RAW_MAGIC):   # NOTE [ Packed records ] in pyx/include/ll_record.h
        return _scale_crop(_raw_pixels(buf, mode, max_pixels), denom, crop)
    from ._opencv import cv2

    kind = next((name for magic, name in _OPENCV_MAGIC if head.startswith(magic)), None)
    if kind == "WebP" and head[8:12] != b"WEBP":
        kind = None
    if kind is None:
        raise DecodeError(f"not a recognised image format (first bytes {head[:8]!r})")
    size = _declared_size(kind, buf)
    if size is None:
        raise DecodeError(f"cannot read the {kind} header (cut off or malformed)")
    if max_pixels and size[0] * size[1] > max_pixels:
        raise DecodeError(f"{kind} declares {size[0]}x{size[1]} = {size[0] * size[1]} pixels, more than "
                          f"max_pixels={max_pixels}; refused before decoding")
    arr = np.frombuffer(buf, dtype=np.uint8)
    rgb_flag = getattr(cv2, "IMREAD_COLOR_RGB", None) if mode == 0 else None
    color = cv2.IMREAD_GRAYSCALE if mode == 2 else (rgb_flag if rgb_flag is not None else cv2.IMREAD_COLOR)
    flags = cv2.IMREAD_IGNORE_ORIENTATION | color
    try:
        img = cv2.imdecode(arr, flags) if kind == "WebP" else _imdecode(cv2, arr, flags)
    except cv2.error as e:
        raise DecodeError(f"OpenCV could not decode this {kind}: {str(e).strip()}") from None
    if img is None:
        raise DecodeError(f"OpenCV could not decode this {kind} (corrupt or truncated)")
    if max_pixels and img.shape[0] * img.shape[1] > max_pixels:
        raise DecodeError(f"{kind} has {img.shape[0] * img.shape[1]} pixels, more than max_pixels={max_pixels}")
    if img.ndim == 2:
        img = img[:, :, None]
    elif mode == 0 and rgb_flag is None:
        for r in range(0, img.shape[0], 64):   # BGR -> RGB in place, 64 rows of scratch at a time
            img[r:r + 64] = img[r:r + 64, :, ::-1]
    return _scale_crop(img, denom, crop)


def raw_record(data: Any) -> tuple[np.ndarray, tuple[int, int]]:
    """The pixels of a raw record (a read-only HWC uint8 view, RGB or one channel) and its
    original ``(width, height)``; NOTE [ Packed records ] in pyx/include/ll_record.h, whose
    parser this one follows. Raises DecodeError saying what is wrong with a bad record."""
    buf = memoryview(data).cast("B") if not isinstance(data, np.ndarray) else data.reshape(-1)
    n = buf.nbytes
    if n < _RAW_HEADER or bytes(buf[:8]) != RAW_MAGIC:
        raise DecodeError(f"raw record of {n} bytes is shorter than its {_RAW_HEADER}-byte header" if
                          bytes(buf[:8]) == RAW_MAGIC[:n] else "not a raw record")
    h, w, c, oh, ow = (int(v) for v in np.frombuffer(buf[8:28], "<u4"))
    lim = 1 << 20
    if not (1 <= h <= lim and 1 <= w <= lim and c in (1, 3) and 1 <= oh <= lim and 1 <= ow <= lim):
        raise DecodeError(f"raw record header is damaged ({w}x{h}x{c} pixels, original {ow}x{oh})")
    if n != _RAW_HEADER + h * w * c:
        raise DecodeError(f"raw record of {w}x{h}x{c} pixels needs {_RAW_HEADER + h * w * c} bytes, has {n} "
                          "(truncated?)")
    return np.frombuffer(buf, np.uint8, h * w * c, _RAW_HEADER).reshape(h, w, c), (ow, oh)


def _raw_pixels(buf: Any, mode: int, max_pixels: int) -> np.ndarray:
    """A raw record's pixels in ``mode`` (NOTE [ Raw records need no decode ] in
    pyx/include/ll_chain.h: the same channel conversions)."""
    px, _ = raw_record(buf)
    h, w, c = px.shape
    if max_pixels and h * w > max_pixels:
        raise DecodeError(f"raw record of {w}x{h} = {w * h} pixels, more than max_pixels={max_pixels}")
    if mode == 2:
        if c == 1:
            return px.copy()
        luma = px.astype(np.int32) @ np.array([4899, 9617, 1868], np.int32)
        return ((luma + (1 << 13)) >> 14).astype(np.uint8)[:, :, None]
    if c == 1:
        return np.repeat(px, 3, axis=2)
    return np.ascontiguousarray(px[:, :, ::-1]) if mode == 1 else px.copy()


def _scale_crop(img: np.ndarray, denom: int, crop: tuple) -> np.ndarray:
    """A decoded image at ``1/denom`` (INTER_AREA) cut to the scaled crop box."""
    H, W = img.shape[:2]
    if denom > 1:
        from ._opencv import cv2

        sw, sh = math.ceil(W / denom), math.ceil(H / denom)
        img = cv2.resize(np.ascontiguousarray(img), (sw, sh), interpolation=cv2.INTER_AREA)
        if img.ndim == 2:
            img = img[:, :, None]
    x, y, w, h = crop
    if w > 0:
        if x + w > W or y + h > H:
            raise ValueError(f"crop box (x={x}, y={y}, w={w}, h={h}) is outside the {W}x{H} image")
        x0, y0 = x // denom, y // denom
        img = img[y0 : -(-(y + h) // denom), x0 : -(-(x + w) // denom)]
    return np.ascontiguousarray(img)


# --------------------------------------------------------------------------- public API


def jpeg_info(data: Any) -> JpegInfo:
    """Read a JPEG's dimensions and coding facts from its headers only.

    Parameters
    ----------
    data : bytes-like
        The complete file (bytes, bytearray, memoryview, mmap slice or uint8 array).

    Raises
    ------
    DecodeError
        If the data is empty, not a JPEG or the headers are corrupt.
    """
    buf = _as_bytes_like(data)
    info = np.zeros((1, len(_jpeg.INFO_FIELDS)), np.int64)
    status, msgs = status_tables(1)
    with _borrow_pool(1) as pool:
        _jpeg.read_headers_into([buf], 0, 1, np.zeros((1, 4), np.int32), 0, info, status, msgs, 1, pool)
    if status[0] < 0:
        raise DecodeError.from_status(int(status[0]), status_message(msgs, 0))
    row = info[0]
    return JpegInfo(
        width=int(row[_INFO_COL["width"]]),
        height=int(row[_INFO_COL["height"]]),
        channels=int(row[_INFO_COL["components"]]),
        color_space=_jpeg.JPEG_COLOR_SPACES.get(int(row[_INFO_COL["color_space"]]), "unknown"),
        subsampling=_SUBSAMPLING.get(int(row[_INFO_COL["subsampling"]]), "other"),
        progressive=bool(row[_INFO_COL["progressive"]]),
        arithmetic=bool(row[_INFO_COL["arithmetic"]]),
        precision=int(row[_INFO_COL["precision"]]),
    )


def decode(
    data: Any,
    mode: str = "RGB",
    scale: Any = 1,
    crop: Crop = None,
    *,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    strict: bool | None = None,
    source: str | None = None,
    fast: bool = False,
) -> np.ndarray:
    """Decode one image to a HWC uint8 array.

    Parameters
    ----------
    data : bytes-like
        The encoded file: bytes, bytearray, memoryview, an mmap slice or a uint8 numpy
        array (never copied). JPEGs use libjpeg-turbo; PNG, BMP, WebP, GIF and TIFF go
        through OpenCV.
    mode : {"RGB", "BGR", "GRAY"}
        Channel order; GRAY gives shape (H, W, 1).
    scale : {1, 1/2, 1/4, 1/8}
        Decode at reduced size with libjpeg's DCT scaling (much cheaper than decoding
        then resizing). The result is ``ceil(W*scale) x ceil(H*scale)``, equal to OpenCV's
        ``IMREAD_REDUCED_COLOR_{2,4,8}``.
    crop : (x, y, w, h) or None
        Box in full-resolution pixels. Only the region covering it is decoded
        (``jpeg_crop_scanline`` + ``jpeg_skip_scanlines``). With ``scale`` the result is
        the slice ``[floor(y*s):ceil((y+h)*s), floor(x*s):ceil((x+w)*s)]`` of the scaled
        image, bitwise equal to slicing a full decode.
    max_pixels : int or None
        Refuse images whose header declares more pixels (decompression-bomb guard);
        None disables the guard.
    strict : bool or None
        None (default): a truncated file (which libjpeg would pad with grey) raises
        DecodeError, other corrupt data libjpeg can recover from decodes with a
        :class:`DecodeWarning`. True: any such data raises. False: partial images are kept,
        with a warning (PIL's ``LOAD_TRUNCATED_IMAGES``).
    source : str, optional
        Name used in error messages (e.g. the file path).
    fast : bool
        False (default): the exact decode, bitwise equal to OpenCV. True: trade exactness
        for speed with libjpeg's fast integer IDCT (``JDCT_IFAST``) and merged (non-fancy)
        chroma upsampling, the equivalent of tf.data's ``dct_method="INTEGER_FAST"`` with
        ``fancy_upscaling=False``. Measured against the exact decode on photo-like JPEGs
        (quality 90 and 95; 4:2:0, 4:2:2, 4:4:4 and grayscale, baseline and progressive;
        17x13 to 640x480; tests/kernels/test_fast_decode.py): mean absolute error 1.23
        levels (of 255) over all pixels, at most 1.9 on any image of 333x251 or more and
        4.7 on thumbnails, where every pixel is near an edge; max absolute error 42 levels,
        at sharp colour edges of chroma-subsampled images (18 for 4:4:4 and grayscale,
        where only the IDCT differs). Only JPEGs are affected; ``crop`` stays bitwise
        equal to slicing a full fast decode (NOTE [ Fast decode ] in
        ``pyx/include/ll_jpeg.h``).

    Returns
    -------
    numpy.ndarray
        C-contiguous uint8 array, (H, W, 3) or (H, W, 1).

    Raises
    ------
    DecodeError
        The data is empty, corrupt, truncated (strict), too large, or not an image.
    """
    res = decode_batch(
        [data], mode=mode, scale=scale, crop=[crop], num_threads=1, max_pixels=max_pixels,
        strict=strict, sources=None if source is None else [source], fast=fast, _single=True,
    )
    if res.errors:
        raise res.errors[0] from None
    return res.images[0]


def decode_batch(
    buffers: Sequence[Any],
    mode: str = "RGB",
    scale: Any = 1,
    crop: Crop | Sequence[Crop] = None,
    *,
    num_threads: int | None = None,
    out: Any = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    strict: bool | None = None,
    sources: Sequence[str] | None = None,
    on_error: str = "raise",
    fast: bool = False,
    _single: bool = False,
) -> BatchDecodeResult:
    """Decode many images in one parallel pass over the OpenMP thread pool.

    JPEG items are decoded without the GIL, one item per task (dynamic schedule), by
    per-thread libjpeg decompressors that are created once and reused. Other formats
    are decoded with OpenCV afterwards.

    Parameters
    ----------
    buffers : sequence of bytes-like
        Encoded images (bytes, bytearray, memoryview, mmap slices, uint8 arrays; no copy).
    mode, scale, max_pixels, strict, fast
        As in :func:`decode`, for every item.
    crop : (x, y, w, h), None, or a sequence of those (one per item)
        As in :func:`decode`. A single box applies to every item.
    num_threads : int, optional
        Threads to use (default: ``LOADERLIB_NUM_THREADS`` or the available CPUs).
        The output does not depend on it.
    out : list of arrays or an (N, H, W, C) uint8 array, optional
        Caller-owned outputs, C-contiguous, each exactly the item's decoded shape
        (otherwise that item fails with a shape error). Without ``out`` each item gets a
        new array.
    sources : sequence of str, optional
        Names for error messages (e.g. file paths), one per item.
    on_error : {"raise", "return"}
        "raise": after the whole batch is processed, raise the first item's
        DecodeError. "return": record failures in the result and return.

    Returns
    -------
    BatchDecodeResult
        ``images``, per-item ``status`` codes and ``errors``.
    """
    if on_error not in ("raise", "return"):
        raise ValueError(f"on_error must be 'raise' or 'return', got {on_error!r}")
    bufs = [_as_bytes_like(b, None if _single else i) for i, b in enumerate(buffers)]
    n = len(bufs)
    mode_c = mode_code(mode)
    denom = scale_denominator(scale)
    fast = fast_flag(fast)
    if sources is not None and len(sources) != n:
        raise ValueError(f"sources has {len(sources)} entries for {n} buffers")
    crops = np.zeros((n, 4), np.int32)
    if crop is not None:
        is_box = len(crop) == 4 and all(isinstance(v, (int, np.integer)) for v in crop)
        if is_box:
            crops[:] = _crop_row(crop)
        else:
            if len(crop) != n:
                raise ValueError(f"crop has {len(crop)} entries for {n} buffers")
            for i, c in enumerate(crop):
                crops[i] = _crop_row(c, "crop" if _single else f"crop[{i}]")
    max_px = check_int(max_pixels, "max_pixels", allow_none=True) or 0
    nthreads = 1 if _single else min(_threads.resolve_num_threads(num_threads), max(n, 1))

    status, msgs = status_tables(n)
    outs: list[Any]   # arrays (the caller's, or allocated below); None where a header failed
    if out is not None:
        outs = list(out)
        if len(outs) != n:
            raise ValueError(f"out has {len(outs)} entries for {n} buffers")
    else:
        outs = [None] * n

    with _borrow_pool(nthreads) as pool:
        if out is None:
            info = np.zeros((n, len(_jpeg.INFO_FIELDS)), np.int64)
            _jpeg.read_headers_into(bufs, mode_c, denom, crops, max_px, info, status, msgs, nthreads, pool)
            oh, ow, oc = _INFO_COL["out_h"], _INFO_COL["out_w"], _INFO_COL["out_c"]
            for i in range(n):
                if status[i] == Status.OK:
                    outs[i] = np.empty((int(info[i, oh]), int(info[i, ow]), int(info[i, oc])), np.uint8)
        _jpeg.decode_into(bufs, outs, mode_c, denom, crops, max_px, strict_level(strict), status, msgs, nthreads, pool,
                           fast=fast)

    errors: dict[int, DecodeError] = {}
    images: list = list(outs)
    for i in np.flatnonzero(status != Status.OK):
        i = int(i)
        src = None if sources is None else str(sources[i])
        reason = status_message(msgs, i)
        if status[i] == Status.WARNED:
            warnings.warn(
                f"{'' if _single else f'item {i} '}{'' if src is None else repr(src) + ' '}"
                f"decoded from corrupt data ({reason}); pass strict=True to refuse such images",
                DecodeWarning,
                stacklevel=3 if _single else 2,
            )
            continue
        if status[i] == Status.ERR_NOT_JPEG:
            try:
                img = _decode_opencv(bufs[i], mode_c, denom, tuple(int(v) for v in crops[i]), max_px)
            except DecodeError as e:
                reason = e.reason
            else:
                if out is None:
                    images[i] = img
                    status[i] = Status.OK
                elif outs[i].shape == img.shape:
                    outs[i][...] = img
                    status[i] = Status.OK
                else:
                    status[i] = Status.ERR_SHAPE
                    reason = (f"output buffer is {'x'.join(map(str, outs[i].shape))} but the decoded image is "
                              f"{'x'.join(map(str, img.shape))}")
        if status[i] == Status.OK:
            continue
        if status[i] == Status.ERR_CROP and _single:
            raise ValueError(reason)
        errors[i] = DecodeError.from_status(int(status[i]), reason, None if _single else i, src)
        images[i] = None
    result = BatchDecodeResult(images=images, status=status, errors=errors)
    if on_error == "raise" and not _single:
        result.raise_first()
    return result
