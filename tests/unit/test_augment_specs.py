"""Augmentation specs: parameter validation, the native parameter distributions against a
plain-Python model of torchvision's sampling (two-sample Kolmogorov-Smirnov over 10,000
draws), and the batch-level MixUp / CutMix (values, soft labels, box areas, determinism in a
DataLoader at 1 and 2 threads and across a resume)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T
from tests.kernels._loader_images import make_image_folder

N_DRAWS = 10_000
TRIVIAL = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
           "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")
SIGNED = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast", "Sharpness"}


# --------------------------------------------------------------------------- KS test


def ks_statistic(a, b) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    a, b = np.sort(np.asarray(a, np.float64)), np.sort(np.asarray(b, np.float64))
    grid = np.concatenate([a, b])
    return float(np.abs(np.searchsorted(a, grid, "right") / len(a) - np.searchsorted(b, grid, "right") / len(b)).max())


def ks_critical(n: int, m: int, alpha: float = 0.001) -> float:
    """Asymptotic critical value c(alpha) * sqrt((n + m) / (n m)), c = sqrt(-ln(alpha / 2) / 2)."""
    return math.sqrt(-0.5 * math.log(alpha / 2)) * math.sqrt((n + m) / (n * m))


def assert_same_distribution(native, model, what):
    d, crit = ks_statistic(native, model), ks_critical(len(native), len(model))
    assert d < crit, f"{what}: KS statistic {d:.4f} >= critical {crit:.4f}"


def native_draws(op, h=224, w=224, c=3, n=N_DRAWS):
    return [op.get_params(h, w, c, T._Rng(5, 1, i, 3)) for i in range(n)]


def linspace(a, b, n, k):
    return a + (b - a) * k / (n - 1)


def test_ks_detects_a_different_distribution():
    """The test itself can fail: a 10% wider range is detected."""
    native = [p[4] for p in native_draws(T.ColorJitter(brightness=0.4))]
    r = random.Random(0)
    assert ks_statistic(native, [r.uniform(0.6, 1.44) for _ in range(N_DRAWS)]) > ks_critical(N_DRAWS, N_DRAWS)
    assert_same_distribution(native, [r.uniform(0.6, 1.4) for _ in range(N_DRAWS)], "brightness")


# --------------------------------------------------------------------------- distributions


def test_color_jitter_distribution():
    r = random.Random(1)
    draws = native_draws(T.ColorJitter(0.4, (0.5, 1.2), 0.3, 0.1))
    model = []
    for _ in range(N_DRAWS):  # torchvision: randperm(4), then each enabled factor uniform in its range
        model.append((r.sample(range(4), 4), r.uniform(0.6, 1.4), r.uniform(0.5, 1.2), r.uniform(0.7, 1.3),
                      r.uniform(-0.1, 0.1)))
    for k, name in enumerate(("brightness", "contrast", "saturation", "hue")):
        assert_same_distribution([p[4 + k] for p in draws], [m[1 + k] for m in model], name)

    def code(perm):
        return sum(int(v) * 4 ** i for i, v in enumerate(perm))
    assert_same_distribution([code(p[:4]) for p in draws], [code(m[0]) for m in model], "order")
    assert len({tuple(p[:4]) for p in draws}) == 24


def test_blur_rotation_grayscale_distributions():
    r = random.Random(2)
    assert_same_distribution([p[0] for p in native_draws(T.GaussianBlur(5, (0.1, 2.0)))],
                             [r.uniform(0.1, 2.0) for _ in range(N_DRAWS)], "sigma")
    assert_same_distribution([p[0] for p in native_draws(T.RandomRotation((-10, 30)))],
                             [r.uniform(-10, 30) for _ in range(N_DRAWS)], "angle")
    assert_same_distribution([p[0] for p in native_draws(T.RandomGrayscale(0.3))],
                             [float(r.random() < 0.3) for _ in range(N_DRAWS)], "grayscale")


def test_affine_distribution():
    r = random.Random(3)
    draws = native_draws(T.RandomAffine(20, translate=(0.1, 0.3), scale=(0.8, 1.1), shear=(-5, 5, -2, 8)),
                         h=100, w=150)
    model = [(r.uniform(-20, 20), round(r.uniform(-15.0, 15.0)), round(r.uniform(-30.0, 30.0)), r.uniform(0.8, 1.1),
              r.uniform(-5, 5), r.uniform(-2, 8)) for _ in range(N_DRAWS)]
    for k, name in enumerate(("angle", "tx", "ty", "scale", "shear x", "shear y")):
        assert_same_distribution([p[k] for p in draws], [m[k] for m in model], name)


def test_random_crop_distribution():
    r = random.Random(4)
    op = T.RandomCrop((30, 40), padding=(3, 5), pad_if_needed=True)
    draws = native_draws(op, h=28, w=60)
    # padded: h = 28 + 2*5 = 38, w = 60 + 2*3 = 66 -> top uniform in [0, 8], left in [0, 26]
    assert_same_distribution([p[0] for p in draws], [r.randint(0, 8) for _ in range(N_DRAWS)], "top")
    assert_same_distribution([p[1] for p in draws], [r.randint(0, 26) for _ in range(N_DRAWS)], "left")
    assert {tuple(p[2:6]) for p in draws} == {(3, 5, 3, 5)}


def _erasing_model(r, h, w, p, scale, ratio):
    if not r.random() < p:
        return None
    lr = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        area = h * w * r.uniform(*scale)
        ar = math.exp(r.uniform(*lr))
        eh, ew = round(math.sqrt(area * ar)), round(math.sqrt(area / ar))
        if not (eh < h and ew < w):
            continue
        return r.randint(0, h - eh), r.randint(0, w - ew), eh, ew
    return None


def test_random_erasing_distribution():
    r = random.Random(5)
    op = T.RandomErasing(0.6, (0.05, 0.6), (0.2, 4.0))
    draws = [p for p in native_draws(op, h=40, w=70)]
    model = [_erasing_model(r, 40, 70, 0.6, (0.05, 0.6), (0.2, 4.0)) for _ in range(N_DRAWS)]
    assert_same_distribution([p[0] for p in draws], [m is not None for m in model], "applied")
    hit = [p for p in draws if p[0]]
    mod = [m for m in model if m is not None]
    assert_same_distribution([p[3] * p[4] for p in hit], [m[2] * m[3] for m in mod], "area")
    assert_same_distribution([p[3] for p in hit], [m[2] for m in mod], "height")
    assert_same_distribution([p[1] for p in hit], [m[0] for m in mod], "top")


def _op_code(name, mag):
    """One number per (op, magnitude). Magnitudes are rounded: the native tables are float32
    (torch.linspace), the model's float64, and KS on atoms a hair apart would see a gap."""
    return round((TRIVIAL.index(name) * 1000 if name in TRIVIAL else 14000) + float(mag), 3)


def test_trivial_augment_distribution():
    r = random.Random(6)
    draws = native_draws(T.TrivialAugmentWide(), h=64, w=64)
    model = []
    for _ in range(N_DRAWS):  # torchvision v2 TrivialAugmentWide.forward
        name = TRIVIAL[r.randrange(14)]
        b = r.randrange(31)
        mag = {"ShearX": linspace(0, 0.99, 31, b), "ShearY": linspace(0, 0.99, 31, b),
               "TranslateX": linspace(0, 32, 31, b), "TranslateY": linspace(0, 32, 31, b),
               "Rotate": linspace(0, 135, 31, b), "Posterize": round(8 - b / (30 / 6)),
               "Solarize": linspace(1.0, 0.0, 31, b)}.get(name, linspace(0, 0.99, 31, b))
        if name in ("Identity", "AutoContrast", "Equalize"):
            mag = 0.0
        if name in SIGNED and r.random() <= 0.5:
            mag = -mag
        model.append((TRIVIAL.index(name), _op_code(name, mag)))
    got = [_op_code(TRIVIAL[int(p[1])], p[2]) for p in draws]
    assert all(p[0] == 1 for p in draws)
    assert_same_distribution(got, [m[1] for m in model], "trivial op and magnitude")
    assert_same_distribution([int(p[1]) for p in draws], [m[0] for m in model], "trivial op")


def test_rand_augment_distribution():
    r = random.Random(7)
    draws = native_draws(T.RandAugment(num_ops=2, magnitude=12), h=100, w=80)
    model = []
    for _ in range(N_DRAWS):
        ops = []
        for _ in range(2):
            name = TRIVIAL[r.randrange(14)]
            mag = {"ShearX": linspace(0, 0.3, 31, 12), "ShearY": linspace(0, 0.3, 31, 12),
                   "TranslateX": linspace(0, 150 / 331 * 80, 31, 12), "TranslateY": linspace(0, 150 / 331 * 100, 31, 12),
                   "Rotate": linspace(0, 30, 31, 12), "Posterize": round(8 - 12 / (30 / 4)),
                   "Solarize": linspace(1.0, 0.0, 31, 12)}.get(name, linspace(0, 0.9, 31, 12))
            if name in ("Identity", "AutoContrast", "Equalize"):
                mag = 0.0
            if name in SIGNED and r.random() <= 0.5:
                mag = -mag
            ops.append(_op_code(name, mag))
        model.append(ops)
    for k in range(2):
        got = [_op_code(TRIVIAL[int(p[1 + 2 * k])], p[2 + 2 * k]) for p in draws]
        assert_same_distribution(got, [m[k] for m in model], f"op {k}")


IMAGENET_POLICY = [
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)), (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, None)), (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)), (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)), (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
    (("Equalize", 0.0, None), ("Equalize", 0.8, None)), (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)), (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)), (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, None)), (("Color", 0.4, 0), ("Equalize", 0.6, None)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)), (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
]  # torchvision's AutoAugmentPolicy.IMAGENET


CIFAR10_POLICY = [
    (("Invert", 0.1, None), ("Contrast", 0.2, 6)), (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
    (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)), (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
    (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)), (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
    (("Color", 0.4, 3), ("Brightness", 0.6, 7)), (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
    (("Equalize", 0.6, None), ("Equalize", 0.5, None)), (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
    (("Color", 0.7, 7), ("TranslateX", 0.5, 8)), (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
    (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)), (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
    (("Solarize", 0.5, 2), ("Invert", 0.0, None)), (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.2, None), ("Equalize", 0.6, None)), (("Color", 0.9, 9), ("Equalize", 0.6, None)),
    (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)), (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
    (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)), (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
    (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)), (("Equalize", 0.8, None), ("Invert", 0.1, None)),
    (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
]  # torchvision's AutoAugmentPolicy.CIFAR10

SVHN_POLICY = [
    (("ShearX", 0.9, 4), ("Invert", 0.2, None)), (("ShearY", 0.9, 8), ("Invert", 0.7, None)),
    (("Equalize", 0.6, None), ("Solarize", 0.6, 6)), (("Invert", 0.9, None), ("Equalize", 0.6, None)),
    (("Equalize", 0.6, None), ("Rotate", 0.9, 3)), (("ShearX", 0.9, 4), ("AutoContrast", 0.8, None)),
    (("ShearY", 0.9, 8), ("Invert", 0.4, None)), (("ShearY", 0.9, 5), ("Solarize", 0.2, 6)),
    (("Invert", 0.9, None), ("AutoContrast", 0.8, None)), (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
    (("ShearX", 0.9, 4), ("Solarize", 0.3, 3)), (("ShearY", 0.8, 8), ("Invert", 0.7, None)),
    (("Equalize", 0.9, None), ("TranslateY", 0.6, 6)), (("Invert", 0.9, None), ("Equalize", 0.6, None)),
    (("Contrast", 0.3, 3), ("Rotate", 0.8, 4)), (("Invert", 0.8, None), ("TranslateY", 0.0, 2)),
    (("ShearY", 0.7, 6), ("Solarize", 0.4, 8)), (("Invert", 0.6, None), ("Rotate", 0.8, 4)),
    (("ShearY", 0.3, 7), ("TranslateX", 0.9, 3)), (("ShearX", 0.1, 6), ("Invert", 0.6, None)),
    (("Solarize", 0.7, 2), ("TranslateY", 0.6, 7)), (("ShearY", 0.8, 4), ("Invert", 0.8, None)),
    (("ShearX", 0.7, 9), ("TranslateY", 0.8, 3)), (("ShearY", 0.8, 5), ("AutoContrast", 0.7, None)),
    (("ShearX", 0.7, 2), ("Invert", 0.1, None)),
]  # torchvision's AutoAugmentPolicy.SVHN

POLICIES = {"imagenet": IMAGENET_POLICY, "cifar10": CIFAR10_POLICY, "svhn": SVHN_POLICY}
AUTO_OPS = (*TRIVIAL, "Invert")


def auto_augment_magnitude(name, b, h, w):
    """torchvision v2 AutoAugment._AUGMENTATION_SPACE at 10 bins (unsigned; 0 for ops without one)."""
    if b is None:
        return 0.0
    return {"ShearX": linspace(0, 0.3, 10, b), "ShearY": linspace(0, 0.3, 10, b),
            "TranslateX": linspace(0, 150 / 331 * w, 10, b), "TranslateY": linspace(0, 150 / 331 * h, 10, b),
            "Rotate": linspace(0, 30, 10, b), "Posterize": round(8 - b / (9 / 4)),
            "Solarize": linspace(1.0, 0.0, 10, b)}.get(name, linspace(0, 0.9, 10, b))


@pytest.mark.parametrize("policy", ["imagenet", "cifar10", "svhn"])
def test_auto_augment_distribution(policy):
    table = POLICIES[policy]
    h, w = 48, 80
    r = random.Random(8)
    draws = native_draws(T.AutoAugment(policy), h=h, w=w)
    model = []
    for _ in range(N_DRAWS):
        pol = r.randrange(25)
        ops = []
        for name, p, b in table[pol]:
            if not r.random() <= p:
                continue
            mag = auto_augment_magnitude(name, b, h, w)
            if name in SIGNED and r.random() <= 0.5:
                mag = -mag
            ops.append(AUTO_OPS.index(name) * 1000 + mag)
        model.append((pol, len(ops), round(sum(ops), 3)))
    assert_same_distribution([p[-1] for p in draws], [m[0] for m in model], "policy")
    assert_same_distribution([p[0] for p in draws], [m[1] for m in model], "ops applied")
    got = [round(sum(p[1 + 2 * k] * 1000 + p[2 + 2 * k] for k in range(int(p[0]))), 3) for p in draws]
    assert_same_distribution(got, [m[2] for m in model], "ops and magnitudes")
    # Draw by draw: the ops applied are the drawn sub-policy's, in its order, at its magnitudes.
    seen = set()
    for p in draws:
        pol, n = int(p[-1]), int(p[0])
        ops = [(AUTO_OPS[int(p[1 + 2 * k])], abs(float(p[2 + 2 * k]))) for k in range(n)]
        pairs = [(name, auto_augment_magnitude(name, b, h, w)) for name, _, b in table[pol]]
        subsets = [pairs, pairs[:1], pairs[1:], []]
        assert any(len(ops) == len(s) and all(a == c and m == pytest.approx(abs(d), abs=1e-4)
                                              for (a, m), (c, d) in zip(ops, s)) for s in subsets), (policy, pol, ops)
        seen.update((pol, k) for k, op in enumerate(pairs) if op[0] in {o for o, _ in ops})
    # Every sub-op with a probability above 0 was applied at least once in 10,000 draws.
    assert seen >= {(pol, k) for pol in range(25) for k in range(2) if table[pol][k][1] > 0}


def test_auto_augment_policy_names():
    assert [p.value for p in T.AutoAugmentPolicy] == ["imagenet", "cifar10", "svhn"]
    assert T.AutoAugment().policy is T.AutoAugmentPolicy.IMAGENET
    for given in (T.AutoAugmentPolicy.CIFAR10, "cifar10", "CIFAR10"):
        assert T.AutoAugment(given).policy is T.AutoAugmentPolicy.CIFAR10
    assert T.AutoAugment(T.AutoAugmentPolicy.SVHN) == T.AutoAugment("svhn")
    # The same key draws the same sub-policy index; the tables then differ.
    a, b = (T.AutoAugment(p).get_params(32, 32, 3, T._Rng(5, 1, 7, 3)) for p in ("imagenet", "svhn"))
    assert a[-1] == b[-1]
    assert [draw[1:3].tolist() for draw in native_draws(T.AutoAugment("cifar10"), 32, 32, n=50)] != \
        [draw[1:3].tolist() for draw in native_draws(T.AutoAugment("imagenet"), 32, 32, n=50)]


@pytest.mark.parametrize("alpha", [0.2, 1.0, 3.0])
def test_mixup_lambda_is_beta(alpha):
    r = random.Random(9)
    op = T.MixUp(alpha, 10)
    lam = [op.get_params(8, 16, 16, T._Rng(1, 2, b, T._BATCH_POSITION))["lam"] for b in range(N_DRAWS)]
    assert_same_distribution(lam, [r.betavariate(alpha, alpha) for _ in range(N_DRAWS)], f"Beta({alpha})")


def test_cutmix_box_distribution():
    r = random.Random(10)
    op = T.CutMix(1.0, 10)
    H, W = 24, 40
    got = [op.get_params(8, H, W, T._Rng(1, 2, b, T._BATCH_POSITION))["lam_adjusted"] for b in range(N_DRAWS)]
    model = []
    for _ in range(N_DRAWS):  # torchvision v2 CutMix._get_params
        lam = r.betavariate(1.0, 1.0)
        rx, ry = r.randrange(W), r.randrange(H)
        rr = 0.5 * math.sqrt(1 - lam)
        rw, rh = int(rr * W), int(rr * H)
        x1, y1, x2, y2 = max(rx - rw, 0), max(ry - rh, 0), min(rx + rw, W), min(ry + rh, H)
        model.append(1.0 - (x2 - x1) * (y2 - y1) / (W * H))
    assert_same_distribution(got, model, "lam_adjusted")


# --------------------------------------------------------------------------- batch ops


def _batch(n=6, layout="CHW", seed=0):
    g = np.random.default_rng(seed)
    shape = (n, 3, 12, 20) if layout == "CHW" else (n, 12, 20, 3)
    return g.standard_normal(shape).astype(np.float32), g.integers(0, 5, n)


def test_mixup_values_and_labels():
    x, y = _batch()
    op = T.MixUp(0.4, 5)
    params = op.get_params(6, 12, 20, T._Rng(3, 1, 7, T._BATCH_POSITION))
    lam = params["lam"]
    out, soft = op(x.copy(), y, seed=3, epoch=1, batch_index=7)
    ref = x * np.float32(lam) + np.roll(x, 1, 0) * np.float32(1 - lam)
    assert np.array_equal(out, ref)
    onehot = np.eye(5, dtype=np.float32)[y]
    assert np.allclose(soft, lam * onehot + (1 - lam) * np.roll(onehot, 1, 0), atol=1e-6)
    assert soft.shape == (6, 5) and soft.dtype == np.float32
    assert np.allclose(soft.sum(1), 1.0, atol=1e-6)


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
def test_cutmix_box_area_matches_lambda(layout):
    op = T.CutMix(1.0, 5)
    for b in range(40):
        x, y = _batch(layout=layout, seed=b)
        p = op.get_params(6, 12, 20, T._Rng(3, 0, b, T._BATCH_POSITION))
        out, soft = op(x.copy(), y, seed=3, epoch=0, batch_index=b)
        x1, y1, x2, y2 = p["box"]
        area = (x2 - x1) * (y2 - y1)
        assert p["lam_adjusted"] == pytest.approx(1 - area / (12 * 20))
        changed = (out != x).any(axis=1 if layout == "CHW" else 3)  # (n, H, W)
        assert (changed.sum((1, 2)) == area).all()  # every pixel of the box came from the previous image
        sl = (slice(None), slice(None), slice(y1, y2), slice(x1, x2)) if layout == "CHW" else \
            (slice(None), slice(y1, y2), slice(x1, x2))
        assert np.array_equal(out[sl], np.roll(x, 1, 0)[sl])
        rw, rh = int(0.5 * math.sqrt(1 - p["lam"]) * 20), int(0.5 * math.sqrt(1 - p["lam"]) * 12)
        if x1 > 0 and y1 > 0 and x2 < 20 and y2 < 12:  # unclipped: the box is 2rw x 2rh, about (1 - lam) H W
            assert area == 4 * rw * rh
            assert abs(area / 240 - (1 - p["lam"])) <= 2 / 20 + 2 / 12
        assert np.allclose(soft.sum(1), 1.0, atol=1e-6)
        assert np.allclose(soft[np.arange(6), y] + (y == np.roll(y, 1)) * 0, soft[np.arange(6), y])


def test_random_choice_uses_both_and_respects_p():
    op = T.RandomChoice([T.MixUp(0.2, 5), T.CutMix(1.0, 5)], p=[0.25, 0.75])
    picks = [op.get_params(4, 8, 8, T._Rng(0, 0, b, T._BATCH_POSITION))["choice"] for b in range(4000)]
    assert abs(np.mean(picks) - 0.75) < 0.03
    x, y = _batch()
    _, soft = op(x.copy(), y, seed=1, epoch=0, batch_index=0)
    assert soft.shape == (6, 5) and np.allclose(soft.sum(1), 1.0, atol=1e-6)


def test_batch_transform_bad_input():
    with pytest.raises(ValueError, match="alpha must be a positive"):
        T.MixUp(0.0, 10)
    with pytest.raises(ValueError, match="num_classes must be a positive integer"):
        T.CutMix(1.0, 0)
    with pytest.raises(TypeError, match="MixUp / CutMix"):
        T.RandomChoice([T.ColorJitter(0.1)])
    with pytest.raises(ValueError, match="agree on num_classes"):
        T.RandomChoice([T.MixUp(1.0, 10), T.CutMix(1.0, 11)])
    with pytest.raises(ValueError, match="one non-negative weight"):
        T.RandomChoice([T.MixUp(1.0, 10)], p=[0.5, 0.5])
    x, y = _batch()
    with pytest.raises(ValueError, match="labels must be in"):
        T.MixUp(1.0, 3)(x, y + 3, seed=0)
    with pytest.raises(ValueError, match="one integer label per image"):
        T.MixUp(1.0, 5)(x, y[:3], seed=0)
    with pytest.raises(TypeError, match="float images"):
        T.MixUp(1.0, 5)(np.zeros((2, 3, 4, 4), np.uint8), np.zeros(2, int), seed=0)
    with pytest.raises(TypeError, match="batch of images"):
        T.CutMix(1.0, 5)(np.zeros((3, 4, 4), np.float32), np.zeros(3, int), seed=0)
    with pytest.raises(TypeError, match="batch_transform must be"):
        ll.DataLoader(ll.ArrayDataset(np.zeros((4, 2))), batch_size=2, batch_transform=lambda b: b)


def _recipe_loader(root, num_threads, batch_transform):
    ds = ll.ImageFolderDataset(root).transform_first(T.Compose([
        T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.TrivialAugmentWide(),
        T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), T.ToCHW(), T.RandomErasing()]))
    return ll.DataLoader(ds, batch_size=4, shuffle=True, seed=7, num_threads=num_threads,
                         batch_transform=batch_transform)


def test_loader_batch_transform_deterministic_threads_and_resume(tmp_path):
    root = make_image_folder(tmp_path, num_classes=3, per_class=5)
    op = T.RandomChoice([T.MixUp(0.8, 3), T.CutMix(1.0, 3)])
    runs = []
    for nt in (1, 2):
        loader = _recipe_loader(root, nt, op)
        assert loader.engine == "native"
        assert "batch transform" in loader.explain() and "TrivialAugmentWide" in loader.explain()
        runs.append([(x.copy(), y.copy()) for x, y in loader])
    for (a, b), (c, d) in zip(*runs):
        assert np.array_equal(a, c) and np.array_equal(b, d)
        assert b.shape == (len(b), 3) and np.allclose(b.sum(1), 1.0, atol=1e-6)
    # resume after two batches: the rest is bitwise the uninterrupted run
    loader = _recipe_loader(root, 2, op)
    it = iter(loader)
    next(it), next(it)
    state = it.state_dict()
    it.close()
    again = _recipe_loader(root, 1, op)
    again.load_state_dict(state)
    rest = [(x.copy(), y.copy()) for x, y in again]
    assert len(rest) == len(runs[0]) - 2
    for (a, b), (c, d) in zip(rest, runs[0][2:]):
        assert np.array_equal(a, c) and np.array_equal(b, d)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("make, exc, match", [
    (lambda: T.ColorJitter(brightness=-0.1), ValueError, "non negative"),
    (lambda: T.ColorJitter(contrast=(1.5, 1.0)), ValueError, "should be between"),
    (lambda: T.ColorJitter(hue=0.6), ValueError, r"between \(-0.5, 0.5\)"),
    (lambda: T.ColorJitter(saturation="x"), TypeError, "single number or a sequence"),
    (lambda: T.RandomGrayscale(1.5), ValueError, r"p must be in \[0, 1\]"),
    (lambda: T.GaussianBlur(4), ValueError, "odd and positive"),
    (lambda: T.GaussianBlur((3, 5, 7)), TypeError, "sequence of 2 ints"),
    (lambda: T.GaussianBlur(3, 0), ValueError, "must be positive"),
    (lambda: T.GaussianBlur(3, (2.0, 1.0)), ValueError, r"\(min, max\)"),
    (lambda: T.TrivialAugmentWide(num_magnitude_bins=1), ValueError, "num_magnitude_bins must be an integer >= 2, got 1"),
    (lambda: T.TrivialAugmentWide(interpolation="bicubic"), ValueError, "interpolation must be one of"),
    (lambda: T.RandAugment(magnitude=31), ValueError, "magnitude must be a non-negative integer <= 30, got 31"),
    (lambda: T.RandAugment(num_ops=-1), ValueError, "num_ops must be a non-negative integer, got -1"),
    (lambda: T.RandAugment(fill="red"), TypeError, "fill must be a number"),
    (lambda: T.AutoAugment("cifar100"), ValueError, r"policy must be one of \['imagenet', 'cifar10', 'svhn'\]"),
    (lambda: T.RandomCrop(0), ValueError, "size must be positive"),
    (lambda: T.RandomCrop(32, padding=(1, 2, 3)), TypeError, "padding must be"),
    (lambda: T.RandomCrop(32, padding=-1), ValueError, "non-negative"),
    (lambda: T.RandomCrop(32, padding_mode="wrap"), ValueError, "padding_mode must be one of"),
    (lambda: T.RandomRotation(-5), ValueError, "must be positive"),
    (lambda: T.RandomRotation((10, -10)), ValueError, "min <= max"),
    (lambda: T.RandomRotation(10, expand=True), ValueError, "expand=False"),
    (lambda: T.RandomAffine(10, translate=(0.5, 1.5)), ValueError, "between 0 and 1"),
    (lambda: T.RandomAffine(10, scale=(0.0, 1.0)), ValueError, "scale values should be positive"),
    (lambda: T.RandomAffine(10, shear=(1, 2, 3)), TypeError, "shear should be"),
    (lambda: T.RandomErasing(p=2), ValueError, "probability should be between 0 and 1"),
    (lambda: T.RandomErasing(scale=(0.5, 0.1)), ValueError, r"\(min, max\)"),
    (lambda: T.RandomErasing(scale=(0.1, 1.5)), ValueError, "between 0 and 1"),
    (lambda: T.RandomErasing(value="noise"), ValueError, "'random'"),
    (lambda: T.RandomErasing(value=(1, 2)), TypeError, "value should be"),
])
def test_bad_parameters_raise(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_specs_are_frozen_and_keep_torchvision_defaults():
    cj = T.ColorJitter(0.4, 0.4, 0.4, 0.1)
    assert cj.brightness == (0.6, 1.4) and cj.hue == (-0.1, 0.1)
    assert T.ColorJitter(brightness=0).brightness is None
    assert T.RandomErasing().scale == (0.02, 0.33) and T.RandomErasing().ratio == (0.3, 3.3)
    assert T.GaussianBlur(3).sigma == (0.1, 2.0)
    assert T.RandAugment().num_ops == 2 and T.RandAugment().magnitude == 9
    with pytest.raises(AttributeError, match="cannot assign"):
        cj.hue = 0.2  # type: ignore[misc]
    spec = T.Compose([T.RandomResizedCrop(40), T.RandomCrop(32, padding=4), T.ColorJitter(0.2)]).plan(T.ImageSpec())
    assert (spec.height, spec.width) == (32, 32)
