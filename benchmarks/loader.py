"""Loader benchmark: the ResNet-50 training input pipeline, consumed by an infinitely fast model.

Runs side by side, each in a fresh process (so peak memory is its own):

* ``loaderlib``: ImageFolderDataset + native transforms, native engine;
* ``loaderlib-bilinear``: the same with ``RandomResizedCrop(224, antialias=False)``, the plain
  bilinear resize of the TurboLoader, tf.data and OpenCV pipelines (same work as theirs);
* ``torch``: PyTorch's DataLoader with ``num_workers=2``, OpenCV decode and the same
  transforms written in numpy/OpenCV (skipped with a message when torch is absent);
* ``opencv-1thread``: a plain one-thread OpenCV loop (the per-core limit of the usual
  Python pipeline);
* with ``--peers PYTHON`` (an interpreter with ``turboloader``, ``nvidia-dali`` and
  ``tensorflow`` installed, e.g. ``.venv-peers/bin/python`` from ``make bench-peers``; any that
  is missing is skipped): TurboLoader's fused C++ train path (``train_aug=True`` on a TAR of
  the same JPEGs), DALI's CPU pipeline (``readers.file`` + ``decoders.image_random_crop`` +
  ``resize`` + ``crop_mirror_normalize``, ``device_id=None``) and tf.data's ImageNet
  preprocessing (``decode_and_crop_jpeg``), each with the same thread count as loaderlib.

Two variants: ``float`` (RandomResizedCrop(224), flip, Normalize, CHW float32) and ``uint8``
(RandomResizedCrop(224), flip, HWC uint8). Batch 64. Reports images/s (after the first
batch), first-batch latency and the peak RSS and PSS of the whole process tree (workers
included; PSS splits shared pages between the processes mapping them).

Data: by default 1,024 generated JPEGs with ImageNet's statistics (benchmarks/_photos.py:
several photos of scikit-image and loaderlib, ImageNet's sizes and shapes, quality 75-95, mostly
4:2:0, a few grayscale and progressive files, sensor-like noise; about 100 KB each); the report
prints their size, dimension and subsampling statistics. ``--data-kind one-photo`` runs on the
data of the figures before round 4 (clean crops of one photo, about 45 KB).

Usage::

    python benchmarks/loader.py                      # generates the photos once
    python benchmarks/loader.py --data /path/to/imagefolder --images 4096 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
from _photos import DEFAULT_KIND, add_data_kind, make_photos, photos_for

HERE = os.path.dirname(os.path.abspath(__file__))
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
BATCH = 64


# --------------------------------------------------------------------------- data


def make_dataset(root: str, n: int, classes: int = 8, kind: str = DEFAULT_KIND) -> str:
    """``n`` generated JPEGs of ``kind`` under ``root`` (benchmarks/_photos.py: ImageNet-like by
    default, ``"one-photo"`` for the data of the benchmarks before round 4)."""
    return make_photos(root, n, kind, classes)


def image_files(root: str) -> tuple[list[str], list[int]]:
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    paths, labels = [], []
    for k, c in enumerate(classes):
        for f in sorted(os.listdir(os.path.join(root, c))):
            if f.lower().endswith((".jpg", ".jpeg", ".png")):
                paths.append(os.path.join(root, c, f))
                labels.append(k)
    return paths, labels


# --------------------------------------------------------------------------- the OpenCV/numpy pipeline


class CvPipeline:
    """The usual Python pipeline: cv2.imread, RandomResizedCrop, flip, normalize, CHW (numpy)."""

    def __init__(self, variant: str, seed: int = 0) -> None:
        self.variant = variant
        self.rng = np.random.default_rng(seed)
        self.mean = np.array(MEAN, np.float32) * 255
        self.inv_std = 1.0 / (np.array(STD, np.float32) * 255)

    def crop_box(self, h: int, w: int) -> tuple[int, int, int, int]:
        from loaderlib.transforms import random_resized_crop_box  # (children of other venvs lack loaderlib)

        return random_resized_crop_box(w, h, rng=self.rng)   # torchvision's get_params

    def __call__(self, path: str) -> np.ndarray:
        import cv2

        img = cv2.imread(path, cv2.IMREAD_COLOR)
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        y, x, ch, cw = self.crop_box(*img.shape[:2])
        img = cv2.resize(img[y:y + ch, x:x + cw], (224, 224), interpolation=cv2.INTER_LINEAR)
        if self.rng.random() < 0.5:
            img = img[:, ::-1]
        if self.variant == "uint8":
            return np.ascontiguousarray(img)
        out = (img.astype(np.float32) - self.mean) * self.inv_std
        return np.ascontiguousarray(out.transpose(2, 0, 1))


# --------------------------------------------------------------------------- runners (child process)


def rn50_chain(variant: str, antialias: bool = True):
    """The ResNet-50 training chain as loaderlib transforms: RandomResizedCrop(224) + flip, then
    Normalize + CHW float32 for ``"float"`` (HWC uint8 for ``"uint8"``). ``antialias=False``:
    the plain bilinear resize the TurboLoader, tf.data and OpenCV pipelines use."""
    from loaderlib import transforms as T

    steps = [T.RandomResizedCrop(224, antialias=antialias), T.RandomHorizontalFlip()]
    if variant == "float":
        steps += [T.Normalize(MEAN, STD), T.ToCHW()]
    return T.Compose(steps)


def run_loaderlib(root: str, variant: str, images: int, threads: int, antialias: bool = True) -> dict:
    import loaderlib as ll

    t0 = time.perf_counter()
    ds = ll.ImageFolderDataset(root).transform_first(rn50_chain(variant, antialias))
    loader = ll.DataLoader(ds, batch_size=BATCH, shuffle=True, num_threads=threads, seed=0, last_batch="discard")
    return consume(loader, images, t0, engine=loader.engine)


def _torch_dataset(root: str, variant: str):
    import torch

    paths, labels = image_files(root)

    class Folder(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.pipe = None

        def __len__(self) -> int:
            return len(paths)

        def __getitem__(self, i: int):
            if self.pipe is None:   # one generator per worker process
                info = torch.utils.data.get_worker_info()
                self.pipe = CvPipeline(variant, seed=0 if info is None else info.id + 1)
            return torch.from_numpy(self.pipe(paths[i])), labels[i]

    return Folder()


def run_torch(root: str, variant: str, images: int, workers: int) -> dict:
    import cv2
    import torch

    cv2.setNumThreads(1)
    t0 = time.perf_counter()
    loader = torch.utils.data.DataLoader(_torch_dataset(root, variant), batch_size=BATCH, shuffle=True,
                                         num_workers=workers, drop_last=True, persistent_workers=workers > 0)
    return consume(loader, images, t0)


def _tar_of(root: str) -> str:
    """The ImageFolder as one uncompressed TAR (``class/file`` members), made once: the input
    TurboLoader's fast path reads."""
    import tarfile

    paths, _ = image_files(root)
    out = root.rstrip(os.sep) + f"-{len(paths)}.tar"
    if not os.path.exists(out):
        tmp = out + ".tmp"
        with tarfile.open(tmp, "w") as t:
            for p in paths:
                t.add(p, arcname=os.path.relpath(p, root))
        os.replace(tmp, out)
    return out


def run_turbo(root: str, variant: str, images: int, threads: int) -> dict:
    import turboloader as tl

    t0 = time.perf_counter()
    kw = {"transform": tl.ImageNetNormalize(), "output_format": "numpy_chw"} if variant == "float" else \
        {"output_format": "numpy"}   # no uint8 output: HWC float32 0-255 is its closest
    loader = tl.DataLoader(_tar_of(root), batch_size=BATCH, num_workers=threads, shuffle=True, image_size=224,
                           train_aug=True, drop_last=True, **kw)
    return consume(loader, images, t0, version=getattr(tl, "__version__", "?"))


def run_dali(root: str, variant: str, images: int, threads: int) -> dict:
    from nvidia import dali
    from nvidia.dali import fn, pipeline_def, types

    mean = [m * 255 for m in MEAN] if variant == "float" else [0.0, 0.0, 0.0]
    std = [s * 255 for s in STD] if variant == "float" else [1.0, 1.0, 1.0]

    @pipeline_def(batch_size=BATCH, num_threads=threads, device_id=None, seed=0)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="Reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=224, resize_y=224)
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT if variant == "float" else types.UINT8,
            output_layout="CHW" if variant == "float" else "HWC", mean=mean, std=std,
            mirror=fn.random.coin_flip())
        return images, labels

    t0 = time.perf_counter()
    p = pipe()
    p.build()

    def batches():
        while True:
            x, y = p.run()
            yield x.as_array(), y.as_array()

    return consume(batches(), images, t0, version=dali.__version__)


def tf_train_image(data, variant: str):
    """TensorFlow's ResNet training preprocessing of one JPEG's bytes (a string tensor):
    ``sample_distorted_bounding_box`` + ``decode_and_crop_jpeg``, bilinear resize to 224, flip;
    then normalize + CHW for ``"float"`` (HWC uint8 for ``"uint8"``)."""
    import tensorflow as tf

    shape = tf.io.extract_jpeg_shape(data)
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape, tf.zeros([0, 0, 4], tf.float32), min_object_covered=0.0, aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0), max_attempts=10, use_image_if_no_bounding_boxes=True)
    y, x, _ = tf.unstack(begin)
    h, w, _ = tf.unstack(size)
    img = tf.io.decode_and_crop_jpeg(data, tf.stack([y, x, h, w]), channels=3)
    img = tf.image.resize(img, (224, 224), method="bilinear")
    img = tf.image.random_flip_left_right(img)
    if variant == "float":
        mean = tf.constant([m * 255 for m in MEAN])
        std = tf.constant([s * 255 for s in STD])
        return tf.transpose((img - mean) / std, (2, 0, 1))
    return tf.cast(tf.clip_by_value(tf.round(img), 0, 255), tf.uint8)


def run_tfdata(root: str, variant: str, images: int, threads: int) -> dict:
    """tf.data's ImageNet input pipeline (TensorFlow's own ResNet preprocessing): shuffled file
    list, ``sample_distorted_bounding_box`` + ``decode_and_crop_jpeg`` (it decodes only the crop,
    as loaderlib does), bilinear resize to 224, flip, normalize, CHW; ``num_parallel_calls`` and
    ``prefetch`` AUTOTUNE on a private pool of ``threads`` threads."""
    import tensorflow as tf

    paths, labels = image_files(root)

    def load(path, label):
        return tf_train_image(tf.io.read_file(path), variant), label

    opts = tf.data.Options()
    opts.threading.private_threadpool_size = threads
    ds = (tf.data.Dataset.from_tensor_slices((paths, labels)).shuffle(len(paths), seed=0).repeat()
          .map(load, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH, drop_remainder=True)
          .prefetch(tf.data.AUTOTUNE).with_options(opts))
    t0 = time.perf_counter()
    return consume(((x.numpy(), y.numpy()) for x, y in ds), images, t0, version=tf.__version__)


def run_opencv(root: str, variant: str, images: int) -> dict:
    import cv2

    cv2.setNumThreads(1)
    paths, labels = image_files(root)
    pipe = CvPipeline(variant)
    t0 = time.perf_counter()

    def batches():
        rng = np.random.default_rng(0)
        while True:
            order = rng.permutation(len(paths))
            for k in range(len(order) // BATCH):
                idx = order[k * BATCH:(k + 1) * BATCH]
                yield np.stack([pipe(paths[i]) for i in idx]), np.asarray([labels[i] for i in idx])

    return consume(batches(), images, t0)


WARMUP = 0   # images taken after the first batch before the clock starts (--warmup)


def consume(loader, images: int, t0: float, **extra) -> dict:
    """The infinitely fast model: take batches and drop them. Counts ``images`` after the
    first batch and, with ``--warmup``, after WARMUP more (the same for every loader)."""
    first = None
    seen = 0
    t_first = None
    skip = WARMUP
    while seen < images:
        for x, _y in loader:
            n = len(x)
            if first is None:
                first = time.perf_counter() - t0
                t_first = time.perf_counter()
            elif skip > 0:
                skip -= n
                t_first = time.perf_counter()
            else:
                seen += n
            if seen >= images:
                break
    dt = time.perf_counter() - t_first
    return {"images_per_s": seen / dt, "first_batch_s": first, "images": seen, **extra}


# --------------------------------------------------------------------------- parent


def _tree_memory(proc, pss: bool) -> tuple[int, int]:
    """(RSS, PSS) summed over ``proc`` and its descendants; PSS (``/proc/PID/smaps_rollup``:
    shared pages split between the processes mapping them) only when ``pss``, else 0."""
    import psutil

    rss = ps = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0, 0
    for p in procs:
        try:
            if pss:
                m = p.memory_full_info()
                rss += m.rss
                ps += m.pss
            else:
                rss += p.memory_info().rss
        except psutil.Error:
            pass
    return rss, ps


def measure(args: list[str], python: str | None = None) -> dict:
    """Run one configuration in a fresh process; sample its process tree's RSS and PSS."""
    import psutil

    child = subprocess.Popen([python or sys.executable, os.path.abspath(__file__), "--child", *args],
                             stdout=subprocess.PIPE, text=True)
    proc = psutil.Process(child.pid)
    peak = peak_pss = 0
    stop = threading.Event()
    pss = hasattr(psutil.Process, "memory_full_info") and os.path.exists("/proc/self/smaps_rollup")

    def sample() -> None:
        nonlocal peak, peak_pss
        while not stop.is_set():
            rss, ps = _tree_memory(proc, pss)
            peak, peak_pss = max(peak, rss), max(peak_pss, ps)
            time.sleep(0.02)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, _ = child.communicate()
    stop.set()
    t.join()
    if child.returncode != 0:
        raise RuntimeError(f"benchmark child {args} failed with exit code {child.returncode}")
    res = json.loads(out.strip().splitlines()[-1])
    res["peak_rss_mb"] = peak / 2**20
    res["peak_pss_mb"] = peak_pss / 2**20 if pss else float("nan")
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="an ImageFolder (default: generate photos, see --data-kind)")
    p.add_argument("--make", type=int, default=1024, help="images to generate when --data is not given")
    add_data_kind(p)
    p.add_argument("--images", type=int, default=2048,
                   help="images consumed per measurement, after the first batch (long enough that the batches a "
                        "pipeline prefetched while the first one was made do not inflate its rate)")
    p.add_argument("--threads", type=int, default=2, help="loaderlib threads")
    p.add_argument("--workers", type=int, default=2, help="PyTorch DataLoader workers")
    p.add_argument("--variants", default="float,uint8")
    p.add_argument("--repeat", type=int, default=3,
                   help="runs per configuration, interleaved; medians are reported (shared machines are noisy)")
    p.add_argument("--peers", metavar="PYTHON",
                   help="an interpreter with turboloader and nvidia-dali installed (make bench-peers makes one): "
                        "adds TurboLoader and DALI's CPU pipeline to the comparison")
    p.add_argument("--warmup", type=int, default=0,
                   help="images every loader takes (after its first batch) before the clock starts: 1024 = one "
                        "epoch of the generated data, so first-touch costs (batch memory, caches) are not timed")
    p.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        kind, root, variant, images, n, warmup = a.child
        global WARMUP
        WARMUP = int(warmup)
        if kind in ("loaderlib", "loaderlib-bilinear"):
            res = run_loaderlib(root, variant, int(images), int(n), antialias=kind == "loaderlib")
        elif kind == "torch":
            res = run_torch(root, variant, int(images), int(n))
        elif kind == "turbo":
            res = run_turbo(root, variant, int(images), int(n))
        elif kind == "dali":
            res = run_dali(root, variant, int(images), int(n))
        elif kind == "tfdata":
            res = run_tfdata(root, variant, int(images), int(n))
        else:
            res = run_opencv(root, variant, int(images))
        print(json.dumps(res))
        return

    root = photos_for(a, a.make, os.path.join(HERE, "out"))
    n_files = len(image_files(root)[0])
    try:
        import torch  # noqa: F401

        have_torch = True
    except ImportError:
        have_torch = False
    print(f"data: {root} ({n_files} JPEGs), batch {BATCH}, {a.images} images per measurement after the first "
          f"batch{f' and {a.warmup} warm-up images' if a.warmup else ''}, {os.cpu_count()} CPUs")
    if not have_torch:
        print("torch is not installed: the PyTorch DataLoader comparison is skipped "
              "(pip install torch==2.13.0 to include it)")
    for variant in a.variants.split(","):
        title = ("RandomResizedCrop(224) + flip + Normalize + CHW float32" if variant == "float"
                 else "RandomResizedCrop(224) + flip, HWC uint8")
        print(f"\n== {variant}: {title}")
        rows = [("loaderlib native", ["loaderlib", root, variant, str(a.images), str(a.threads), str(a.warmup)],
                 f"{a.threads} threads"),
                ("loaderlib bilinear", ["loaderlib-bilinear", root, variant, str(a.images), str(a.threads), str(a.warmup)],
                 f"{a.threads} threads, antialias=False")]
        if have_torch:
            rows.append(("PyTorch DataLoader", ["torch", root, variant, str(a.images), str(a.workers), str(a.warmup)],
                         f"num_workers={a.workers}, OpenCV+numpy"))
        rows.append(("OpenCV loop", ["opencv", root, variant, str(a.images), "1", str(a.warmup)], "1 thread"))
        python = {}
        if a.peers:
            for name, kind, cfg, module in (
                    ("TurboLoader", "turbo", f"train_aug fused path, {a.threads} threads", "turboloader"),
                    ("DALI CPU", "dali", f"device_id=None, {a.threads} threads", "nvidia.dali"),
                    ("tf.data", "tfdata", f"decode_and_crop_jpeg, {a.threads}-thread pool", "tensorflow")):
                probe = subprocess.run([a.peers, "-c", f"import {module}"], capture_output=True, check=False)
                if probe.returncode != 0:
                    print(f"{name}: {module} is not installed in {a.peers}; skipped")
                    continue
                rows.append((name, [kind, root, variant, str(a.images), str(a.threads), str(a.warmup)], cfg))
                python[name] = a.peers
        runs: dict = {name: [] for name, _, _ in rows}
        for _ in range(max(1, a.repeat)):
            for name, args, _cfg in rows:
                runs[name].append(measure(args, python.get(name)))
        results = {name: {k: float(np.median([r[k] for r in rs])) for k in ("images_per_s", "first_batch_s",
                                                                              "peak_rss_mb", "peak_pss_mb")}
                   for name, rs in runs.items()}
        best = {name: {"images_per_s": max(r["images_per_s"] for r in rs),
                       "first_batch_s": min(r["first_batch_s"] for r in rs)} for name, rs in runs.items()}
        print(f"{'pipeline':<20} {'config':<30} {'images/s':>9} {'(best)':>7} {'first batch':>12} {'(best)':>8} "
              f"{'peak RSS':>9} {'peak PSS':>9}")
        for name, _args, cfg in rows:
            r, b = results[name], best[name]
            print(f"{name:<20} {cfg:<30} {r['images_per_s']:9.0f} {b['images_per_s']:7.0f} "
                  f"{r['first_batch_s']:10.3f} s {b['first_batch_s']:6.3f} s {r['peak_rss_mb']:6.0f} MB {r['peak_pss_mb']:6.0f} MB", flush=True)
        print(f"(median and best of {max(1, a.repeat)} interleaved runs; images/s per run: "
              + "; ".join(f"{name}: " + ", ".join(f"{x['images_per_s']:.0f}" for x in runs[name]) for name in runs)
              + ")")
        for label, res in (("median", results), ("best", best)):
            ll_r, cv_r = res["loaderlib native"], res["OpenCV loop"]
            line = f"{label:>6}: loaderlib / (2 x one-thread OpenCV) {ll_r['images_per_s'] / (2 * cv_r['images_per_s']):.2f}x"
            if have_torch:
                t_r = res["PyTorch DataLoader"]
                line += f"; loaderlib / PyTorch DataLoader {ll_r['images_per_s'] / t_r['images_per_s']:.2f}x"
            print(line)
        peers = [n for n in ("TurboLoader", "DALI CPU", "tf.data", "PyTorch DataLoader") if n in results]
        if peers:
            top = max(peers, key=lambda n: results[n]["images_per_s"])
            for ours in ("loaderlib native", "loaderlib bilinear"):
                r = results[ours]["images_per_s"]
                print(f"median: {ours} / best peer ({top}) {r / results[top]['images_per_s']:.2f}x; "
                      + "; ".join(f"vs {n} {r / results[n]['images_per_s']:.2f}x" for n in peers))
        if have_torch:
            print(f"peak RSS: loaderlib / PyTorch DataLoader "
                  f"{results['loaderlib native']['peak_rss_mb'] / results['PyTorch DataLoader']['peak_rss_mb']:.2f}x")
        if peers:
            for kind in ("pss", "rss"):
                key = f"peak_{kind}_mb"
                light = min(peers, key=lambda n: results[n][key])
                print(f"peak {kind.upper()}: loaderlib native {results['loaderlib native'][key]:.0f} MB / lightest peer "
                      f"({light}, {results[light][key]:.0f} MB) {results['loaderlib native'][key] / results[light][key]:.2f}x "
                      f"(process tree, sampled every 20 ms, median of runs)")


if __name__ == "__main__":
    main()
