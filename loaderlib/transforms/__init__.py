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
``pyx/include/ll_rng.h``); ``_rng._Rng`` is its bit-identical Python twin. The position
of a transform is its index in the flattened chain, not counting :class:`Decode`, so
``Compose([Decode(), RandomResizedCrop(224)])`` and ``Compose([RandomResizedCrop(224)])``
draw the same boxes. Calling a transform with ``seed=None`` (the default) draws a fresh
seed, so plain calls are random like torchvision's; pass ``seed``, ``epoch`` and
``index`` to reproduce exactly what the loader computed for that sample.

Layout
------
One module per family, as torchvision v2 arranges its transforms: ``_base`` (the
:class:`Transform` interface, :class:`ImageSpec`, output dtypes and the base of the native
augmentations), ``_rng`` (the generator and the random-resized-crop box), ``_misc``
(Decode, Normalize, ToCHW, Cast, GaussianBlur), ``_geometry``, ``_color``,
``_auto_augment``, ``_augment`` (RandomErasing), ``_container`` (Compose) and ``_batch``
(MixUp, CutMix, RandomChoice). This module only re-exports them.
"""

from __future__ import annotations

from .._ext import _transform  # noqa: F401  (the kernels' constants, read by the tests)
from ._augment import RandomErasing
from ._auto_augment import AutoAugment, AutoAugmentPolicy, RandAugment, TrivialAugmentWide
from ._base import (  # noqa: F401  (private names: the chain compiler, the cache and the tests use them)
    ImageSpec,
    Size,
    Transform,
    _Augment,
    _bfloat16_bits,
    _interp,
    _pair,
    _resize,
    as_bfloat16,
)
from ._batch import _BATCH_POSITION, BatchTransform, CutMix, MixUp, RandomChoice  # noqa: F401
from ._color import ColorJitter, RandomGrayscale
from ._container import Compose
from ._geometry import (
    CenterCrop,
    RandomAffine,
    RandomCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    RandomRotation,
    Resize,
)
from ._misc import Cast, Decode, GaussianBlur, Normalize, ToCHW
from ._rng import _Rng, _rrc_params, random_resized_crop_box  # noqa: F401

__all__ = [
    "AutoAugment",
    "AutoAugmentPolicy",
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
