"""One torchrun job over a loaderlib DataLoader checkpointed with ``torch.distributed.checkpoint``,
for test_dcp.py.

    python -m torch.distributed.run --standalone --nproc_per_node W dcp_run.py OUT --steps S
        [--save-at K DIR] [--resume DIR]

gloo on CPU. ``--save-at`` calls ``dcp.save({"loader": LoaderState(loader)}, checkpoint_id=DIR)``
after step K; ``--resume`` calls ``dcp.load`` with ``LoaderState(loader, checkpoint_id=DIR)``
first. Each rank writes ``OUT/rank{r}.json``: the sample indices of each batch it took, and how
the state was applied.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from _leave import leave

import loaderlib as ll
from loaderlib.integrations.dcp import LoaderState

N, BATCH, ORDER_SEED = 30, 4, 3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--save-at", nargs=2)
    p.add_argument("--resume")
    p.add_argument("--skip", action="store_true", help="on_error='skip' (no lockstep state)")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = ll.DataLoader(ll.ArrayDataset(np.arange(N, dtype=np.int64)), batch_size=BATCH, seed=0, num_threads=1,
                           on_error="skip" if a.skip else "raise",
                           sampler=ll.ShardedSampler(world, rank, shuffle=True, seed=ORDER_SEED))
    applied = None
    if a.resume:
        state = LoaderState(loader, checkpoint_id=a.resume)
        dcp.load({"loader": state}, checkpoint_id=a.resume)
        applied = state.applied
    seen: list[list[int]] = []
    step = 0
    while step < a.steps:
        for b in loader:
            seen.append([int(v) for v in b.tolist()])
            step += 1
            if a.save_at and step == int(a.save_at[0]):
                dcp.save({"loader": LoaderState(loader)}, checkpoint_id=a.save_at[1])
            if step == a.steps:
                break
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as f:
        json.dump({"batches": seen, "applied": applied}, f)
    leave()   # NOTE [ Workers leave without the interpreter's teardown ]


if __name__ == "__main__":
    main()
