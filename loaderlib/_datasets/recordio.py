"""MXNet RecordIO image files (NOTE [ MXNet RecordIO layout ] in ``loaderlib/recordio.py``):
:class:`ImageRecordDataset` finds each image's bytes from the frames and headers alone.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np

from .._extract.remote.files import remote_files
from .._extract.shardfiles import ShardFiles
from .._extract.source import NativeSource, SourceKind
from ..decoding import decode
from ..errors import LoaderError, RemoteReadError
from .base import Dataset, _check_index

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

    def __init__(self, path_rec: str | os.PathLike, *, storage_options: dict | None = None,
                 cache_dir: str | os.PathLike | None = None, cache_limit: int | str | None = None) -> None:
        self._remote = remote_files(os.fspath(path_rec), storage_options, cache_dir, cache_limit,
                                    "ImageRecordDataset")
        self.url = os.fspath(path_rec) if self._remote is not None else None
        self.path = os.fspath(path_rec)
        self.idx_path = os.path.splitext(self.path)[0] + ".idx"
        if self._remote is not None and self._remote.cached:
            self.path = self._remote.local([self.path])[0]
            try:
                self.idx_path = self._remote.local([self.idx_path])[0]
            except RemoteReadError as e:
                if e.status != 404:
                    raise
                self.idx_path = os.path.splitext(self.path)[0] + ".idx"     # none: scan the copy
        if self._ranges:
            keys, offsets, sizes, labels = self._open_remote()
        else:
            keys, offsets, sizes, labels = self._open_local()
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

    @property
    def _ranges(self) -> bool:
        """Records are read by byte range from a store (NOTE [ Remote datasets: cache or ranges ])."""
        return self._remote is not None and not self._remote.cached

    def _open_local(self) -> tuple[list, list, list, list]:
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"ImageRecordDataset: {self.path!r} does not exist")
        size = os.path.getsize(self.path)
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            if os.path.exists(self.idx_path):
                with open(self.idx_path, encoding="utf-8", errors="replace") as f:   # bad bytes: a bad line
                    keys, starts = self._read_idx(f)
            else:
                keys, starts = self._scan(fd, size)
            offsets, sizes, labels = [], [], []
            for key, start in zip(keys, starts):
                off, n, lab = self._header(lambda k, o, w, fd=fd: self._pread(fd, k, o, w), start, size, key)
                offsets.append(off)
                sizes.append(n)
                labels.append(lab)
        finally:
            os.close(fd)
        return keys, offsets, sizes, labels

    def _open_remote(self) -> tuple[list, list, list, list]:
        """The ``.idx`` whole, then every record's frame and header in one batched range read
        (scanning a .rec frame by frame over the network would be one request per record)."""
        try:
            text = self._remote.fetch(self.idx_path).decode("utf-8", "replace")
        except RemoteReadError as e:
            if e.status != 404:
                raise
            raise LoaderError(f"ImageRecordDataset: {self.idx_path} is missing; over URLs the .idx is needed "
                              "(or pass cache_dir= to download the .rec and scan it)") from None
        keys, starts = self._read_idx(text.splitlines())
        size = self._remote.size(self.path)
        span = _FRAME.size + _IRHEADER.size
        heads = self._remote.read([self.path] * len(starts), np.asarray(starts, np.int64),
                                  np.full(len(starts), span, np.int64), list(range(len(starts))))
        offsets, sizes, labels = [], [], []
        for key, start, head in zip(keys, starts, heads):
            head = bytes(head)

            def pread(n, off, what, start=start, head=head):
                if start <= off and off + n <= start + len(head):
                    return head[off - start:off - start + n]
                return bytes(self._remote.read_range(self.path, off, off + n))

            off, n, lab = self._header(pread, start, size, key)
            offsets.append(off)
            sizes.append(n)
            labels.append(lab)
        return keys, offsets, sizes, labels

    def _read_idx(self, lines) -> tuple[list[int], list[int]]:
        keys, starts = [], []
        for line_no, line in enumerate(lines, 1):
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

    def _header(self, pread, start: int, size: int, key: int) -> tuple[int, int, tuple]:
        what = f"record {key} (byte {start})"
        if start < 0 or start + _FRAME.size + _IRHEADER.size > size:
            raise LoaderError(f"{self.path!r}: {what} lies outside the file ({size} bytes)")
        head = pread(_FRAME.size + _IRHEADER.size, start, what)
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
            if body + 4 * flag > size:   # before the read: flag (up to 2**32) sizes its buffer
                raise LoaderError(f"{self.path!r}: {what} declares {flag} labels, past the end of the file")
            labels = struct.unpack(f"<{flag}f", pread(4 * flag, body, what))
            body += 4 * flag
        img = n - _IRHEADER.size - 4 * max(flag, 0)
        if img < 0 or start + _FRAME.size + n > size:
            raise LoaderError(f"{self.path!r}: {what} declares {n} bytes, past the end of the file or shorter "
                              "than its header")
        return body, img, labels

    def __len__(self) -> int:
        return len(self.keys)

    def native_source(self) -> NativeSource | None:
        """SHARDS: records read with ``pread`` by the kernels; BUFFERS for a ``.rec`` in a store
        read by byte range."""
        if self._ranges:
            return NativeSource(SourceKind.BUFFERS, stage="ImageRecordDataset (MXNet RecordIO): byte ranges from "
                                "the store, a batch's requests concurrent", dataset=self, labels=self.labels,
                                description=repr(self))
        return NativeSource(SourceKind.SHARDS, stage="ImageRecordDataset (MXNet RecordIO): pread inside the kernel",
                            dataset=self, labels=self.labels, description=repr(self))

    def source(self, idx: int) -> str | None:
        return f"{self.url or self.path}:record {self.keys[_check_index(idx, len(self.keys))]}"

    def read(self, idx: int) -> bytes:
        """The encoded image bytes of record ``idx``."""
        i = _check_index(idx, len(self.keys))
        if self._ranges:
            return bytes(self._remote.read([self.path], self.offsets[i:i + 1], self.sizes[i:i + 1], [i])[0])
        n = int(self.sizes[i])
        data = os.pread(self.fileno(), n, int(self.offsets[i]))
        if len(data) != n:
            raise OSError(f"short read of {self.source(i)}")
        return data

    def __getitem__(self, idx: int) -> Any:
        i = _check_index(idx, len(self.keys))
        return self.item_from_bytes(i, self.read(i))

    def item_from_bytes(self, i: int, data: Any) -> Any:
        """Item ``i`` from its record's image bytes ``data`` (read ahead by the loader)."""
        img = decode(data, source=self.source(i))
        lab = self.labels[i]
        return img, (int(lab) if self.labels.dtype == np.int64 and self.labels.ndim == 1 else lab)

    def __repr__(self) -> str:
        return f"ImageRecordDataset({self.url or self.path!r}: {len(self)} records)"
