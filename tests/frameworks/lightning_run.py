"""One PyTorch Lightning training run over a loaderlib DataLoader, for test_lightning.py.

Run as a file (Lightning's DDP launcher starts the other ranks by running this script again):

    python lightning_run.py OUT --steps S [--devices D] [--ckpt-dir DIR] [--resume CKPT]

Each rank writes ``OUT/rank{r}.json``: the sample indices of every batch its training step
received, in order, and what the ``LoaderMonitor`` callback logged (read back from the CSV
logger's metrics file by the test). With ``--ckpt-dir`` a ``ModelCheckpoint`` saves every
``--every`` steps; with ``--resume`` the run continues from that checkpoint
(``fit(ckpt_path=...)``), as a user resuming a job in a new process does.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

import loaderlib as ll
from loaderlib.integrations.lightning import LoaderMonitor

N = 30           # samples: 15 per rank on 2 ranks, 4 batches of 4, 4, 4, 3 per epoch
BATCH = 4
ORDER_SEED = 3   # the sampler's seed: the global order


class Model(LightningModule):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.out = out
        self.seen: list[list[int]] = []

    def train_dataloader(self):
        world, rank = self.trainer.world_size, self.trainer.global_rank
        x = np.stack([np.arange(N, dtype=np.float32), np.ones(N, np.float32)], axis=1)
        ds = ll.ArrayDataset(x, np.arange(N, dtype=np.int64))
        return ll.DataLoader(ds, batch_size=BATCH, seed=0, num_threads=1, output="torch",
                             sampler=ll.ShardedSampler(world, rank, shuffle=True, seed=ORDER_SEED))

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append([int(v) for v in y.tolist()])
        return ((self.layer(x).squeeze(1) - y.float()) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-4)

    def on_train_end(self) -> None:
        with open(os.path.join(self.out, f"rank{self.global_rank}.json"), "w") as f:
            json.dump({"batches": self.seen, "world_size": self.trainer.world_size}, f)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--ckpt-dir")
    p.add_argument("--every", type=int, default=2)
    p.add_argument("--resume")
    p.add_argument("--logger", choices=("csv", "tensorboard"), default="csv")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    callbacks: list = [LoaderMonitor(every_n_steps=2)]
    if a.ckpt_dir:
        callbacks.append(ModelCheckpoint(dirpath=a.ckpt_dir, filename="{step}", every_n_train_steps=a.every,
                                         save_top_k=-1))
    trainer = Trainer(accelerator="cpu", devices=a.devices, strategy="ddp" if a.devices > 1 else "auto",
                      max_steps=a.steps, logger=(CSVLogger if a.logger == "csv" else TensorBoardLogger)(a.out, name="logs", version=0),
                      callbacks=callbacks,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      limit_val_batches=0, log_every_n_steps=1)
    trainer.fit(Model(a.out), ckpt_path=a.resume)


if __name__ == "__main__":
    main()
