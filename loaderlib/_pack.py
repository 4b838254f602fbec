"""Packing at a capped resolution: the owner of ``loaderlib._ext._pack``.

:class:`PackOptions` holds what ``pack --max-side N --quality Q --raw-below P --reencode``
asks for; :func:`pack_batch` runs a batch of encoded images through the kernel (NOTE [ Packing
at a capped resolution ] in ``pyx/include/ll_pack.h``) on the OpenMP pool and returns, per
image, the bytes to store (the file's own when it is kept), what became of it and its
original size, or the error that names it. Images that are not JPEG (PNG, a raw record
packed before, ...) are decoded here first (OpenCV, or the raw record's pixels) and packed
from their pixels by the same kernel.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _threads
from ._ext import _pack
from ._ext._jpeg import Status
from .decoding import (
    DEFAULT_MAX_PIXELS,
    RAW_MAGIC,
    decode,
    raw_record,
    status_message,
    status_tables,
    strict_level,
)
from .errors import DecodeError, DecodeWarning

__all__ = ["KINDS", "PackOptions", "PackedItem", "pack_batch", "stored_size"]

#: What became of a record, by the kernel's code: kept as it was, re-encoded JPEG, raw pixels.
KINDS = {_pack.KEEP: "file", _pack.JPEG: "jpeg", _pack.RAW: "raw"}
_MIN_SIDE = 16


def stored_size(width: int, height: int, max_side: int | None) -> tuple[int, int]:
    """The ``(width, height)`` an image of ``width`` x ``height`` is stored at under ``max_side``
    (the longer side becomes ``max_side``, the other is rounded half up; never below 1)."""
    return _pack.stored_size(int(width), int(height), int(max_side or 0))


@dataclass(frozen=True)
class PackOptions:
    """What ``pack`` does to each image (NOTE [ Packing at a capped resolution ]).

    Parameters
    ----------
    max_side : int, optional
        Resize images whose longer side exceeds this (at least 16); None: no cap.
    quality : int
        JPEG quality of re-encoded images, 1 to 100.
    raw_below : int
        Store images whose stored pixel count is below this as raw pixels (0: never).
    reencode : bool
        Re-encode images already within the cap too (otherwise their bytes are kept).
    """

    max_side: int | None = None
    quality: int = 90
    raw_below: int = 0
    reencode: bool = False

    def __post_init__(self) -> None:
        def whole(v: Any) -> bool:
            return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

        if self.max_side is not None and (not whole(self.max_side) or self.max_side < _MIN_SIDE):
            raise ValueError(f"max_side (--max-side) must be an integer of at least {_MIN_SIDE}, got {self.max_side!r}")
        if not whole(self.quality) or not 1 <= self.quality <= 100:
            raise ValueError(f"quality (--quality) must be an integer from 1 to 100, got {self.quality!r}")
        if not whole(self.raw_below) or self.raw_below < 0:
            raise ValueError(f"raw_below (--raw-below) must be a pixel count >= 0, got {self.raw_below!r}")
        if not isinstance(self.reencode, bool):
            raise TypeError(f"reencode must be True or False, got {self.reencode!r}")

    @property
    def changes_images(self) -> bool:
        """Whether any image may be stored otherwise than as its file's bytes."""
        return self.max_side is not None or self.raw_below > 0 or self.reencode


@dataclass
class PackedItem:
    """One image after :func:`pack_batch`.

    Attributes
    ----------
    data : bytes-like or None
        What to store (the input itself when kept); None when it failed.
    kind : str
        ``"file"`` (kept as it was), ``"jpeg"`` (re-encoded) or ``"raw"``.
    original_size, stored_size : (int, int)
        ``(width, height)`` of the original image and of the stored one.
    error : DecodeError or None
        Why it failed, naming the source.
    """

    data: Any
    kind: str = "file"
    original_size: tuple[int, int] = (-1, -1)
    stored_size: tuple[int, int] = (-1, -1)
    error: DecodeError | None = None


_pools: list = []
_pools_lock = threading.Lock()


def _borrow(size: int) -> Any:
    with _pools_lock:
        for k, p in enumerate(_pools):
            if p.size >= size:
                return _pools.pop(k)
    return _pack.PackWorkers(size)


def _give_back(pool: Any) -> None:
    with _pools_lock:
        if len(_pools) < 2:
            _pools.append(pool)


def _run(items: list, pixels: np.ndarray, opts: PackOptions, nthreads: int) -> tuple[list, np.ndarray, np.ndarray,
                                                                                     np.ndarray]:
    n = len(items)
    status, msgs = status_tables(n)
    info = np.zeros((n, len(_pack.INFO_FIELDS)), np.int32)
    nthreads = max(1, min(nthreads, n))
    pool = _borrow(nthreads)
    try:
        out = _pack.pack_into(items, pixels, int(opts.max_side or 0), int(opts.quality), int(opts.raw_below),
                              bool(opts.reencode), DEFAULT_MAX_PIXELS, strict_level(None), status, msgs, info,
                              nthreads, pool)
    finally:
        _give_back(pool)
    return out, status, msgs, info


def pack_batch(blobs: list, sources: list[str], opts: PackOptions, num_threads: int | None = None) -> list[PackedItem]:
    """Pack encoded images in one parallel pass; the result does not depend on the thread count.

    Parameters
    ----------
    blobs : list of bytes-like
        The files' bytes.
    sources : list of str
        Their names, for errors and warnings.
    opts : PackOptions
    num_threads : int, optional
        Threads of the OpenMP pool (default: ``LOADERLIB_NUM_THREADS`` or the available CPUs).

    Returns
    -------
    list of PackedItem
        One per blob, in order. A damaged JPEG that libjpeg recovered from is packed with a
        :class:`~loaderlib.DecodeWarning` naming it.
    """
    n = len(blobs)
    nthreads = _threads.resolve_num_threads(num_threads)
    res: list[PackedItem] = [PackedItem(None) for _ in range(n)]
    out, status, msgs, info = _run(list(blobs), np.zeros((n, 5), np.int32), opts, nthreads)
    later: list[int] = []
    for i in range(n):
        st = int(status[i])
        if st == Status.ERR_NOT_JPEG:
            later.append(i)
            continue
        _fill(res[i], blobs[i], out[i], st, status_message(msgs, i), info[i], sources[i])
    if later:
        _pack_pixels(later, blobs, sources, opts, nthreads, res)
    return res


def _fill(item: PackedItem, blob: Any, data: Any, st: int, reason: str, row: np.ndarray, source: str) -> None:
    if st < 0:
        item.error = DecodeError.from_status(st, reason, None, source)
        return
    if st == Status.WARNED:
        warnings.warn(f"{source!r} decoded from corrupt data ({reason}); packed as decoded", DecodeWarning,
                      stacklevel=4)
    kind = int(row[0])
    item.kind = KINDS[kind]
    item.data = blob if kind == _pack.KEEP else data
    item.original_size = (int(row[1]), int(row[2]))
    item.stored_size = (int(row[3]), int(row[4]))


def _pack_pixels(idx: list[int], blobs: list, sources: list[str], opts: PackOptions, nthreads: int,
                 res: list[PackedItem]) -> None:
    """The items that are not JPEG: decoded here, kept when the kernel would keep a JPEG,
    else packed from their pixels."""
    imgs, dims, todo = [], [], []
    for i in idx:
        try:
            head = bytes(memoryview(blobs[i]).cast("B")[:8])
            if head == RAW_MAGIC:
                px, (ow, oh) = raw_record(blobs[i])
            else:
                px = decode(blobs[i], source=sources[i])
                ow, oh = px.shape[1], px.shape[0]
        except DecodeError as e:
            res[i].error = DecodeError(e.reason, None, sources[i])
            continue
        h, w, c = px.shape
        tw, th = stored_size(w, h, opts.max_side)
        if (tw, th) == (w, h) and tw * th >= opts.raw_below and not opts.reencode:
            res[i] = PackedItem(blobs[i], "file", (ow, oh), (w, h))
            continue
        imgs.append(np.ascontiguousarray(px))
        dims.append((h, w, c, ow, oh))
        todo.append(i)
    if not todo:
        return
    out, status, msgs, info = _run(imgs, np.asarray(dims, np.int32).reshape(-1, 5), opts, nthreads)
    for k, i in enumerate(todo):
        _fill(res[i], blobs[i], out[k], int(status[k]), status_message(msgs, k), info[k], sources[i])
