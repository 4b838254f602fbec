"""Every native augmentation against torchvision v2 itself (``make check-torchvision``).

Runs in the side environment .venv-tv (torch 2.13.0 CPU + the matching torchvision), with
loaderlib imported from the source tree. Two checks per op:

* pixels: loaderlib's kernel and torchvision's functional kernel on the same parameters
  (the ones loaderlib's sampler drew), on photo-like 224x224 (and 1-channel) uint8 images;
  prints the largest difference in levels and the share of values that differ;
* parameters: loaderlib's native sampler against torchvision's own sampler (its
  ``make_params`` or, for the automatic policies, the ops its ``forward`` picks), two-sample
  Kolmogorov-Smirnov over 10,000 draws each, at alpha = 0.001.

``--smoke`` runs 300 draws per op and always exits 0 (``benchmarks/smoke.py``).

Exit status 1 when an op differs by more than 2 levels on more than 1% of the values (geometric
ops: more than 1% of the pixels) or a KS statistic reaches its critical value.
"""

from __future__ import annotations

import math
import platform
import sys

import numpy as np
import torch
from _synth import photo_like
from _torchvision import import_torchvision

from loaderlib import transforms as T

torchvision = import_torchvision()   # NOTE [ torchvision beside CPU torch ] in _torchvision.py
from torchvision.transforms import (  # noqa: E402  (after the stub above)
    InterpolationMode,
    v2,
)
from torchvision.transforms.v2 import functional as F  # noqa: E402

N = 10_000
OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
       "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert")
FAILED: list[str] = []


def ks(a, b) -> tuple[float, float]:
    a, b = np.sort(np.asarray(a, np.float64)), np.sort(np.asarray(b, np.float64))
    grid = np.concatenate([a, b])
    d = float(np.abs(np.searchsorted(a, grid, "right") / len(a) - np.searchsorted(b, grid, "right") / len(b)).max())
    crit = math.sqrt(-0.5 * math.log(0.0005)) * math.sqrt((len(a) + len(b)) / (len(a) * len(b)))
    return d, crit


def tens(img: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).contiguous()


def arr(t: torch.Tensor) -> np.ndarray:
    return t.permute(1, 2, 0).contiguous().numpy()


def rng(i: int, pos: int = 0) -> T._Rng:
    return T._Rng(17, 0, i, pos)


def report_pixels(name: str, pairs: list, geometric: bool = False) -> None:
    worst, share = 0, 0.0
    for ours, theirs in pairs:
        d = np.abs(ours.astype(int) - theirs.astype(int))
        worst = max(worst, int(d.max()))
        share = max(share, float((d.any(-1) if geometric else d > 0).mean()))
    bad = share > 0.01 if geometric else (worst > 2 and share > 0.01) or worst > 2 and not geometric
    print(f"  {name:<34} pixels: {len(pairs):3d} cases, max diff {worst:3d} levels, "
          f"{'pixels' if geometric else 'values'} differing {share:6.2%}{'   FAIL' if bad else ''}")
    if bad:
        FAILED.append(name)


def report_ks(name: str, ours, theirs) -> None:
    d, crit = ks(ours, theirs)
    print(f"  {name:<34} params: KS {d:.4f} (critical {crit:.4f}){'   FAIL' if d >= crit else ''}")
    if d >= crit:
        FAILED.append(name + " params")


def images() -> list[np.ndarray]:
    out = [np.ascontiguousarray(photo_like(224, 224, s)[:, :, ::-1]) for s in range(3)]
    out.append(np.ascontiguousarray(photo_like(160, 120, 7)[:, :, ::-1]))
    return out


def record_policy(tv_op: v2.Transform, img: torch.Tensor, n: int) -> list[list[tuple[str, float]]]:
    """The (op, magnitude) lists torchvision's forward picks, n times."""
    seen: list[tuple[str, float]] = []
    tv_op._apply_image_or_video_transform = lambda image, tid, mag, interpolation, fill: (seen.append((tid, mag)),
                                                                                            image)[1]
    out = []
    for _ in range(n):
        seen.clear()
        tv_op(img)
        out.append(list(seen))
    return out


def code(ops) -> float:
    return round(sum(OPS.index(name) * 1000 + float(mag) for name, mag in ops), 3)


def main() -> int:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    print(f"loaderlib augmentations vs torchvision {torchvision.__version__} (torch {torch.__version__}), "
          f"{platform.machine()}, Python {platform.python_version()}")
    imgs = images()
    gray = [np.ascontiguousarray(i[:, :, :1]) for i in imgs[:2]]
    small = tens(imgs[3])

    # ColorJitter: the four adjustments in the drawn order
    op = T.ColorJitter(0.4, 0.4, 0.4, 0.1)
    fns = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
    pairs = []
    for k, img in enumerate(imgs + gray):
        for s in range(8):
            prm = op.get_params(*img.shape, rng(s + 10 * k))
            t = tens(img)
            for f in prm[:4].astype(int):
                t = fns[f](t, prm[4 + f])
            pairs.append((op.apply_params(img, prm), arr(t)))
    report_pixels("ColorJitter(0.4, 0.4, 0.4, 0.1)", pairs)
    tv = v2.ColorJitter(0.4, 0.4, 0.4, 0.1)
    theirs = [tv.make_params([small]) for _ in range(N)]
    ours = [op.get_params(120, 160, 3, rng(i)) for i in range(N)]
    for k, key in enumerate(("brightness_factor", "contrast_factor", "saturation_factor", "hue_factor")):
        report_ks(f"ColorJitter {key}", [p[4 + k] for p in ours], [float(d[key]) for d in theirs])
    report_ks("ColorJitter order", [sum(int(v) * 4 ** i for i, v in enumerate(p[:4])) for p in ours],
              [sum(int(v) * 4 ** i for i, v in enumerate(d["fn_idx"].tolist())) for d in theirs])

    op = T.RandomGrayscale(1.0)
    pairs = [(op.apply_params(img, op.get_params(*img.shape, rng(0))), arr(F.rgb_to_grayscale(tens(img), 3)))
             for img in imgs]
    report_pixels("RandomGrayscale", pairs)

    for ks_ in (3, (5, 9), 23):
        op = T.GaussianBlur(ks_, (0.1, 5.0))
        pairs = []
        for k, img in enumerate(imgs + gray):
            prm = op.get_params(*img.shape, rng(k))
            pairs.append((op.apply_params(img, prm),
                          arr(F.gaussian_blur(tens(img), list(op.kernel_size), [prm[0], prm[0]]))))
        report_pixels(f"GaussianBlur({ks_})", pairs)
    tv = v2.GaussianBlur(3, (0.1, 5.0))
    report_ks("GaussianBlur sigma", [op.get_params(8, 8, 3, rng(i))[0] for i in range(N)],
              [tv.make_params([small])["sigma"][0] for _ in range(N)])

    # the automatic policies: each primitive, then the drawn op lists
    base = v2.TrivialAugmentWide()
    for kind, tv_op, op in (("TrivialAugmentWide", v2.TrivialAugmentWide(), T.TrivialAugmentWide()),
                            ("RandAugment", v2.RandAugment(), T.RandAugment()),
                            ("AutoAugment", v2.AutoAugment(), T.AutoAugment()),
                            ("AutoAugment(CIFAR10)", v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10),
                             T.AutoAugment(T.AutoAugmentPolicy.CIFAR10)),
                            ("AutoAugment(SVHN)", v2.AutoAugment(v2.AutoAugmentPolicy.SVHN), T.AutoAugment("svhn"))):
        pairs, geo = [], []
        for k, img in enumerate(imgs + gray):
            for s in range(40):
                prm = op.get_params(*img.shape, rng(s + 100 * k))
                t = tens(img)
                names = []
                for j in range(int(prm[0])):
                    name, mag = OPS[int(prm[1 + 2 * j])], float(prm[2 + 2 * j])
                    names.append(name)
                    t = base._apply_image_or_video_transform(t, name, mag, InterpolationMode.NEAREST, {})
                pair = (op.apply_params(img, prm), arr(t))
                (geo if {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"} & set(names) else pairs).append(pair)
        report_pixels(f"{kind} (colour ops)", pairs)
        report_pixels(f"{kind} (with geometric ops)", geo, geometric=True)
        theirs = record_policy(tv_op, small, N)
        ours = []
        for i in range(N):
            prm = op.get_params(120, 160, 3, rng(i))
            ours.append([(OPS[int(prm[1 + 2 * j])], prm[2 + 2 * j]) for j in range(int(prm[0]))])
        report_ks(f"{kind} ops", [code(o) for o in ours], [code(o) for o in theirs])

    for mode in ("constant", "edge", "reflect", "symmetric"):
        op = T.RandomCrop(200, padding=(8, 16), pad_if_needed=True, fill=(10, 20, 30), padding_mode=mode)
        pairs = []
        for k, img in enumerate(imgs):
            prm = op.get_params(*img.shape, rng(k))
            pl, pt, pr, pb = (int(v) for v in prm[2:6])
            t = F.pad(tens(img), [pl, pt, pr, pb], fill=[10, 20, 30] if mode == "constant" else 0, padding_mode=mode)
            pairs.append((op.apply_params(img, prm), arr(F.crop(t, int(prm[0]), int(prm[1]), 200, 200))))
        report_pixels(f"RandomCrop(padding_mode={mode!r})", pairs)
    tv = v2.RandomCrop(100, padding=(8, 16), pad_if_needed=True)
    op = T.RandomCrop(100, padding=(8, 16), pad_if_needed=True)
    theirs = [tv.make_params([small]) for _ in range(N)]
    ours = [op.get_params(120, 160, 3, rng(i)) for i in range(N)]
    report_ks("RandomCrop top", [p[0] for p in ours], [d["top"] for d in theirs])
    report_ks("RandomCrop left", [p[1] for p in ours], [d["left"] for d in theirs])

    op = T.RandomRotation(45, fill=(5, 6, 7))
    pairs = [(op.apply_params(img, p := op.get_params(*img.shape, rng(k))),
              arr(F.rotate(tens(img), p[0], InterpolationMode.NEAREST, fill=[5, 6, 7]))) for k, img in enumerate(imgs)]
    report_pixels("RandomRotation(45)", pairs, geometric=True)
    report_ks("RandomRotation angle", [op.get_params(8, 8, 3, rng(i))[0] for i in range(N)],
              [v2.RandomRotation(45).make_params([small])["angle"] for _ in range(N)])

    op = T.RandomAffine(30, (0.1, 0.2), (0.8, 1.2), (-10, 10, -5, 5))
    tv = v2.RandomAffine(30, (0.1, 0.2), (0.8, 1.2), (-10, 10, -5, 5))
    pairs = []
    for k, img in enumerate(imgs):
        p = op.get_params(*img.shape, rng(k))
        pairs.append((op.apply_params(img, p), arr(F.affine(tens(img), p[0], [int(p[1]), int(p[2])], p[3],
                                                             [p[4], p[5]], InterpolationMode.NEAREST, fill=0))))
    report_pixels("RandomAffine", pairs, geometric=True)
    theirs = [tv.make_params([small]) for _ in range(N)]
    ours = [op.get_params(120, 160, 3, rng(i)) for i in range(N)]
    for k, (key, get) in enumerate((("angle", lambda d: d["angle"]), ("tx", lambda d: d["translate"][0]),
                                    ("ty", lambda d: d["translate"][1]), ("scale", lambda d: d["scale"]),
                                    ("shear x", lambda d: d["shear"][0]), ("shear y", lambda d: d["shear"][1]))):
        report_ks(f"RandomAffine {key}", [p[k] for p in ours], [get(d) for d in theirs])

    op = T.RandomErasing(1.0, value=(0.5, -1.0, 2.0))
    pairs = []
    for k in range(20):
        x = np.random.default_rng(k).standard_normal((64, 80, 3)).astype(np.float32)
        p = op.get_params(64, 80, 3, rng(k))
        i, j, h, w = (int(v) for v in p[1:5])
        ref = F.erase(torch.from_numpy(x).permute(2, 0, 1), i, j, h, w, torch.tensor([0.5, -1.0, 2.0])[:, None, None])
        pairs.append((op.apply_params(x, p), arr(ref)))
    worst = max(float(np.abs(a - b).max()) for a, b in pairs)
    print(f"  {'RandomErasing':<34} pixels: {len(pairs):3d} cases, max diff {worst:.3g}{'   FAIL' if worst else ''}")
    if worst:
        FAILED.append("RandomErasing")
    op, tv = T.RandomErasing(0.5), v2.RandomErasing(0.5)
    small_f = small.float()
    theirs = []
    for _ in range(N):
        if torch.rand(1) >= 0.5:  # _RandomApplyTransform's coin, then make_params
            theirs.append(None)
            continue
        d = tv.make_params([small_f])
        theirs.append(None if d["v"] is None else (d["h"], d["w"], d["i"]))
    ours = [op.get_params(120, 160, 3, rng(i)) for i in range(N)]
    ours = [None if not p[0] else (p[3], p[4], p[1]) for p in ours]
    report_ks("RandomErasing applied", [o is not None for o in ours], [t is not None for t in theirs])
    report_ks("RandomErasing area", [o[0] * o[1] for o in ours if o], [t[0] * t[1] for t in theirs if t])
    report_ks("RandomErasing top", [o[2] for o in ours if o], [t[2] for t in theirs if t])

    # MixUp / CutMix: torchvision's forward with loaderlib's drawn parameters
    x = np.random.default_rng(1).standard_normal((8, 3, 32, 40)).astype(np.float32)
    y = np.random.default_rng(2).integers(0, 10, 8)
    for cls, tcls in ((T.MixUp, v2.MixUp), (T.CutMix, v2.CutMix)):
        op, tv = cls(1.0, 10), tcls(alpha=1.0, num_classes=10)
        worst = 0.0
        for b in range(20):
            p = op.get_params(8, 32, 40, T._Rng(3, 0, b, T._BATCH_POSITION))
            ours_x, ours_y = op.apply_params(x.copy(), y, p, "CHW")
            tv.make_params = lambda flat, p=p: ({"lam": p["lam"]} if "box" not in p else
                                                 {"box": p["box"], "lam_adjusted": p["lam_adjusted"]})
            tx, ty = tv(torch.from_numpy(x.copy()), torch.from_numpy(y))
            worst = max(worst, float(np.abs(ours_x - tx.numpy()).max()), float(np.abs(ours_y - ty.numpy()).max()))
        print(f"  {cls.__name__:<34} batch:  20 batches, max diff {worst:.3g} (images and soft labels)"
              f"{'   FAIL' if worst > 1e-6 else ''}")
        if worst > 1e-6:
            FAILED.append(cls.__name__)
        del tv.make_params
        theirs = [tv.make_params([torch.from_numpy(x)]) for _ in range(N)]
        ours = [op.get_params(8, 32, 40, T._Rng(3, 0, b, T._BATCH_POSITION)) for b in range(N)]
        key = "lam" if cls is T.MixUp else "lam_adjusted"
        report_ks(f"{cls.__name__} {key}", [o[key] for o in ours], [float(t[key]) for t in theirs])

    print("FAILED: " + ", ".join(FAILED) if FAILED else "all ops agree with torchvision")
    return 1 if FAILED else 0


if __name__ == "__main__":
    if "--smoke" in sys.argv[1:]:
        # benchmarks/smoke.py: 300 draws per op, a check that the script runs (its KS tests mean little)
        N = 300
        main()
        sys.exit(0)
    sys.exit(main())
