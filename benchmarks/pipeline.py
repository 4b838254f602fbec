"""Pipeline benchmark: native Pipeline vs DataLoader, cached epochs, AUTOTUNE vs hand-tuned.

Three measurements on a folder of photo-like JPEGs of ImageNet's typical size (about
500x375, generated once by ``benchmarks/loader.py``'s generator), consumed by an infinitely
fast model (batches are taken and dropped):

(a) ``Pipeline.from_folder(root).shuffle(n).map(RN50 train chain).batch(64).prefetch(2)`` vs
    ``DataLoader(ImageFolderDataset(root).transform_first(chain), batch_size=64, shuffle=True)``:
    the same engine underneath, so equal within noise; with ``--peers PYTHON`` (an interpreter
    with TensorFlow, e.g. ``.venv-peers/bin/python`` from ``make bench-peers``) also tf.data's
    ImageNet pipeline on the same folder (``benchmarks/loader.py``'s ``decode_and_crop_jpeg``
    pipeline, in its own process, images/s after its first batch). Interleaved rounds, median.
(b) a small fine-tuning set decoded every epoch (the native fused pipeline) vs
    ``.cache()`` of the decoded full-resolution images followed by the same random chain
    (epoch 1 fills the cache; epoch 2 reads it), a new cached pipeline every round. Also the crop-quality cost of
    ``cache(max_side=...)``: mean absolute difference (uint8 levels) between the final
    ``RandomResizedCrop(224)`` + flip crops from a reduced cache and from the full decode,
    the same crop boxes (same seed) on both.
(c) ``AUTOTUNE`` (threads and prefetch) vs every hand setting of threads (1..cores) x
    prefetch (1, 2, 4), and vs the default: steady-state images/s once the tuner has settled
    (it runs alone first, at most 12 epochs, and says when it settled).

Usage::

    python benchmarks/pipeline.py                  # all three, 1024 images
    python benchmarks/pipeline.py --only b --images 512
    python benchmarks/pipeline.py --only a --peers .venv-peers/bin/python
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from _photos import add_data_kind, photos_for
from _report import machine_summary, med, median_rate

import loaderlib as ll
from loaderlib import transforms as T

HERE = os.path.dirname(os.path.abspath(__file__))

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
BATCH = 64


def train_chain() -> T.Compose:
    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.Normalize(MEAN, STD), T.ToCHW()])


def drain(it) -> int:
    n = 0
    for b in it:
        n += len(b[0])
    return n


def part_a(root: str, rounds: int, peers: str | None = None) -> None:
    n = len(ll.ImageFolderDataset(root))
    pipe = (ll.Pipeline.from_folder(root).shuffle(n).map(train_chain()).batch(BATCH).prefetch(2)
            .with_options(seed=0))
    loader = ll.DataLoader(ll.ImageFolderDataset(root).transform_first(train_chain()), batch_size=BATCH,
                           shuffle=True, seed=0, prefetch=2)
    print(f"(a) engine: pipeline {pipe.engine}, DataLoader {loader.engine}; {n} images, batch {BATCH}, "
          f"{ll.default_num_threads()} threads, {rounds} interleaved rounds, median")
    rates: dict = {"Pipeline": [], "DataLoader": []}
    if peers:
        rates["tf.data"] = []
    for _ in range(rounds):
        for k, v in median_rate({"Pipeline": lambda: drain(pipe), "DataLoader": lambda: drain(loader)}, 1).items():
            rates[k] += v
        if peers:
            from loader import measure

            rates["tf.data"].append(measure(["tfdata", root, "float", str(2 * n), str(ll.default_num_threads()), "0"],
                                            python=peers)["images_per_s"])
    for k, v in rates.items():
        print(f"    {k:<11} {med(v):8.1f} images/s   (rounds: {', '.join(f'{x:.0f}' for x in v)})")
    print(f"    Pipeline / DataLoader = {med(rates['Pipeline']) / med(rates['DataLoader']):.3f}")
    if peers:
        print(f"    Pipeline / tf.data = {med(rates['Pipeline']) / med(rates['tf.data']):.2f}x "
              f"(tf.data: decode_and_crop_jpeg, {ll.default_num_threads()}-thread pool, its own process)")
    pipe.close()
    loader.close()


def part_b(root: str, epochs: int) -> None:
    n = len(ll.ImageFolderDataset(root))
    threads = ll.default_num_threads()
    rounds = max(2, epochs - 1)
    decoded = ll.Pipeline.from_folder(root).map(train_chain()).batch(BATCH).with_options(seed=0)

    def fresh_cached() -> ll.Pipeline:
        return (ll.Pipeline.from_folder(root).cache().map(train_chain(), num_parallel_calls=threads)
                .batch(BATCH).with_options(seed=0))

    print(f"(b) fine-tuning set of {n} images, RN50 train chain, batch {BATCH}, {threads} threads. The decoding "
          f"pipeline's epoch 1, then {rounds} rounds of: one epoch of it, then a new .cache() pipeline's epoch 1 "
          "(decodes and fills the cache) and epoch 2 (from the cache); interleaved, so load changes hit all alike; "
          "warm iterations off, as the other pipeline's turn would otherwise prefetch for it")
    decoded._warm_iteration = lambda iteration: None

    def epoch(pipe: ll.Pipeline) -> float:
        t0 = time.perf_counter()
        drain(pipe)
        return n / (time.perf_counter() - t0)

    first = epoch(decoded)
    rates: dict = {"decoded every epoch (native, fused)": [], "cache(): epoch 1, filling": [],
                   "cache(): epoch 2, from the cache": []}
    cached = None
    for _ in range(rounds):
        if cached is not None:
            cached.close()
        cached = fresh_cached()
        for k, pipe in zip(rates, (decoded, cached, cached)):
            rates[k].append(epoch(pipe))
    print(f"    decoded every epoch, its epoch 1: {first:7.1f} images/s")
    for k, r in rates.items():
        print(f"    {k:<38} {med(r):7.1f} images/s (rounds: {', '.join(f'{x:.0f}' for x in r)})")
    info = cached.cache_info()[0]
    print(f"    cache holds {info['elements']} images, {info['bytes'] / 1e6:.1f} MB ({info['note']})")
    plain, fill, replay = rates.values()

    def ratio(a: list, b: list) -> str:
        return f"{med(a) / med(b):.2f}x (median of per-round ratios {med([x / y for x, y in zip(a, b)]):.2f}x)"

    print(f"    cached epochs vs decoded every epoch: {ratio(replay, plain)}; vs its own epoch 1: {ratio(replay, fill)}")
    print(f"    the epoch that fills the cache vs an uncached epoch: {ratio(fill, plain)}")
    quality(root)
    decoded.close()
    cached.close()


def quality(root: str, count: int = 64) -> None:
    crop = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])
    full = [x for x, _ in ll.Pipeline.from_folder(root).take(count).cache().map(crop).with_options(seed=3)]
    sizes = [x.shape[:2] for x, _ in ll.Pipeline.from_folder(root).take(count)]
    print(f"    crop quality of cache(max_side=...): {count} photos of {int(np.median([s[1] for s in sizes]))}x"
          f"{int(np.median([s[0] for s in sizes]))} px (median), RandomResizedCrop(224) + flip after the cache, "
          "same boxes; mean |diff| vs the full-resolution cache in uint8 levels:")
    for side in (128, 192, 256, 384, 512):
        red = [x for x, _ in ll.Pipeline.from_folder(root).take(count).cache(max_side=side).map(crop)
               .with_options(seed=3)]
        diff = np.mean([np.abs(a.astype(np.int16) - b.astype(np.int16)).mean() for a, b in zip(full, red)])
        print(f"      max_side={side:<4} {diff:6.2f}")


def part_c(root: str, epochs: int) -> None:
    ds = ll.ImageFolderDataset(root).transform_first(train_chain())
    n = len(ds)
    cores = ll.available_cpus()
    loaders = {}
    for threads in range(1, cores + 1):
        for prefetch in (1, 2, 4):
            loaders[f"threads={threads} prefetch={prefetch}"] = ll.DataLoader(
                ds, batch_size=BATCH, shuffle=True, seed=0, num_threads=threads, prefetch=prefetch)
    loaders["default"] = ll.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=0)
    tuned = loaders["AUTOTUNE"] = ll.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=0, num_threads=ll.AUTOTUNE,
                                                prefetch=ll.AUTOTUNE, ram_budget="2GB")
    print(f"(c) AUTOTUNE vs hand-tuned: {n} images, RN50 train chain, batch {BATCH}, {cores} cores. The tuned "
          "loader first runs alone until its tuner settles (at most 12 epochs); then one epoch of each setting per "
          f"round, interleaved so load changes hit all alike, {epochs} rounds, images/s (median). Warm epochs are "
          "off for the measurement: a loader would otherwise produce its next epoch during the others' turns.")
    t0 = time.perf_counter()
    for e in range(12):
        drain(tuned)
        if tuned._tuner.settled:
            break
    decisions = tuned.stats.autotune
    when = f"{decisions[-1][0]:.1f} s after the loader was made" if tuned._tuner.settled else "not settled"
    print(f"    tuner settled: {tuned._tuner.settled} during epoch {e + 1} ({when}; {len(decisions)} decisions); "
          f"the tuning epochs took {time.perf_counter() - t0:.1f} s")
    for ld in loaders.values():
        ld._warm_epochs = False
    rates: dict = {k: [] for k in loaders}
    for _ in range(epochs):
        for k, ld in loaders.items():
            t0 = time.perf_counter()
            drain(ld)
            rates[k].append(n / (time.perf_counter() - t0))
    results = {k: med(v) for k, v in rates.items()}
    for k, v in results.items():
        print(f"    {k:<24} {v:8.1f}   (rounds: {', '.join(f'{x:.0f}' for x in rates[k])})")
    best = max(v for k, v in results.items() if k.startswith("threads="))
    print(f"    AUTOTUNE / best hand-tuned = {results['AUTOTUNE'] / best:.3f}; AUTOTUNE / default = "
          f"{results['AUTOTUNE'] / results['default']:.3f}")
    print(f"    decisions: {list(tuned.stats.autotune) or 'none'} -> num_threads={tuned.num_threads}, "
          f"prefetch={tuned.prefetch}")
    for ld in loaders.values():
        ld.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None, help="an image folder (default: generated under benchmarks/.data)")
    ap.add_argument("--images", type=int, default=1024)
    add_data_kind(ap)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--only", default="abc", help="which parts to run, e.g. 'b'")
    ap.add_argument("--peers", default=None, metavar="PYTHON", help="an interpreter with TensorFlow: adds tf.data to (a)")
    args = ap.parse_args()
    print(machine_summary())
    root = photos_for(args, args.images, os.path.join(HERE, "out"))
    if "a" in args.only:
        part_a(root, args.rounds, args.peers)
    if "b" in args.only:
        part_b(root, max(2, args.epochs))
    if "c" in args.only:
        part_c(root, max(3, args.epochs))


if __name__ == "__main__":
    main()
