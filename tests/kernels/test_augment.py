"""Native augmentations against independent numpy / OpenCV implementations of torchvision's
documented formulas, on the parameters the native sampler drew; the fused chain against the
same ops called step by step, at 1 and 2 threads.

Tolerances (NOTE [ Augmentation arithmetic ] in pyx/include/ll_augment.h):
* point ops (brightness, contrast, saturation, grayscale, posterize, solarize, invert,
  autocontrast, equalize): at most 1 level, on at most 0.5% of the values. The kernel and the
  reference do the same float32 operations; a float32 result that lands on an integer
  boundary before truncation can still round differently when the compiler reorders a sum.
* hue: at most 1 level (a float32 HSV round trip, then x * 255.999 truncated).
* blur and sharpness: at most 1 level (float32 convolution sums in another order, then
  round-half-even).
* geometric ops (shear, translate, rotate, affine, nearest): identical except where a
  source coordinate lies on a half-pixel tie (within 1e-4), where float32 (the kernel, and
  torch's grid) and the float64 reference may pick different neighbours.
* RandomCrop and RandomErasing: exact (pure indexing).
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest

from benchmarks._synth import encode_jpeg
from loaderlib import transforms as T
from loaderlib._chain import compile_chain
from loaderlib.decoding import decode
from tests.conftest import make_photo

OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
       "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert")


def _img(h: int = 48, w: int = 64, seed: int = 0, gray: bool = False) -> np.ndarray:
    img = np.ascontiguousarray(make_photo(w, h, seed)[:, :, ::-1])
    if gray:
        img = np.ascontiguousarray(img[:, :, :1])
    return img


def _rng(seed: int, pos: int = 0) -> T._Rng:
    return T._Rng(seed, 0, seed * 7 + 1, pos)


# --------------------------------------------------------------------------- references
F32 = np.float32


def ref_trunc(x: np.ndarray) -> np.ndarray:
    return np.clip(x, 0, 255).astype(np.uint8)


def fma32(a, b, c):
    """float32 fused multiply-add: torch's CPU ``x.add_(y, alpha=a)`` computes x + a * y this
    way. The float32 product is exact in float64; one rounding of the sum (double rounding
    through float64 is off in rare halfway cases only)."""
    return (np.asarray(a, F32).astype(np.float64) * np.asarray(b, F32) + np.asarray(c, F32)).astype(F32)


def ref_gray(img: np.ndarray) -> np.ndarray:
    """r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114) in float32."""
    f = img.astype(F32)
    return fma32(f[..., 2], F32(0.114), fma32(f[..., 1], F32(0.587), f[..., 0] * F32(0.2989)))


def ref_blend(img: np.ndarray, other, ratio: float) -> np.ndarray:
    """torchvision's _blend: image.mul(ratio).add_(other, alpha=1 - ratio), clamped, truncated."""
    return ref_trunc(fma32(other, F32(1.0 - ratio), img.astype(F32) * F32(ratio)))


def ref_brightness(img, f):
    return ref_trunc(img.astype(F32) * F32(f))


def ref_contrast(img, f):
    mean = np.floor(ref_gray(img)).mean(dtype=np.float64) if img.shape[2] == 3 else img.mean(dtype=np.float64)
    return ref_blend(img, F32(mean), f)


def ref_saturation(img, f):
    if img.shape[2] == 1:
        return img.copy()
    return ref_blend(img, np.floor(ref_gray(img))[..., None], f)


def ref_hue(img, f):
    if img.shape[2] == 1:
        return img.copy()
    x = img.astype(F32) * F32(1 / 255)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    maxc, minc = x.max(-1), x.min(-1)
    eqc = maxc == minc
    cr = maxc - minc
    s = cr / np.where(eqc, F32(1), maxc)
    div = np.where(eqc, F32(1), cr)
    rc, gc, bc = (maxc - r) / div, (maxc - g) / div, (maxc - b) / div
    h = np.where(maxc == r, bc - gc, np.where(maxc == g, F32(2) + rc - bc, F32(4) + gc - rc))
    h = np.fmod(h * F32(1 / 6) + F32(1), F32(1))
    h = np.mod(h + F32(f), F32(1))
    i = np.floor(h * F32(6))
    fr = h * F32(6) - i
    i = i.astype(int) % 6
    v = maxc
    p = np.clip(v * (F32(1) - s), 0, 1)
    q = np.clip(v * (F32(1) - s * fr), 0, 1)
    t = np.clip(v * (F32(1) - s * (F32(1) - fr)), 0, 1)
    table = np.stack([v, p, q, t], -1)
    sel = np.array([[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]])
    rgb = np.stack([np.take_along_axis(table, sel[c][i][..., None], -1)[..., 0] for c in range(3)], -1)
    return ref_trunc(rgb * F32(255.999))


def ref_grayscale(img):
    if img.shape[2] == 1:
        return img.copy()
    return np.repeat(ref_trunc(ref_gray(img))[..., None], 3, axis=2)


def ref_posterize(img, bits):
    return img & np.uint8((0xFF << (8 - bits)) & 0xFF) if bits < 8 else img.copy()


def ref_solarize(img, threshold):
    return np.where(img.astype(F32) >= F32(threshold), 255 - img, img).astype(np.uint8)


def ref_autocontrast(img):
    f = img.astype(F32)
    lo, hi = f.min((0, 1)), f.max((0, 1))
    scale = (hi - lo) * F32(1 / 255)
    eq = hi == lo
    lo, scale = np.where(eq, F32(0), lo), np.where(eq, F32(1), scale)
    return ref_trunc((f - lo) / scale)


def ref_equalize(img):
    """PIL's ImageOps.equalize per channel (the formula torchvision reproduces)."""
    out = img.copy()
    for c in range(img.shape[2]):
        ch = img[..., c]
        hist = np.bincount(ch.ravel(), minlength=256)
        nz = hist[hist > 0]
        step = (nz[:-1].sum() if len(nz) else 0) // 255
        if not step:
            continue
        lut = np.empty(256, np.int64)
        n = step // 2
        for k in range(256):
            lut[k] = min(255, n // step)
            n += hist[k]
        out[..., c] = lut[ch]
    return out


def ref_sharpness(img, f):
    h, w = img.shape[:2]
    if h <= 2 or w <= 2:
        return img.copy()
    k = np.full((3, 3), 1 / 13, F32)
    k[1, 1] = 5 / 13
    x = img.astype(F32)
    blur = np.rint(np.stack([cv2.filter2D(x[..., c], -1, k, borderType=cv2.BORDER_REFLECT_101)
                             for c in range(img.shape[2])], -1))
    out = x.copy()
    out[1:-1, 1:-1] = x[1:-1, 1:-1] + (blur[1:-1, 1:-1] - x[1:-1, 1:-1]) * F32(1 - f)
    return ref_trunc(out)


def ref_blur(img, kx, ky, sigma):
    def kernel(k):
        x = np.arange(k, dtype=np.float64) - (k - 1) / 2
        e = np.exp(-x * x / (2 * sigma * sigma))
        return (e / e.sum()).astype(F32)
    x = img.astype(F32)
    out = cv2.sepFilter2D(x, -1, kernel(kx), kernel(ky), borderType=cv2.BORDER_REFLECT_101)
    return np.clip(np.rint(out.reshape(img.shape)), 0, 255).astype(np.uint8)


def ref_inverse_affine(center, angle, translate, scale, shear):
    """torchvision's _get_inverse_affine_matrix (transcribed from its documented formula)."""
    rot, sx, sy = (math.radians(a) for a in (angle, *shear))
    cx, cy = center
    tx, ty = translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = np.array([[d, -b, 0.0], [-c, a, 0.0]]) / scale
    m[0, 2] = m[0, 0] * (-cx - tx) + m[0, 1] * (-cy - ty) + cx
    m[1, 2] = m[1, 0] * (-cx - tx) + m[1, 1] * (-cy - ty) + cy
    return m


TIES: list = []  # per ref_warp call: pixels whose source coordinate is a half-pixel tie


def ref_warp(img, m, fill=None):
    """grid_sample(nearest, align_corners=False) through the inverse matrix m. Records in
    TIES the pixels whose source coordinate lies within 1e-4 of a half-pixel tie, where
    float32 (torch and the kernel) and float64 can round to different neighbours."""
    h, w, C = img.shape
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float64)
    X, Y = xs - (w - 1) / 2, ys - (h - 1) / 2
    fx = m[0, 0] * X + m[0, 1] * Y + m[0, 2] + (w - 1) / 2
    fy = m[1, 0] * X + m[1, 1] * Y + m[1, 2] + (h - 1) / 2
    TIES.append((np.abs(np.abs(fx - np.floor(fx)) - 0.5) < 1e-4) | (np.abs(np.abs(fy - np.floor(fy)) - 0.5) < 1e-4))
    sx, sy = np.rint(fx), np.rint(fy)
    inside = (sx >= 0) & (sx < w) & (sy >= 0) & (sy < h)
    out = np.zeros_like(img)
    if fill is not None:
        out[:] = np.asarray(fill[:C], np.uint8)
    out[inside] = img[sy[inside].astype(int), sx[inside].astype(int)]
    return out


def ref_prim(name, mag, img, fill=None):
    h, w = img.shape[:2]
    if name == "Identity":
        return img.copy()
    if name in ("ShearX", "ShearY"):
        sh = math.degrees(math.atan(mag))
        return ref_warp(img, ref_inverse_affine((-w / 2, -h / 2), 0.0, (0, 0), 1.0,
                                                (sh, 0.0) if name == "ShearX" else (0.0, sh)), fill)
    if name in ("TranslateX", "TranslateY"):
        t = int(mag)
        return ref_warp(img, ref_inverse_affine((0, 0), 0.0, (t, 0) if name == "TranslateX" else (0, t), 1.0, (0, 0)), fill)
    if name == "Rotate":
        if mag % 360 == 0:
            return img.copy()
        return ref_warp(img, ref_inverse_affine((0, 0), -mag, (0, 0), 1.0, (0, 0)), fill)
    if name == "Brightness":
        return ref_brightness(img, 1 + mag)
    if name == "Color":
        return ref_saturation(img, 1 + mag)
    if name == "Contrast":
        return ref_contrast(img, 1 + mag)
    if name == "Sharpness":
        return ref_sharpness(img, 1 + mag)
    if name == "Posterize":
        return ref_posterize(img, int(mag))
    if name == "Solarize":
        return ref_solarize(img, 255.0 * mag)
    if name == "AutoContrast":
        return ref_autocontrast(img)
    if name == "Equalize":
        return ref_equalize(img)
    if name == "Invert":
        return 255 - img
    raise AssertionError(name)


GEOMETRIC = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"}


def assert_close(got, ref, what, levels=1, frac=0.005, geometric=False):
    if not geometric:
        TIES.clear()
    assert got.shape == ref.shape, f"{what}: shape {got.shape} vs {ref.shape}"
    diff = np.abs(got.astype(int) - ref.astype(int))
    if geometric:
        # every differing pixel must sit on a half-pixel tie of one of the warps
        ties = np.zeros(got.shape[:2], bool)
        for t in TIES:
            ties |= t
        TIES.clear()
        bad = (diff > 0).any(-1) & ~ties
        assert not bad.any(), f"{what}: {bad.sum()} pixels differ away from a half-pixel tie"
        return
    assert diff.max() <= levels, f"{what}: max diff {diff.max()} > {levels}"
    assert (diff > 0).mean() <= frac, f"{what}: {(diff > 0).mean():.2%} of the values differ"


# --------------------------------------------------------------------------- per-op tests


@pytest.mark.parametrize("gray", [False, True], ids=["rgb", "gray"])
def test_color_jitter_matches_reference(gray):
    op = T.ColorJitter(0.5, 0.5, 0.5, 0.3 if not gray else None)
    img = _img(gray=gray)
    for s in range(12):
        prm = op.get_params(*img.shape, _rng(s))
        ref = img
        for f in prm[:4].astype(int):
            fac = prm[4 + f]
            if f == 0:
                ref = ref_brightness(ref, fac)
            elif f == 1:
                ref = ref_contrast(ref, fac)
            elif f == 2:
                ref = ref_saturation(ref, fac)
            elif op.hue is not None:
                ref = ref_hue(ref, fac)
        assert_close(op.apply_params(img, prm), ref, f"seed {s} order {prm[:4]}", levels=1, frac=0.01)
        assert np.array_equal(op(img, seed=s, epoch=0, index=s * 7 + 1), op.apply_params(img, prm))


@pytest.mark.parametrize("factor", [0.0, 0.3, 1.0, 1.7])
def test_color_jitter_single_properties(factor):
    img = _img(seed=2)
    for name, ref in (("brightness", ref_brightness), ("contrast", ref_contrast), ("saturation", ref_saturation)):
        op = T.ColorJitter(**{name: (factor, factor)})
        prm = op.get_params(*img.shape, _rng(0))
        assert_close(op.apply_params(img, prm), ref(img, factor), f"{name} {factor}")
    for hue in (-0.5, -0.2, 0.0, 0.25, 0.5):
        op = T.ColorJitter(hue=(hue, hue))
        prm = op.get_params(*img.shape, _rng(0))
        assert_close(op.apply_params(img, prm), ref_hue(img, hue), f"hue {hue}", frac=0.01)


def test_grayscale_matches_reference():
    img = _img(seed=3)
    op = T.RandomGrayscale(0.5)
    seen = set()
    for s in range(20):
        prm = op.get_params(*img.shape, _rng(s))
        seen.add(bool(prm[0]))
        ref = ref_grayscale(img) if prm[0] else img
        assert_close(op.apply_params(img, prm), ref, f"seed {s}")
    assert seen == {True, False}


@pytest.mark.parametrize("ks", [3, (5, 3), 9])
def test_gaussian_blur_matches_opencv(ks):
    img = _img(seed=4)
    op = T.GaussianBlur(ks, (0.3, 3.0))
    kx, ky = op.kernel_size
    for s in range(5):
        prm = op.get_params(*img.shape, _rng(s))
        assert 0.3 <= prm[0] < 3.0
        assert_close(op.apply_params(img, prm), ref_blur(img, kx, ky, prm[0]), f"k={ks} sigma={prm[0]}",
                     frac=0.02)


def torch_blur_taps(k, sigma):
    """torchvision's _get_gaussian_kernel1d in float32: linspace(-lim, lim, k), exp(-x^2), / sum."""
    lim = np.float32((k - 1) / (2 * math.sqrt(2) * sigma))
    # torch.linspace on CPU: the first half steps up from the start, the second down from the end.
    step = np.float32((np.float64(lim) * 2) / (k - 1)) if k > 1 else np.float32(0)
    x = np.array([-lim + step * np.float32(i) if i < k // 2 else lim - step * np.float32(k - 1 - i)
                  for i in range(k)], np.float32)
    e = np.exp(-(x * x), dtype=np.float32)
    return (e.astype(np.float64) / e.astype(np.float64).sum()).astype(F32)


@pytest.mark.parametrize("k", [3, 9, 23, 51])
def test_blur_taps_have_no_subnormal_floats(k):
    """NOTE [ Blur taps ]: the taps the kernel convolves with are torchvision's, with those that
    would make subnormal floats cut (at sigma 0.3-0.8 they made a blur 5x slower)."""
    tiny = np.finfo(F32).tiny
    for sigma in (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 3.0, 10.0):
        taps = T._transform.blur_taps(k, sigma)
        ref = torch_blur_taps(k, sigma)
        kept = taps != 0
        # No subnormal tap, and no product of two kept taps (the vertical pass's smallest) is one.
        assert not np.any((taps != 0) & (np.abs(taps) < tiny)), (k, sigma, taps)
        assert float(taps[kept].min()) ** 2 >= tiny, (k, sigma)
        # The kept taps are torchvision's (up to float32 rounding of the sum), the cut ones negligible.
        np.testing.assert_allclose(taps[kept], ref[kept], rtol=1e-6)
        assert float(ref[~kept].sum()) < 1e-17, (k, sigma)
        assert kept[k // 2] and np.array_equal(kept, kept[::-1])
    # At sigma 0.5 the 23-tap kernel keeps the taps within 4.5 pixels of its centre.
    assert np.count_nonzero(T._transform.blur_taps(23, 0.5)) == 9


@pytest.mark.parametrize("sigma", [0.3, 0.5, 0.8])
def test_gaussian_blur_small_sigma_matches_opencv(sigma):
    img = _img(seed=4)
    op = T.GaussianBlur(23, sigma)
    prm = op.get_params(*img.shape, _rng(0))
    assert prm[0] == pytest.approx(sigma)
    assert_close(op.apply_params(img, prm), ref_blur(img, 23, 23, sigma), f"k=23 sigma={sigma}", frac=0.02)


def test_gaussian_blur_kernel_larger_than_image():
    img = _img(5, 4, seed=5)
    op = T.GaussianBlur(11, 2.0)
    prm = op.get_params(*img.shape, _rng(0))
    assert_close(op.apply_params(img, prm), ref_blur(img, 11, 11, 2.0), "11x11 on 4x5", frac=0.05)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("gray", [False, True], ids=["rgb", "gray"])
def test_policy_primitives_match_reference(name, gray):
    """Each primitive at several magnitudes, through RandAugment's op list."""
    img = _img(40, 56, seed=6, gray=gray)
    op = T.RandAugment(num_ops=1)
    k = OPS.index(name)
    for mag in {"Posterize": (0, 1, 4, 7, 8), "Solarize": (0.0, 0.3, 0.7, 1.0)}.get(
            name, (-0.9, -0.3, 0.0, 0.2, 0.99) if name not in ("TranslateX", "TranslateY", "Rotate")
            else (-30.0, -7.5, 0.0, 12.7, 90.0)):
        prm = np.zeros(T._transform.AUG_NPRM)
        prm[:3] = (1, k, mag)
        assert_close(op.apply_params(img, prm), ref_prim(name, mag, img), f"{name} {mag}",
                     geometric=name in GEOMETRIC, frac=0.005 if name in GEOMETRIC else 0.01)


@pytest.mark.parametrize("op", [T.TrivialAugmentWide(), T.RandAugment(num_ops=3, magnitude=14), T.AutoAugment(),
                                T.AutoAugment(T.AutoAugmentPolicy.CIFAR10), T.AutoAugment("svhn", fill=(10, 200, 30)),
                                T.TrivialAugmentWide(fill=(10, 200, 30))],
                         ids=["trivial", "randaug", "autoaug", "autoaug-cifar10", "autoaug-svhn-fill", "trivial-fill"])
def test_policies_match_reference_on_drawn_ops(op):
    img = _img(40, 56, seed=7)
    fill = op.fill
    for s in range(30):
        prm = op.get_params(*img.shape, _rng(s))
        ref = img
        n = int(prm[0])
        for j in range(n):
            name, mag = OPS[int(prm[1 + 2 * j])], prm[2 + 2 * j]
            ref = ref_prim(name, mag, ref, fill)
        names = [OPS[int(prm[1 + 2 * j])] for j in range(n)]
        assert_close(op.apply_params(img, prm), ref, f"seed {s}: {names}", levels=2, frac=0.01,
                     geometric=any(x in GEOMETRIC for x in names))


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric"])
def test_random_crop_matches_numpy_pad(mode):
    img = _img(20, 30, seed=8)
    for padding in (None, 3, (2, 5), (1, 2, 3, 4)):
        op = T.RandomCrop((18, 33), padding=padding, pad_if_needed=True, fill=(7, 8, 9), padding_mode=mode)
        for s in range(6):
            prm = op.get_params(*img.shape, _rng(s))
            pl, pt, pr, pb = prm[2:6].astype(int)
            kw = {"constant_values": 0} if mode == "constant" else {}
            padded = np.pad(img, ((pt, pb), (pl, pr), (0, 0)), mode=mode, **kw)
            if mode == "constant":
                padded[:pt], padded[padded.shape[0] - pb:] = (7, 8, 9), (7, 8, 9)
                padded[:, :pl], padded[:, padded.shape[1] - pr:] = (7, 8, 9), (7, 8, 9)
            top, left = int(prm[0]), int(prm[1])
            ref = padded[top:top + 18, left:left + 33]
            got = op.apply_params(img, prm)
            assert np.array_equal(got, ref), f"{mode} {padding} seed {s}"


def test_random_crop_too_small_raises():
    with pytest.raises(ValueError, match="pad_if_needed"):
        T.RandomCrop(64)(_img(20, 30), seed=0)


@pytest.mark.parametrize("center", [None, (5.0, 30.0)])
def test_random_rotation_matches_reference(center):
    img = _img(seed=9)
    op = T.RandomRotation(40, center=center, fill=(1, 2, 3))
    h, w = img.shape[:2]
    for s in range(8):
        prm = op.get_params(*img.shape, _rng(s))
        assert -40 <= prm[0] < 40
        c = (0.0, 0.0) if center is None else (center[0] - w / 2, center[1] - h / 2)
        ref = ref_warp(img, ref_inverse_affine(c, -prm[0], (0, 0), 1.0, (0, 0)), (1, 2, 3))
        assert_close(op.apply_params(img, prm), ref, f"angle {prm[0]}", geometric=True)


def test_random_affine_matches_reference():
    img = _img(seed=10)
    op = T.RandomAffine(25, translate=(0.2, 0.1), scale=(0.7, 1.3), shear=(-10, 10, -5, 5))
    for s in range(10):
        prm = op.get_params(*img.shape, _rng(s))
        angle, tx, ty, scale, shx, shy = prm[:6]
        assert tx == int(tx) and abs(tx) <= 0.2 * 64 + 0.5 and abs(ty) <= 0.1 * 48 + 0.5
        ref = ref_warp(img, ref_inverse_affine((0, 0), angle, (tx, ty), scale, (shx, shy)), (0, 0, 0))
        assert_close(op.apply_params(img, prm), ref, f"params {prm[:6]}", geometric=True)


@pytest.mark.parametrize("value", [0.0, (0.5, -1.0, 2.0), "random"])
def test_random_erasing_matches_numpy(value):
    img = np.random.default_rng(0).standard_normal((32, 40, 3)).astype(np.float32)
    op = T.RandomErasing(p=0.8, value=value)
    erased = 0
    for s in range(20):
        rng = _rng(s)
        prm = op.get_params(32, 40, 3, rng)
        got = op.apply_params(img, prm, key=rng.key)
        ref = img.copy()
        if prm[0]:
            erased += 1
            i, j, h, w = prm[1:5].astype(int)
            assert h < 32 and w < 40 and 0.02 * 32 * 40 - 40 <= h * w <= 0.33 * 32 * 40 + 40
            if value == "random":
                box = got[i:i + h, j:j + w]
                assert abs(box.mean()) < 0.5 and 0.5 < box.std() < 1.5  # standard normal values
                ref[i:i + h, j:j + w] = box
            else:
                ref[i:i + h, j:j + w] = np.broadcast_to(np.asarray(value, np.float32), (h, w, 3))
        assert np.array_equal(got, ref), f"seed {s}"
        assert np.array_equal(op(img, seed=s, epoch=0, index=s * 7 + 1), got)
    assert 8 <= erased <= 20


def test_augment_rejects_float_and_chw_input():
    with pytest.raises(TypeError, match="uint8"):
        T.ColorJitter(0.2)(np.zeros((8, 8, 3), np.float32), seed=0)
    with pytest.raises(ValueError, match="CHW"):
        T.RandAugment()(np.zeros((3, 16, 16), np.uint8), seed=0)
    with pytest.raises(ValueError, match="3 values"):
        T.RandomErasing(value=(1, 2, 3))(np.zeros((8, 8, 1), np.float32), seed=0)


# --------------------------------------------------------------------------- fused chain

RECIPE = [T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.TrivialAugmentWide(), T.ColorJitter(0.4, 0.4, 0.4, 0.1),
          T.RandomGrayscale(0.2), T.GaussianBlur(3), T.RandAugment(), T.AutoAugment(), T.RandomRotation(10),
          T.RandomAffine(5, (0.05, 0.05)), T.RandomCrop(36, padding=2, padding_mode="reflect"),
          T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), T.ToCHW(), T.RandomErasing(0.7, value="random")]


@pytest.fixture(scope="module")
def jpegs() -> list[bytes]:
    return [encode_jpeg(make_photo(90 + 13 * k, 70 + 7 * k, seed=k), 90, "420") for k in range(6)]


@pytest.mark.parametrize("gray", [False, True], ids=["rgb", "gray"])
def test_fused_chain_equals_step_by_step_at_1_and_2_threads(jpegs, gray):
    mode = "GRAY" if gray else "RGB"
    steps = [s if not isinstance(s, T.Normalize) or not gray else T.Normalize(0.5, 0.25) for s in RECIPE]
    chain = T.Compose([T.Decode(mode=mode, dct_scaling=False), *steps])
    plan = compile_chain(chain)
    assert plan is not None and plan.sample_shape == (1 if gray else 3, 36, 36)
    bufs = jpegs * 4
    idx = np.arange(100, 100 + len(bufs))
    outs = []
    for nt in (1, 2):
        out = np.zeros((len(bufs), *plan.sample_shape), np.float32)
        st = plan.run_buffers_into(bufs, out, idx, seed=11, epoch=3, num_threads=nt)
        assert not st.errors
        outs.append(out)
    assert np.array_equal(outs[0], outs[1])
    for k, b in enumerate(bufs):
        ref = chain(decode(b, mode=mode), seed=11, epoch=3, index=int(idx[k]))
        assert np.array_equal(outs[0][k], ref), f"item {k}"


def test_fused_uint8_chain_with_random_crop_only(jpegs):
    chain = T.Compose([T.Decode(dct_scaling=False), T.Resize((40, 48)), T.RandomCrop(32, padding=4)])
    plan = compile_chain(chain)
    out = np.zeros((6, 32, 32, 3), np.uint8)
    st = plan.run_buffers_into(jpegs, out, np.arange(6), seed=1, epoch=0, num_threads=2)
    assert not st.errors
    for k, b in enumerate(jpegs):
        assert np.array_equal(out[k], chain(decode(b), seed=1, epoch=0, index=k))


def test_fused_random_crop_larger_than_image_fails_the_item(jpegs):
    plan = compile_chain(T.Compose([T.Resize((20, 20)), T.RandomCrop(32)]))
    out = np.zeros((2, 32, 32, 3), np.uint8)
    st = plan.run_buffers_into(jpegs[:2], out, np.arange(2), seed=1, epoch=0, num_threads=1)
    assert set(st.errors) == {0, 1}
    assert "pad_if_needed" in str(st.errors[0])


def test_unfusable_orders_fall_back():
    assert compile_chain(T.Compose([T.ColorJitter(0.2), T.RandomResizedCrop(32)])) is None  # geometry after
    assert compile_chain(T.Compose([T.RandomResizedCrop(32), T.Normalize(0.5, 0.2), T.ColorJitter(0.2)])) is None
    assert compile_chain(T.Compose([T.RandomResizedCrop(32), T.RandomErasing(), T.Normalize(0.5, 0.2)])) is None
    plan = compile_chain(T.Compose([T.RandomResizedCrop(32), T.AutoAugment(), T.Normalize(0.5, 0.2)]))
    assert plan is not None and any("AutoAugment" in line for line in plan.describe())


@pytest.mark.parametrize("op", [T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomGrayscale(), T.GaussianBlur(5),
                                T.TrivialAugmentWide(), T.RandAugment(), T.AutoAugment(), T.RandomCrop(16, padding=3),
                                T.RandomRotation(20), T.RandomAffine(10, (0.1, 0.1))],
                         ids=lambda o: type(o).__name__)
def test_garbage_parameter_vectors_are_refused_or_harmless(op):
    """apply_params is public: any parameter vector (NaN, huge, negative) gives an image of
    the planned shape or a ValueError, never a crash or an out-of-bounds access."""
    img = _img(20, 24, seed=11)
    g = np.random.default_rng(0)
    for k in range(200):
        prm = g.choice([np.nan, np.inf, -np.inf, -1e12, -3.0, -0.5, 0.0, 0.5, 1.0, 2.0, 7.0, 14.0, 99.0, 1e12], 40)
        if k % 2:
            prm[0] = g.integers(0, 4)
            prm[1::2] = g.integers(0, 15, 20)
        try:
            out = op.apply_params(img, prm)
        except ValueError as e:
            assert "inconsistent parameters" in str(e)
            continue
        assert out.dtype == np.uint8 and out.shape[2] == 3
    erase = T.RandomErasing()
    with pytest.raises(ValueError, match="box outside the image"):
        erase.apply_params(np.zeros((8, 8, 3), np.float32), np.array([1, -2, 0, 4, 4] + [0] * 35, np.float64))
