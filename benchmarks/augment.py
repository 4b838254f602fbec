"""Augmentation benchmark: modern training recipes against the plain chain, and the CPU cost of every op.

Three parts, each pipeline in a fresh process, in interleaved rounds (medians reported):

1. The recipe against the plain chain, loaderlib's native engine on ``--threads`` threads
   (batch 64, consumed by an infinitely fast model):
   * plain: RandomResizedCrop(224), flip, Normalize, CHW float32;
   * recipe: RandomResizedCrop(224), flip, TrivialAugmentWide, ColorJitter(0.4, 0.4, 0.4),
     Normalize, CHW, RandomErasing(0.25), then per batch RandomChoice([MixUp(0.2),
     CutMix(1.0)]) with soft labels.
   The ratio recipe / plain is taken per round. With ``--baseline DIR`` (a loaderlib source tree
   built in place, for instance ``git archive <commit>`` + ``python setup.py build_ext
   --inplace``) the same two pipelines of that build join the rounds.
2. torchvision's ImageNet recipe (references/classification with ``--auto-augment ta_wide
   --random-erase 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0``): loaderlib against PyTorch's
   DataLoader with ``--workers`` workers, each sample read with OpenCV and augmented with
   OpenCV/numpy equivalents of the same ops (skipped without torch; ``--skip-peers`` skips it).
3. The CPU cost per image of each op on one thread (``time.process_time``, best of blocks): the
   marginal cost of adding the op to the fused chain (in-memory JPEGs, ``num_threads=1``), and
   each primitive's kernel on a 224x224 image; with ``--baseline`` the baseline build's figure
   beside it (before -> after), both measured in alternating child processes. The Gaussian
   blur's kernel is timed at several sigmas (NOTE [ Blur taps ]: small ones used to make
   subnormal taps); ``--blur-only`` times just that, on one 224x224 photo.

Usage::

    python benchmarks/augment.py                    # generates photo-like JPEGs once
    python benchmarks/augment.py --baseline /tmp/before --repeat 5
    python benchmarks/augment.py --costs-only --baseline /tmp/before
    python benchmarks/augment.py --blur-only --repeat 5 [--baseline /tmp/before]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np
from _photos import add_data_kind, photos_for
from loader import image_files

from loaderlib.transforms import random_resized_crop_box

HERE = os.path.dirname(os.path.abspath(__file__))

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
BATCH = 64
CLASSES = 8


# --------------------------------------------------------------------------- OpenCV/numpy recipe


def _affine(img, m, cv2):
    """Nearest-neighbour warp through the 2x3 inverse map m about the image centre."""
    return cv2.warpAffine(img, m, (img.shape[1], img.shape[0]), flags=cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP,
                          borderMode=cv2.BORDER_CONSTANT, borderValue=0)


def _gray(img):
    return img[..., 0] * np.float32(0.2989) + img[..., 1] * np.float32(0.587) + img[..., 2] * np.float32(0.114)


def _blend(img, other, f, cv2):
    return np.clip(img.astype(np.float32) * np.float32(f) + other * np.float32(1 - f), 0, 255).astype(np.uint8)


def cv_trivial_op(name: str, mag: float, img: np.ndarray) -> np.ndarray:
    """One TrivialAugmentWide op with OpenCV/numpy (the same formulas as torchvision)."""
    import cv2

    h, w = img.shape[:2]
    if name == "Identity":
        return img
    if name in ("ShearX", "ShearY"):
        m = np.float32([[1, mag, 0], [0, 1, 0]]) if name == "ShearX" else np.float32([[1, 0, 0], [mag, 1, 0]])
        return _affine(img, m, cv2)
    if name in ("TranslateX", "TranslateY"):
        t = int(mag)
        return _affine(img, np.float32([[1, 0, -t if name == "TranslateX" else 0],
                                        [0, 1, -t if name == "TranslateY" else 0]]), cv2)
    if name == "Rotate":
        return cv2.warpAffine(img, cv2.getRotationMatrix2D(((w - 1) / 2, (h - 1) / 2), mag, 1.0), (w, h),
                              flags=cv2.INTER_NEAREST)
    if name == "Brightness":
        return cv2.convertScaleAbs(img, alpha=1 + mag)
    if name == "Color":
        return _blend(img, np.floor(_gray(img.astype(np.float32)))[..., None], 1 + mag, cv2)
    if name == "Contrast":
        return _blend(img, np.floor(_gray(img.astype(np.float32))).mean(), 1 + mag, cv2)
    if name == "Sharpness":
        k = np.full((3, 3), 1 / 13, np.float32)
        k[1, 1] = 5 / 13
        blur = cv2.filter2D(img, -1, k)
        out = _blend(img, blur.astype(np.float32), 1 + mag, cv2)
        out[0], out[-1], out[:, 0], out[:, -1] = img[0], img[-1], img[:, 0], img[:, -1]
        return out
    if name == "Posterize":
        return img & np.uint8((0xFF << (8 - int(mag))) & 0xFF)
    if name == "Solarize":
        lut = np.arange(256, dtype=np.uint8)
        lut = np.where(lut >= 255 * mag, 255 - lut, lut).astype(np.uint8)
        return cv2.LUT(img, lut)
    if name == "AutoContrast":
        lo, hi = img.min((0, 1)), img.max((0, 1))
        scale = np.where(hi > lo, 255.0 / np.maximum(hi - lo, 1), 1.0)
        return np.clip((img - np.where(hi > lo, lo, 0)) * scale, 0, 255).astype(np.uint8)
    if name == "Equalize":
        return cv2.merge([cv2.equalizeHist(c) for c in cv2.split(img)])
    raise ValueError(name)


TRIVIAL = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
           "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")
SIGNED = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast", "Sharpness"}


def trivial_magnitude(name: str, b: int) -> float:
    top = {"ShearX": 0.99, "ShearY": 0.99, "TranslateX": 32.0, "TranslateY": 32.0, "Rotate": 135.0}.get(name, 0.99)
    if name == "Posterize":
        return float(round(8 - b / 5))
    if name == "Solarize":
        return 1.0 - b / 30
    if name in ("Identity", "AutoContrast", "Equalize"):
        return 0.0
    return top * b / 30


class CvRecipe:
    """Per sample: cv2.imread, RandomResizedCrop, flip, TrivialAugmentWide, Normalize, CHW,
    RandomErasing(0.1) (OpenCV/numpy)."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.mean = np.array(MEAN, np.float32) * 255
        self.inv_std = 1.0 / (np.array(STD, np.float32) * 255)

    def __call__(self, path: str) -> np.ndarray:
        import cv2

        img = cv2.cvtColor(cv2.imread(path, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        y, x, ch, cw = random_resized_crop_box(img.shape[1], img.shape[0], rng=self.rng)
        img = cv2.resize(img[y:y + ch, x:x + cw], (224, 224), interpolation=cv2.INTER_LINEAR)
        if self.rng.random() < 0.5:
            img = img[:, ::-1]
        name = TRIVIAL[self.rng.integers(14)]
        mag = trivial_magnitude(name, int(self.rng.integers(31)))
        if name in SIGNED and self.rng.random() <= 0.5:
            mag = -mag
        img = cv_trivial_op(name, mag, np.ascontiguousarray(img))
        out = ((img.astype(np.float32) - self.mean) * self.inv_std).transpose(2, 0, 1)
        out = np.ascontiguousarray(out)
        if self.rng.random() < 0.1:
            self.erase(out)
        return out

    def erase(self, out: np.ndarray) -> None:
        _, h, w = out.shape
        for _ in range(10):
            area = h * w * self.rng.uniform(0.02, 0.33)
            ar = math.exp(self.rng.uniform(math.log(0.3), math.log(3.3)))
            eh, ew = round(math.sqrt(area * ar)), round(math.sqrt(area / ar))
            if eh < h and ew < w:
                i, j = self.rng.integers(0, h - eh + 1), self.rng.integers(0, w - ew + 1)
                out[:, i:i + eh, j:j + ew] = 0
                return


def np_mix(images: np.ndarray, labels: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """RandomChoice([MixUp(0.2), CutMix(1.0)]) on a batch with numpy (soft labels)."""
    onehot = np.eye(CLASSES, dtype=np.float32)[labels]
    if rng.random() < 0.5:
        lam = rng.beta(0.2, 0.2)
        images = images * np.float32(lam) + np.roll(images, 1, 0) * np.float32(1 - lam)
    else:
        lam = rng.beta(1.0, 1.0)
        _, _, H, W = images.shape
        rx, ry = rng.integers(W), rng.integers(H)
        r = 0.5 * math.sqrt(1 - lam)
        x1, y1 = max(rx - int(r * W), 0), max(ry - int(r * H), 0)
        x2, y2 = min(rx + int(r * W), W), min(ry + int(r * H), H)
        images[:, :, y1:y2, x1:x2] = np.roll(images, 1, 0)[:, :, y1:y2, x1:x2]
        lam = 1 - (x2 - x1) * (y2 - y1) / (W * H)
    return images, onehot * np.float32(lam) + np.roll(onehot, 1, 0) * np.float32(1 - lam)


# --------------------------------------------------------------------------- runners (child process)


def loaderlib_recipe():
    """torchvision's ImageNet recipe (part 2)."""
    from loaderlib import transforms as T

    return (T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.TrivialAugmentWide(),
                       T.Normalize(MEAN, STD), T.ToCHW(), T.RandomErasing(0.1)]),
            T.RandomChoice([T.MixUp(0.2, CLASSES), T.CutMix(1.0, CLASSES)]))


def modern_recipe():
    """The recipe of part 1: TrivialAugmentWide + ColorJitter(0.4, 0.4, 0.4) + RandomErasing(0.25)
    + MixUp/CutMix."""
    from loaderlib import transforms as T

    return (T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.TrivialAugmentWide(),
                       T.ColorJitter(0.4, 0.4, 0.4), T.Normalize(MEAN, STD), T.ToCHW(), T.RandomErasing(0.25)]),
            T.RandomChoice([T.MixUp(0.2, CLASSES), T.CutMix(1.0, CLASSES)]))


def plain_chain():
    from loaderlib import transforms as T

    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.Normalize(MEAN, STD), T.ToCHW()]), None


CHAINS = {"imagenet": loaderlib_recipe, "recipe": modern_recipe, "plain": plain_chain}


def run_loaderlib(root: str, images: int, threads: int, chain: str = "imagenet") -> dict:
    import loaderlib as ll

    steps, mix = CHAINS[chain]()
    ds = ll.ImageFolderDataset(root).transform_first(steps)
    loader = ll.DataLoader(ds, batch_size=BATCH, shuffle=True, num_threads=threads, seed=0, last_batch="discard",
                           batch_transform=mix)
    assert loader.engine == "native", loader.explain()
    return {**consume(loader, images, soft=mix is not None), "loaderlib": os.path.dirname(ll.__file__)}


def run_torch(root: str, images: int, workers: int) -> dict:
    import cv2
    import torch

    cv2.setNumThreads(1)
    paths, labels = image_files(root)

    class Folder(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.pipe = None

        def __len__(self) -> int:
            return len(paths)

        def __getitem__(self, i: int):
            if self.pipe is None:  # one generator per worker process
                info = torch.utils.data.get_worker_info()
                self.pipe = CvRecipe(seed=0 if info is None else info.id + 1)
            return self.pipe(paths[i]), labels[i]

    rng = np.random.default_rng(1)

    def collate(items):
        x = np.stack([it[0] for it in items])
        y = np.asarray([it[1] for it in items])
        x, soft = np_mix(x, y, rng)
        return torch.from_numpy(x), torch.from_numpy(soft)

    loader = torch.utils.data.DataLoader(Folder(), batch_size=BATCH, shuffle=True, num_workers=workers,
                                         drop_last=True, persistent_workers=workers > 0, collate_fn=collate)
    return consume(loader, images)


def run_dali(root: str, images: int, threads: int) -> dict:
    """DALI's CPU pipeline with its own TrivialAugmentWide (``nvidia.dali.auto_aug``; its policies
    need ``enable_conditionals``), ``device_id=None``: file reader, random-crop decode, resize,
    the policy, flip + normalize + CHW; RandomErasing(0.1) with DALI's ``fn.erase`` on one random
    box per image drawn with probability 0.1 (its shape arguments), MixUp/CutMix in numpy on the
    batch (DALI has neither), as the PyTorch rows do."""
    from nvidia import dali
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.auto_aug import trivial_augment

    @pipeline_def(batch_size=BATCH, num_threads=threads, device_id=None, seed=0, enable_conditionals=True)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="Reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=224, resize_y=224)
        images = trivial_augment.trivial_augment_wide(images)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD],
                                          mirror=fn.random.coin_flip())
        erase = fn.random.coin_flip(probability=0.1)
        side = fn.random.uniform(range=(0.1, 0.57)) * erase   # RandomErasing's area 0.02-0.33 as a square
        anchor = fn.random.uniform(range=(0.0, 0.5), shape=2)
        images = fn.erase(images, anchor=anchor, shape=fn.stack(side, side), axis_names="HW",
                          normalized_anchor=True, normalized_shape=True, fill_value=0.0)
        return images, labels

    p = pipe()
    p.build()
    rng = np.random.default_rng(0)

    def batches():
        while True:
            x, y = p.run()
            x = np.ascontiguousarray(x.as_array())
            yield np_mix(x, np.asarray(y.as_array()).reshape(-1).astype(np.int64) % CLASSES, rng)

    return {**consume(batches(), images), "dali": dali.__version__}


def run_tv(root: str, images: int, workers: int) -> dict:
    """PyTorch's DataLoader with torchvision v2's own transforms on uint8 tensors (decoded with
    OpenCV: torchvision's decoders do not load beside the CPU torch wheel, NOTE [ torchvision
    beside CPU torch ] in check_torchvision.py) and v2.MixUp/CutMix in the collate function."""
    import cv2
    import torch
    from check_torchvision import torchvision  # noqa: F401  (imported the way that works here)
    from torchvision.transforms import v2

    cv2.setNumThreads(1)
    paths, labels = image_files(root)
    tf = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(), v2.TrivialAugmentWide(),
                     v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD), v2.RandomErasing(0.1)])
    mix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=CLASSES), v2.CutMix(alpha=1.0, num_classes=CLASSES)])

    class Folder(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(paths)

        def __getitem__(self, i: int):
            torch.set_num_threads(1)
            img = cv2.cvtColor(cv2.imread(paths[i], cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
            return tf(torch.from_numpy(img).permute(2, 0, 1)), labels[i]

    def collate(items):
        return mix(torch.stack([it[0] for it in items]), torch.as_tensor([it[1] for it in items]))

    loader = torch.utils.data.DataLoader(Folder(), batch_size=BATCH, shuffle=True, num_workers=workers,
                                         drop_last=True, persistent_workers=workers > 0, collate_fn=collate)
    return consume(loader, images)


def consume(loader, images: int, soft: bool = True) -> dict:
    """The infinitely fast model: take batches and drop them (the first batch is not timed).
    Also the process's CPU time per image (all threads): on a shared machine the wall clock
    depends on the other processes, the CPU time much less."""
    seen, t_first, c_first = 0, None, None
    while seen < images:
        for x, y in loader:
            assert x.shape[1:] == (3, 224, 224) and (y.shape[1] == CLASSES if soft else y.ndim == 1)
            if t_first is None:
                t_first, c_first = time.perf_counter(), time.process_time()
            else:
                seen += len(x)
            if seen >= images:
                break
    return {"images_per_s": seen / (time.perf_counter() - t_first),
            "cpu_ms_per_image": (time.process_time() - c_first) * 1000 / seen}


# --------------------------------------------------------------------------- per-op CPU cost


#: ``--smoke`` (benchmarks/smoke.py): one call per timing and 8 images, to check the script runs.
SMOKE = False


def cpu_ms(fn, n: int, blocks: int = 3) -> float:
    """CPU ms per call: the best of ``blocks`` blocks of n calls (other processes on a shared
    machine only ever add time)."""
    if SMOKE:
        n, blocks = 1, 1
    fn()  # warm scratch buffers
    best = float("inf")
    for _ in range(blocks):
        t = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - t) * 1000 / n)
    return best


def chain_variants():
    """(name, extra ops after the flip, erasing ops after CHW) of the per-op table."""
    from loaderlib import transforms as T

    cj = T.ColorJitter
    return [("decode + RandomResizedCrop + flip + Normalize + CHW (base)", [], []),
            ("+ TrivialAugmentWide", [T.TrivialAugmentWide()], []),
            ("+ RandAugment(2, 9)", [T.RandAugment()], []),
            ("+ AutoAugment(imagenet)", [T.AutoAugment()], []),
            ("+ ColorJitter(brightness=0.4)", [cj(brightness=0.4)], []),
            ("+ ColorJitter(contrast=0.4)", [cj(contrast=0.4)], []),
            ("+ ColorJitter(saturation=0.4)", [cj(saturation=0.4)], []),
            ("+ ColorJitter(hue=0.1)", [cj(hue=0.1)], []),
            ("+ ColorJitter(0.4, 0.4, 0.4)", [cj(0.4, 0.4, 0.4)], []),
            ("+ ColorJitter(0.4, 0.4, 0.4, 0.1)", [cj(0.4, 0.4, 0.4, 0.1)], []),
            ("+ RandomGrayscale(p=1)", [T.RandomGrayscale(1.0)], []),
            ("+ GaussianBlur(23)", [T.GaussianBlur(23)], []),
            ("+ RandomRotation(30)", [T.RandomRotation(30)], []),
            ("+ RandomRotation(30, bilinear)", [T.RandomRotation(30, interpolation="bilinear")], []),
            ("+ RandomAffine(15, (0.1, 0.1), (0.9, 1.1), 10)", [T.RandomAffine(15, (0.1, 0.1), (0.9, 1.1), 10)], []),
            ("+ RandomCrop(224, padding=16)", [T.RandomCrop(224, padding=16)], []),
            ("+ RandomErasing(p=1)", [], [T.RandomErasing(1.0)]),
            ("+ TA + ColorJitter(0.4, 0.4, 0.4) + RandomErasing(0.25)",
             [T.TrivialAugmentWide(), cj(0.4, 0.4, 0.4)], [T.RandomErasing(0.25)])]


PRIMS = (*TRIVIAL, "Invert", "Hue")
BLUR_SIGMAS = (0.3, 0.5, 0.8, 1.5, 3.0)


def blur_costs(img: np.ndarray) -> dict:
    """CPU ms of GaussianBlur(23) at each of BLUR_SIGMAS on one image (one thread), the sigmas
    interleaved block by block."""
    from loaderlib import transforms as T

    ops = []
    for sigma in BLUR_SIGMAS:
        op = T.GaussianBlur(23, sigma)
        ops.append((f"GaussianBlur(23), sigma {sigma:g}", op, op.get_params(*img.shape, T._Rng(0, 0, 0, 0))))
    best: dict = {}
    for _ in range(3):
        for name, op, prm in ops:
            ms = cpu_ms(lambda op=op, prm=prm: op.apply_params(img, prm), 2 if SMOKE else 40, blocks=1)
            best[name] = min(best.get(name, math.inf), ms)
    return best


def op_costs(root: str, with_cv: bool = True) -> dict:
    """CPU ms per image of every op (one thread): {"chain": marginal costs in the fused chain
    (the base's own cost under its name), "prims": each primitive's kernel on 224x224 through
    one Python call, "cv": the OpenCV/numpy equivalents, "mix": MixUp/CutMix per image}."""
    import cv2

    from loaderlib import transforms as T
    from loaderlib._chain import compile_chain

    cv2.setNumThreads(1)
    paths, _ = image_files(root)
    bufs = []
    for path in paths[:8 if SMOKE else 128]:
        with open(path, "rb") as f:
            bufs.append(f.read())
    idx = np.arange(len(bufs))
    out = np.empty((len(bufs), 3, 224, 224), np.float32)
    res: dict = {"chain": {}, "prims": {}, "cv": {}, "mix": {}}
    base_ms = None
    for name, extra, erase in chain_variants():
        steps = [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), *extra, T.Normalize(MEAN, STD), T.ToCHW(), *erase]
        plan = compile_chain(T.Compose(steps))
        epoch = [0]

        def run(plan=plan, epoch=epoch):
            epoch[0] += 1
            plan.run_buffers_into(bufs, out, idx, seed=0, epoch=epoch[0], num_threads=1)

        ms = cpu_ms(run, 2, blocks=3) / len(bufs)
        if base_ms is None:
            base_ms = ms
            res["chain"][name] = ms
        else:
            res["chain"][name] = ms - base_ms
    img = np.ascontiguousarray(cv2.resize(cv2.imread(paths[0])[:, :, ::-1], (224, 224)))
    op = T.RandAugment(num_ops=1)
    for k, name in enumerate(PRIMS):
        mag = 0.1 if name == "Hue" else trivial_magnitude(name, 20)
        prm = np.zeros(T._transform.AUG_NPRM)
        prm[:3] = (1, k, mag)
        res["prims"][name] = cpu_ms(lambda prm=prm: op.apply_params(img, prm), 100)
        if with_cv and name in TRIVIAL:
            res["cv"][name] = cpu_ms(lambda name=name, mag=mag: cv_trivial_op(name, mag, img), 100)
    res["prims"].update(blur_costs(img))
    x = np.random.default_rng(0).standard_normal((BATCH, 3, 224, 224)).astype(np.float32)
    y = np.arange(BATCH) % CLASSES
    for mix in (T.MixUp(0.2, CLASSES), T.CutMix(1.0, CLASSES)):
        b = [0]

        def go(mix=mix, b=b):
            b[0] += 1
            mix(x, y, seed=0, epoch=0, batch_index=b[0])

        res["mix"][type(mix).__name__] = cpu_ms(go, 10) / BATCH
    if with_cv:
        g = np.random.default_rng(0)
        res["mix"]["numpy MixUp/CutMix (copies)"] = cpu_ms(lambda: np_mix(x.copy(), y, g), 10) / BATCH
    return res


def print_costs(after: list[dict], before: list[dict]) -> None:
    """The per-op table: medians over the rounds, before -> after when a baseline ran."""

    def med(runs: list[dict], part: str, name: str) -> float:
        vals = [r[part][name] for r in runs if name in r[part]]
        return float(np.median(vals)) if vals else float("nan")

    def row(label: str, part: str, name: str, cv: str = "") -> str:
        a = med(after, part, name)
        line = f"  {label:<58}"
        if before:
            b = med(before, part, name)
            line += f" {b:8.3f} -> {a:6.3f} ms" + (f"  ({b / a:4.1f}x)" if a > 0.005 and b > 0 else "        ")
        else:
            line += f" {a:8.3f} ms"
        return line + cv

    rounds = f"median of {len(after)} round(s)" + (f", interleaved with the baseline build's {len(before)}"
                                                     if before else "")
    print(f"\nCPU per image, one thread ({rounds}; process_time, best of blocks)")
    print("  in the fused chain (in-memory JPEGs, 128 photos): the base, then each op's marginal cost"
          + ("; baseline -> this build" if before else ""))
    for name in after[0]["chain"]:
        print(row(name, "chain", name))
    print("  each primitive's kernel on 224x224 (one Python call; OpenCV/numpy baseline on the right):")
    for name in after[0]["prims"]:
        cv = after[0]["cv"].get(name)
        print(row(f"  {name}", "prims", name, f"   OpenCV/numpy {med(after, 'cv', name):6.3f} ms" if cv else ""))
    print(f"  batch transforms (batch {BATCH}, in place), per image:")
    for name in after[0]["mix"]:
        print(row(f"  {name}", "mix", name))


def measure(args: list[str], tree: str | None = None, python: str | None = None) -> dict:
    """Run one child: loaderlib from ``tree`` (a source tree built in place) when given, under
    another interpreter (``python``: a peer's environment, loaderlib from this tree) when given."""
    env = dict(os.environ)
    if python and not tree:
        tree = os.path.dirname(HERE)
    if tree:
        env["PYTHONPATH"] = os.pathsep.join([tree, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = subprocess.run([python or sys.executable, os.path.abspath(__file__), "--child", *args], check=True,
                         stdout=subprocess.PIPE, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_costs(root: str, repeat: int, baseline: str | None) -> None:
    after: list[dict] = []
    before: list[dict] = []
    for _ in range(max(1, repeat)):  # alternate the builds so both see the same machine load
        after.append(measure(["costs", root]))
        if baseline:
            before.append(measure(["costs", root], tree=baseline))
    print_costs(after, before)


def run_blur(root: str, repeat: int, baseline: str | None) -> None:
    """GaussianBlur(23) by sigma, in child processes alternating with the baseline build's."""
    after: list[dict] = []
    before: list[dict] = []
    for _ in range(max(1, repeat)):
        after.append(measure(["blur", root]))
        if baseline:
            before.append(measure(["blur", root], tree=baseline))
    print(f"\nGaussianBlur(23) on one 224x224 photo, CPU ms per image, one thread (median of {len(after)} rounds, "
          "each the best of 3 blocks of 40 calls" + (", alternating with the baseline build" if baseline else "")
          + "; process_time)")
    for name in after[0]:
        a = float(np.median([r[name] for r in after]))
        line = f"  {name:<32} {a:7.3f} ms"
        if before:
            b = float(np.median([r[name] for r in before]))
            line = f"  {name:<32} {b:7.3f} -> {a:7.3f} ms ({b / a:4.1f}x)"
        print(line)
    key = "GaussianBlur(23), sigma {:g}"
    ratios = [r[key.format(0.5)] / r[key.format(1.5)] for r in after]
    print(f"  sigma 0.5 / sigma 1.5: {np.median(ratios):.2f}x (per round " + ", ".join(f"{x:.2f}" for x in ratios)
          + ")" + (f"; baseline build {np.median([r[key.format(0.5)] / r[key.format(1.5)] for r in before]):.2f}x"
                   if before else ""))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="an ImageFolder (default: generate photo-like JPEGs)")
    p.add_argument("--make", type=int, default=1024, help="images to generate when --data is not given")
    add_data_kind(p)
    p.add_argument("--images", type=int, default=2048, help="images consumed per measurement, after the first batch")
    p.add_argument("--threads", type=int, default=2, help="loaderlib threads")
    p.add_argument("--workers", type=int, default=2, help="PyTorch DataLoader workers")
    p.add_argument("--repeat", type=int, default=3, help="interleaved rounds; medians are reported")
    p.add_argument("--baseline", help="a loaderlib source tree built in place: its figures join every part")
    p.add_argument("--costs-only", action="store_true", help="only the per-op CPU costs (part 3)")
    p.add_argument("--blur-only", action="store_true", help="only GaussianBlur(23)'s cost by sigma")
    p.add_argument("--skip-costs", action="store_true", help="skip the per-op CPU costs (part 3)")
    p.add_argument("--skip-peers", action="store_true", help="skip torchvision's recipe against PyTorch (part 2)")
    p.add_argument("--tv-python", default=os.path.join(os.path.dirname(HERE), ".venv-tv", "bin", "python"),
                   help="an interpreter with torch and torchvision (make check-torchvision builds .venv-tv) for the "
                        "torchvision v2 row of part 2; skipped when it does not exist")
    p.add_argument("--smoke", action="store_true", help="time each op once on 8 images (a check that it runs)")
    p.add_argument("--peers", default=os.path.join(os.path.dirname(HERE), ".venv-peers", "bin", "python"),
                   help="an interpreter with nvidia-dali (make bench-peers builds .venv-peers) for the DALI row of "
                        "part 2; skipped when it does not exist")
    p.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    a = p.parse_args()
    global SMOKE
    SMOKE = a.smoke
    if a.child:
        kind, root, *rest = a.child
        if kind == "costs":
            res = op_costs(root)
        elif kind == "blur":
            import cv2

            img = np.ascontiguousarray(cv2.resize(cv2.imread(image_files(root)[0][0])[:, :, ::-1], (224, 224)))
            res = blur_costs(img)
        elif kind == "torch":
            res = run_torch(root, int(rest[0]), int(rest[1]))
        elif kind == "tv":
            res = run_tv(root, int(rest[0]), int(rest[1]))
        elif kind == "dali":
            res = run_dali(root, int(rest[0]), int(rest[1]))
        else:
            res = run_loaderlib(root, int(rest[0]), int(rest[1]), chain=kind)
        print(json.dumps(res))
        return
    root = photos_for(a, a.make, os.path.join(HERE, "out"))
    if a.baseline:
        a.baseline = os.path.abspath(a.baseline)
    print(f"data: {root} ({len(image_files(root)[0])} JPEGs), {a.images} images per measurement, "
          f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, Python {platform.python_version()}"
          + (f"; baseline build: {a.baseline}" if a.baseline else ""))
    if a.costs_only:
        run_costs(root, a.repeat, a.baseline)
        return
    if a.blur_only:
        run_blur(root, a.repeat, a.baseline)
        return
    # part 1: the recipe against the plain chain
    print(f"\n1. recipe = RandomResizedCrop(224), flip, TrivialAugmentWide, ColorJitter(0.4, 0.4, 0.4), Normalize, "
          f"CHW, RandomErasing(0.25), RandomChoice(MixUp(0.2), CutMix(1.0)); plain = RandomResizedCrop(224), flip, "
          f"Normalize, CHW; batch {BATCH}, loaderlib native, {a.threads} threads")
    rows = [("plain", ["plain", root, str(a.images), str(a.threads)], None),
            ("recipe", ["recipe", root, str(a.images), str(a.threads)], None)]
    if a.baseline:
        rows += [("plain (baseline)", rows[0][1], a.baseline), ("recipe (baseline)", rows[1][1], a.baseline)]
    runs: dict = {name: [] for name, _, _ in rows}
    cpu: dict = {name: [] for name, _, _ in rows}
    for _ in range(max(1, a.repeat)):
        for name, args, tree in rows:
            res = measure(args, tree=tree)
            runs[name].append(res["images_per_s"])
            cpu[name].append(res["cpu_ms_per_image"])
    print(f"{'pipeline':<22} {'images/s':>9} {'CPU-ms/img':>11}   runs (images/s)")
    for name, _args, _tree in rows:
        print(f"{name:<22} {np.median(runs[name]):9.0f} {np.median(cpu[name]):11.3f}   "
              + ", ".join(f"{v:.0f}" for v in runs[name]))
    for tag in ("", " (baseline)") if a.baseline else ("",):
        ratios = [x / y for x, y in zip(runs["recipe" + tag], runs["plain" + tag])]
        cratios = [y / x for x, y in zip(cpu["recipe" + tag], cpu["plain" + tag])]
        print(f"recipe / plain{tag}: {np.median(ratios):.2f}x in images/s (median of {len(ratios)} interleaved rounds; "
              "per round " + ", ".join(f"{r:.2f}x" for r in ratios) + f"), {np.median(cratios):.2f}x in CPU per image")
    if a.baseline:
        sp = [x / y for x, y in zip(runs["recipe"], runs["recipe (baseline)"])]
        print(f"recipe, this build / baseline: {np.median(sp):.2f}x in images/s")
    # part 2: torchvision's ImageNet recipe against PyTorch's DataLoader
    if not a.skip_peers:
        try:
            import torch

            have_torch = f"torch {torch.__version__}"
        except ImportError:
            have_torch = ""
        print(f"\n2. torchvision ImageNet recipe (RandomResizedCrop(224), flip, TrivialAugmentWide, Normalize, CHW, "
              f"RandomErasing(0.1), RandomChoice(MixUp(0.2), CutMix(1.0))), batch {BATCH}")
        rows = [("loaderlib native", ["imagenet", root, str(a.images), str(a.threads)], f"{a.threads} threads")]
        if have_torch:
            rows.append(("PyTorch DataLoader", ["torch", root, str(a.images), str(a.workers)],
                         f"num_workers={a.workers}, OpenCV+numpy ({have_torch})"))
        else:
            print("torch is not installed: the PyTorch DataLoader comparison is skipped")
        pythons = {}
        if os.path.exists(a.tv_python):
            rows.append(("PyTorch + tv v2", ["tv", root, str(a.images), str(a.workers)],
                         f"num_workers={a.workers}, torchvision v2 on tensors"))
            pythons["PyTorch + tv v2"] = a.tv_python
        else:
            print(f"{a.tv_python} not found (make check-torchvision creates it): the torchvision v2 row is skipped")
        if os.path.exists(a.peers):
            rows.append(("DALI CPU", ["dali", root, str(a.images), str(a.threads)],
                         f"{a.threads} threads, device_id=None, auto_aug.trivial_augment_wide"))
            pythons["DALI CPU"] = a.peers
        else:
            print(f"{a.peers} not found (make bench-peers creates it): the DALI row is skipped")
        runs = {name: [] for name, _, _ in rows}
        for _ in range(max(1, a.repeat)):
            for name, args, _cfg in rows:
                runs[name].append(measure(args, python=pythons.get(name))["images_per_s"])
        print(f"{'pipeline':<20} {'config':<48} {'images/s':>9}   runs")
        for name, _args, cfg in rows:
            print(f"{name:<20} {cfg:<48} {np.median(runs[name]):9.0f}   " + ", ".join(f"{v:.0f}" for v in runs[name]))
        for peer in ("PyTorch DataLoader", "PyTorch + tv v2", "DALI CPU"):
            if peer in runs:
                ratios = [x / y for x, y in zip(runs["loaderlib native"], runs[peer])]
                print(f"loaderlib / {peer}: {np.median(ratios):.2f}x (median of {len(ratios)} interleaved "
                      "rounds; per round " + ", ".join(f"{r:.2f}x" for r in ratios) + ")")
    # part 3: per-op CPU costs
    if not a.skip_costs:
        run_costs(root, a.repeat, a.baseline)


if __name__ == "__main__":
    main()
