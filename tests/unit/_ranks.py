"""One rank of tests/unit/test_distributed.py, launched by torchrun: samples a JPEG folder
with ``ShardedSampler`` over ``--epochs`` epochs and writes what it saw to ``OUT/rank<r>.json``
(the labels are the samples' indices), for the test to check."""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)   # torchrun runs this file as a script: the repository's packages


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    a = ap.parse_args()

    import torch.distributed as dist

    import loaderlib as ll
    from loaderlib import transforms as T

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    paths = sorted(os.path.join(a.data, f) for f in os.listdir(a.data) if f.endswith(".jpg"))
    chain = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToCHW()])
    ds = ll.ImageListDataset(paths, labels=list(range(len(paths)))).transform_first(chain)
    loader = ll.DataLoader(ds, batch_size=a.batch_size, sampler=ll.ShardedSampler(world, rank, shuffle=True, seed=0),
                           seed=0)
    mine = {"rank": rank, "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            "num_threads": loader.num_threads, "available_cpus": ll.available_cpus(), "epochs": []}
    for epoch in range(a.epochs):
        loader.set_epoch(epoch)
        mine["epochs"].append([int(v) for _x, y in loader for v in y])
    loader.close()
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as f:
        json.dump(mine, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)   # NOTE [ Workers leave without the interpreter's teardown ] in tests/frameworks/_leave.py


if __name__ == "__main__":
    main()
