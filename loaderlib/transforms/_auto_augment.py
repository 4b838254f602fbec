"""Augmentation policies: TrivialAugmentWide, RandAugment, AutoAugment (torchvision v2's
``_auto_augment``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._checks import check_int
from .._ext import _transform
from ._base import _Augment, _policy_fill

_AUG_OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
            "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert")


@dataclass(frozen=True)
class TrivialAugmentWide(_Augment):
    """TrivialAugment Wide (torchvision v2): one op of 14 chosen uniformly, at a magnitude
    bin chosen uniformly from ``num_magnitude_bins``, signed ops negated with probability 1/2."""

    num_magnitude_bins: int = 31
    interpolation: str = "nearest"
    fill: Any = None

    _kind = _transform.AUG_TRIVIAL

    def __post_init__(self) -> None:
        check_int(self.num_magnitude_bins, "num_magnitude_bins", minimum=2)
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
        check_int(self.num_ops, "num_ops", maximum=19)
        check_int(self.num_magnitude_bins, "num_magnitude_bins", minimum=2)
        check_int(self.magnitude, "magnitude", maximum=self.num_magnitude_bins - 1)
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
