"""Record files: many small encoded images packed into shards of one data file plus an index.

NOTE [ Record shard format ]
A shard is a pair ``NAME.llrec`` (data) and ``NAME.llidx`` (index). The data file starts
with a 32-byte header: the magic ``LLREC\\x02\\0\\0`` and a random 16-byte identifier, then the
records back to back. The index is a numpy ``.npz`` archive (no pickle) holding the same
identifier, the data file's size, per-record offsets, sizes, labels and keys, the class
names, and a CRC-32 of all of those. Opening a shard checks the magic, that both files carry
the same identifier (two ``pack`` runs racing to one name can never pair one's data with the
other's index), the size, the checksum, and that every record lies inside the data file; a
failure names the file and the record. Shards written by :func:`pack` (or ``write_records``
with ``max_side`` / ``raw_below`` / ``reencode``) also hold, per record, its original size,
its stored size and what it is (``file``, ``jpeg`` or ``raw``: NOTE [ Packed records ] in
``pyx/include/ll_record.h``), covered by the checksum. Writing goes to unique temporary names in the target
folder, is fsynced, and is published with ``link`` (refusing to overwrite unless asked) or
``rename``. The pre-2 format (``NAME.rec`` + ``NAME.idx`` without header) is still read. An
MXNet RecordIO ``.rec`` is recognised by its magic number and pointed to
:class:`~loaderlib.ImageRecordDataset`.
"""

from __future__ import annotations

from ._datasets.records import (
    INDEX_EXT,
    RECORD_EXT,
    PackReport,
    RecordFileDataset,
    pack,
    parse_size,
    record_paths,
    write_records,
)

__all__ = [
    "INDEX_EXT",
    "RECORD_EXT",
    "PackReport",
    "RecordFileDataset",
    "pack",
    "parse_size",
    "record_paths",
    "write_records",
]
