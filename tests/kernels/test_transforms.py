"""Single-image transforms and their kernels against independent references
(OpenCV's resize, Pillow's antialiased bilinear, numpy slicing and float32 arithmetic, a
transcription of torchvision's RandomResizedCrop.get_params on numpy's generator)."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest

from loaderlib import transforms as T
from loaderlib._ext import _transform
from tests.conftest import make_photo
from tests.kernels import _resample_ref as resample_ref

# (source w, h) -> (target w, h): down and up, integer and fractional factors, mixed axes.
RESIZE_CASES = [
    ((512, 600), (224, 224)), ((512, 600), (256, 300)), ((512, 600), (64, 75)), ((512, 600), (1000, 700)),
    ((333, 251), (224, 224)), ((333, 251), (111, 83)), ((333, 251), (700, 400)), ((333, 251), (100, 500)),
    ((17, 13), (224, 224)), ((17, 13), (5, 3)), ((1031, 777), (224, 224)), ((1031, 777), (37, 29)),
    ((64, 48), (65, 47)), ((500, 375), (500, 375)), ((1, 1), (7, 5)), ((40, 1), (13, 3)),
]


def _photo_rgb(w: int, h: int, seed: int = 0) -> np.ndarray:
    return np.ascontiguousarray(make_photo(w, h, seed)[:, :, ::-1])


def _native_resize(img: np.ndarray, w: int, h: int, interp: int, antialias: bool = False) -> np.ndarray:
    out = np.empty((h, w, img.shape[2]), np.uint8)
    _transform.resize_into(img, out, interp, antialias)
    return out


@pytest.mark.parametrize("interp, flag", [(_transform.INTERP_LINEAR, cv2.INTER_LINEAR),
                                          (_transform.INTERP_AREA, cv2.INTER_AREA)],
                         ids=["bilinear", "area"])
def test_resize_within_one_level_of_opencv(interp, flag):
    for k, ((sw, sh), (dw, dh)) in enumerate(RESIZE_CASES):
        src = _photo_rgb(sw, sh, seed=k)
        got = _native_resize(src, dw, dh, interp)
        ref = cv2.resize(src, (dw, dh), interpolation=flag).reshape(dh, dw, 3)
        diff = np.abs(got.astype(int) - ref)
        assert diff.max() <= 1, f"{(sw, sh)}->{(dw, dh)}: max diff {diff.max()}"
        assert diff.mean() < 0.2, f"{(sw, sh)}->{(dw, dh)}: mean diff {diff.mean()}"


@pytest.mark.parametrize("channels", [1, 4])
def test_resize_other_channel_counts(channels):
    src = _photo_rgb(333, 251, seed=3)
    src = np.ascontiguousarray(np.concatenate([src, src[:, :, :1]], axis=2)[:, :, :channels])
    for interp, flag in ((_transform.INTERP_LINEAR, cv2.INTER_LINEAR), (_transform.INTERP_AREA, cv2.INTER_AREA)):
        got = _native_resize(src, 150, 222, interp)
        ref = cv2.resize(src, (150, 222), interpolation=flag).reshape(222, 150, channels)
        assert np.abs(got.astype(int) - ref).max() <= 1


def test_nearest_takes_the_pixel_under_each_centre():
    for (sw, sh), (dw, dh) in RESIZE_CASES:
        src = _photo_rgb(sw, sh, seed=1)
        got = _native_resize(src, dw, dh, _transform.INTERP_NEAREST)
        ys = np.minimum(np.floor((np.arange(dh) + 0.5) * sh / dh).astype(int), sh - 1)
        xs = np.minimum(np.floor((np.arange(dw) + 0.5) * sw / dw).astype(int), sw - 1)
        assert np.array_equal(got, src[ys][:, xs]), f"{(sw, sh)}->{(dw, dh)}"


def test_antialiased_bilinear_matches_pillow():
    from PIL import Image

    for (sw, sh), (dw, dh) in [((512, 600), (64, 75)), ((1031, 777), (224, 224)), ((333, 251), (100, 90))]:
        src = _photo_rgb(sw, sh, seed=2)
        got = _native_resize(src, dw, dh, _transform.INTERP_LINEAR, antialias=True)
        ref = np.asarray(Image.fromarray(src).resize((dw, dh), Image.BILINEAR))
        diff = np.abs(got.astype(int) - ref)
        assert diff.max() <= 1, f"{(sw, sh)}->{(dw, dh)}: {diff.max()}"
        # and it really is a different filter from plain bilinear on strong reductions
        plain = _native_resize(src, dw, dh, _transform.INTERP_LINEAR)
        assert np.abs(plain.astype(int) - ref).max() > 5


def test_resize_transform_semantics():
    img = _photo_rgb(500, 375)
    out = T.Resize(256)(img)
    assert out.shape == (256, int(256 * 500 / 375), 3)  # shorter side, torchvision's int()
    out = T.Resize(100)(_photo_rgb(80, 333))
    assert out.shape == (int(100 * 333 / 80), 100, 3)
    out = T.Resize((123, 45), interpolation="area")(img)
    ref = cv2.resize(img, (45, 123), interpolation=cv2.INTER_AREA)
    assert np.abs(out.astype(int) - ref).max() <= 1


def test_crop_flip_and_layout_are_exact():
    img = _photo_rgb(333, 251, seed=4)
    assert np.array_equal(T.CenterCrop(100)(img), img[76:176, 116:216])
    assert np.array_equal(T.CenterCrop((50, 81))(img), img[100:150, 126:207])
    # torchvision rounds the offset: (251 - 2) / 2 = 124.5 -> 124 (half to even)
    assert np.array_equal(T.CenterCrop((2, 333))(img), img[124:126])
    assert np.array_equal(T.RandomHorizontalFlip(p=1.0)(img), img[:, ::-1])
    assert np.array_equal(T.RandomHorizontalFlip(p=0.0)(img), img)
    chw = T.ToCHW()(img)
    assert chw.shape == (3, 251, 333) and chw.flags.c_contiguous
    assert np.array_equal(chw, np.moveaxis(img, 2, 0))


def test_center_crop_larger_than_image_pads_with_zeros_like_torchvision():
    img = _photo_rgb(20, 10, seed=5)
    out = T.CenterCrop((15, 25))(img)
    # torchvision pads left (25-20)//2 = 2, top (15-10)//2 = 2, the rest right/bottom
    ref = np.zeros((15, 25, 3), np.uint8)
    ref[2:12, 2:22] = img
    assert np.array_equal(out, ref)


def test_normalize_within_1e6_of_numpy_float32():
    img = _photo_rgb(64, 48, seed=6)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    out = T.Normalize(mean, std)(img)
    ref = (img.astype(np.float32) / 255.0 - np.float32(mean)) / np.float32(std)
    assert out.dtype == np.float32
    assert np.abs(out - ref).max() <= 1e-6
    # a single value applies to every channel
    out1 = T.Normalize(0.5, 0.25)(img)
    assert np.abs(out1 - (img.astype(np.float32) / 255.0 - 0.5) / 0.25).max() <= 1e-6


def test_cast():
    img = _photo_rgb(16, 8)
    f = T.Cast("float32")(img)
    assert f.dtype == np.float32 and np.array_equal(f, img.astype(np.float32))
    back = T.Cast("uint8")(f * 1.0001 + 300 - 300)
    assert back.dtype == np.uint8 and np.abs(back.astype(int) - img).max() <= 1
    assert np.array_equal(T.Cast("uint8")(np.array([[[-3.0, 255.6, 2.5]]], np.float32)), [[[0, 255, 2]]])


def test_transforms_accept_float_images_after_normalize():
    img = _photo_rgb(100, 80, seed=7)
    x = T.Normalize(0.5, 0.5)(img)
    y = T.Resize((40, 50))(x)
    ref = cv2.resize(x, (50, 40), interpolation=cv2.INTER_LINEAR)
    assert y.dtype == np.float32 and np.abs(y - ref).max() < 1e-5
    assert T.CenterCrop(10)(x).shape == (10, 10, 3)


def test_compose_treats_chw_images_as_chw():
    img = _photo_rgb(64, 48, seed=8)
    c = T.Compose([T.ToCHW(), T.Normalize((0.1, 0.2, 0.3), (0.5, 0.5, 0.5))])
    out = c(img, seed=0)
    ref = np.moveaxis(T.Normalize((0.1, 0.2, 0.3), (0.5, 0.5, 0.5))(img), 2, 0)
    assert out.shape == (3, 48, 64) and np.abs(out - ref).max() <= 1e-6


# --------------------------------------------------------------------------- randomness


def test_python_generator_is_the_native_one():
    rng = np.random.default_rng(0)
    for _ in range(300):
        seed, epoch, index, pos = (int(v) for v in rng.integers(0, 2**63, 4))
        r = T._Rng(seed, epoch, index, pos)
        key = _transform.rng_key(seed, epoch, index, pos)
        assert r.key == key
        for c in (0, 1, 7, 39, 2**40):
            assert r.u64(c) == _transform.rng_u64(key, c)
            assert r.uniform(c) == _transform.rng_uniform(key, c)
    # negative seeds are taken modulo 2**64 on both sides
    assert T._Rng(-1, 0, 0, 0).key == _transform.rng_key(2**64 - 1, 0, 0, 0)


def test_rrc_box_identical_in_python_and_native():
    rng = np.random.default_rng(1)
    cases = [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.5, 0.5), (1.0, 1.0)), ((0.9, 1.0), (2.0, 3.0)), ((0.01, 0.2), (0.2, 5))]
    for k in range(3000):
        w, h = (int(v) for v in rng.integers(1, 2000, 2))
        if k % 10 == 0:
            w = int(rng.integers(1, 30))  # extreme aspect ratios exercise the fallback
        scale, ratio = cases[k % len(cases)]
        r = T._Rng(7, 3, k, 2)
        py = T._rrc_params(r, w, h, scale, ratio)
        nat = _transform.rrc_params(r.key, w, h, scale[0], scale[1], ratio[0], ratio[1])
        assert py == tuple(nat), (w, h, scale, ratio)
        i, j, bh, bw = py
        assert 0 <= i and 0 <= j and 0 < bh and 0 < bw and i + bh <= h and j + bw <= w


def _torchvision_get_params(gen: np.random.Generator, width, height, scale, ratio):
    """A line-by-line transcription of torchvision.transforms.RandomResizedCrop.get_params
    (torch's generator replaced by numpy's)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * gen.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(gen.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))  # noqa: RUF046
        h = int(round(math.sqrt(target_area / aspect_ratio)))  # noqa: RUF046
        if 0 < w <= width and 0 < h <= height:
            i = int(gen.integers(0, height - h + 1))
            j = int(gen.integers(0, width - w + 1))
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))  # noqa: RUF046
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))  # noqa: RUF046
    else:
        w = width
        h = height
    i = (height - h) // 2
    j = (width - w) // 2
    return i, j, h, w


def _ks(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    return float(np.max(np.abs(np.searchsorted(a, grid, "right") / len(a) - np.searchsorted(b, grid, "right") / len(b))))


@pytest.mark.parametrize("width, height", [(500, 375), (224, 600), (64, 64)])
def test_rrc_box_statistics_match_torchvision_over_10000_draws(width, height):
    n = 10_000
    rrc = T.RandomResizedCrop(224)
    ours = np.array([rrc.get_params(width, height, T._Rng(0, 0, k, 0)) for k in range(n)], float)
    gen = np.random.default_rng(12345)
    ref = np.array([_torchvision_get_params(gen, width, height, rrc.scale, rrc.ratio) for _ in range(n)], float)
    for arr in (ours, ref):
        assert np.all(arr[:, 2] >= 1) and np.all(arr[:, 0] + arr[:, 2] <= height)
        assert np.all(arr[:, 1] + arr[:, 3] <= width)
    area = lambda a: a[:, 2] * a[:, 3] / (width * height)
    logr = lambda a: np.log(a[:, 3] / a[:, 2])
    centre_y = lambda a: (a[:, 0] + a[:, 2] / 2) / height
    centre_x = lambda a: (a[:, 1] + a[:, 3] / 2) / width
    # two-sample Kolmogorov-Smirnov: the 0.1% critical value for 10,000 vs 10,000 is 0.0276
    for name, f in (("area fraction", area), ("log aspect ratio", logr), ("centre y", centre_y),
                    ("centre x", centre_x)):
        d = _ks(f(ours), f(ref))
        assert d < 0.0276, f"{name}: KS distance {d:.4f}"
    assert abs(area(ours).mean() - area(ref).mean()) < 0.01
    # the test has the power to see a small mistake: a scale range of (0.12, 1) is caught
    wrong = np.array([_torchvision_get_params(gen, width, height, (0.12, 1.0), rrc.ratio) for _ in range(n)], float)
    assert _ks(area(ours), area(wrong)) > 0.0276


def test_random_transforms_depend_only_on_their_key():
    img = _photo_rgb(300, 200, seed=9)
    rrc = T.RandomResizedCrop(64)
    a = rrc(img, seed=5, epoch=1, index=17)
    assert np.array_equal(a, rrc(img, seed=5, epoch=1, index=17))
    assert not np.array_equal(a, rrc(img, seed=6, epoch=1, index=17))
    assert not np.array_equal(a, rrc(img, seed=5, epoch=2, index=17))
    assert not np.array_equal(a, rrc(img, seed=5, epoch=1, index=18))
    flips = [T.RandomHorizontalFlip()(img, seed=0, index=k)[0, 0, 0] != img[0, 0, 0] for k in range(400)]
    assert 150 < sum(flips) < 250  # p = 0.5
    # fresh seeds when none is given: two calls almost surely differ
    assert any(not np.array_equal(rrc(img), rrc(img)) for _ in range(3))


def test_rrc_crops_the_drawn_box_then_resizes():
    img = _photo_rgb(300, 200, seed=10)
    rrc = T.RandomResizedCrop((50, 70), scale=(0.2, 0.6))
    i, j, h, w = rrc.get_params(300, 200, T._Rng(3, 0, 4, 0))
    ref = resample_ref.resize(img[i:i + h, j:j + w], 50, 70)   # antialiased by default
    out = rrc(img, seed=3, index=4)
    assert out.shape == (50, 70, 3) and np.abs(out.astype(int) - ref).max() <= 1
    plain = T.RandomResizedCrop((50, 70), scale=(0.2, 0.6), antialias=False)(img, seed=3, index=4)
    ref = cv2.resize(img[i:i + h, j:j + w], (70, 50), interpolation=cv2.INTER_LINEAR)
    assert np.abs(plain.astype(int) - ref).max() <= 1


def test_antialias_reference_is_pillows_bilinear():
    """The numpy model of the documented filter against an independent implementation
    (Pillow's BILINEAR reduce, float, then rounded): it is the filter torchvision and
    Pillow use, and differs from OpenCV's box average (INTER_AREA) by well under 2 levels."""
    from PIL import Image

    for (sw, sh), (dw, dh) in [((512, 600), (64, 75)), ((333, 251), (100, 90)), ((1031, 777), (224, 200))]:
        src = _photo_rgb(sw, sh, seed=7)
        ref = resample_ref.resize(src, dh, dw)
        pil = np.asarray(Image.fromarray(src).resize((dw, dh), Image.BILINEAR))
        assert np.abs(ref.astype(int) - pil).max() <= 1
        # the plain bilinear model (antialias off) is cv2.INTER_LINEAR
        lin = resample_ref.resize(src, dh, dw, antialias=False)
        assert np.abs(lin.astype(int) - cv2.resize(src, (dw, dh), interpolation=cv2.INTER_LINEAR)).max() <= 1
        # a low-pass: much closer to OpenCV's box average than aliasing bilinear is
        area = cv2.resize(src, (dw, dh), interpolation=cv2.INTER_AREA).astype(int)
        assert np.abs(ref - area).mean() < 0.7 * np.abs(lin - area).mean()


def test_resize_antialiases_by_default_like_torchvision_v2():
    """Resize and RandomResizedCrop default to antialias=True: every downscaling case is within
    +-1 of the numpy model of the triangle filter, upscaling is plain bilinear (cv2), and
    antialias=False keeps plain bilinear (which aliases: far from the model)."""
    assert T.Resize(10).antialias and T.RandomResizedCrop(10).antialias
    for k, ((sw, sh), (dw, dh)) in enumerate(RESIZE_CASES):
        src = _photo_rgb(sw, sh, seed=20 + k)
        got = T.Resize((dh, dw))(src)
        ref = resample_ref.resize(src, dh, dw)
        assert np.abs(got.astype(int) - ref).max() <= 1, f"{(sw, sh)}->{(dw, dh)}"
        if dw > sw and dh > sh:   # upscaling: no low-pass, OpenCV's bilinear
            assert np.abs(got.astype(int) - cv2.resize(src, (dw, dh), interpolation=cv2.INTER_LINEAR)).max() <= 1
    src = _photo_rgb(1031, 777, seed=3)
    plain = T.Resize((37, 29), antialias=False)(src)
    assert np.abs(plain.astype(int) - resample_ref.resize(src, 37, 29)).mean() > 2.0
