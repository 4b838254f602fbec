"""WebDataset tar shards read natively: each sample's image is a byte range of its shard.

NOTE [ WebDataset layout ]
A WebDataset shard is a plain (uncompressed) POSIX tar file. Members that share a *key*
form one sample: the key is the member's path up to the first dot of its file name, the
rest is the field (``n01440764/img_001.jpg`` and ``n01440764/img_001.cls`` are key
``n01440764/img_001``, fields ``jpg`` and ``cls``). The image field is the first of ``jpg``,
``jpeg``, ``png`` present; the label is the integer in ``cls``, or from ``json`` (an integer,
or an object's ``"label"``/``"cls"`` entry). Opening a shard reads only the tar headers
(``tarfile`` seeks over the data), so the dataset knows every image's offset and size and
the DataLoader reads and decodes them inside its kernels with ``pread``, like a record file.
Compressed shards (``.tar.gz``) have no byte ranges and are refused.
"""

from __future__ import annotations

from ._datasets.webdataset import (
    IMAGE_FIELDS,  # noqa: F401 - a public constant, not in __all__
    WebDataset,
    expand_shards,
    write_webdataset,
    write_webdataset_index,
)

__all__ = [
    "WebDataset",
    "expand_shards",
    "write_webdataset",
    "write_webdataset_index",
]
