"""Keras 3 ``model.fit`` over a loaderlib loader through ``KerasView``, for test_keras.py.

    KERAS_BACKEND=torch|jax|tensorflow python keras_run.py OUT

Writes ``OUT``: the labels of every batch Keras received, per epoch, as counted by a callback
and recorded in the view.
"""

from __future__ import annotations

import json
import sys

import keras
import numpy as np

import loaderlib as ll
from loaderlib.integrations.keras import KerasView

N, BATCH = 30, 4


class Recording(KerasView):
    def __init__(self, loader):
        super().__init__(loader)
        self.epochs: list[list[list[int]]] = [[]]

    def __getitem__(self, index):
        fresh = index == self._served   # not a batch served again after Keras' look
        x, y = super().__getitem__(index)
        if fresh:
            self.epochs[-1].append(y.tolist())
        return x, y

    def on_epoch_end(self):
        super().on_epoch_end()
        if self._served == 0:   # an epoch ended (not Keras' look at the first batches)
            self.epochs.append([])


class Steps(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.per_epoch: list[int] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.per_epoch.append(0)

    def on_train_batch_end(self, batch, logs=None):
        self.per_epoch[-1] += 1


def main() -> None:
    x = np.stack([np.arange(N, dtype=np.float32), np.ones(N, np.float32)], axis=1)
    loader = ll.DataLoader(ll.ArrayDataset(x, np.arange(N, dtype=np.float32)), batch_size=BATCH, shuffle=True,
                           seed=5, num_threads=1)
    view = Recording(loader)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    steps = Steps()
    model.fit(view, epochs=3, verbose=0, callbacks=[steps], shuffle=False)
    with open(sys.argv[1], "w") as f:
        json.dump({"backend": keras.backend.backend(), "keras": keras.__version__, "steps": steps.per_epoch,
                   "epochs": [e for e in view.epochs if e], "len": len(loader)}, f)


if __name__ == "__main__":
    main()
