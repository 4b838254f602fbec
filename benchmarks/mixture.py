"""What a MixtureDataset costs: two image folders mixed against one folder of the same images.

The demo dataset's images (``python -m loaderlib bench`` builds and caches it, or ``--data``)
are hard-linked (copied where links fail) into three folders under a temporary directory:
``all/`` with every class, ``a/`` with the first half of the classes and ``b/`` with the
rest. Two loaders run the ResNet-50 training chain (RandomResizedCrop(224), flip, Normalize,
CHW float32), batch 64, shuffle, the default thread count:

* "one folder": ``ImageFolderDataset(all)``;
* "mixture of two": ``MixtureDataset([ImageFolderDataset(a), ImageFolderDataset(b)])``
  (default weights and size: each epoch reads every image once, interleaved).

Both read the same bytes per epoch and stay on the native engine (printed). Each round runs
``--epochs`` epochs of each loader, the loaders interleaved; images/s per round, the medians
and their ratio are printed. Expected (issue 37): the mixture at >= 0.95x one folder.

Usage::

    python benchmarks/mixture.py [--data DIR] [--rounds 15] [--epochs 1] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from _report import machine_summary, med
from loader import BATCH, rn50_chain


def _place(src: str, dst: str) -> None:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _folders(root: str, tmp: str) -> tuple[str, str, str]:
    import loaderlib as ll

    ds = ll.ImageFolderDataset(root)
    half = len(ds.synsets) // 2
    for path, label in ds.items:
        cls = ds.synsets[label]
        name = os.path.basename(path)
        _place(path, os.path.join(tmp, "all", cls, name))
        _place(path, os.path.join(tmp, "a" if label < half else "b", cls, name))
    return tuple(os.path.join(tmp, d) for d in ("all", "a", "b"))  # type: ignore[return-value]


def _epochs(loader, n: int) -> tuple[int, float, float]:
    """Images, wall seconds and this process's CPU seconds (every thread) for ``n`` epochs."""
    t0, c0 = time.perf_counter(), time.process_time()
    images = 0
    for _ in range(n):
        for x, _y in loader:
            images += len(x)
    return images, time.perf_counter() - t0, time.process_time() - c0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--data", help="image folder; default: the cached demo dataset")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()

    from loaderlib.profiling import build_demo_dataset

    import loaderlib as ll

    root = args.data or str(build_demo_dataset(progress=False))
    with tempfile.TemporaryDirectory(prefix="ll-mixture-") as tmp:
        one, a, b = _folders(root, tmp)
        chain = rn50_chain("float")
        loaders = {
            "one folder": ll.DataLoader(ll.ImageFolderDataset(one).transform_first(chain), batch_size=BATCH,
                                        shuffle=True, seed=0, num_threads=args.threads),
            "mixture of two": ll.DataLoader(
                ll.MixtureDataset([ll.ImageFolderDataset(a), ll.ImageFolderDataset(b)]).transform_first(chain),
                batch_size=BATCH, shuffle=True, seed=0, num_threads=args.threads),
        }
        print(machine_summary())
        n = len(loaders["one folder"].dataset)
        print(f"data: {n} images from {root}, hard-linked into one folder and into two halves by class; batch "
              f"{BATCH}; {loaders['one folder'].num_threads} threads; ResNet-50 train chain, float32 CHW; "
              f"{args.epochs} epochs per loader per round, {args.rounds} interleaved rounds (after one warm-up round)")
        for name, loader in loaders.items():
            print(f"  {name}: engine {loader.engine}")
            if loader.engine != "native":
                print(loader.explain())
                return 1
        for loader in loaders.values():
            _epochs(loader, 1)   # page cache, arena slots, kernel threads
        rates: dict[str, list[float]] = {k: [] for k in loaders}
        cpu: dict[str, list[float]] = {k: [] for k in loaders}
        for _ in range(args.rounds):
            for name, loader in loaders.items():
                images, dt, used = _epochs(loader, args.epochs)
                rates[name].append(images / dt)
                cpu[name].append(1e3 * used / images)
        for name, xs in rates.items():
            print(f"{name:>16}: median {med(xs):7.0f} img/s, {med(cpu[name]):.3f} CPU-ms/img   rounds: "
                  f"{', '.join(f'{x:.0f}' for x in xs)}")
        ratios = [m / o for m, o in zip(rates["mixture of two"], rates["one folder"])]
        print(f"mixture / one folder: {med(rates['mixture of two']) / med(rates['one folder']):.3f}x of the median "
              f"rates, median of the per-round ratios {med(ratios):.3f}x (rounds {', '.join(f'{r:.3f}' for r in ratios)});"
              f" CPU per image {med(cpu['mixture of two']) / med(cpu['one folder']):.3f}x (goal: rate >= 0.95x)")
        print(f"per source, last epoch: {loaders['mixture of two'].stats.sources}")
        for loader in loaders.values():
            loader.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
