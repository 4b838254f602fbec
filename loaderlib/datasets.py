"""Datasets (Gluon names): random access to samples, plus lazy per-sample transforms.

Every dataset has ``len(ds)``, ``ds[i]``, ``ds.transform(fn)`` and ``ds.transform_first(fn)``.
The image datasets (:class:`ImageFolderDataset`, :class:`ImageListDataset`,
:class:`RecordFileDataset`) know where each sample's bytes live, so the DataLoader can read
and decode them inside its native kernels; indexing them from Python reads and decodes one
image with the same decoder.
"""

from __future__ import annotations

from ._datasets.base import Dataset, SimpleDataset
from ._datasets.images import (
    IMAGE_EXTENSIONS,
    MAX_FILE_BYTES,  # noqa: F401 - a public constant, not in __all__
    ArrayDataset,
    ImageFolderDataset,
    ImageListDataset,
    TupleDataset,
)
from ._datasets.mixture import MixtureDataset
from ._datasets.tokens.dataset import TokenDataset

__all__ = [
    "IMAGE_EXTENSIONS",
    "ArrayDataset",
    "Dataset",
    "ImageFolderDataset",
    "ImageListDataset",
    "MixtureDataset",
    "TokenDataset",
    "SimpleDataset",
    "TupleDataset",
]
