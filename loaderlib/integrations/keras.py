"""Keras 3: a loaderlib loader as a ``keras.utils.PyDataset``, on any backend (torch, JAX,
TensorFlow).

NOTE [ A loader as a Keras PyDataset ]
Keras 3 takes a torch ``DataLoader``, a generator or a ``PyDataset`` and nothing else
("Unrecognized data type"). A ``PyDataset`` is indexed, ``dataset[i]`` giving batch ``i`` of
the epoch, and Keras asks for the indices of an epoch in order when ``fit`` gets
``shuffle=False`` (the loader shuffles samples itself; Keras would shuffle the batch indices)
and the dataset has one worker without multiprocessing (the only setting :class:`KerasView`
takes). Each training epoch is bracketed by ``on_epoch_begin`` and ``on_epoch_end`` (Keras
3.5 on). Before the first one, Keras looks at the first batches to learn their structure and
ends that look with ``on_epoch_end``: on the torch and JAX backends it asks for ``dataset[0]``
inside a bracket of its own, on the TensorFlow backend for ``dataset[0]`` and ``dataset[1]``
outside any bracket (its ``tf.data`` signature). :class:`KerasView` serves batch ``i`` by
advancing one iterator of the loader per epoch and keeps the first two batches of the epoch:
an index asked again (after a look) gets the same batch, an ``on_epoch_end`` that ends a look
(batches served outside a bracket, or batch 0 alone inside one) keeps the epoch, so the look
costs no epoch of the loader, and an index out of order raises ``IndexError`` naming it.
Batches are copied out of the loader's arena slot: Keras may keep them beyond the next batch.
An epoch of Keras is an epoch of the loader, so the loader's order, resume and ``len()`` hold
on every backend.
"""

from __future__ import annotations

from typing import Any

import numpy as np

try:
    import keras
except ModuleNotFoundError as e:   # Keras 3 picks TensorFlow unless told otherwise
    if e.name != "tensorflow":
        raise
    raise ImportError("Keras 3 is set to its TensorFlow backend, which is not installed: set KERAS_BACKEND=torch "
                      "or KERAS_BACKEND=jax before importing keras (or install tensorflow)") from e

from ..loader import DataLoader
from ._versions import check_version

__all__ = ["SUPPORTED", "KerasView"]

#: Keras versions this module supports: ``(lowest, first unsupported)`` (NOTE [ Framework version
#: ranges ]). Before 3.5 a ``PyDataset`` gets no ``on_epoch_begin``, which tells Keras' look at
#: the first batches from an epoch (NOTE [ A loader as a Keras PyDataset ]).
SUPPORTED = ((3, 5), (4, 0))
_KEPT = 2   # the batches Keras' look may take (the TensorFlow backend's tf.data signature reads 2)


def _check_version(text: str) -> None:
    check_version("keras", "Keras", "keras", text, SUPPORTED,
                  "before 3.5 a PyDataset gets no on_epoch_begin; 4 is untested")


_check_version(keras.__version__)


def _copy(batch: Any) -> Any:
    if isinstance(batch, dict):
        return {k: _copy(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return tuple(_copy(v) for v in batch)
    return np.array(batch)


class KerasView(keras.utils.PyDataset):
    """A loaderlib :class:`~loaderlib.DataLoader` as a Keras 3 ``PyDataset``.

    Parameters
    ----------
    loader : DataLoader
        A loader with ``output="numpy"`` (the default); its batches ``(x, y)`` (or
        ``(x, y, sample_weight)``, or one array) are what Keras trains on.

    Examples
    --------
    >>> model.fit(KerasView(loader), epochs=3, shuffle=False)  # doctest: +SKIP
    """

    def __init__(self, loader: DataLoader) -> None:
        super().__init__(workers=1, use_multiprocessing=False)
        if not isinstance(loader, DataLoader):
            raise TypeError(f"KerasView takes a loaderlib DataLoader, got {type(loader).__name__}")
        if loader.output != "numpy":
            raise ValueError(f"KerasView needs a loader with output='numpy', this one has output={loader.output!r}")
        self.loader = loader
        self._it: Any = None
        self._served = 0                 # batches of this epoch served so far
        self._head: list[Any] = []       # the epoch's first _KEPT batches, served again after a look
        self._last: Any = None           # the batch served last
        self._in_epoch = False           # between Keras' on_epoch_begin and on_epoch_end

    def __len__(self) -> int:
        return len(self.loader)

    def __getitem__(self, index: int) -> Any:
        if 0 <= index < self._served:   # asked again: a look, then the epoch (NOTE [ A loader as a Keras PyDataset ])
            if index == self._served - 1:
                return self._last
            if index < len(self._head):
                return self._head[index]
        if index != self._served:
            raise IndexError(f"KerasView serves an epoch's batches in order: asked for batch {index}, the next is "
                             f"{self._served}: pass model.fit(..., shuffle=False) (the loader shuffles itself; Keras "
                             "would shuffle the batch indices) and keep workers=1 without multiprocessing")
        if self._it is None:
            self._it = iter(self.loader)
        try:
            batch = _copy(next(self._it))
        except StopIteration:
            raise IndexError(f"batch {index} is past the end of the epoch ({len(self)} batches)") from None
        self._served += 1
        self._last = batch
        if index < _KEPT:
            self._head.append(batch)
        return batch

    def on_epoch_begin(self) -> None:
        self._in_epoch = True

    def on_epoch_end(self) -> None:
        look = self._served > 0 and (not self._in_epoch or (self._served == 1 and len(self) > 1))
        self._in_epoch = False
        if look:
            return   # Keras looked at the first batches and ends that look as an epoch: the epoch is still to run
        if self._it is not None:
            for _ in self._it:   # a loader that delivered fewer batches than len(): finish its epoch
                pass
        self._it, self._served, self._head, self._last = None, 0, [], None
