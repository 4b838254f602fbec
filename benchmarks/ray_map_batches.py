"""Ray Data ``map_batches``: loaderlib's native kernels vs the same pipeline in PIL/torchvision and OpenCV.

One local Ray cluster (``ray.init(num_cpus=N)``, loopback), one dataset of photo-like JPEGs
of ImageNet's typical size held in the object store as a ``bytes`` column; three
``map_batches`` functions compute the ResNet-50 training input (RandomResizedCrop(224),
horizontal flip, Normalize, CHW float32):

* ``loaderlib``: :func:`loaderlib.integrations.ray.map_batches_fn` with its defaults (decode
  only the crop region at the smallest DCT scale, resample, normalise in one fused pass, as
  many kernel threads as CPUs Ray gave the task, output written into a reused slot);
* ``torchvision``: the usual PyTorch recipe, ``PIL.Image.open(...).convert("RGB")`` then
  ``Compose([RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(), Normalize(...)])`` per
  image and ``torch.stack``. torchvision itself when it imports; otherwise (its PyPI wheel is
  a CUDA build that does not load beside a CPU-only torch, as on this project's VM) the same
  calls those transforms make on a PIL image, written out below line for line (PIL ``crop``
  + bilinear ``resize``, ``transpose``; ``to_tensor``'s uint8 -> permute -> float / 255;
  ``normalize``'s clone, ``sub_``, ``div_``). Normalising with torch is about 3x faster
  than the numpy expression an earlier version of this benchmark used;
* ``opencv``: ``cv2.imdecode``, crop, ``cv2.resize``, flip, numpy normalise.

Each round runs the three pipelines one after the other (interleaved, so drift on a shared
machine hits all alike) and the driver consumes every batch (``iter_batches``); the table
gives the median images/s over rounds and the ratio to loaderlib's, and CPU-ms per image in
the map tasks, the driver and the whole local cluster. Batches are 256 images by default
(``iter_batches``' own default): Ray's per-batch work in the driver and its processes is the
same for all three pipelines, and at 64 images it is a large share of loaderlib's total.

Usage::

    python benchmarks/ray_map_batches.py                   # 1024 images, 2 CPUs, 3 rounds
    python benchmarks/ray_map_batches.py --images 2048 --cpus 8 --rounds 5
    python benchmarks/ray_map_batches.py --output uint8      # 4x fewer bytes through the object store
    python benchmarks/ray_map_batches.py --batch-size 64     # Ray's per-batch costs over fewer images
"""

from __future__ import annotations

import argparse
import io
import os
import re
import time
from typing import Any

import numpy as np
from _photos import add_data_kind
from _report import machine_summary, med

HERE = os.path.dirname(os.path.abspath(__file__))

MEAN = np.array((0.485, 0.456, 0.406), np.float32)
STD = np.array((0.229, 0.224, 0.225), np.float32)
SIZE = 224


def make_blobs(n: int, kind: str = "imagenet-like") -> list[bytes]:
    """``n`` generated JPEGs with ImageNet's statistics (benchmarks/_photos.py; its statistics
    are printed)."""
    from _photos import describe, jpegs

    out = jpegs(n, kind)
    print(describe(out, kind), flush=True)
    return out


def _box(h: int, w: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
    from loaderlib.transforms import random_resized_crop_box

    return random_resized_crop_box(w, h, rng=rng)


#: "float": Normalize + CHW float32 (600 kB per image); "uint8": HWC uint8 (150 kB per image),
#: normalised on the accelerator instead. Set by --output.
OUTPUT = "float"


def _normalize_chw(img: np.ndarray) -> np.ndarray:
    if OUTPUT == "uint8":
        return np.ascontiguousarray(img)
    return np.ascontiguousarray(((img.astype(np.float32) / 255.0 - MEAN) / STD).transpose(2, 0, 1))


def _out(n: int) -> np.ndarray:
    return np.empty((n, SIZE, SIZE, 3), np.uint8) if OUTPUT == "uint8" else np.empty((n, 3, SIZE, SIZE), np.float32)


def cluster_cpu_s() -> float:
    """CPU seconds used so far by this process and every process below it: on a local
    cluster that is the driver, Ray's own processes (GCS, raylet, ...) and its workers."""
    tick = os.sysconf("SC_CLK_TCK")
    parent, cpu = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue   # gone meanwhile
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick   # utime + stime
    root, total = os.getpid(), 0.0
    for pid, c in cpu.items():
        p = pid
        while p not in (root, 0, 1) and p in parent:
            p = parent[p]
        if p == root:
            total += c
    return total


class OpenCVFn:
    def __call__(self, batch: dict) -> dict:
        import cv2

        rng = np.random.default_rng()
        out = _out(len(batch["bytes"]))
        for k, b in enumerate(batch["bytes"]):
            img = cv2.cvtColor(cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
            y, x, h, w = _box(*img.shape[:2], rng)
            img = cv2.resize(img[y:y + h, x:x + w], (SIZE, SIZE), interpolation=cv2.INTER_LINEAR)
            if rng.random() < 0.5:
                img = img[:, ::-1]
            out[k] = _normalize_chw(img)
        return {"image": out, "label": batch["label"]}


def _torchvision_like(uint8: bool) -> tuple:
    """``(transform, name)``: torchvision's Compose for this pipeline, or the same calls its
    transforms make on a PIL image when torchvision cannot be imported."""
    import torch

    mean, std = tuple(float(v) for v in MEAN), tuple(float(v) for v in STD)
    try:
        from torchvision import transforms as tv
    except Exception:  # noqa: BLE001 - no torchvision, or one built for another torch
        tv = None
    if tv is not None:
        tail = [] if uint8 else [tv.ToTensor(), tv.Normalize(mean, std)]
        return tv.Compose([tv.RandomResizedCrop(SIZE), tv.RandomHorizontalFlip(), *tail]), "torchvision"
    from PIL import Image

    m = torch.as_tensor(mean).view(-1, 1, 1)
    s = torch.as_tensor(std).view(-1, 1, 1)
    rng = np.random.default_rng()

    def transform(pic: Any) -> Any:
        y, x, h, w = _box(pic.height, pic.width, rng)                                # RandomResizedCrop
        pic = pic.crop((x, y, x + w, y + h)).resize((SIZE, SIZE), Image.BILINEAR)     # F.resized_crop (PIL)
        if torch.rand(1) < 0.5:                                                        # RandomHorizontalFlip
            pic = pic.transpose(Image.FLIP_LEFT_RIGHT)
        if uint8:
            return pic
        img = torch.from_numpy(np.array(pic, np.uint8, copy=True))                     # F.to_tensor
        img = img.view(pic.size[1], pic.size[0], 3).permute((2, 0, 1)).contiguous()
        img = img.to(dtype=torch.get_default_dtype()).div(255)
        return img.clone().sub_(m).div_(s)                                             # F.normalize

    return transform, "torchvision's calls written out"


class TorchvisionFn:
    """PIL decode + torchvision transforms per image, ``torch.stack`` per batch."""

    def __getstate__(self) -> dict:
        return {}   # each worker builds its own transform (and random state)

    def __call__(self, batch: dict) -> dict:
        import torch
        from PIL import Image

        if not hasattr(self, "_tf"):
            self._tf = _torchvision_like(OUTPUT == "uint8")[0]
        imgs = [self._tf(Image.open(io.BytesIO(b)).convert("RGB")) for b in batch["bytes"]]
        if OUTPUT == "uint8":
            return {"image": np.stack([np.asarray(i) for i in imgs]), "label": batch["label"]}
        return {"image": torch.stack(imgs).numpy(), "label": batch["label"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=1024)
    add_data_kind(ap)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--output", choices=("float", "uint8"), default="float",
                    help="float: Normalize + CHW float32; uint8: HWC uint8 (normalise on the accelerator)")
    args = ap.parse_args()
    global OUTPUT
    OUTPUT = args.output

    import ray

    from loaderlib import transforms as T
    from loaderlib.integrations.ray import map_batches_fn

    blobs = make_blobs(args.images, args.data_kind)
    ray.init(num_cpus=args.cpus, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    source = ray.data.from_items([{"bytes": b, "label": i % 1000} for i, b in enumerate(blobs)]).materialize()
    tail = [T.Normalize(tuple(MEAN), tuple(STD)), T.ToCHW()] if OUTPUT == "float" else []
    chain = T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), *tail])
    sample = (3, SIZE, SIZE) if OUTPUT == "float" else (SIZE, SIZE, 3)
    fns = {"loaderlib": map_batches_fn(chain), "torchvision": TorchvisionFn(), "opencv": OpenCVFn()}

    def run(fn) -> tuple[int, float, float, float]:
        """Images consumed, and CPU-ms per image in the map tasks (Ray's own count), in this
        driver process and in the whole local cluster (driver, Ray's processes, workers)."""
        ds = source.map_batches(fn, batch_format="numpy", batch_size=args.batch_size)
        n = 0
        c0, k0 = time.process_time(), cluster_cpu_s()
        for b in ds.iter_batches(batch_size=args.batch_size, batch_format="numpy"):
            assert b["image"].shape[1:] == sample
            n += len(b["image"])
        driver = 1000 * (time.process_time() - c0) / n
        cluster = 1000 * (cluster_cpu_s() - k0) / n
        m = re.search(r"MapBatches\(.*?Remote cpu time: .*?([\d.]+)(us|ms|s) total", ds.stats(), re.DOTALL)
        task = float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)] / n if m else float("nan")
        return n, task, driver, cluster

    # The functions alone, in this process, one thread, on the same batches: CPU-ms per image
    # of each pipeline's own work, without Ray's scheduling and object-store transfers.
    batches = [{"bytes": np.array(blobs[i:i + args.batch_size], dtype=object),
                "label": np.arange(i, min(i + args.batch_size, len(blobs)))}
               for i in range(0, len(blobs), args.batch_size)]
    import torch

    torch.set_num_threads(1)   # as in a 1-CPU Ray task (Ray sets OMP_NUM_THREADS=1 there)
    alone: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            t0 = time.process_time()
            for b in batches:
                fn(b)
            alone[name].append(1000 * (time.process_time() - t0) / len(blobs))

    for fn in fns.values():     # warm-up: worker processes, imports, plan compilation
        run(fn)
    load0 = os.getloadavg()
    rates: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[tuple[float, float, float]]] = {k: [] for k in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            n, *costs = run(fn)
            rates[name].append(n / (time.perf_counter() - t0))
            cpu[name].append(tuple(costs))
    load1 = os.getloadavg()
    ray.shutdown()

    print(machine_summary())
    print(f"ray {ray.__version__}: local cluster, num_cpus={args.cpus}, loopback; {args.images} JPEGs "
          f"(~500x375, q90, 4:2:0) in the object store; map_batches(batch_size={args.batch_size}, "
          f"batch_format='numpy'), each task 1 CPU; RandomResizedCrop(224) + flip + "
          f"{'Normalize + CHW float32' if OUTPUT == 'float' else 'HWC uint8'}; "
          f"the driver consumes every batch; median of {args.rounds} interleaved rounds after a warm-up; "
          f"baseline: {_torchvision_like(OUTPUT == 'uint8')[1]}; load average "
          f"{load0[0]:.2f} before the rounds, {load1[0]:.2f} after")
    base = med(rates["loaderlib"])
    costs = {k: [med([c[j] for c in v]) for j in range(3)] for k, v in cpu.items()}
    print("CPU-ms per image: in the map tasks (Ray's count), in the driver, in the whole cluster "
          "(driver + Ray's processes + workers; on a saturated node images/s ~ cores / this)")
    print(f"{'pipeline':<12}{'images/s':>10}{'vs loaderlib':>14}{'task':>8}{'driver':>8}{'cluster':>9}"
          "   rounds (images/s)")
    for name, r in rates.items():
        task, driver, cluster = costs[name]
        print(f"{name:<12}{med(r):>10.0f}{med(r) / base:>13.2f}x{task:>8.2f}{driver:>8.2f}{cluster:>9.2f}   "
              + ", ".join(f"{x:.0f}" for x in r))
    def per_round(other: str) -> float:   # drift between rounds cancels within a round
        return med([a / b for a, b in zip(rates["loaderlib"], rates[other])])

    print(f"loaderlib speed-up: {base / med(rates['torchvision']):.2f}x over PIL/torchvision, "
          f"{base / med(rates['opencv']):.2f}x over OpenCV (medians of images/s; median of the rounds' "
          f"ratios {per_round('torchvision'):.2f}x and {per_round('opencv'):.2f}x); cluster CPU per image "
          f"{costs['torchvision'][2] / costs['loaderlib'][2]:.2f}x and {costs['opencv'][2] / costs['loaderlib'][2]:.2f}x "
          "less")
    print(f"the map_batches functions alone (this process, 1 thread, CPU time per image, median of "
          f"{args.rounds}): " + ", ".join(f"{k} {med(v):.2f} ms" for k, v in alone.items())
          + f" -> loaderlib {med(alone['torchvision']) / med(alone['loaderlib']):.2f}x less CPU than "
          f"PIL/torchvision, {med(alone['opencv']) / med(alone['loaderlib']):.2f}x less than OpenCV")


if __name__ == "__main__":
    main()
