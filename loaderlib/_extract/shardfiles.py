"""Read-only descriptors of a dataset's data files, opened once per process.

The one owner of the descriptors that record shards, WebDataset tars and RecordIO files are
read through (with ``pread``, so threads never interfere). A forked or unpickled copy opens
its own; ``close()`` (or garbage collection) closes them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np


class ShardFiles:
    """Mixin for datasets whose samples are byte ranges of the files in ``self.paths``."""

    paths: list[str]

    def _init_files(self) -> None:
        self._fds: list[int] = []
        self._pid = -1
        self._lock = threading.Lock()

    def fileno(self, shard: int = 0) -> int:
        """A read-only descriptor of file ``shard`` of ``self.paths``, opened once per process.
        With the shard cache it waits for the local copy and holds it until :meth:`close`
        (the loader reads cached shards through :meth:`buffers` instead, which holds only
        the shards in use: NOTE [ Shards held by a dataset ] in ``_extract/remote/files.py``)."""
        remote: Any = getattr(self, "_remote", None)
        urls = getattr(self, "urls", None)
        if remote is not None and remote.cached and urls:
            remote.local([urls[shard]])
        with self._lock:
            if self._pid != os.getpid():
                self._fds, self._pid = [], os.getpid()
            while len(self._fds) <= shard:
                self._fds.append(-1)
            if self._fds[shard] < 0:
                self._fds[shard] = os.open(self.paths[shard], os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            return self._fds[shard]

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_fds"], d["_pid"] = [], -1
        del d["_lock"]
        return d

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def buffers(self, indices: Sequence[int]) -> list:
        """The bytes of samples ``indices`` from a store (``self._remote``), read by byte range,
        concurrently, or with the shard cache slices of the local copies: the BUFFERS source
        of a dataset whose shards are URLs."""
        idx = np.asarray(indices, np.int64)
        if self._remote.cached:
            return self._remote.slices([self.urls[s] for s in self.shard_of[idx].tolist()], self.offsets[idx],
                                       self.sizes[idx])
        return self._remote.read([self.paths[s] for s in self.shard_of[idx].tolist()], self.offsets[idx],
                                 self.sizes[idx], idx.tolist(), record=True)

    def remote_request(self, i: int) -> tuple[str, int, int] | None:
        """Sample ``i``'s request to its store, ``(url, start, end)``, for a read of that sample
        alone (NOTE [ One sample, one request ] in ``_extract/remote/readahead.py``); with the
        shard cache only while its shard downloads (NOTE [ Samples of a shard still on its way ]
        in ``_extract/remote/files.py``), None once the sample is a slice of the local copy."""
        remote: Any = getattr(self, "_remote", None)
        if remote is None:
            return None
        s = int(self.shard_of[i])
        if remote.cached:
            urls = getattr(self, "urls", None)
            if not urls or not remote.downloading(urls[s]):
                return None
            url = urls[s]
        else:
            url = self.paths[s]
        start = int(self.offsets[i])
        return url, start, start + int(self.sizes[i])

    def plan_epoch(self, indices: np.ndarray) -> None:
        """With the shard cache: download the shards a few ahead of the reads, in the order
        ``indices`` (the run's samples, in the order they will be read) first needs them
        (NOTE [ Epoch order to the dataset ] in ``_extract/source.py``, NOTE [ Shards held by a
        dataset ] in ``_extract/remote/files.py``)."""
        remote: Any = getattr(self, "_remote", None)
        urls = getattr(self, "urls", None)
        if remote is None or not remote.cached or not urls or len(urls) < 2 or not len(indices):
            return
        remote.plan([urls[s] for s in first_uses(self.shard_of[np.asarray(indices, np.int64)])])

    def _read_cached(self, i: int) -> bytes:
        """The bytes of sample ``i`` from the local copy of its shard (shard cache on)."""
        return bytes(self.buffers([i])[0])

    def read_failure(self, idx: int) -> Exception | None:
        """Why sample ``idx`` came back empty from :meth:`buffers` (NOTE [ Remote failures per sample ])."""
        remote: Any = getattr(self, "_remote", None)
        return remote.failure(idx) if remote is not None else None

    def close(self) -> None:
        """Close this process's descriptors (they reopen on the next read) and, with the shard
        cache, release the cached copies."""
        remote: Any = getattr(self, "_remote", None)
        if remote is not None:
            remote.close()
        with self._lock:
            if self._pid == os.getpid():
                for fd in self._fds:
                    if fd >= 0:
                        os.close(fd)
            self._fds = []

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass


def first_uses(shards: np.ndarray) -> list[int]:
    """The distinct values of ``shards`` in the order of their first appearance."""
    shards = np.asarray(shards, np.int64)
    if not shards.size:
        return []
    _, first = np.unique(shards, return_index=True)
    return shards[np.sort(first)].tolist()
