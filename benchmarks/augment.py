"""Augmentation benchmark: torchvision's ImageNet training recipe, consumed by an infinitely fast model.

The recipe (torchvision's references/classification with ``--auto-augment ta_wide
--random-erase 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0``): RandomResizedCrop(224), random
horizontal flip, TrivialAugmentWide, Normalize, CHW float32, RandomErasing(p=0.1), then per
batch a random choice of MixUp(0.2) or CutMix(1.0) with soft labels. Two pipelines, each in a
fresh process, in interleaved rounds at the same core count:

* ``loaderlib``: ImageFolderDataset + the native transforms, native engine, ``--threads``
  threads, ``batch_transform=RandomChoice([MixUp, CutMix])``;
* ``torch``: PyTorch's DataLoader with ``--workers`` worker processes; each sample is read
  with OpenCV and augmented with OpenCV/numpy equivalents of the same ops (TrivialAugmentWide's
  14 ops with cv2.warpAffine, lookup tables and cv2.addWeighted), MixUp/CutMix in the
  collate function.

Then the CPU cost per image of each op on one thread (``time.process_time``): in loaderlib as
the marginal cost of adding the op to the fused chain (in-memory JPEGs, ``num_threads=1``), and
each OpenCV/numpy equivalent on 224x224 images.

Usage::

    python benchmarks/augment.py                    # generates photo-like JPEGs once
    python benchmarks/augment.py --images 4096 --repeat 5
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
from loader import image_files, make_dataset

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
    from loaderlib import transforms as T

    return (T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.TrivialAugmentWide(),
                       T.Normalize(MEAN, STD), T.ToCHW(), T.RandomErasing(0.1)]),
            T.RandomChoice([T.MixUp(0.2, CLASSES), T.CutMix(1.0, CLASSES)]))


def run_loaderlib(root: str, images: int, threads: int) -> dict:
    import loaderlib as ll

    chain, mix = loaderlib_recipe()
    ds = ll.ImageFolderDataset(root).transform_first(chain)
    loader = ll.DataLoader(ds, batch_size=BATCH, shuffle=True, num_threads=threads, seed=0, last_batch="discard",
                           batch_transform=mix)
    assert loader.engine == "native", loader.explain()
    return consume(loader, images)


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


def consume(loader, images: int) -> dict:
    """The infinitely fast model: take batches and drop them (the first batch is not timed)."""
    seen, t_first = 0, None
    while seen < images:
        for x, y in loader:
            assert x.shape[1:] == (3, 224, 224) and y.shape[1] == CLASSES
            if t_first is None:
                t_first = time.perf_counter()
            else:
                seen += len(x)
            if seen >= images:
                break
    return {"images_per_s": seen / (time.perf_counter() - t_first)}


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


def op_costs(root: str) -> None:
    import cv2

    import loaderlib as ll
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
    base = [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
    tail = [T.Normalize(MEAN, STD), T.ToCHW()]
    variants = [("decode + RandomResizedCrop + flip + Normalize (base)", []),
                ("+ TrivialAugmentWide", [T.TrivialAugmentWide()]),
                ("+ RandAugment(2, 9)", [T.RandAugment()]),
                ("+ AutoAugment(imagenet)", [T.AutoAugment()]),
                ("+ ColorJitter(0.4, 0.4, 0.4, 0.1)", [T.ColorJitter(0.4, 0.4, 0.4, 0.1)]),
                ("+ GaussianBlur(23)", [T.GaussianBlur(23)]),
                ("+ RandomRotation(30)", [T.RandomRotation(30)]),
                ("+ RandomErasing(p=1)", "erase")]
    print("\nCPU per image, one thread (loaderlib: marginal cost in the fused chain; in-memory JPEGs)")
    base_ms = None
    for name, extra in variants:
        steps = base + tail + [T.RandomErasing(1.0)] if extra == "erase" else base + list(extra) + tail
        plan = compile_chain(T.Compose(steps))
        epoch = [0]

        def run(plan=plan, epoch=epoch):
            epoch[0] += 1
            plan.run_buffers_into(bufs, out, idx, seed=0, epoch=epoch[0], num_threads=1)

        ms = cpu_ms(run, 3, blocks=5) / len(bufs)
        base_ms = ms if base_ms is None else base_ms
        print(f"  loaderlib {name:<52} {ms:7.3f} ms" + ("" if ms is base_ms else f"  (+{ms - base_ms:.3f} ms)"))
    # TrivialAugmentWide's primitives on a 224x224 image, native (one call each) vs OpenCV/numpy
    img = np.ascontiguousarray(cv2.resize(cv2.imread(paths[0])[:, :, ::-1], (224, 224)))
    op = T.RandAugment(num_ops=1)
    print("  per TrivialAugmentWide op on 224x224 (native kernel via one Python call vs the OpenCV/numpy baseline):")
    for k, name in enumerate(TRIVIAL):
        mag = trivial_magnitude(name, 20)
        prm = np.zeros(T._transform.AUG_NPRM)
        prm[:3] = (1, k, mag)
        nat = cpu_ms(lambda prm=prm: op.apply_params(img, prm), 200)
        cvm = cpu_ms(lambda name=name, mag=mag: cv_trivial_op(name, mag, img), 200)
        print(f"    {name:<14} native {nat:6.3f} ms   OpenCV/numpy {cvm:6.3f} ms")
    x = np.random.default_rng(0).standard_normal((BATCH, 3, 224, 224)).astype(np.float32)
    y = np.arange(BATCH) % CLASSES
    for mix in (T.MixUp(0.2, CLASSES), T.CutMix(1.0, CLASSES)):
        b = [0]

        def go(mix=mix, b=b):
            b[0] += 1
            mix(x, y, seed=0, epoch=0, batch_index=b[0])

        print(f"  {type(mix).__name__:<10} (batch {BATCH}, in place)  {cpu_ms(go, 10) / BATCH:7.3f} ms per image")
    g = np.random.default_rng(0)
    print(f"  numpy MixUp/CutMix baseline (copies)    {cpu_ms(lambda: np_mix(x.copy(), y, g), 10) / BATCH:7.3f} "
          "ms per image (includes one batch copy)")
    del ll


def measure(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *args], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="an ImageFolder (default: generate photo-like JPEGs)")
    p.add_argument("--make", type=int, default=1024, help="images to generate when --data is not given")
    p.add_argument("--images", type=int, default=2048, help="images consumed per measurement, after the first batch")
    p.add_argument("--threads", type=int, default=2, help="loaderlib threads")
    p.add_argument("--workers", type=int, default=2, help="PyTorch DataLoader workers")
    p.add_argument("--repeat", type=int, default=3, help="interleaved rounds; medians are reported")
    p.add_argument("--costs-only", action="store_true", help="only the per-op CPU costs")
    p.add_argument("--smoke", action="store_true", help="time each op once on 8 images (a check that it runs)")
    p.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    a = p.parse_args()
    global SMOKE
    SMOKE = a.smoke
    if a.costs_only:
        op_costs(a.data or make_dataset(os.path.join(HERE, "out", "photos"), a.make))
        return
    if a.child:
        kind, root, images, n = a.child
        res = run_loaderlib(root, int(images), int(n)) if kind == "loaderlib" else run_torch(root, int(images), int(n))
        print(json.dumps(res))
        return
    root = a.data or make_dataset(os.path.join(HERE, "out", "photos"), a.make)
    try:
        import torch

        have_torch = f"torch {torch.__version__}"
    except ImportError:
        have_torch = ""
    print(f"torchvision ImageNet recipe (RandomResizedCrop(224), flip, TrivialAugmentWide, Normalize, CHW, "
          f"RandomErasing(0.1), RandomChoice(MixUp(0.2), CutMix(1.0))), batch {BATCH}")
    print(f"data: {root} ({len(image_files(root)[0])} JPEGs), {a.images} images per measurement, "
          f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    rows = [("loaderlib native", ["loaderlib", root, str(a.images), str(a.threads)], f"{a.threads} threads")]
    if have_torch:
        rows.append(("PyTorch DataLoader", ["torch", root, str(a.images), str(a.workers)],
                     f"num_workers={a.workers}, OpenCV+numpy ({have_torch})"))
    else:
        print("torch is not installed: the PyTorch DataLoader comparison is skipped")
    runs: dict = {name: [] for name, _, _ in rows}
    for _ in range(max(1, a.repeat)):
        for name, args, _cfg in rows:
            runs[name].append(measure(args)["images_per_s"])
    print(f"\n{'pipeline':<20} {'config':<48} {'images/s':>9}   runs")
    for name, _args, cfg in rows:
        print(f"{name:<20} {cfg:<48} {np.median(runs[name]):9.0f}   " + ", ".join(f"{v:.0f}" for v in runs[name]))
    if have_torch:
        ratios = [x / y for x, y in zip(runs["loaderlib native"], runs["PyTorch DataLoader"])]
        print(f"loaderlib / PyTorch DataLoader: {np.median(runs['loaderlib native']) / np.median(runs['PyTorch DataLoader']):.2f}x "
              f"(medians of {len(ratios)} interleaved rounds; per round " + ", ".join(f"{r:.2f}x" for r in ratios) + ")")
    op_costs(root)


if __name__ == "__main__":
    main()
