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

import os
import struct
from typing import Any

import numpy as np

from ._shardfiles import ShardFiles
from ._source import NativeSource, SourceKind
from .datasets import Dataset, _check_index
from .decoding import decode
from .errors import LoaderError

__all__ = ["ImageRecordDataset"]

MAGIC = 0xCED7230A
_FRAME = struct.Struct("<II")
_IRHEADER = struct.Struct("<IfQQ")


class ImageRecordDataset(ShardFiles, Dataset):
    """Images packed with MXNet's ``im2rec`` / ``recordio.pack_img``: ``(image, label)`` items.

    Parameters
    ----------
    path_rec : str or path
        The ``.rec`` file; its ``.idx`` (same name) gives the record order and offsets, and
        without one the file is scanned. See NOTE [ MXNet RecordIO layout ].

    Attributes
    ----------
    labels : numpy.ndarray
        int64 when every label is a whole number, float32 otherwise; shape ``(n, k)`` for
        records with ``k`` labels.
    keys : list of int
        The record keys (from the ``.idx``, or positions).
    offsets, sizes : numpy.ndarray
        Where each record's image bytes are.
    """

    def __init__(self, path_rec: str | os.PathLike) -> None:
        self.path = os.fspath(path_rec)
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"ImageRecordDataset: {self.path!r} does not exist")
        self.idx_path = os.path.splitext(self.path)[0] + ".idx"
        size = os.path.getsize(self.path)
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            if os.path.exists(self.idx_path):
                keys, starts = self._read_idx()
            else:
                keys, starts = self._scan(fd, size)
            offsets, sizes, labels = [], [], []
            for key, start in zip(keys, starts):
                off, n, lab = self._header(fd, start, size, key)
                offsets.append(off)
                sizes.append(n)
                labels.append(lab)
        finally:
            os.close(fd)
        self.keys = keys
        self.offsets = np.asarray(offsets, np.int64)
        self.sizes = np.asarray(sizes, np.int64)
        self.shard_of = np.zeros(len(keys), np.int64)
        widths = {len(x) for x in labels}
        if len(widths) > 1:
            raise LoaderError(f"{self.path!r}: records carry different numbers of labels ({sorted(widths)})")
        lab = np.asarray(labels, np.float32).reshape(len(labels), -1) if labels else np.zeros((0, 1), np.float32)
        if lab.shape[1] == 1:
            lab = lab[:, 0]
        self.labels = lab.astype(np.int64) if np.all(np.mod(lab, 1) == 0) else lab
        self.paths = [self.path]
        self._init_files()

    def _read_idx(self) -> tuple[list[int], list[int]]:
        keys, starts = [], []
        with open(self.idx_path) as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                parts = line.split("\t")
                try:
                    keys.append(int(parts[0]))
                    starts.append(int(parts[1]))
                except (IndexError, ValueError):
                    raise LoaderError(f"{self.idx_path!r} line {line_no}: expected 'key<TAB>offset', got "
                                      f"{line.strip()[:60]!r}") from None
        return keys, starts

    def _scan(self, fd: int, size: int) -> tuple[list[int], list[int]]:
        keys, starts = [], []
        pos = 0
        while pos < size:
            magic, lrec = _FRAME.unpack(self._pread(fd, _FRAME.size, pos, f"record at byte {pos}"))
            if magic != MAGIC:
                raise LoaderError(f"{self.path!r}: no RecordIO magic at byte {pos} (not an MXNet .rec file?)")
            keys.append(len(keys))
            starts.append(pos)
            n = lrec & ((1 << 29) - 1)
            pos += _FRAME.size + n + (-n % 4)
        return keys, starts

    def _pread(self, fd: int, n: int, offset: int, what: str) -> bytes:
        data = os.pread(fd, n, offset)
        if len(data) != n:
            raise LoaderError(f"{self.path!r}: {what} is cut off by the end of the file")
        return data

    def _header(self, fd: int, start: int, size: int, key: int) -> tuple[int, int, tuple]:
        what = f"record {key} (byte {start})"
        if start < 0 or start + _FRAME.size + _IRHEADER.size > size:
            raise LoaderError(f"{self.path!r}: {what} lies outside the file ({size} bytes)")
        head = self._pread(fd, _FRAME.size + _IRHEADER.size, start, what)
        magic, lrec = _FRAME.unpack_from(head)
        if magic != MAGIC:
            raise LoaderError(f"{self.path!r}: {what} has no RecordIO magic (index and data disagree?)")
        if lrec >> 29:
            raise LoaderError(f"{self.path!r}: {what} is split into parts (continuation flag {lrec >> 29}); such "
                              "records (over 512 MB) are not supported")
        n = lrec & ((1 << 29) - 1)
        flag, label, _id, _id2 = _IRHEADER.unpack_from(head, _FRAME.size)
        body = start + _FRAME.size + _IRHEADER.size
        labels: tuple = (label,)
        if flag > 0:
            labels = struct.unpack(f"<{flag}f", self._pread(fd, 4 * flag, body, what))
            body += 4 * flag
        img = n - _IRHEADER.size - 4 * max(flag, 0)
        if img < 0 or start + _FRAME.size + n > size:
            raise LoaderError(f"{self.path!r}: {what} declares {n} bytes, past the end of the file or shorter "
                              "than its header")
        return body, img, labels

    def __len__(self) -> int:
        return len(self.keys)

    def native_source(self) -> NativeSource | None:
        """SHARDS: records read with ``pread`` by the kernels."""
        return NativeSource(SourceKind.SHARDS, stage="ImageRecordDataset (MXNet RecordIO): pread inside the kernel",
                            dataset=self, labels=self.labels, description=repr(self))

    def source(self, idx: int) -> str | None:
        return f"{self.path}:record {self.keys[_check_index(idx, len(self.keys))]}"

    def read(self, idx: int) -> bytes:
        """The encoded image bytes of record ``idx``."""
        i = _check_index(idx, len(self.keys))
        n = int(self.sizes[i])
        data = os.pread(self.fileno(), n, int(self.offsets[i]))
        if len(data) != n:
            raise OSError(f"short read of {self.source(i)}")
        return data

    def __getitem__(self, idx: int) -> Any:
        i = _check_index(idx, len(self.keys))
        img = decode(self.read(i), source=self.source(i))
        lab = self.labels[i]
        return img, (int(lab) if self.labels.dtype == np.int64 and self.labels.ndim == 1 else lab)

    def __repr__(self) -> str:
        return f"ImageRecordDataset({self.path!r}: {len(self)} records)"
