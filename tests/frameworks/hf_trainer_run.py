"""One Hugging Face ``Trainer`` run over a loaderlib DataLoader, for test_hf_trainer.py.

    python -m torch.distributed.run --standalone --nproc_per_node W hf_trainer_run.py OUT --steps S
        [--save-steps K] [--resume CKPT]

CPU, gloo. The Trainer's ``get_train_dataloader`` returns the loader; ``LoaderCheckpointCallback``
saves its state with each checkpoint (every ``--save-steps``) and restores it on
``train(resume_from_checkpoint=CKPT)``. Each rank writes ``OUT/rank{r}.json``: the sample
indices of each batch the training step received, and how the state was applied.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch
from _leave import leave
from transformers import Trainer, TrainingArguments

import loaderlib as ll
from loaderlib.integrations.hf_trainer import LoaderCheckpointCallback

N, BATCH, ORDER_SEED = 30, 4, 3


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def forward(self, x):
        return self.layer(x)


class LoaderTrainer(Trainer):
    def __init__(self, loader, seen, **kw):
        super().__init__(**kw)
        self.loader, self.seen = loader, seen

    def get_train_dataloader(self):
        return self.loader

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        x, y = inputs
        self.seen.append([int(v) for v in y.tolist()])
        loss = ((model(x).squeeze(1) - y.float()) ** 2).mean()
        return (loss, None) if return_outputs else loss


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--save-steps", type=int, default=0)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--resume")
    a = p.parse_args()
    args = TrainingArguments(output_dir=a.ckpt_dir, max_steps=a.steps, use_cpu=True, ddp_backend="gloo",
                             save_strategy="steps" if a.save_steps else "no", save_steps=a.save_steps or 500,
                             ignore_data_skip=True, report_to=[], logging_strategy="no", disable_tqdm=True,
                             learning_rate=1e-4, per_device_train_batch_size=BATCH, seed=0)
    rank, world = args.process_index, args.world_size
    x = np.stack([np.arange(N, dtype=np.float32), np.ones(N, np.float32)], axis=1)
    loader = ll.DataLoader(ll.ArrayDataset(x, np.arange(N, dtype=np.int64)), batch_size=BATCH, seed=0,
                           num_threads=1, output="torch",
                           sampler=ll.ShardedSampler(world, rank, shuffle=True, seed=ORDER_SEED))
    seen: list[list[int]] = []
    callback = LoaderCheckpointCallback(loader)
    trainer = LoaderTrainer(loader, seen, model=Model(), args=args, callbacks=[callback])
    trainer.train(resume_from_checkpoint=a.resume)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as f:
        json.dump({"batches": seen, "applied": callback.applied}, f)
    leave()   # NOTE [ Workers leave without the interpreter's teardown ]


if __name__ == "__main__":
    main()
