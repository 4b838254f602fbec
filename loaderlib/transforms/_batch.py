"""Batch-level augmentations: MixUp, CutMix and RandomChoice of them (torchvision v2 keeps
MixUp and CutMix in ``_augment``; here they have their own module because they run on the batch)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._checks import check_int
from ._base import _number
from ._rng import _fresh_seed, _Rng

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
    check_int(num_classes, "num_classes", minimum=1)


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
        p = self.p
        assert p is not None   # __post_init__ normalised it to a tuple
        k, acc = len(p) - 1, 0.0
        for i, v in enumerate(p):
            acc += v
            if u < acc:
                k = i
                break
        return {"choice": k, **self.transforms[k].get_params(n, height, width, rng)}

    def apply_params(self, images: np.ndarray, labels: np.ndarray, params: dict,
                     layout: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        return self.transforms[int(params["choice"])].apply_params(images, labels, params, layout)
