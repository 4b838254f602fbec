"""Where a native batch's bytes come from: :class:`NativeSource`, which every dataset that
the kernels can read describes for itself.

NOTE [ Datasets describe their own source ]
The engines never test dataset types. A dataset whose samples the native kernels can read
answers ``native_source()`` with a :class:`NativeSource`: the kind of read (:class:`SourceKind`),
what the read needs (paths, byte ranges through the dataset's ``shard_of`` / ``offsets`` /
``sizes`` / ``fileno``, in-memory buffers, decoded pixels, or plain arrays), the labels the
kernels gather with ``take``, and the line ``explain()`` shows for the read stage. Any other
dataset answers None (``Dataset.native_source``'s default) and is read with ``dataset[i]``
from Python. ``DataLoader``'s analysis and the Pipeline's head both ask the dataset, so a new
format (or a new store) is one dataset class with one method; the reading itself is here, in
:meth:`NativeSource.run`, one branch per kind, where the read-ahead stage plugs in
(NOTE [ Read-ahead ] in ``_extract/readahead.py``). The same holds for what a dataset's
items are: ``Dataset.element_spec()`` (a nest of ``TensorSpec``, or None to trace an item),
which the Pipeline's sources take as their ``element_spec``; how a dataset is layered
(``Dataset.unwrap()``: the transform layers over the innermost dataset) and whether it is a
zip of plain arrays (``Dataset.zipped_arrays()``) are asked the same way, and a test keeps
the Pipeline, the loader and the engines free of dataset type tests.
"""

from __future__ import annotations

import enum
import operator
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from .._layout import LazyOrder
from ..errors import DecodeError, RemoteReadError

__all__ = ["NativeSource", "SourceKind", "announce_order", "encode_paths", "native_error", "native_source_of"]

_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


def encode_paths(paths: Sequence[Any], rows: list[int]) -> tuple[list[bytes], Sequence[Any]]:
    """The file names of ``paths[rows]`` as bytes (``os.fsencode``), and the paths themselves.

    NOTE [ Paths per batch ]
    The driver hands every batch's file names to the kernels as bytes. Encoding them one by
    one (``os.fsencode``: three Python-level calls per path) was most of the driver's Python
    work per batch at batch 256 (benchmarks/serial.py). Here the batch's paths are picked
    with one ``itemgetter`` call, joined, encoded and split at the NULs in one pass each, all
    in C; a path cannot contain NUL (``open`` refuses it), and when one does, or a path is not
    a ``str``, each is encoded on its own as before, so the result is the same. The ``str``
    names for messages are not made per batch: the caller gets the paths and decodes one only
    when an item fails (``_chain.FileNames``).
    """
    if not rows:
        return [], ()
    picked = operator.itemgetter(*rows)(paths)
    if len(rows) == 1:
        picked = (picked,)
    try:
        enc = "\0".join(picked).encode(_FS_ENCODING, _FS_ERRORS).split(b"\0")
    except (TypeError, UnicodeError):
        enc = []
    if len(enc) != len(rows):
        enc = [os.fsencode(p) for p in picked]
    return enc, picked


class SourceKind(enum.Enum):
    """How the kernels get a sample's bytes."""

    #: One file per sample (``paths``), opened and read inside the kernel pass.
    FILES = "files"
    #: Byte ranges of a few open files (record shards, WebDataset tars, RecordIO): the
    #: dataset's ``shard_of``, ``offsets``, ``sizes`` and ``fileno(shard)``; read with ``pread``.
    SHARDS = "shards"
    #: Encoded images in memory, from the dataset's ``buffers(indices)``.
    BUFFERS = "buffers"
    #: Decoded HWC uint8 images from the dataset's ``images(indices, num_threads)`` (no decode).
    PIXELS = "pixels"
    #: Plain numpy arrays gathered with ``take`` (no image pipeline).
    ARRAYS = "arrays"
    #: Training rows of a token corpus, written by the token kernel through the dataset's
    #: ``token_parts`` / ``gather_into`` / ``token_batch`` (NOTE [ Token batches ] in
    #: loaderlib/_datasets/tokens/dataset.py); no image pipeline.
    TOKENS = "tokens"


class NativeSource:
    """A dataset's description of how the native engine reads it
    (NOTE [ Datasets describe their own source ]).

    Parameters
    ----------
    kind : SourceKind
    stage : str
        What ``explain()`` says about the read stage.
    paths : sequence of str, optional
        FILES: one path per sample.
    dataset : object, optional
        SHARDS, BUFFERS, PIXELS: the dataset that holds the byte ranges / buffers / pixels.
    labels : numpy.ndarray, optional
        Per-sample labels collated with ``take`` (None: the samples are images alone).
    arrays : sequence of numpy.ndarray, optional
        ARRAYS: the columns.
    description : str
        The dataset's repr, for messages.
    """

    def __init__(self, kind: SourceKind, *, stage: str, paths: Sequence[str] | None = None, dataset: Any = None,
                 labels: np.ndarray | None = None, arrays: Sequence[np.ndarray] | None = None,
                 description: str = "") -> None:
        if not isinstance(kind, SourceKind):
            raise TypeError(f"kind must be a SourceKind, got {kind!r}")
        self.kind = kind
        self.stage = stage
        self.paths = list(paths) if paths is not None else None
        self.dataset = dataset
        self.labels = labels
        self.arrays = list(arrays) if arrays is not None else None
        self.description = description
        # NOTE [ Virtual indices ]: a Pipeline that passes over its source several times in
        # one iteration (``repeat``) numbers the k-th pass's sample i as ``k * wrap + i``, so
        # each pass gets its own augmentation key; the data read is sample ``v % wrap``.
        self.wrap: int | None = None
        # NOTE [ Datasets that change with the epoch ] (_datasets/mixture.py): ``epoch_map(epoch, seed)``
        # gives an epoch's ``remap`` (stream index -> row); set by ``at_epoch``, needed to read.
        self.epoch_map: Callable[[int, int], np.ndarray] | None = None
        self.remap: Any = None   # an ndarray, or a LazyOrder

    def __repr__(self) -> str:
        return f"NativeSource({self.kind.name}, {self.description})"

    @property
    def parts(self) -> int:
        """Arrays in a batch: the columns (ARRAYS), else the images and, with labels, the labels."""
        if self.kind is SourceKind.ARRAYS:
            return len(self.arrays or ())
        if self.kind is SourceKind.TOKENS:
            return 1   # one dict
        return 1 if self.labels is None else 2

    @property
    def decodes(self) -> bool:
        """Whether the samples are encoded images the kernels decode."""
        return self.kind in (SourceKind.FILES, SourceKind.SHARDS, SourceKind.BUFFERS)

    def _copy(self) -> NativeSource:
        out = NativeSource(self.kind, stage=self.stage, paths=self.paths, dataset=self.dataset, labels=self.labels,
                           arrays=self.arrays, description=self.description)
        out.wrap, out.epoch_map, out.remap = self.wrap, self.epoch_map, self.remap
        return out

    def with_wrap(self, n: int) -> NativeSource:
        """This source numbered with virtual indices modulo ``n`` (NOTE [ Virtual indices ])."""
        out = self._copy()
        out.wrap = int(n)
        return out

    def at_epoch(self, epoch: int, seed: int) -> NativeSource:
        """This source as a run of ``epoch`` (seeded ``seed``) reads it: itself, unless its rows
        change with the epoch (NOTE [ Datasets that change with the epoch ] in ``_datasets/mixture.py``)."""
        if self.epoch_map is None:
            return self
        out = self._copy()
        remap = self.epoch_map(int(epoch), int(seed))
        # an order too large to hold stays lazy (NOTE [ Orders too large to hold ] in _layout.py)
        out.remap = remap if isinstance(remap, LazyOrder) else np.asarray(remap, np.int64)
        return out

    def data_index(self, idx: np.ndarray) -> np.ndarray:
        """The dataset indices of the stream indices ``idx`` (NOTE [ Virtual indices ]; rows of an
        epoch's ``remap``, NOTE [ Datasets that change with the epoch ])."""
        d = idx % self.wrap if self.wrap else idx
        if self.epoch_map is None:
            return d
        if self.remap is None:
            raise RuntimeError(f"{self!r} changes with the epoch: read it through at_epoch(epoch, seed)")
        return self.remap[d]

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """What ``np.take`` of the labels or arrays gets for stream indices ``idx``, with :attr:`take_mode`."""
        return idx if self.epoch_map is None else self.data_index(np.asarray(idx, np.int64))

    @property
    def take_mode(self) -> Literal["raise", "wrap"]:
        """``np.take`` mode that maps stream indices to rows (NOTE [ Virtual indices ])."""
        return "wrap" if self.wrap and self.epoch_map is None else "raise"

    def source(self, i: int) -> str | None:
        """The path or record key of stream index ``i``, for messages."""
        i = int(self.data_index(np.asarray([int(i)], np.int64))[0])
        if self.kind is SourceKind.FILES:
            if self.epoch_map is not None and self.dataset is not None:
                return self.dataset.source(i)   # names the mixture's source too
            return self._file_paths()[i]
        if self.kind is SourceKind.ARRAYS:
            return None
        return self.dataset.source(i)

    @property
    def gathered(self) -> bool:
        """Whether the samples are gathered whole on the driver (ARRAYS, TOKENS) rather than
        run through a compiled image plan."""
        return self.kind in (SourceKind.ARRAYS, SourceKind.TOKENS)

    # ------------------------------------------------------------------ the readers

    def _file_paths(self) -> list[str]:
        """FILES: the paths (a FILES source is always made with them)."""
        if self.paths is None:
            raise ValueError(f"a FILES source without paths: {self!r}")
        return self.paths

    def ranges(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """SHARDS: per stream index, the descriptor, byte offset and length of its bytes."""
        ds = self.dataset
        d = self.data_index(idx)
        shard = ds.shard_of[d]
        used, where = np.unique(shard, return_inverse=True)
        fds = np.asarray([ds.fileno(int(s)) for s in used.tolist()], np.int32)[where.reshape(-1)]
        return fds, np.ascontiguousarray(ds.offsets[d], np.int64), np.ascontiguousarray(ds.sizes[d], np.int64)

    def run(self, plan: Any, idx: np.ndarray, out: np.ndarray, *, seed: int, epoch: int, num_threads: int,
            timings: np.ndarray | None, wait: bool = True, positions: np.ndarray | None = None,
            reader: Any = None, gated: bool = False) -> Any:
        """Run ``plan`` on the samples ``idx`` into ``out``: the BatchStatus, or with
        ``wait=False`` a PendingBatch queued on the plan's kernel threads.

        ``reader`` (a :class:`~loaderlib._extract.readahead.ReadAhead`) and ``positions`` (the stream
        positions of ``idx``): samples whose bytes the read-ahead stage already fetched or is
        fetching are taken from it (NOTE [ Read-ahead ]); the others are read in the pass.
        ``gated``: queued behind a closed gate (NOTE [ Batches in memory ] in _engines/depth.py).
        """
        kind = self.kind
        if kind is SourceKind.FILES:   # NOTE [ Paths per batch ]
            enc, paths = encode_paths(self._file_paths(), self.data_index(idx).tolist())
            return plan.run_encoded_files_into(enc, paths, out, idx, seed=seed, epoch=epoch,
                                               num_threads=num_threads, timings=timings, wait=wait,
                                               positions=positions, reader=reader, gated=gated)
        if kind is SourceKind.SHARDS:
            fds, offs, sizes = self.ranges(idx)
            return plan.run_records_into(fds, offs, sizes, out, idx, seed=seed, epoch=epoch, num_threads=num_threads,
                                         timings=timings, sources=[self.source(i) for i in idx.tolist()], wait=wait,
                                         positions=positions, reader=reader, gated=gated)
        if kind is SourceKind.PIXELS:   # NOTE [ Cached pixels ] in _pipeline/cache.py
            data = self.data_index(idx).tolist()
            return plan.run_pixels_into(self.dataset.images(data, num_threads), out, idx, seed=seed, epoch=epoch,
                                        num_threads=num_threads, timings=timings, wait=wait, gated=gated)
        if kind is SourceKind.BUFFERS:
            data = self.data_index(idx).tolist()
            # NOTE [ Remote read-ahead ] in _extract/remote/readahead.py: bytes read ahead by position.
            bufs = (reader.buffers(positions, data) if reader is not None and positions is not None
                    else self.dataset.buffers(data))
            return plan.run_buffers_into(bufs, out, idx, seed=seed, epoch=epoch,
                                         num_threads=num_threads, timings=timings,
                                         sources=[self.dataset.source(i) for i in data], wait=wait, gated=gated)
        raise ValueError(f"no kernel reader for a {kind.name} source")


def native_source_of(dataset: Any) -> NativeSource | None:
    """``dataset.native_source()`` when the dataset describes one, else None (read from Python)."""
    fn = getattr(dataset, "native_source", None)
    if fn is None or not callable(fn):
        return None
    src = fn()
    if src is not None and not isinstance(src, NativeSource):
        raise TypeError(f"{type(dataset).__name__}.native_source() returned {type(src).__name__}, "
                        "not a NativeSource or None")
    return src


def announce_order(src: NativeSource | None, stream: np.ndarray, start: int = 0) -> None:
    """Tell the dataset of ``src`` the order a run will read its samples in.

    NOTE [ Epoch order to the dataset ]
    A run reads the stream from ``start`` on (the sampler's order, NOTE [ The epoch is one
    stream ] in ``sampler.py``). A dataset that can use that order ahead of the reads (the
    shard cache downloads whole shards in the order they are first needed) defines
    ``plan_epoch(indices)``; the loader calls it with the dataset indices of the stream, once
    per run, before the run's first read. Datasets without it are not asked.
    """
    if src is None or src.epoch_map is not None:   # a mixture's sources are local (_datasets/mixture.py)
        return
    hook = getattr(src.dataset, "plan_epoch", None)
    if callable(hook):
        hook(src.data_index(np.asarray(stream[int(start):], np.int64)))


def native_error(src: NativeSource, st: Any, j: int, todo: np.ndarray) -> DecodeError | RemoteReadError:
    """The plan's error for item ``j`` of a kernel call on ``todo``, naming the sample index and
    its source: a :class:`DecodeError`, or the :class:`RemoteReadError` of a sample whose bytes
    never came (both carry ``reason``)."""
    j = int(j)
    failed = getattr(src.dataset, "read_failure", None) if src.kind is SourceKind.BUFFERS else None
    if failed is not None:   # NOTE [ Remote failures per sample ] in _extract/remote/files.py
        remote = failed(int(src.data_index(np.asarray([todo[j]]))[0]))
        if remote is not None:
            return remote
    e = st.errors.get(j)
    if isinstance(e, DecodeError):
        return DecodeError(e.reason, int(todo[j]), src.source(todo[j]))
    return DecodeError.from_status(int(st.status[j]), str(e or ""), int(todo[j]), src.source(todo[j]))
