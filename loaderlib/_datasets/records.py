"""Record shards (NOTE [ Record shard format ] in ``loaderlib/records.py``): writing them
(:func:`write_records`, :func:`pack`) and reading them (:class:`RecordFileDataset`).
"""

from __future__ import annotations

import glob
import os
import time
import warnings
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import _threads
from .._checks import parse_bytes
from .._extract.remote.files import RemoteFiles, remote_files
from .._extract.remote.store import expand_urls
from .._extract.remote.urls import expand_braces
from .._extract.shardfiles import ShardFiles
from .._extract.source import NativeSource, SourceKind
from .._pack import PackOptions, pack_batch
from .._tensor_spec import TensorSpec
from ..decoding import decode
from ..errors import LoaderError, SkipWarning
from .base import Dataset, _check_index
from .durable import fsync_dir
from .images import _read_file

__all__ = ["INDEX_EXT", "RECORD_EXT", "PackReport", "RecordFileDataset", "pack", "parse_size", "record_paths",
           "write_records"]

RECORD_EXT, INDEX_EXT = ".llrec", ".llidx"
_MAGIC = b"LLREC\x02\x00\x00"
_HEADER = 32
_VERSION = 2
_MXNET_MAGIC = 0xCED7230A


def parse_size(size: int | str) -> int:
    """Bytes from an int or a string such as ``"512MB"``, ``"1GB"``, ``"64KiB"`` (KB/MB/GB are
    powers of 1000, KiB/MiB/GiB of 1024, as everywhere in loaderlib)."""
    return parse_bytes(size, "size")


def record_paths(path: str | os.PathLike) -> tuple[str, str]:
    """``(data_path, index_path)`` of the shard named ``X``, ``X.llrec`` or ``X.llidx`` (or the
    older ``X.rec``/``X.idx``)."""
    p = os.fspath(path)
    for ext, idx in ((RECORD_EXT, INDEX_EXT), (INDEX_EXT, INDEX_EXT), (".rec", ".idx"), (".idx", ".idx")):
        if p.endswith(ext):
            base = p[:-len(ext)]
            return (base + (RECORD_EXT if idx == INDEX_EXT else ".rec")), base + idx
    if not os.path.exists(p + RECORD_EXT) and os.path.exists(p + ".rec"):
        return p + ".rec", p + ".idx"
    return p + RECORD_EXT, p + INDEX_EXT


_META = ("orig_sizes", "stored_sizes", "kinds")   # the per-record facts of a packed shard


def _checksum(offsets: np.ndarray, sizes: np.ndarray, labels: np.ndarray, keys: Sequence[str],
              ident: str, data_size: int, meta: dict | None = None) -> int:
    c = zlib.crc32(np.ascontiguousarray(offsets, np.int64).tobytes())
    c = zlib.crc32(np.ascontiguousarray(sizes, np.int64).tobytes(), c)
    c = zlib.crc32(np.ascontiguousarray(labels, np.int64).tobytes(), c)
    c = zlib.crc32("\0".join(keys).encode("utf-8", "surrogateescape"), c)
    if meta is not None:
        c = zlib.crc32(np.ascontiguousarray(meta["orig_sizes"], np.int64).tobytes(), c)
        c = zlib.crc32(np.ascontiguousarray(meta["stored_sizes"], np.int64).tobytes(), c)
        c = zlib.crc32("\0".join(str(k) for k in meta["kinds"]).encode(), c)
    return zlib.crc32(f"{ident}:{data_size}".encode(), c)


def _publish(tmp: str, final: str, overwrite: bool) -> None:
    if overwrite:
        os.replace(tmp, final)
        return
    try:
        os.link(tmp, final)   # atomic, and fails if ``final`` exists: never clobbers
    except FileExistsError:
        raise FileExistsError(f"{final!r} exists; pass overwrite=True (--force) to replace it") from None
    os.unlink(tmp)


class _ShardWriter:
    """One shard being written to unique temporary files next to its final names."""

    def __init__(self, base: str) -> None:
        self.data_path, self.index_path = record_paths(base)
        folder = os.path.dirname(os.path.abspath(self.data_path))
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"output folder {folder!r} does not exist")
        name = os.path.basename(self.data_path)
        import tempfile  # here, not at import: NOTE [ What import costs ] in loaderlib/__init__.py
        import uuid

        fd, self.tmp_data = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
        self.f = os.fdopen(fd, "wb")
        self.ident = uuid.uuid4().hex
        self.f.write(_MAGIC + bytes.fromhex(self.ident) + bytes(_HEADER - len(_MAGIC) - 16))
        self.off = _HEADER
        self.offsets: list[int] = []
        self.sizes: list[int] = []
        self.tmp_index: str | None = None

    def add(self, blob: Any) -> None:
        self.f.write(blob)
        n = memoryview(blob).nbytes
        self.offsets.append(self.off)
        self.sizes.append(n)
        self.off += n

    def finish(self, labels: np.ndarray, keys: list[str], synsets: Sequence[str], overwrite: bool,
               meta: dict | None = None) -> tuple[str, str]:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        offsets, sizes = np.asarray(self.offsets, np.int64), np.asarray(self.sizes, np.int64)
        folder = os.path.dirname(os.path.abspath(self.index_path))
        import tempfile  # here, not at import: NOTE [ What import costs ] in loaderlib/__init__.py

        fd, self.tmp_index = tempfile.mkstemp(prefix=f".{os.path.basename(self.index_path)}.", suffix=".tmp",
                                              dir=folder)
        extra = {} if meta is None else {"orig_sizes": np.asarray(meta["orig_sizes"], np.int64).reshape(-1, 2),
                                         "stored_sizes": np.asarray(meta["stored_sizes"], np.int64).reshape(-1, 2),
                                         "kinds": np.asarray(meta["kinds"], dtype=str)}
        with os.fdopen(fd, "wb") as f:
            np.savez(f, version=np.int64(_VERSION), ident=np.asarray(self.ident), data_size=np.int64(self.off),
                     offsets=offsets, sizes=sizes, labels=labels, keys=np.asarray(keys, dtype=str),
                     synsets=np.asarray(list(synsets), dtype=str),
                     checksum=np.int64(_checksum(offsets, sizes, labels, keys, self.ident, self.off, meta)), **extra)
            f.flush()
            os.fsync(f.fileno())
        _publish(self.tmp_data, self.data_path, overwrite)
        try:
            _publish(self.tmp_index, self.index_path, overwrite)
        except BaseException:
            os.unlink(self.data_path)   # ours, just linked: no index for it may stay behind
            raise
        fsync_dir(self.data_path)
        return self.data_path, self.index_path

    def discard(self) -> None:
        try:
            self.f.close()
        except OSError:
            pass
        for t in (self.tmp_data, self.tmp_index):
            if t is not None and os.path.exists(t):
                os.unlink(t)


def _blobs(items: Iterable[Any]) -> Iterator[tuple[Any, str, str | None]]:
    """Per item: its bytes (None when unreadable), its name, and why it could not be read."""
    for i, item in enumerate(items):
        if isinstance(item, (str, os.PathLike)):
            name = os.fspath(item)
            try:
                yield _read_file(name), name, None
            except OSError as e:
                yield None, name, f"cannot read item {i} {name!r}: {e.strerror or e}"
        else:
            try:
                yield memoryview(item).cast("B"), f"record {i}", None
            except TypeError:
                raise TypeError(f"write_records: item {i} is {type(item).__name__}, not bytes or a path") from None


@dataclass
class PackReport:
    """What :func:`pack` (or :func:`write_records`) wrote.

    Attributes
    ----------
    shards : list of (str, str)
        The ``(data, index)`` files written.
    images : int
        Records written.
    skipped : list of (str, str)
        ``(source, reason)`` of each image left out (``on_error="skip"``).
    kinds : dict
        Records per kind: ``"file"`` (the file's bytes), ``"jpeg"`` (resized or re-encoded),
        ``"raw"`` (pixels).
    bytes_in, bytes_out : int
        Bytes of the written records' source files, and of the records.
    seconds : float
        Wall time of the whole call.
    classes : int
        Class folders (:func:`pack`).
    """

    shards: list = field(default_factory=list)
    images: int = 0
    skipped: list = field(default_factory=list)
    kinds: dict = field(default_factory=lambda: {"file": 0, "jpeg": 0, "raw": 0})
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    classes: int = 0

    @property
    def bytes_saved(self) -> int:
        """``bytes_in - bytes_out`` (negative when raw records outweigh their JPEGs)."""
        return self.bytes_in - self.bytes_out


def _check_free(base: str, sharded: bool) -> None:
    for p in record_paths((f"{base}-00000" if sharded else base) + RECORD_EXT):
        if os.path.exists(p):
            raise FileExistsError(f"{p!r} exists; pass overwrite=True (--force) to replace it")


def _base_name(path: str | os.PathLike) -> str:
    base = os.fspath(path)
    for ext in (RECORD_EXT, INDEX_EXT, ".rec", ".idx"):
        if base.endswith(ext):
            return base[:-len(ext)]
    return base


def write_records(path: str | os.PathLike, items: Iterable[Any], labels: Sequence[int] | None = None, *,
                  keys: Sequence[str] | None = None, synsets: Sequence[str] | None = None, overwrite: bool = False,
                  shard_size: int | str | None = None, max_side: int | None = None, quality: int = 90,
                  raw_below: int = 0, reencode: bool = False, on_error: str = "raise",
                  num_threads: int | None = None) -> Any:
    """Pack encoded images into record shards (NOTE [ Record shard format ]).

    Parameters
    ----------
    path : str or path
        ``X`` (or ``X.llrec``): writes ``X.llrec`` and ``X.llidx``; with ``shard_size``,
        ``X-00000.llrec``, ``X-00001.llrec``, ... and their indexes.
    items : iterable
        Each a bytes-like record, or a path whose file content becomes the record.
    labels : sequence of int, optional
        One label per item (default 0).
    keys : sequence of str, optional
        A name per item for error messages (default: the path for path items, else
        ``"record <i>"``).
    synsets : sequence of str, optional
        Class names, stored in every index (``RecordFileDataset.synsets``).
    overwrite : bool
        Replace existing files (default: refuse with ``FileExistsError``).
    shard_size : int or str, optional
        Start a new shard once one holds this many bytes (``"1GB"``).
    max_side : int, optional
        Store images whose longer side exceeds this (at least 16) resized to it, antialiased,
        and re-encoded at ``quality`` (NOTE [ Packing at a capped resolution ] in
        ``pyx/include/ll_pack.h``). Records keep the original size, so the loader's crops
        mean what they meant on the originals (NOTE [ Original coordinates ] in
        ``pyx/include/ll_chain.h``). None (default): records are the items' bytes.
    quality : int
        JPEG quality (1 to 100) of re-encoded images.
    raw_below : int
        Store images whose stored pixel count is below this as raw pixels, which the loader
        reads without decoding.
    reencode : bool
        Re-encode images within the cap too (default: keep their bytes).
    on_error : {"raise", "skip"}
        An item that cannot be read or, when packing, decoded: raise the error naming it
        (nothing is written), or leave it out with a :class:`~loaderlib.SkipWarning`.
    num_threads : int, optional
        Threads that pack images (default: ``LOADERLIB_NUM_THREADS`` or the available CPUs);
        the output does not depend on it.

    Returns
    -------
    ``(data_path, index_path)``, or a list of them with ``shard_size``.
    """
    opts = PackOptions(max_side, quality, raw_below, reencode)
    report = _write(path, items, labels, keys=keys, synsets=synsets, overwrite=overwrite, shard_size=shard_size,
                    opts=opts, on_error=on_error, num_threads=num_threads)
    return report.shards if shard_size is not None else report.shards[0]


def _write(path: str | os.PathLike, items: Iterable[Any], labels: Sequence[int] | None, *,
           keys: Sequence[str] | None, synsets: Sequence[str] | None, overwrite: bool,
           shard_size: int | str | None, opts: PackOptions, on_error: str, num_threads: int | None) -> PackReport:
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    base = _base_name(path)
    limit = parse_size(shard_size) if shard_size is not None else None
    lab_all = None if labels is None else np.asarray(labels, dtype=np.int64).reshape(-1)
    if hasattr(items, "__len__"):
        for what, seq in (("labels", lab_all), ("keys", keys)):
            if seq is not None and len(seq) != len(items):
                raise ValueError(f"write_records: {len(items)} records but {len(seq)} {what}")
    if not overwrite:   # before any work: the first shard's names
        _check_free(base, limit is not None)
    packing = opts.changes_images
    batch = 16 * _threads.resolve_num_threads(num_threads) if packing else 1
    report = PackReport()
    out = report.shards
    writer: _ShardWriter | None = None
    rec: dict[str, list] = {"labels": [], "keys": [], "orig_sizes": [], "stored_sizes": [], "kinds": []}
    n = 0   # items seen

    def close_shard() -> None:
        nonlocal writer
        meta = {k: rec[k] for k in _META} if packing else None
        out.append(writer.finish(np.asarray(rec["labels"], np.int64), rec["keys"], synsets or [], overwrite, meta))
        writer = None
        for v in rec.values():
            v.clear()

    def label_of(i: int) -> int:
        if lab_all is None:
            return 0
        if i >= lab_all.shape[0]:
            raise ValueError(f"write_records: more records than the {lab_all.shape[0]} labels given")
        return int(lab_all[i])

    def add(i: int, name: str, blob: Any, size_in: int, packed: Any) -> None:
        nonlocal writer
        if writer is None:
            target = f"{base}-{len(out):05d}" if limit is not None else base
            if not overwrite:
                for p in record_paths(target + RECORD_EXT):
                    if os.path.exists(p):
                        raise FileExistsError(f"{p!r} exists; pass overwrite=True (--force) to replace it")
            writer = _ShardWriter(target + RECORD_EXT)
        writer.add(blob)
        rec["labels"].append(label_of(i))
        rec["keys"].append(name if keys is None else str(keys[i]))
        kind = "file" if packed is None else packed.kind
        rec["kinds"].append(kind)
        rec["orig_sizes"].append(None if packed is None else packed.original_size)
        rec["stored_sizes"].append(None if packed is None else packed.stored_size)
        report.images += 1
        report.kinds[kind] += 1
        report.bytes_in += size_in
        report.bytes_out += memoryview(blob).nbytes
        if limit is not None and writer.off - _HEADER >= limit:
            close_shard()

    def fail(name: str, err: Exception) -> None:
        if on_error == "raise":
            raise err
        report.skipped.append((name, getattr(err, "reason", None) or str(err)))
        warnings.warn(f"write_records: skipped {name!r}: {report.skipped[-1][1]}", SkipWarning, stacklevel=4)

    def flush(pending: list) -> None:
        good = [(i, b, nm) for i, b, nm, why in pending if why is None]
        packed = pack_batch([b for _, b, _ in good], [nm for _, _, nm in good], opts, num_threads) if packing \
            else [None] * len(good)
        results = dict(zip([i for i, _, _ in good], zip(good, packed)))
        for i, b, nm, why in pending:
            if why is not None:
                fail(nm, LoaderError(f"write_records: {why}"))
                continue
            (_, blob, name), p = results[i]
            if p is not None and p.error is not None:
                fail(name, p.error)
                continue
            add(i, name, blob if p is None else p.data, memoryview(blob).nbytes, p)

    try:
        pending: list = []
        for blob, name, why in _blobs(items):
            pending.append((n, blob, name, why))
            n += 1
            if len(pending) >= batch:
                flush(pending)
                pending = []
        flush(pending)
        if writer is None and not out:
            writer = _ShardWriter((f"{base}-00000" if limit is not None else base) + RECORD_EXT)
        if writer is not None:
            close_shard()
        for what, seq in (("labels", lab_all), ("keys", keys)):
            if seq is not None and len(seq) != n:
                raise ValueError(f"write_records: {n} records but {len(seq)} {what}")
    except BaseException:
        if writer is not None:
            writer.discard()
        for pair in out:   # this call's shards: none may outlive a failed pack
            for p in pair:
                if os.path.exists(p):
                    os.unlink(p)
        raise
    return report


def pack(image_dir: str | os.PathLike, out: str | os.PathLike, *, max_side: int | None = None, quality: int = 90,
         raw_below: int = 0, reencode: bool = False, shard_size: int | str | None = None, overwrite: bool = False,
         on_error: str = "raise", num_threads: int | None = None, progress: bool = True) -> PackReport:
    """Pack an image folder (one sub-folder per class) into record shards, optionally at a
    capped resolution: what ``python -m loaderlib pack`` runs.

    Parameters
    ----------
    image_dir : str or path
        ``image_dir/<class>/<image>``, as :class:`~loaderlib.ImageFolderDataset` reads it.
    out : str or path
        Output name: ``OUT.llrec`` and ``OUT.llidx`` (``OUT-00000.llrec``, ... with ``shard_size``).
    max_side, quality, raw_below, reencode, shard_size, overwrite, on_error, num_threads
        As in :func:`write_records`.
    progress : bool
        Show a progress bar (``tqdm.auto``).

    Returns
    -------
    PackReport
        The shards, counts, bytes in and out (``bytes_saved``) and the time taken.

    Raises
    ------
    ValueError
        A bad option (the message names it and its command-line flag), or no images.
    FileExistsError
        The output exists and ``overwrite`` is False.
    """
    t0 = time.perf_counter()
    opts = PackOptions(max_side, quality, raw_below, reencode)
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    from tqdm.auto import tqdm  # here, not at import: NOTE [ What import costs ] in loaderlib/__init__.py

    from .images import ImageFolderDataset

    root = os.fspath(image_dir)
    if not os.path.isdir(root):
        raise NotADirectoryError(f"{root!r} is not a folder")
    if not overwrite:
        _check_free(_base_name(out), shard_size is not None)
    ds = ImageFolderDataset(root)
    if not len(ds):
        raise ValueError(f"no images under {root!r}")
    paths = [p for p, _ in ds.items]
    with tqdm(paths, desc="packing", unit="img", disable=not progress) as bar:
        report = _write(out, bar, ds.labels, keys=None, synsets=ds.synsets, overwrite=overwrite,
                        shard_size=shard_size, opts=opts, on_error=on_error, num_threads=num_threads)
    report.classes = len(ds.synsets)
    report.seconds = time.perf_counter() - t0
    return report


def _expand(paths: Any, remote: RemoteFiles | None = None) -> list[str]:
    if remote is not None:
        return expand_urls([paths] if isinstance(paths, str) else list(paths), remote.options,
                           suffixes=(RECORD_EXT, ".rec"))
    if isinstance(paths, (str, os.PathLike)):
        p = os.fspath(paths)
        names = expand_braces(p)   # NOTE [ Brace patterns are bounded ] in _extract/remote/urls.py
        if names != [p]:
            return [f for q in names for f in _expand(q)]
        if any(c in p for c in "*?["):
            found = sorted(f for f in glob.glob(p) if not f.endswith((INDEX_EXT, ".idx")))
            if not found:
                raise FileNotFoundError(f"no record shard matches {p!r}")
            return found
        return [p]
    out: list[str] = []
    for q in paths:
        out += _expand(q)
    if not out:
        raise ValueError("RecordFileDataset needs at least one shard")
    return out


def _open_shard(data_path: str, index_path: str, remote: RemoteFiles | None = None) -> dict:
    if remote is None:
        for p in (data_path, index_path):
            if not os.path.exists(p):
                raise FileNotFoundError(f"RecordFileDataset: {p!r} does not exist (a shard needs both "
                                        f"{os.path.basename(data_path)!r} and {os.path.basename(index_path)!r})")
        size = os.path.getsize(data_path)
        with open(data_path, "rb") as f:
            head = f.read(_HEADER)
        index: Any = index_path
    else:   # NOTE [ Remote datasets: cache or ranges ]: the index whole, the header by range
        size = remote.size(data_path)
        head = bytes(remote.read_range(data_path, 0, min(_HEADER, size))) if size else b""
        index = index_path if os.path.exists(index_path) else remote.open_bytes(index_path)
    if len(head) >= 4 and int.from_bytes(head[:4], "little") == _MXNET_MAGIC:
        raise LoaderError(f"{data_path!r} is an MXNet RecordIO file: open it with ll.ImageRecordDataset")
    try:
        with np.load(index, allow_pickle=False) as z:
            d = {k: z[k] for k in z.files}
    except Exception as e:   # numpy's and zipfile's parsers raise many types on damaged files (TokenError, ...)
        raise LoaderError(f"{index_path!r} is not a loaderlib record index ({e})") from None
    # A damaged index: a missing entry, or one of another type or shape (fuzz/fuzz_parsers.py).
    try:
        version = int(d.get("version", -1))
        if version not in (1, _VERSION):
            raise LoaderError(f"{index_path!r}: unsupported index version {version}")
        offsets = np.ascontiguousarray(d["offsets"], np.int64).reshape(-1)
        sizes = np.ascontiguousarray(d["sizes"], np.int64).reshape(-1)
        labels = np.ascontiguousarray(d["labels"], np.int64).reshape(-1)
        keys = [str(k) for k in np.asarray(d["keys"]).reshape(-1)]
        synsets = [str(s) for s in np.asarray(d["synsets"]).reshape(-1)]
        ident = str(d["ident"]) if version == _VERSION else ""
        data_size = int(d["data_size"]) if version == _VERSION else size
        checksum = int(d["checksum"]) if version == _VERSION else 0
        meta = None
        if all(k in d for k in _META):
            meta = {"orig_sizes": np.asarray(d["orig_sizes"], np.int64),
                    "stored_sizes": np.asarray(d["stored_sizes"], np.int64),
                    "kinds": [str(k) for k in np.asarray(d["kinds"]).reshape(-1)]}
    except (KeyError, ValueError, TypeError, OverflowError) as e:
        raise LoaderError(f"{index_path!r} is not a loaderlib record index (entry {e} missing or malformed)") from None
    n = offsets.shape[0]
    if sizes.shape[0] != n or labels.shape[0] != n or len(keys) != n:
        raise LoaderError(f"{index_path!r}: {n} offsets but {sizes.shape[0]} sizes, {labels.shape[0]} labels, "
                          f"{len(keys)} keys")
    if meta is not None:
        if meta["orig_sizes"].shape != (n, 2) or meta["stored_sizes"].shape != (n, 2) or len(meta["kinds"]) != n:
            raise LoaderError(f"{index_path!r}: the packed-record sizes do not match its {n} records")
    start = 0
    if version == _VERSION:
        if head[:len(_MAGIC)] != _MAGIC:
            raise LoaderError(f"{data_path!r} is not a loaderlib record file (bad magic)")
        if head[len(_MAGIC):len(_MAGIC) + 16].hex() != ident:
            raise LoaderError(f"{data_path!r} and {index_path!r} belong to different pack runs (their identifiers "
                              "differ): the pair was overwritten half-way; pack it again")
        if data_size != size:
            raise LoaderError(f"{data_path!r} has {size} bytes, its index expects {data_size} (truncated "
                              "or appended to?)")
        if checksum != _checksum(offsets, sizes, labels, keys, ident, size, meta):
            raise LoaderError(f"{index_path!r}: checksum mismatch: the index was modified or damaged")
        start = _HEADER
    bad = np.flatnonzero((sizes < 0) | (offsets < start) | (sizes > size - offsets))   # offsets + sizes may wrap
    if bad.size:
        k = int(bad[0])
        raise LoaderError(f"{index_path!r}: record {k} ({keys[k]!r}) has offset {int(offsets[k])} and size "
                          f"{int(sizes[k])}, outside {data_path!r} ({size} bytes)")
    if meta is None:   # not packed with pack's options: sizes unknown, every record its file's bytes
        meta = {"orig_sizes": np.full((n, 2), -1, np.int64), "stored_sizes": np.full((n, 2), -1, np.int64),
                "kinds": ["file"] * n}
    return {"offsets": offsets, "sizes": sizes, "labels": labels, "keys": keys,
            "synsets": synsets, **meta}


class RecordFileDataset(ShardFiles, Dataset):
    """Records packed by :func:`write_records`; item ``i`` is ``(image, label)``.

    Records are read with ``pread`` (no seek, so reads from many threads never interfere);
    millions of small files become a few sequential files.

    Parameters
    ----------
    paths : str, path or list
        One shard (``X``, ``X.llrec`` or ``X.llidx``), a list of them, or a glob
        (``"train-*.llrec"``). See NOTE [ Record shard format ]. URLs too
        (``s3://``, ``gs://``, ``http(s)://``), with brace ranges (``part-{0000..0099}``) and,
        in object stores, globs; see NOTE [ Remote datasets: cache or ranges ].
    raw : bool
        Items are ``(bytes, label)`` instead of decoded images.
    storage_options : dict, optional
        For URLs: ``endpoint_url``, ``aws_access_key_id``, ``aws_secret_access_key``,
        ``region_name`` (boto3's names; the AWS environment variables otherwise), ``timeout``,
        ``max_retries``, and anything the store takes.
    cache_dir : str, optional
        For URLs: download whole shards into this folder (shared by the node's processes)
        and read them as local files. Off by default: records are read by byte range.
    cache_limit : int or str, optional
        Bytes (or ``"20GB"``) the cache may hold; least recently used shards not in use go
        first. At least the largest shard; the dataset holds only the shards it is reading
        (NOTE [ Shards held by a dataset ]), so the limit may be far below the dataset's size.

    Attributes
    ----------
    paths, index_paths : list of str
        The shards' data and index files.
    shard_of, offsets, sizes, labels : numpy.ndarray
        int64 per record: its shard, byte offset, length and label.
    keys : list of str
        Per-record names (source paths when packed from files).
    synsets : list of str
        Class names stored at packing time (the first shard's).
    original_sizes, stored_sizes : numpy.ndarray
        int64 ``(n, 2)``: per record, ``(width, height)`` of the image it was packed from
        and of the stored image; -1 in shards written without :func:`pack`'s options.
        The native loader draws crops in original coordinates (NOTE [ Original
        coordinates ] in ``pyx/include/ll_chain.h``).
    kinds : list of str
        Per record ``"file"`` (a file's bytes), ``"jpeg"`` (resized or re-encoded by
        :func:`pack`) or ``"raw"`` (pixels, read without decoding).
    """

    def __init__(self, paths: str | os.PathLike | Sequence[str | os.PathLike], raw: bool = False, *,
                 storage_options: dict | None = None, cache_dir: str | os.PathLike | None = None,
                 cache_limit: int | str | None = None) -> None:
        self._remote = remote_files(paths, storage_options, cache_dir, cache_limit, "RecordFileDataset")
        pairs = [record_paths(p) for p in _expand(paths, self._remote)]
        self.urls = [d for d, _ in pairs] if self._remote is not None else None
        self.index_paths = [i for _, i in pairs]
        if self._remote is not None and self._remote.cached:
            # The indexes and headers from the store now; the data shards download a few
            # ahead of the reads in the order a run first needs them (plan_epoch, NOTE [ Epoch
            # order to the dataset ] in _extract/source.py) and a shard's first read waits for its
            # copy, so reading starts before the last shard arrives.
            self.paths = [self._remote.cache.path_of(d) for d, _ in pairs]
        else:
            self.paths = [d for d, _ in pairs]
        if self._remote is not None:   # NOTE [ Downloads ahead of a cold epoch ]: all at once
            shards = self._remote.each(lambda pair: _open_shard(pair[0], pair[1], self._remote), pairs)
        else:
            shards = [_open_shard(d, i, self._remote) for d, i in pairs]
        self.offsets = np.concatenate([s["offsets"] for s in shards])
        self.sizes = np.concatenate([s["sizes"] for s in shards])
        self.labels = np.concatenate([s["labels"] for s in shards])
        self.shard_of = np.concatenate([np.full(s["offsets"].shape[0], k, np.int64) for k, s in enumerate(shards)])
        self.keys = [k for s in shards for k in s["keys"]]
        self.original_sizes = np.concatenate([s["orig_sizes"] for s in shards]).reshape(-1, 2)
        self.stored_sizes = np.concatenate([s["stored_sizes"] for s in shards]).reshape(-1, 2)
        self.kinds = [k for s in shards for k in s["kinds"]]
        self.synsets = shards[0]["synsets"]
        self.raw = bool(raw)
        self._init_files()

    @property
    def path(self) -> str:
        """The first shard's data file."""
        return self.paths[0]

    @property
    def index_path(self) -> str:
        return self.index_paths[0]

    @property
    def shard_sizes(self) -> list[int]:
        """Records per shard, in order."""
        return np.bincount(self.shard_of, minlength=len(self.paths)).tolist()

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def _ranges(self) -> bool:
        """Records are read by byte range from a store (NOTE [ Remote datasets: cache or ranges ])."""
        return self._remote is not None and not self._remote.cached

    def element_spec(self) -> Any:
        """(image, int64 label), the image an HWC uint8 RGB array, or a 1-D uint8 array of the
        record's bytes with ``raw=True``."""
        data = TensorSpec((None,), np.uint8) if self.raw else TensorSpec((None, None, 3), np.uint8)
        return (data, TensorSpec((), np.int64))

    def native_source(self) -> NativeSource | None:
        """SHARDS: records read with ``pread`` by the kernels (None with ``raw=True``: the items
        are bytes, not images); BUFFERS for shards in a store, read by byte range or sliced
        from the shard cache's copies."""
        if self.raw:
            return None
        if self._remote is not None and self._remote.cached:
            return NativeSource(SourceKind.BUFFERS, stage="RecordFileDataset: slices of the shard cache's local "
                                "copies", dataset=self, labels=self.labels, description=repr(self))
        if self._ranges:
            return NativeSource(SourceKind.BUFFERS, stage="RecordFileDataset: byte ranges from the store, a batch's "
                                "requests concurrent", dataset=self, labels=self.labels, description=repr(self))
        return NativeSource(SourceKind.SHARDS, stage="RecordFileDataset: pread of the record shards inside the kernel",
                            dataset=self, labels=self.labels, description=repr(self))

    def source(self, idx: int) -> str | None:
        return self.keys[_check_index(idx, len(self.offsets))]

    def read(self, idx: int) -> bytes:
        """The raw bytes of record ``idx``."""
        i = _check_index(idx, len(self.offsets))
        n = int(self.sizes[i])
        s = int(self.shard_of[i])
        if self._ranges:
            return bytes(self._remote.read([self.paths[s]], self.offsets[i:i + 1], self.sizes[i:i + 1], [i])[0])
        if self._remote is not None:
            return self._read_cached(i)
        data = os.pread(self.fileno(s), n, int(self.offsets[i]))
        if len(data) != n:
            raise OSError(f"short read of record {i} ({self.keys[i]!r}) in {self.paths[s]!r}")
        return data

    def __getitem__(self, idx: int) -> Any:
        i = _check_index(idx, len(self.offsets))
        return self.item_from_bytes(i, self.read(i))

    def item_from_bytes(self, i: int, data: Any) -> Any:
        """Item ``i`` from its record's bytes ``data`` (read ahead by the loader)."""
        if self.raw:
            return bytes(data), int(self.labels[i])
        return decode(data, source=self.keys[i]), int(self.labels[i])

    def __repr__(self) -> str:
        names = self.urls or self.paths
        where = names[0] if len(names) == 1 else f"{len(names)} shards"
        return f"RecordFileDataset({where!r}: {len(self)} records)"
