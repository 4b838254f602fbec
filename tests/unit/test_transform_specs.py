"""Transform specs: validation, immutability, shape/dtype/layout planning, positions and
the Python twin of the counter-based generator."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def test_public_names():
    assert ll.transforms is T
    for name in ("Decode", "RandomResizedCrop", "Resize", "CenterCrop", "RandomHorizontalFlip", "Normalize",
                 "ToCHW", "Cast", "Compose", "ImageSpec"):
        assert name in T.__all__ and hasattr(T, name)


def test_specs_are_frozen_and_hashable():
    rrc = T.RandomResizedCrop(224)
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'size'"):
        rrc.size = 100  # type: ignore[misc]
    assert rrc == T.RandomResizedCrop(224) and hash(rrc) == hash(T.RandomResizedCrop(224))
    assert T.Normalize([0.5, 0.5, 0.5], [0.2, 0.2, 0.2]).mean == (0.5, 0.5, 0.5)
    assert T.Decode(mode="rgb").mode == "RGB"
    assert T.Cast(np.float32).dtype == "float32"


@pytest.mark.parametrize(("make", "match"), [
    (lambda: T.RandomResizedCrop(0), "size must be positive"),
    (lambda: T.RandomResizedCrop((10, -1)), "size must be positive"),
    (lambda: T.RandomResizedCrop(10, scale=(0.5, 0.1)), r"scale must satisfy 0 < min <= max"),
    (lambda: T.RandomResizedCrop(10, ratio=(0, 1)), r"ratio must satisfy 0 < min <= max"),
    (lambda: T.RandomResizedCrop(10, interpolation="cubic"), "interpolation must be one of"),
    (lambda: T.Resize("big"), r"size must be an int or a \(height, width\) pair"),
    (lambda: T.CenterCrop((1, 2, 3)), r"size must be an int or a \(height, width\) pair"),
    (lambda: T.RandomHorizontalFlip(p=1.5), r"p must be in \[0, 1\]"),
    (lambda: T.Normalize((0.5, 0.5), (0.2,)), "mean and std need the same length"),
    (lambda: T.Normalize(0.5, 0.0), "std must not contain zeros"),
    (lambda: T.Cast("int64"), "Cast supports"),
    (lambda: T.Decode(mode="CMYK"), "mode must be one of"),
])
def test_invalid_arguments_raise_value_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_compose_rejects_non_callables_and_flattens():
    with pytest.raises(TypeError, match="Compose items must be callable, got int"):
        T.Compose([T.ToCHW(), 3])
    inner = T.Compose([T.RandomResizedCrop(8), T.RandomHorizontalFlip()])
    outer = T.Compose([T.Decode(), inner, T.ToCHW()])
    assert [type(t).__name__ for t in outer.steps] == ["Decode", "RandomResizedCrop", "RandomHorizontalFlip", "ToCHW"]
    assert outer.positions() == [0, 0, 1, 2]  # Decode takes no position
    assert outer.random and not T.Compose([T.Resize(3)]).random


def test_plan_propagates_shape_dtype_layout():
    start = T.ImageSpec(encoded=True)
    s = T.Compose([T.Decode(), T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.Normalize(MEAN, STD),
                   T.ToCHW()]).plan(start)
    assert s.shape == (3, 224, 224) and s.dtype == np.float32 and s.layout == "CHW"
    s = T.Compose([T.Decode(), T.RandomResizedCrop((100, 80))]).plan(start)
    assert s.shape == (100, 80, 3) and s.dtype == np.uint8
    assert T.Decode().plan(start).shape is None
    assert T.Decode(mode="GRAY").plan(start).channels == 1
    assert T.Resize(256).plan(start).shape is None
    assert T.Resize(256).plan(T.ImageSpec(375, 500, 3)).shape == (256, 341, 3)
    assert T.Resize((10, 20)).plan(start).shape == (10, 20, 3)
    assert T.Compose([T.Resize(256), T.CenterCrop(224)]).plan(start).shape == (224, 224, 3)
    assert T.Cast("float32").plan(T.ImageSpec(4, 5, 3)).dtype == np.float32
    assert T.Compose([T.CenterCrop(8), lambda x: x]).plan(start).shape is None
    with pytest.raises(ValueError, match="ToCHW applied twice"):
        T.Compose([T.ToCHW(), T.ToCHW()]).plan(T.ImageSpec(4, 5, 3))
    with pytest.raises(ValueError, match="Normalize has 3 means for 1 channels"):
        T.Normalize(MEAN, STD).plan(T.ImageSpec(4, 5, 1))


def test_plan_agrees_with_what_a_call_produces():
    img = np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    chains = [
        [T.RandomResizedCrop((20, 30)), T.Normalize(MEAN, STD), T.ToCHW()],
        [T.Resize(16), T.CenterCrop((9, 11)), T.Cast("float32")],
        [T.Resize((5, 6), interpolation="nearest"), T.RandomHorizontalFlip()],
    ]
    for steps in chains:
        c = T.Compose(steps)
        out = c(img, seed=1)
        spec = c.plan(T.ImageSpec(37, 53, 3))
        assert spec.shape == out.shape and spec.dtype == out.dtype


def test_python_generator_draws():
    r = T._Rng(1, 2, 3, 4)
    u = [r.uniform(c) for c in range(20_000)]
    assert min(u) >= 0.0 and max(u) < 1.0
    assert abs(np.mean(u) - 0.5) < 0.01
    b = [r.below(c, 7) for c in range(7000)]
    assert set(b) == set(range(7)) and max(np.bincount(b)) < 1150
    # the key depends on every field, and draws are pure functions of (key, counter)
    keys = {T._Rng(*k).key for k in [(1, 2, 3, 4), (0, 2, 3, 4), (1, 0, 3, 4), (1, 2, 0, 4), (1, 2, 3, 0)]}
    assert len(keys) == 5
    assert T._Rng(1, 2, 3, 4).u64(99) == r.u64(99)


def test_decode_on_a_decoded_image_is_identity():
    img = np.zeros((4, 5, 3), np.uint8)
    assert T.Decode()(img) is img


def test_geometric_transforms_need_an_hwc_image():
    with pytest.raises(TypeError, match=r"CenterCrop expects an HWC numpy image \(H, W, C\), got ndarray\(4, 4\)"):
        T.CenterCrop(4)(np.zeros((4, 4), np.uint8))
    with pytest.raises(TypeError, match="RandomResizedCrop expects an HWC numpy image .* got list"):
        T.RandomResizedCrop(4)([1, 2, 3])


def test_random_resized_crop_box_matches_a_plain_model():
    """The one RRC box definition, with numpy draws, against torchvision's algorithm written out."""
    import math

    import numpy as np

    from loaderlib.transforms import random_resized_crop_box

    def model(width, height, scale, ratio, rng):
        area = width * height
        for _ in range(10):
            target = area * (scale[0] + (scale[1] - scale[0]) * rng.random())
            lr0, lr1 = math.log(ratio[0]), math.log(ratio[1])
            ar = math.exp(lr0 + (lr1 - lr0) * rng.random())
            w, h = round(math.sqrt(target * ar)), round(math.sqrt(target / ar))
            if 0 < w <= width and 0 < h <= height:
                return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
        in_ratio = width / height
        if in_ratio < min(ratio):
            w, h = width, round(width / min(ratio))
        elif in_ratio > max(ratio):
            h, w = height, round(height * max(ratio))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    for k, (w, h) in enumerate([(500, 375), (64, 48), (10, 300), (300, 10), (1, 1)]):
        for scale, ratio in [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.9, 1.0), (0.2, 5.0))]:
            got = random_resized_crop_box(w, h, scale, ratio, rng=np.random.default_rng(k))
            assert got == model(w, h, scale, ratio, np.random.default_rng(k))
