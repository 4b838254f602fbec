"""Augmentation policies: TrivialAugmentWide, RandAugment, AutoAugment (torchvision v2's
``_auto_augment``)."""

from __future__ import annotations

import enum
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


class AutoAugmentPolicy(str, enum.Enum):
    """The policies AutoAugment learned on three datasets (torchvision's ``AutoAugmentPolicy``).

    Each is a table of 25 sub-policies of two ops (op, probability, magnitude bin), copied
    from torchvision v2 in its order. The members are also their strings (``"imagenet"``,
    ``"cifar10"``, ``"svhn"``), which :class:`AutoAugment` accepts too.
    """

    IMAGENET = "imagenet"
    CIFAR10 = "cifar10"
    SVHN = "svhn"


# The index of each policy's table in pyx/include/ll_augment.h ll_autoaug_policies.
_POLICY_TABLE = {AutoAugmentPolicy.IMAGENET: 0, AutoAugmentPolicy.CIFAR10: 1, AutoAugmentPolicy.SVHN: 2}


@dataclass(frozen=True)
class AutoAugment(_Augment):
    """AutoAugment (torchvision v2) with one of its learned policies.

    One of the policy's 25 sub-policies is chosen uniformly, then each of its two ops is
    applied with its probability at its magnitude bin (of 10), signed ops negated with
    probability 1/2.

    Parameters
    ----------
    policy : AutoAugmentPolicy or str
        ``AutoAugmentPolicy.IMAGENET`` (default), ``CIFAR10`` or ``SVHN``, or their strings
        ``"imagenet"``, ``"cifar10"``, ``"svhn"`` (torchvision's enum is accepted too).
    interpolation : str
        ``"nearest"`` (default) or ``"bilinear"``, for the geometric ops.
    fill : number or sequence, optional
        Pixel value of the area the geometric ops uncover (0 when not given).
    """

    policy: Any = AutoAugmentPolicy.IMAGENET
    interpolation: str = "nearest"
    fill: Any = None

    _kind = _transform.AUG_AUTOAUG

    def __post_init__(self) -> None:
        name = getattr(self.policy, "value", self.policy)
        try:
            policy = AutoAugmentPolicy(name.lower() if isinstance(name, str) else name)
        except ValueError:
            raise ValueError(f"AutoAugment policy must be one of {[p.value for p in AutoAugmentPolicy]} "
                             f"(or AutoAugmentPolicy.IMAGENET, CIFAR10, SVHN), got {self.policy!r}") from None
        object.__setattr__(self, "policy", policy)
        _policy_fill(self.fill, self.interpolation)

    def _config(self) -> tuple[tuple, tuple]:
        (bil, has_fill), fill = _policy_fill(self.fill, self.interpolation)
        return (_POLICY_TABLE[self.policy], 0, 0, 0, 0, 0, bil, has_fill), (0.0,) * 12 + tuple(fill)
