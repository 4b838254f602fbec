"""One Hugging Face Accelerate training run over a loaderlib DataLoader, for test_accelerate.py.

Run with torchrun (``python -m torch.distributed.run --standalone --nproc_per_node 2
accelerate_run.py OUT --steps S ...``): ``Accelerator(cpu=True)`` takes the process group from
torchrun's environment (gloo). The loader is registered with
``accelerator.register_for_checkpointing(loader)``; ``--save-at K DIR`` calls
``accelerator.save_state(DIR)`` after step K (Accelerate saves a registered object's
``state_dict()`` from the main process only), and ``--resume DIR`` calls
``accelerator.load_state(DIR)`` first (every rank loads that one state) and runs from step
``--from-step``. Each rank writes ``OUT/rank{r}.json``: the sample indices of each batch it trained
on, in order.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch
from _leave import leave
from accelerate import Accelerator

import loaderlib as ll

N = 30           # 15 samples per rank on 2 ranks: batches of 4, 4, 4, 3 per epoch
BATCH = 4
ORDER_SEED = 3   # the sampler's seed: the global order


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--from-step", type=int, default=0)
    p.add_argument("--save-at", nargs=2, action="append", default=[], metavar=("STEP", "DIR"))
    p.add_argument("--resume")
    a = p.parse_args()
    acc = Accelerator(cpu=True)
    x = np.stack([np.arange(N, dtype=np.float32), np.ones(N, np.float32)], axis=1)
    loader = ll.DataLoader(ll.ArrayDataset(x, np.arange(N, dtype=np.int64)), batch_size=BATCH, seed=0,
                           num_threads=1, output="torch",
                           sampler=ll.ShardedSampler(acc.num_processes, acc.process_index, shuffle=True,
                                                     seed=ORDER_SEED))
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    model, opt, loader = acc.prepare(model, opt, loader)   # a loaderlib loader passes through as it is
    acc.register_for_checkpointing(loader)
    if a.resume:
        acc.load_state(a.resume)
    saves = {int(k): d for k, d in a.save_at}
    seen: list[list[int]] = []
    step = a.from_step
    while step < a.steps:
        for xb, yb in loader:
            seen.append([int(v) for v in yb.tolist()])
            loss = ((model(xb).squeeze(1) - yb.float()) ** 2).mean()
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            step += 1
            if step in saves:
                acc.save_state(saves[step])
            if step == a.steps:
                break
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"rank{acc.process_index}.json"), "w") as f:
        json.dump({"batches": seen, "world_size": acc.num_processes}, f)
    acc.end_training()
    leave()   # NOTE [ Workers leave without the interpreter's teardown ]


if __name__ == "__main__":
    main()
