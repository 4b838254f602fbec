"""Ray Data ``map_batches``: loaderlib's native kernels vs the same pipeline in PIL and OpenCV.

One local Ray cluster (``ray.init(num_cpus=N)``, loopback), one dataset of photo-like JPEGs
of ImageNet's typical size held in the object store as a ``bytes`` column; three
``map_batches`` functions compute the ResNet-50 training input (RandomResizedCrop(224),
horizontal flip, Normalize, CHW float32):

* ``loaderlib``: :func:`loaderlib.integrations.ray.map_batches_fn` (decode only the crop
  region at the smallest DCT scale, resample, normalise in one fused pass);
* ``opencv``: ``cv2.imdecode``, crop, ``cv2.resize``, flip, numpy normalise;
* ``pil``: ``PIL.Image.open(...).convert("RGB")``, ``crop``, ``resize`` (bilinear), flip,
  numpy normalise.

Each round runs the three pipelines one after the other (interleaved, so drift on a shared
machine hits all alike) and the driver consumes every batch (``iter_batches``); the table
gives the median images/s over rounds and the ratio to loaderlib's.

Usage::

    python benchmarks/ray_map_batches.py                   # 512 images, 2 CPUs, 3 rounds
    python benchmarks/ray_map_batches.py --images 2048 --cpus 8 --rounds 5
    python benchmarks/ray_map_batches.py --output uint8      # 4x fewer bytes through the object store
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))   # repo root: tests._synth

from _report import machine_summary, med

MEAN = np.array((0.485, 0.456, 0.406), np.float32)
STD = np.array((0.229, 0.224, 0.225), np.float32)
SIZE = 224


def make_blobs(n: int) -> list[bytes]:
    """Photo-like JPEGs of about 500x375 (quality 90, 4:2:0), like ImageNet's average."""
    from tests._synth import encode_jpeg, photo_like

    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        w = int(rng.integers(400, 520))
        h = round(w * rng.uniform(0.66, 0.8))
        out.append(encode_jpeg(photo_like(w, h, seed=i), quality=90))
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


class PILFn:
    def __call__(self, batch: dict) -> dict:
        from PIL import Image

        rng = np.random.default_rng()
        out = _out(len(batch["bytes"]))
        for k, b in enumerate(batch["bytes"]):
            img = Image.open(io.BytesIO(b)).convert("RGB")
            y, x, h, w = _box(img.height, img.width, rng)
            img = img.crop((x, y, x + w, y + h)).resize((SIZE, SIZE), Image.BILINEAR)
            if rng.random() < 0.5:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
            out[k] = _normalize_chw(np.asarray(img))
        return {"image": out, "label": batch["label"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--output", choices=("float", "uint8"), default="float",
                    help="float: Normalize + CHW float32; uint8: HWC uint8 (normalise on the accelerator)")
    args = ap.parse_args()
    global OUTPUT
    OUTPUT = args.output

    import ray

    from loaderlib import transforms as T
    from loaderlib.integrations.ray import map_batches_fn

    blobs = make_blobs(args.images)
    ray.init(num_cpus=args.cpus, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    source = ray.data.from_items([{"bytes": b, "label": i % 1000} for i, b in enumerate(blobs)]).materialize()
    tail = [T.Normalize(tuple(MEAN), tuple(STD)), T.ToCHW()] if OUTPUT == "float" else []
    chain = T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), *tail])
    sample = (3, SIZE, SIZE) if OUTPUT == "float" else (SIZE, SIZE, 3)
    fns = {"loaderlib": map_batches_fn(chain, num_threads=1), "opencv": OpenCVFn(), "pil": PILFn()}

    def run(fn) -> int:
        ds = source.map_batches(fn, batch_format="numpy", batch_size=args.batch_size)
        n = 0
        for b in ds.iter_batches(batch_size=args.batch_size, batch_format="numpy"):
            assert b["image"].shape[1:] == sample
            n += len(b["image"])
        return n

    # The functions alone, in this process, one thread, on the same batches: CPU-ms per image
    # of each pipeline's own work, without Ray's scheduling and object-store transfers.
    batches = [{"bytes": np.array(blobs[i:i + args.batch_size], dtype=object),
                "label": np.arange(i, min(i + args.batch_size, len(blobs)))}
               for i in range(0, len(blobs), args.batch_size)]
    alone: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            t0 = time.process_time()
            for b in batches:
                fn(b)
            alone[name].append(1000 * (time.process_time() - t0) / len(blobs))

    for fn in fns.values():     # warm-up: worker processes, imports, plan compilation
        run(fn)
    rates: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            n = run(fn)
            rates[name].append(n / (time.perf_counter() - t0))
    ray.shutdown()

    print(machine_summary())
    print(f"ray {ray.__version__}: local cluster, num_cpus={args.cpus}, loopback; {args.images} JPEGs "
          f"(~500x375, q90, 4:2:0) in the object store; map_batches(batch_size={args.batch_size}, "
          f"batch_format='numpy'), each task 1 CPU; RandomResizedCrop(224) + flip + "
          f"{'Normalize + CHW float32' if OUTPUT == 'float' else 'HWC uint8'}; "
          f"the driver consumes every batch; median of {args.rounds} interleaved rounds after a warm-up")
    base = med(rates["loaderlib"])
    print(f"{'pipeline':<12}{'images/s':>10}{'vs loaderlib':>14}   rounds")
    for name, r in rates.items():
        print(f"{name:<12}{med(r):>10.0f}{med(r) / base:>13.2f}x   " + ", ".join(f"{x:.0f}" for x in r))
    print(f"loaderlib speed-up: {base / med(rates['opencv']):.2f}x over OpenCV, "
          f"{base / med(rates['pil']):.2f}x over PIL")
    print(f"the map_batches functions alone (this process, 1 thread, CPU time per image, median of "
          f"{args.rounds}): " + ", ".join(f"{k} {med(v):.2f} ms" for k, v in alone.items())
          + f" -> loaderlib {med(alone['opencv']) / med(alone['loaderlib']):.2f}x less CPU than OpenCV, "
          f"{med(alone['pil']) / med(alone['loaderlib']):.2f}x less than PIL")


if __name__ == "__main__":
    main()
