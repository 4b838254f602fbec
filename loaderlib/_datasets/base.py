"""The base of every dataset: ``Dataset`` (``len``, ``[i]``, lazy transforms), its transform
layers and the plain wrapper of a sequence. Kept apart from the formats (``images.py``,
``records.py``, ...) so datasets built from other datasets (``mixture.py``) can subclass it
without importing the formats (NOTE [ Datasets that change with the epoch ] in ``mixture.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._extract.source import NativeSource

__all__ = ["Dataset", "SimpleDataset", "at_epoch"]


class Dataset:
    """Base class: ``__len__``, ``__getitem__`` and lazy transforms."""

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, idx: int) -> Any:
        raise NotImplementedError

    def source(self, idx: int) -> str | None:
        """Where sample ``idx`` comes from (a path or record key), for error messages."""
        return None

    def native_source(self) -> NativeSource | None:
        """How the native kernels read this dataset's samples, or None when ``dataset[i]``
        is read from Python (NOTE [ Datasets describe their own source ] in ``_extract/source.py``).

        A dataset format the kernels can read overrides this; the loader and the Pipeline
        never test dataset types.
        """
        return None

    def unwrap(self) -> tuple[Any, list]:
        """The innermost dataset and the ``transform``/``transform_first`` layers over it,
        innermost first (this dataset and no layer, unless it is such a layer)."""
        return self, []

    def zipped_arrays(self) -> list | None:
        """The numpy arrays whose rows, zipped, are this dataset's items, when it is made of
        plain arrays and can be gathered as an :class:`ArrayDataset` of them; else None."""
        return None

    def element_spec(self) -> Any:
        """The structure, shapes and dtypes of this dataset's items (a nest of
        :class:`~loaderlib.pipeline.TensorSpec`, unknown dimensions None), or None when
        they are known only by reading an item.

        A dataset that knows its items without reading one overrides this; a Pipeline over
        it (``Pipeline.from_dataset`` and the other sources) takes its ``element_spec``
        from here, never from the dataset's type, and traces the first item otherwise.
        """
        return None

    def transform(self, fn: Callable, lazy: bool = True) -> Dataset:
        """A dataset whose items are ``fn(*item)`` for tuple items, ``fn(item)`` otherwise.

        With ``lazy=False`` every item is transformed now and kept in memory.
        """
        return self._transformed(fn, False, lazy)

    def transform_first(self, fn: Callable, lazy: bool = True) -> Dataset:
        """A dataset whose items have ``fn`` applied to their first element only.

        For the image datasets, ``fn`` made of :mod:`loaderlib.transforms` specs lets the
        DataLoader run the whole pipeline natively.
        """
        return self._transformed(fn, True, lazy)

    def _transformed(self, fn: Callable, first: bool, lazy: bool) -> Dataset:
        if not callable(fn):
            raise TypeError(f"{'transform_first' if first else 'transform'} needs a callable, got {fn!r}")
        ds = _TransformDataset(self, fn, first=first)
        return ds if lazy else SimpleDataset([ds[i] for i in range(len(ds))])

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


def _source_of(data: Any, idx: int) -> str | None:
    """``data.source(idx)`` when the wrapped object has one (a path or record key), else None."""
    src = getattr(data, "source", None)
    return src(idx) if callable(src) else None


def _check_index(idx: Any, n: int) -> int:
    if isinstance(idx, (bool, np.bool_)) or not isinstance(idx, (int, np.integer)):
        raise TypeError(f"dataset indices must be integers, got {type(idx).__name__}")
    i = int(idx)
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise IndexError(f"index {idx} out of range for a dataset of {n} samples")
    return i


class _TransformDataset(Dataset):
    def __init__(self, base: Any, fn: Callable, first: bool) -> None:
        self.base = base
        self.fn = fn
        self.first = first

    def __len__(self) -> int:
        return len(self.base)

    def source(self, idx: int) -> str | None:
        return _source_of(self.base, idx)

    def __getitem__(self, idx: int) -> Any:
        return self.apply(self.base[idx])

    def apply(self, item: Any) -> Any:
        """This layer's function applied to an item of ``base``."""
        if self.first:
            if isinstance(item, tuple):
                return (self.fn(item[0]), *item[1:])
            return self.fn(item)
        if isinstance(item, tuple):
            return self.fn(*item)
        return self.fn(item)

    def unwrap(self) -> tuple[Any, list[_TransformDataset]]:
        """The innermost dataset and the transform layers over it, innermost first."""
        layers: list[_TransformDataset] = []
        ds: Any = self
        while isinstance(ds, _TransformDataset):
            layers.append(ds)
            ds = ds.base
        return ds, layers[::-1]

    def __repr__(self) -> str:
        kind = "transform_first" if self.first else "transform"
        return f"{self.base!r}.{kind}({self.fn!r})"


class SimpleDataset(Dataset):
    """Wrap any sequence (list, array, object with ``__len__``/``__getitem__``)."""

    def __init__(self, data: Any) -> None:
        if not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
            data = list(data)
        self._data = data

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, idx: int) -> Any:
        return self._data[idx]

    def source(self, idx: int) -> str | None:
        return _source_of(self._data, idx)


def at_epoch(dataset: Any, epoch: int, seed: int) -> Any:
    """``dataset`` fixed to ``epoch`` when its items depend on it (NOTE [ Datasets that change
    with the epoch ] in ``mixture.py``); transform layers are kept over it. Other datasets are
    returned as they are."""
    base, layers = dataset.unwrap() if isinstance(dataset, _TransformDataset) else (dataset, [])
    hook = getattr(base, "at_epoch", None)
    if not callable(hook):
        return dataset
    out = hook(int(epoch), int(seed))
    for layer in layers:
        out = _TransformDataset(out, layer.fn, first=layer.first)
    return out
