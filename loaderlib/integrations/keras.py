"""Keras 3: a loaderlib loader as a ``keras.utils.PyDataset``, on any backend (torch, JAX,
TensorFlow).

NOTE [ A loader as a Keras PyDataset ]
Keras 3 takes a torch ``DataLoader``, a generator or a ``PyDataset`` and nothing else
("Unrecognized data type"). A ``PyDataset`` is indexed, ``dataset[i]`` giving batch ``i`` of
the epoch, and Keras asks for the indices of an epoch in order when ``fit`` gets
``shuffle=False`` (the loader shuffles samples itself; Keras would shuffle the batch indices)
and the dataset has one worker without multiprocessing (the only setting :class:`KerasView`
takes), after looking at ``dataset[0]`` once to learn the batch's structure (and calling
``on_epoch_end`` after that look). :class:`KerasView` serves batch ``i`` by advancing one
iterator of the loader per epoch; an index asked again (that first look) gets the same batch,
an ``on_epoch_end`` after batch 0 alone keeps the epoch (so the look costs no epoch of the
loader), and an index out of order raises ``IndexError`` naming it. Batches are copied out
of the loader's arena slot: Keras may keep them beyond the next batch. An epoch of Keras is an
epoch of the loader, so the loader's order, resume and ``len()`` hold.
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

__all__ = ["KerasView"]


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
        self._last: tuple[int, Any] | None = None   # the index served last and its batch

    def __len__(self) -> int:
        return len(self.loader)

    def __getitem__(self, index: int) -> Any:
        if self._last is not None and self._last[0] == index:
            return self._last[1]
        expected = 0 if self._last is None else self._last[0] + 1
        if index != expected:
            raise IndexError(f"KerasView serves an epoch's batches in order: asked for batch {index}, the next is "
                             f"{expected}: pass model.fit(..., shuffle=False) (the loader shuffles itself; Keras "
                             "would shuffle the batch indices) and keep workers=1 without multiprocessing")
        if self._it is None:
            self._it = iter(self.loader)
        try:
            batch = _copy(next(self._it))
        except StopIteration:
            raise IndexError(f"batch {index} is past the end of the epoch ({len(self)} batches)") from None
        self._last = (index, batch)
        return batch

    def on_epoch_end(self) -> None:
        if self._last is not None and self._last[0] == 0 and len(self) > 1:
            return   # Keras looked at dataset[0] and ends that look as an epoch: the epoch is still to run
        if self._it is not None:
            for _ in self._it:   # a loader that delivered fewer batches than len(): finish its epoch
                pass
        self._it, self._last = None, None
