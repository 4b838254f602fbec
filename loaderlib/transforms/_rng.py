"""The counter-based sample generator in Python and the random-resized-crop box."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np

_M64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_INIT = 0x243F6A8885A308D3


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
