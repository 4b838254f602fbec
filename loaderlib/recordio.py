"""MXNet RecordIO image files (what Gluon users packed ImageNet into), read natively.

NOTE [ MXNet RecordIO layout ]
A ``.rec`` file is a sequence of records, each: a little-endian ``uint32`` magic
``0xced7230a``, a ``uint32`` whose low 29 bits are the payload length and whose top 3 bits
are a continuation flag (0 for a whole record), the payload, and zero padding to a multiple
of 4 bytes. An image record's payload (``mxnet.recordio.pack_img``) starts with an
``IRHeader``: ``uint32 flag, float32 label, uint64 id, uint64 id2`` (24 bytes); when ``flag``
is positive, ``flag`` float32 labels follow (and the header's ``label`` is unused); the rest
is the encoded image. The optional ``.idx`` text file has one ``key<TAB>offset`` line per
record. Opening reads each record's 8-byte frame and its header (``pread``, no image
bytes), so the dataset knows where every image's bytes are and the DataLoader decodes them
inside its kernels.
"""

from __future__ import annotations

from ._datasets.recordio import (
    MAGIC,  # noqa: F401 - a public constant, not in __all__
    ImageRecordDataset,
)

__all__ = [
    "ImageRecordDataset",
]
