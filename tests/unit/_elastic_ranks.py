"""One rank of the elastic torchrun test in tests/unit/test_distributed.py.

Each rank reads a JPEG list (labels are the sample indices) with ``ShardedSampler``, logs the
labels of every batch it takes to ``OUT/rank<r>.jsonl``, and after each batch gathers every
rank's ``loader.state_dict()`` on rank 0, which writes them to ``--checkpoint`` (atomically).
With ``--stop-after K`` rank 0 then writes ``OUT/saved`` after step K and every rank waits
there to be killed. A rank started with a checkpoint on disk loads
``ll.merge_state_dicts(states)``, whatever the world size that saved it, and runs to the end
of the epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)   # torchrun runs this file as a script: the repository's packages


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--stop-after", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=4)
    a = ap.parse_args()

    import torch.distributed as dist

    import loaderlib as ll
    from loaderlib import transforms as T

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    with open(os.path.join(a.out, f"pid{rank}"), "w") as f:
        f.write(str(os.getpid()))   # torchrun starts each rank in a session of its own: the test kills it by pid
    paths = sorted(os.path.join(a.data, f) for f in os.listdir(a.data) if f.endswith(".jpg"))
    chain = T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ToCHW()])
    ds = ll.ImageListDataset(paths, labels=list(range(len(paths)))).transform_first(chain)
    loader = ll.DataLoader(ds, batch_size=a.batch_size, sampler=ll.ShardedSampler(world, rank, shuffle=True, seed=0),
                           seed=0)
    if os.path.exists(a.checkpoint):
        with open(a.checkpoint) as f:
            loader.load_state_dict(ll.merge_state_dicts(json.load(f)))
    with open(os.path.join(a.out, f"rank{rank}.jsonl"), "a") as log:
        for step, (_x, y) in enumerate(loader, 1):
            log.write(json.dumps([int(v) for v in y]) + "\n")
            log.flush()
            states: list = [None] * world
            dist.all_gather_object(states, loader.state_dict())
            if rank == 0:
                tmp = a.checkpoint + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(states, f)
                os.replace(tmp, a.checkpoint)
                if step == a.stop_after:
                    with open(os.path.join(a.out, "saved"), "w") as f:
                        f.write(str(step))
            if step == a.stop_after:
                threading.Event().wait()   # hold here until the test kills the job
    loader.close()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)   # NOTE [ Workers leave without the interpreter's teardown ] in tests/frameworks/_leave.py


if __name__ == "__main__":
    main()
