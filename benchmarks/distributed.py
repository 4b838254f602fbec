"""loaderlib under torch.distributed: shards, epochs and thread defaults per rank.

Run it with torchrun (gloo on loopback, CPU only)::

    torchrun --nproc_per_node=2 --master_addr=127.0.0.1 --master_port=29531 \\
        benchmarks/distributed.py --images 512 --epochs 2

Every rank builds the ResNet-50 training chain over the same photo-like JPEG folder (made
once by rank 0), samples it with ``ShardedSampler(world_size, rank, shuffle=True)`` and
records which samples it got (each sample's label is its index) and its images/s. Rank 0
gathers everything and checks, printing what it checked:

* the shards are equal-length, disjoint apart from the wrap-around padding, and their union
  is the whole epoch;
* ``set_epoch`` reshuffles: epoch 1's order differs from epoch 0's on every rank;
* the default thread count divides this node's CPUs among the local ranks
  (``LOCAL_WORLD_SIZE``, set by torchrun).

The exit status is non-zero if a check fails. ``--json PATH`` writes the gathered figures
(the test suite checks the same properties with its own launcher, tests/unit/_ranks.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def make_images(root: str, n: int) -> list[str]:
    """``n`` photo-like JPEGs (about 200x160 to keep the test quick), made once."""
    from _synth import encode_jpeg, photo_like

    marker = os.path.join(root, f".complete-{n}")
    paths = [os.path.join(root, f"img_{i:06d}.jpg") for i in range(n)]
    if not os.path.exists(marker):
        os.makedirs(root, exist_ok=True)
        rng = np.random.default_rng(0)
        for i, p in enumerate(paths):
            w = int(rng.integers(160, 240))
            img = photo_like(w, int(w * 0.75), seed=i)
            with open(p + ".tmp", "wb") as f:
                f.write(encode_jpeg(img, quality=90))
            os.replace(p + ".tmp", p)
        open(marker, "w").close()
    return paths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--size", type=int, default=128, help="RandomResizedCrop output size")
    ap.add_argument("--data", default=os.path.join(HERE, "out", "distributed-data"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch.distributed as dist

    import loaderlib as ll
    from loaderlib import transforms as T

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if rank == 0:
        make_images(args.data, args.images)
    dist.barrier()
    paths = make_images(args.data, args.images)

    chain = T.Compose([T.RandomResizedCrop(args.size), T.RandomHorizontalFlip(), T.Normalize(MEAN, STD),
                       T.ToCHW()])
    ds = ll.ImageListDataset(paths, labels=list(range(len(paths)))).transform_first(chain)
    sampler = ll.ShardedSampler(world, rank, shuffle=True, seed=0)
    loader = ll.DataLoader(ds, batch_size=args.batch_size, sampler=sampler, seed=0)
    mine = {"rank": rank, "local_world_size": local_world, "num_threads": loader.num_threads,
            "available_cpus": ll.available_cpus(), "engine": loader.engine, "epochs": [], "rates": []}
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        seen: list[int] = []
        t0 = time.perf_counter()
        for _images, labels in loader:
            seen.extend(labels.tolist())
        dt = time.perf_counter() - t0
        mine["epochs"].append(seen)
        mine["rates"].append(len(seen) / dt)
    loader.close()

    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    ok = True
    if rank == 0:
        n = len(paths)
        lines = [(f"torch.distributed (gloo, loopback): {world} ranks, {local_world} per node, {n} JPEGs, "
                 f"batch {args.batch_size}, RandomResizedCrop({args.size}) + flip + Normalize + CHW, "
                 f"engine {everyone[0]['engine']}")]
        for e in range(args.epochs):
            shards = [r["epochs"][e] for r in everyone]
            lengths = {len(s) for s in shards}
            union = set().union(*map(set, shards))
            total = sum(len(s) for s in shards)
            pad = total - n
            overlap = total - len(union)
            good = len(lengths) == 1 and union == set(range(n)) and overlap == pad and 0 <= pad < world
            ok &= good
            lines.append(f"epoch {e}: shard lengths {sorted(lengths)}, union {len(union)}/{n}, "
                         f"{overlap} repeated (padding {pad}) -> {'ok' if good else 'FAIL'}")
        if args.epochs > 1:
            moved = all(r["epochs"][0] != r["epochs"][1] for r in everyone)
            ok &= moved
            lines.append(f"set_epoch reshuffles every rank's shard: {'ok' if moved else 'FAIL'}")
        threads = [r["num_threads"] for r in everyone]
        want = max(1, everyone[0]["available_cpus"] // local_world)
        good = all(t == want for t in threads) or "LOADERLIB_NUM_THREADS" in os.environ
        ok &= good
        lines.append(f"default threads per rank {threads} = {everyone[0]['available_cpus']} CPUs // "
                     f"{local_world} local ranks -> {'ok' if good else 'FAIL'}")
        for r in everyone:
            lines.append(f"rank {r['rank']}: " + ", ".join(f"epoch {e} {rate:.0f} img/s"
                                                         for e, rate in enumerate(r["rates"])))
        print("\n".join(lines), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ok": bool(ok), "images": n, "ranks": everyone}, f)
    flag = [ok]
    dist.broadcast_object_list(flag, src=0)
    dist.destroy_process_group()
    return 0 if flag[0] else 1


if __name__ == "__main__":
    sys.exit(main())
