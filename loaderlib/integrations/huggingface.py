"""Hugging Face ``datasets`` image columns decoded by loaderlib's native kernels, without PIL.

NOTE [ Hugging Face image bytes ]
A ``datasets`` image column decodes every image with PIL when a row is read. Cast to
``Image(decode=False)``, the same column yields ``{"bytes": ..., "path": ...}``: the encoded
file, untouched. :class:`HFImageDataset` does that cast and hands a batch's bytes to the
native decode-and-transform chain (the bytes are gathered from the Arrow table once per
batch; decoding, cropping and normalising run in the kernels). Rows whose bytes are empty
but whose path is set (datasets that reference local files) are read from the path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._datasets.base import Dataset, _check_index
from .._extract.source import NativeSource, SourceKind
from ..decoding import decode
from ..errors import LoaderError

__all__ = ["HFImageDataset"]


class HFImageDataset(Dataset):
    """A Hugging Face dataset's image column (and label column) as a loaderlib dataset.

    Parameters
    ----------
    dataset : datasets.Dataset
        A map-style Hugging Face dataset (one split).
    image_column : str
        The column of ``Image`` feature (decoded or not; it is cast to undecoded bytes).
    label_column : str or None
        An integer column returned as the label (None: items are images alone).

    Examples
    --------
    >>> ds = HFImageDataset(load_dataset("...", split="train"))          # doctest: +SKIP
    >>> loader = ll.DataLoader(ds.transform_first(T.RandomResizedCrop(224)), batch_size=256)  # doctest: +SKIP
    """

    def __init__(self, dataset: Any, image_column: str = "image", label_column: str | None = "label") -> None:
        try:
            from datasets import Image
        except ImportError:
            raise ImportError("HFImageDataset needs the 'datasets' package (pip install datasets)") from None
        cols = list(getattr(dataset, "column_names", []))
        if image_column not in cols:
            raise LoaderError(f"the dataset has no column {image_column!r} (columns: {cols})")
        if label_column is not None and label_column not in cols:
            raise LoaderError(f"the dataset has no column {label_column!r} (columns: {cols}); pass label_column=None "
                              "for images alone")
        self.image_column = image_column
        self.label_column = label_column
        self.hf = dataset.cast_column(image_column, Image(decode=False))
        self.labels: np.ndarray | None = None
        if label_column is not None:
            lab = np.asarray(self.hf[label_column])
            if lab.dtype.kind not in "iub":
                raise LoaderError(f"column {label_column!r} holds {lab.dtype} values, not integer labels")
            self.labels = lab.astype(np.int64)

    def __len__(self) -> int:
        return len(self.hf)

    def native_source(self) -> NativeSource:
        """BUFFERS: the encoded bytes from the Arrow table, one gather per batch."""
        return NativeSource(SourceKind.BUFFERS,
                            stage="HFImageDataset: encoded bytes from the Arrow table, one gather per batch",
                            dataset=self, labels=self.labels, description=repr(self))

    def source(self, idx: int) -> str | None:
        return f"{self.image_column}[{int(idx)}]"

    def buffers(self, indices: Sequence[int]) -> list[bytes]:
        """The encoded image bytes of rows ``indices`` (one Arrow gather)."""
        rows = self.hf[self.image_column] if len(indices) == len(self) and list(indices) == list(range(len(self))) \
            else self.hf.select([int(i) for i in indices])[self.image_column]
        out = []
        for i, cell in zip(indices, rows):
            data = cell.get("bytes") if isinstance(cell, dict) else None
            if not data:
                path = cell.get("path") if isinstance(cell, dict) else None
                if not path:
                    raise LoaderError(f"{self.source(i)}: the row holds neither bytes nor a path")
                with open(path, "rb") as f:
                    data = f.read()
            out.append(data)
        return out

    def __getitem__(self, idx: int) -> Any:
        i = _check_index(idx, len(self))
        img = decode(self.buffers([i])[0], source=self.source(i))
        return img if self.labels is None else (img, int(self.labels[i]))

    def __repr__(self) -> str:
        return f"HFImageDataset({len(self)} rows, image={self.image_column!r}, label={self.label_column!r})"
