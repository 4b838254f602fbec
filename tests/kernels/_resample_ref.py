"""A float64 numpy model of the documented resampling filters (NOTE [ Resampling geometry ] in
pyx/include/ll_resize.h), written from the documentation, not from the kernel: the reference
for tests of Resize / RandomResizedCrop with ``antialias=True`` (torchvision v2's default).

Per axis, output pixel ``o`` has centre ``c = a * (o + 0.5) + b`` in source coordinates
(pixel ``i`` spans ``[i, i + 1)``); taps are read from the clamp domain ``[d0, d1)``.

* bilinear (``a <= 1`` or no antialias): pixels ``floor(c - 0.5)`` and the next, weights
  ``1 - f`` and ``f``, clamped to the domain (``cv2.INTER_LINEAR``);
* antialiased bilinear (``a > 1``): the triangle ``max(0, 1 - |i + 0.5 - c| / a)`` over the
  domain's pixels, renormalised to sum 1 (Pillow's BILINEAR, torchvision's antialias=True).
"""

from __future__ import annotations

import numpy as np


def axis_matrix(n_out: int, a: float, b: float, d0: int, d1: int, antialias: bool, n_src: int) -> np.ndarray:
    """The (n_out, n_src) weight matrix of one axis."""
    w = np.zeros((n_out, n_src))
    c = a * (np.arange(n_out) + 0.5) + b
    if antialias and a > 1.0:
        x = np.arange(d0, d1) + 0.5
        tri = np.clip(1.0 - np.abs(x[None, :] - c[:, None]) / a, 0.0, None)
        s = tri.sum(axis=1)
        for o in range(n_out):
            if s[o] > 0:
                w[o, d0:d1] = tri[o] / s[o]
            else:   # the whole support is outside the domain: the nearest edge pixel
                w[o, min(max(int(np.floor(c[o])), d0), d1 - 1)] = 1.0
        return w
    fc = c - 0.5
    i0 = np.floor(fc).astype(int)
    f = fc - i0
    lo, hi = i0 < d0, i0 >= d1 - 1
    i0 = np.where(lo, d0, np.where(hi, d1 - 1, i0))
    f = np.where(lo | hi, 0.0, f)
    i1 = np.minimum(i0 + 1, d1 - 1)
    rows = np.arange(n_out)
    np.add.at(w, (rows, i0), 1.0 - f)
    np.add.at(w, (rows, i1), f)
    return w


def resample(img: np.ndarray, out_hw: tuple, a: tuple, b: tuple = (0.0, 0.0), dom: tuple | None = None,
             antialias: bool = True) -> np.ndarray:
    """``img`` (H, W, C) resampled through the map ``a * o + b`` per axis (y, x) with the domain
    ``dom = ((y0, y1), (x0, x1))`` (default: the whole image); float64, not rounded."""
    H, W = img.shape[:2]
    (y0, y1), (x0, x1) = dom if dom is not None else ((0, H), (0, W))
    wy = axis_matrix(out_hw[0], a[0], b[0], y0, y1, antialias, H)
    wx = axis_matrix(out_hw[1], a[1], b[1], x0, x1, antialias, W)
    rows = np.tensordot(wy, img.astype(np.float64), axes=(1, 0))    # (oh, W, C)
    return np.tensordot(rows, wx, axes=(1, 1)).transpose(0, 2, 1)   # (oh, ow, C)


def resize(img: np.ndarray, oh: int, ow: int, antialias: bool = True) -> np.ndarray:
    """A plain resize of the whole image to (oh, ow), rounded to uint8 like the kernels."""
    H, W = img.shape[:2]
    out = resample(img, (oh, ow), (H / oh, W / ow), antialias=antialias)
    return np.clip(np.floor(out + 0.5), 0, 255).astype(np.uint8)
