"""Per-sample cost of the fused native chain vs the same chain in OpenCV + numpy, one thread.

Chains (the ResNet-50 training chain and its uint8 variant):
  float32 CHW: decode -> RandomResizedCrop(224) -> RandomHorizontalFlip -> Normalize -> ToCHW
  uint8 HWC:   decode -> RandomResizedCrop(224) -> RandomHorizontalFlip

The OpenCV + numpy chain is what a careful hand-written loader does: cv2.imdecode (full
image), slice the RandomResizedCrop box (the same boxes: drawn with loaderlib's
generator), cv2.resize(INTER_LINEAR), BGR->RGB and the flip as a view of the 224x224
result, numpy float32 normalisation and a transpose copied into the batch. cv2.setNumThreads(1). The fused
chain runs as one `run_buffers_into` call with num_threads=1 over the whole set.

Images: photo-like JPEGs (tests/_synth.py: crops of a real photo) in the ImageNet-like
size mix of benchmarks/decode.py, qualities 75-95, 4:2:0/4:4:4/4:2:2; with --large also
2000x1500 and 3000x2000 photos, which show the DCT-scaling gain. Rounds alternate between
the contenders; the figure is the median over rounds of (CPU seconds of the round /
images). CPU time (process_time) is reported because the machine may be shared; wall
time is printed too.

    python benchmarks/transforms.py [--rounds 7] [--large]
"""

from __future__ import annotations

import argparse
import statistics
import time

import cv2
import numpy as np
from _report import machine_summary
from decode import SIZES, make_images  # the ImageNet-like mix and its JPEGs

from loaderlib import transforms as T
from loaderlib._chain import compile_chain

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
LARGE = [(2000, 1500), (3000, 2000)]


def opencv_chain(bufs, out, seed, epoch, normalize):
    rrc = T.RandomResizedCrop(224)
    flip = T.RandomHorizontalFlip()
    mean = np.asarray(MEAN, np.float32)
    std = np.asarray(STD, np.float32)
    for i, b in enumerate(bufs):
        img = cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
        top, left, h, w = rrc.get_params(img.shape[1], img.shape[0], T._Rng(seed, epoch, i, 0))
        img = cv2.resize(img[top:top + h, left:left + w], (224, 224), interpolation=cv2.INTER_LINEAR)
        img = img[:, ::-1, ::-1] if flip.flips(T._Rng(seed, epoch, i, 1)) else img[:, :, ::-1]  # BGR->RGB view
        if normalize:
            out[i] = ((img.astype(np.float32) / np.float32(255.0) - mean) / std).transpose(2, 0, 1)
        else:
            out[i] = img


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--copies", type=int, default=4, help="copies of each size (different content)")
    ap.add_argument("--large", action="store_true", help="also run the 2000x1500 / 3000x2000 set")
    args = ap.parse_args()
    cv2.setNumThreads(1)
    print("loaderlib fused transforms vs OpenCV + numpy, one thread")
    print(machine_summary())
    print(f"rounds: {args.rounds} (alternating), figure = median over rounds of CPU time per image")
    sets = [("ImageNet-like", SIZES * args.copies)]
    if args.large:
        sets.append(("large photos", LARGE * 4))
    for set_name, sizes in sets:
        bufs = make_images(sizes)
        n = len(bufs)
        px = sum(w * h for w, h in sizes) / n
        print(f"\n{set_name}: {n} JPEGs, mean {px / 1e3:.0f} kpixels, mean {sum(map(len, bufs)) / n / 1e3:.0f} kB")
        print(f"  {'chain':<34}{'contender':<30}{'CPU ms/img':>11}{'wall ms/img':>12}{'speed-up':>10}")
        for chain_name, normalize in (("RRC224+flip+normalize+CHW f32", True), ("RRC224+flip uint8 HWC", False)):
            tail = [T.Normalize(MEAN, STD), T.ToCHW()] if normalize else []
            contenders = {}
            outs = {}
            for dct in (True, False):
                plan = compile_chain(T.Compose([T.Decode(dct_scaling=dct), T.RandomResizedCrop(224),
                                                T.RandomHorizontalFlip(), *tail]))
                out = np.empty((n, *plan.sample_shape), plan.dtype)
                label = "loaderlib fused" + ("" if dct else " (dct_scaling=False)")
                outs[label] = out
                contenders[label] = (lambda plan=plan, out=out, bufs=bufs, n=n: plan.run_buffers_into(
                    bufs, out, np.arange(n), seed=0, epoch=0, num_threads=1))
            ref_out = np.empty((n, 3, 224, 224) if normalize else (n, 224, 224, 3),
                               np.float32 if normalize else np.uint8)
            contenders["OpenCV + numpy"] = (lambda out=ref_out, bufs=bufs, normalize=normalize:
                                            opencv_chain(bufs, out, 0, 0, normalize))
            cpu = {k: [] for k in contenders}
            wall = {k: [] for k in contenders}
            for f in contenders.values():  # warm-up: scratch buffers, caches
                f()
            for _ in range(args.rounds):
                for k, f in contenders.items():
                    c0, w0 = time.process_time(), time.perf_counter()
                    f()
                    cpu[k].append((time.process_time() - c0) / n * 1e3)
                    wall[k].append((time.perf_counter() - w0) / n * 1e3)
            # same work: with DCT scaling off both compute the same pixels (within +-1 level)
            diff = np.abs(outs["loaderlib fused (dct_scaling=False)"].astype(np.float64) - ref_out)
            unit = 1.0 / 255 / min(STD) if normalize else 1.0
            print(f"  {chain_name:<34}check: fused (dct_scaling=False) vs OpenCV + numpy: max diff "
                  f"{diff.max() / unit:.2f} levels, mean {diff.mean() / unit:.3f} levels")
            base = statistics.median(cpu["OpenCV + numpy"])
            for k in contenders:
                c = statistics.median(cpu[k])
                print(f"  {chain_name:<34}{k:<30}{c:>11.3f}{statistics.median(wall[k]):>12.3f}{base / c:>9.2f}x")
    # what decode costs on its own, for context
    bufs = make_images(SIZES * args.copies)
    t = []
    for _ in range(args.rounds):
        c0 = time.process_time()
        for b in bufs:
            cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
        t.append((time.process_time() - c0) / len(bufs) * 1e3)
    print(f"\ncontext: cv2.imdecode alone (full image, ImageNet-like set): {statistics.median(t):.3f} CPU ms/img")


if __name__ == "__main__":
    main()
