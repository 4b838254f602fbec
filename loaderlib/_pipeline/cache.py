"""``Pipeline.cache()``: the elements of a first full pass, replayed afterwards.

NOTE [ Pipeline cache ]
tf.data's semantics: the first pass that runs to the end fills the cache; a pass that
stops early (a ``take`` downstream, a ``break``) leaves nothing behind, and later passes
read the cache instead of running the steps above it. What is cached is what the upstream
produced, so a cache after a random augmentation freezes it: cache decoded images *before*
the random crop (``from_folder(root).cache().map(T.RandomResizedCrop(224))``), which keeps
full crop quality at the cost of memory, or pass ``max_side`` to store images reduced.

In memory the elements are kept as private copies (read-only views are handed out) as long
as they fit ``ram_budget``; past it the cache gives up (``cache_info()`` says so) and the
pipeline runs uncached. On disk (``cache(path)``) every array goes, 64-byte aligned, into
one data file read back through ``np.memmap`` (zero copy; the OS page cache holds what is
hot, the process only one element at a time while writing), with an index of offsets and
shapes and a ``meta.json``. The files are written into a temporary directory that is renamed
into place only when the pass completed (atomic: a crashed run leaves no half cache), and
are reused by later runs while the fingerprint in ``meta.json`` (the upstream steps, the
source files' names, sizes and mtimes, and the seed when an upstream step is random) matches;
otherwise they are rebuilt. Once complete, a cache of decoded ``(image, label)`` elements
feeds the native engine directly (NOTE [ Cached pixels ]); a cache right after an image source
is filled by that engine stage too, a batch at a time (NOTE [ Filling through the engine ]).

Measured quality cost of ``max_side`` (``python benchmarks/pipeline.py --only b``: the final
``RandomResizedCrop(224)`` + flip crops made from a reduced cache vs the same crops (same seed,
same boxes) from the full-resolution cache, 64 photo-like JPEGs of median size 459x346 px, mean
absolute difference in uint8 levels): ``max_side=128`` 9.3, ``192`` 7.0, ``256`` 5.3, ``384``
3.8, ``512`` 0.6 (only the few larger photos are reduced). RandomResizedCrop zooms in, so its
crops need the source pixels: reduce only when memory forces it. The full-resolution cache
(no ``max_side``) costs nothing.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from .._datasets.base import Dataset
from .._extract.source import NativeSource, SourceKind
from .._tree import is_namedtuple, tree_leaves, tree_map
from ..decoding import decode_batch
from ..errors import DecodeError
from ..transforms import _resize
from . import ops

__all__ = ["CacheFill", "CacheNode", "CacheStore", "CachedImages"]

_ALIGN = 64
_VERSION = 1


def reduce_image(x: Any, max_side: int) -> Any:
    """An HWC uint8 image with its longer side brought down to ``max_side`` (area filter);
    other values unchanged."""
    if not (isinstance(x, np.ndarray) and x.ndim == 3 and x.dtype == np.uint8 and 1 <= x.shape[2] <= 4):
        return x
    h, w = x.shape[:2]
    if max(h, w) <= max_side:
        return x
    s = max_side / max(h, w)
    return _resize(np.ascontiguousarray(x), max(1, round(h * s)), max(1, round(w * s)), "area", False)


def _copy(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        y = np.array(x, copy=True)
        y.flags.writeable = False
        return y
    return x


def _freeze(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        x.flags.writeable = False
    return x


def _nbytes(el: Any) -> int:
    return sum(x.nbytes if isinstance(x, np.ndarray) else 8 for x in tree_leaves(el))


def _treedef(el: Any) -> Any:
    """The structure of ``el`` as JSON, its leaves numbered in ``tree_leaves`` order (the
    containers of ``_tree.py``; a namedtuple is stored as a tuple)."""
    return _sub(el, iter(range(1 << 30)))


def _sub(el: Any, counter: Iterator) -> Any:
    t = type(el)
    if t is dict:
        return {"d": [[k, _sub(v, counter)] for k, v in el.items()]}
    if t is tuple or is_namedtuple(el):
        return {"t": [_sub(v, counter) for v in el]}
    if t is list:
        return {"l": [_sub(v, counter) for v in el]}
    return {"x": next(counter)}


def _unflatten(tree: Any, parts: list) -> Any:
    if "x" in tree:
        a = parts[tree["x"]]
        return a[()] if a.ndim == 0 else a
    if "t" in tree:
        return tuple(_unflatten(t, parts) for t in tree["t"])
    if "l" in tree:
        return [_unflatten(t, parts) for t in tree["l"]]
    return {k: _unflatten(t, parts) for k, t in tree["d"]}


class CacheStore:
    """What one ``cache`` step holds, kept by its pipeline across iterations (NOTE [ Pipeline cache ]).

    Parameters
    ----------
    path : str or None
        None: in memory. Else the cache directory is ``path + ".llcache"``.
    max_side : int or None
        Store uint8 HWC images with their longer side at most this (area filter).
    fingerprint : str
        Identifies the upstream plan and source files.
    ram_budget : int or None
        Bytes an in-memory cache may hold.
    label : str
        The step, for messages.
    """

    def __init__(self, path: str | None, *, max_side: int | None, fingerprint: str, ram_budget: int | None,
                 label: str) -> None:
        self.path = None if path is None else os.fspath(path) + ".llcache"
        self.max_side = max_side
        self.fingerprint = fingerprint
        self.ram_budget = ram_budget
        self.label = label
        self._elements: list | None = None
        self._meta: dict | None = None
        self._mm: Any = None
        self._index: dict | None = None
        self.note = "empty: fills on the first full pass"
        self.writing = False
        self.over_budget = False
        self.filling: _MemoryWriter | _DiskWriter | None = None   # the writer of the pass filling it
        self._lock = threading.Lock()

    # -- reading ---------------------------------------------------------------------
    def ready(self) -> bool:
        """Whether a complete cache for this fingerprint is available."""
        if self.path is None:
            return self._elements is not None
        if self._meta is not None:
            return True
        meta_path = os.path.join(self.path, "meta.json")
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            return False
        if meta.get("version") != _VERSION or meta.get("fingerprint") != self.fingerprint \
                or meta.get("max_side") != self.max_side:
            self.note = f"stale files at {self.path} (the upstream steps or source files changed): rebuilt on this pass"
            return False
        idx = np.load(os.path.join(self.path, "index.npz"))
        self._index = {k: idx[k] for k in idx.files}
        size = os.path.getsize(os.path.join(self.path, "data.bin"))
        self._mm = np.memmap(os.path.join(self.path, "data.bin"), np.uint8, "r") if size else np.zeros(0, np.uint8)
        self._meta = meta
        self.note = f"complete, read from {self.path} (memory-mapped)"
        return True

    def _kept(self) -> list:
        """Memory: the kept elements (read only once the store is complete)."""
        assert self._elements is not None
        return self._elements

    def _mapped(self) -> tuple[dict, dict, Any]:
        """Disk: the metadata, the index and the mapped data file (read only once loaded)."""
        assert self._meta is not None and self._index is not None
        return self._meta, self._index, self._mm

    def read(self) -> Iterator:
        if self.path is None:
            yield from self._kept()
            return
        for i in range(len(self)):
            yield self.element(i)

    def element(self, i: int) -> Any:
        """Cached element ``i`` (memory: the kept copy; disk: views of the mapped file)."""
        if self.path is None:
            return self._kept()[i]
        meta, idx, mm = self._mapped()
        parts = []
        for j, d in enumerate(meta["dtypes"]):
            dt = np.dtype(d)
            shape = tuple(int(v) for v in idx[f"shape{j}"][i])
            n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            parts.append(np.frombuffer(mm, np.uint8, n, int(idx[f"offset{j}"][i])).view(dt).reshape(shape) if n
                         else np.zeros(shape, dt))
        return _unflatten(meta["tree"], parts)

    def __len__(self) -> int:
        if self.path is None:
            return len(self._kept())
        return int(self._mapped()[0]["count"])

    # -- writing ---------------------------------------------------------------------
    def prepare(self, el: Any) -> Any:
        side = self.max_side
        return el if side is None else tree_map(lambda x: reduce_image(x, side), el)

    def writer(self, n: int | None = None) -> _MemoryWriter | _DiskWriter:
        """A writer for one pass (``n``: the element count, when elements may come in any order)."""
        self.filling = _MemoryWriter(self, n) if self.path is None else _DiskWriter(self, n)
        return self.filling

    def info(self) -> dict:
        """What the cache holds (``Pipeline.cache_info()``); while a pass fills it, what it
        holds so far (``complete`` False)."""
        if self.path is None:
            els = self._elements
            out = {"step": self.label, "kind": "memory", "path": None, "max_side": self.max_side,
                   "complete": els is not None, "elements": 0 if els is None else len(els),
                   "bytes": 0 if els is None else sum(_nbytes(e) for e in els), "ram_budget": self.ram_budget,
                   "note": self.note}
        else:
            ready = self.ready()
            meta = self._meta or {}
            out = {"step": self.label, "kind": "disk", "path": self.path, "max_side": self.max_side,
                   "complete": ready, "elements": meta.get("count", 0), "bytes": meta.get("bytes", 0),
                   "ram_budget": self.ram_budget, "note": self.note}
        w = self.filling
        if w is not None and not out["complete"] and not w.given_up:
            out.update(elements=w.count, bytes=w.nbytes, note=f"filling: {w.count} elements so far")
        return out


class _MemoryWriter:
    """Elements kept in memory, within ``ram_budget``; :meth:`put` may come in any order."""

    def __init__(self, store: CacheStore, n: int | None = None) -> None:
        self.store = store
        self.items: list | None = [] if n is None else [None] * n
        self.count = 0
        self.nbytes = 0

    @property
    def given_up(self) -> bool:
        return self.items is None

    def add(self, el: Any) -> Any:
        return self.put(len(self.items) if self.items is not None else 0, el)

    def put(self, i: int, el: Any, owned: bool = False) -> Any:
        """Keep element ``i`` (a private read-only copy, or the arrays themselves when the
        caller hands them over: ``owned``); returns what is kept (``el`` once over budget)."""
        if self.items is None:
            return el
        kept = tree_map(_freeze if owned else _copy, el)
        self.nbytes += _nbytes(kept)
        budget = self.store.ram_budget
        if budget is not None and self.nbytes > budget:
            self.store.note = (f"not cached: the elements passed ram_budget={budget} bytes after "
                               f"{self.count} elements; the pipeline runs uncached")
            self.store.over_budget = True
            self.items = None
            return el
        if i == len(self.items):
            self.items.append(kept)
        else:
            self.items[i] = kept
        self.count += 1
        return kept

    def commit(self) -> None:
        self.store.filling = None
        if self.items is not None:
            self.store._elements = self.items
            self.store.note = f"complete: {len(self.items)} elements, {self.nbytes} bytes in memory"

    def abort(self) -> None:
        self.store.filling = None
        self.items = None


class _DiskWriter:
    """Elements appended to one data file (64-byte aligned) as they come, in any order; the
    index records where element ``i`` is."""

    given_up = False

    def __init__(self, store: CacheStore, n: int | None = None) -> None:
        self.store = store
        assert store.path is not None   # a disk store
        self.path = store.path
        parent = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(parent, exist_ok=True)
        import tempfile  # here, not at import: NOTE [ What import costs ] in loaderlib/__init__.py

        self.tmp = tempfile.mkdtemp(prefix=os.path.basename(self.path) + ".tmp-", dir=parent)
        self.f = open(os.path.join(self.tmp, "data.bin"), "wb")  # noqa: SIM115 - closed in commit/abort
        self.n = n
        self.pos = 0
        self.count = 0
        self.tree: Any = None
        self.dtypes: list | None = None
        self.offsets: list[list] = []
        self.shapes: list[list] = []

    def add(self, el: Any) -> Any:
        return self.put(self.count, el)

    def put(self, i: int, el: Any, owned: bool = False) -> Any:
        parts = tree_leaves(el)
        arrays = []
        for x in parts:
            a = np.asarray(x)
            if not a.flags.c_contiguous:
                a = np.array(a, order="C")   # (np.ascontiguousarray would make a 0-d value 1-d)
            if a.dtype == object or a.dtype.kind in "OUSV":
                raise TypeError(f"{self.store.label}: a disk cache stores numeric arrays; this element holds a "
                                f"{type(x).__name__} ({a.dtype}); cache in memory (cache()) instead")
            arrays.append(a)
        if self.tree is None:
            self.tree = _treedef(el)
            self.dtypes = [a.dtype.str for a in arrays]
            slots = self.n or 0
            self.offsets = [[None] * slots for _ in arrays]
            self.shapes = [[None] * slots for _ in arrays]
        elif [a.dtype.str for a in arrays] != self.dtypes or len(arrays) != len(self.dtypes):
            raise TypeError(f"{self.store.label}: element {i} has dtypes {[a.dtype.str for a in arrays]}, "
                            f"the first had {self.dtypes}; a disk cache needs one structure and dtype per component")
        for j, a in enumerate(arrays):
            pad = (-self.pos) % _ALIGN
            if pad:
                self.f.write(b"\0" * pad)
                self.pos += pad
            if i == len(self.offsets[j]):
                self.offsets[j].append(self.pos)
                self.shapes[j].append(a.shape)
            else:
                self.offsets[j][i] = self.pos
                self.shapes[j][i] = a.shape
            self.f.write(a.data if a.ndim else a.tobytes())
            self.pos += a.nbytes
        self.count += 1
        return el

    @property
    def nbytes(self) -> int:
        return self.pos

    def commit(self) -> None:
        self.store.filling = None
        self.f.close()
        index: dict[str, Any] = {}
        for j in range(len(self.offsets)):
            ndim = len(self.shapes[j][0]) if self.shapes[j] else 0
            index[f"offset{j}"] = np.asarray(self.offsets[j], np.int64)
            index[f"shape{j}"] = np.asarray(self.shapes[j], np.int64).reshape(len(self.shapes[j]), ndim)
        np.savez(os.path.join(self.tmp, "index.npz"), **index)
        meta = {"version": _VERSION, "fingerprint": self.store.fingerprint, "count": self.count, "bytes": self.pos,
                "dtypes": self.dtypes or [], "tree": self.tree or {"t": []}, "max_side": self.store.max_side}
        with open(os.path.join(self.tmp, "meta.json"), "w") as f:
            json.dump(meta, f)
        final = self.path
        import shutil  # here, not at import: NOTE [ What import costs ] in loaderlib/__init__.py

        if os.path.exists(final):
            old = final + f".old-{os.getpid()}"
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(self.tmp, final)
        self.store._meta = None
        self.store.ready()
        self.store.note = f"complete: {self.count} elements, {self.pos} bytes at {final} (memory-mapped)"

    def abort(self) -> None:
        self.store.filling = None
        import shutil  # here, not at import: NOTE [ What import costs ] in loaderlib/__init__.py

        try:
            self.f.close()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


class CacheNode(ops.Unary):
    """The ``cache`` step (NOTE [ Pipeline cache ])."""

    def __init__(self, up: ops.Node, label: str, store: CacheStore) -> None:
        super().__init__(up, label)
        self.store = store

    def what(self) -> str:
        s = self.store
        where = "in memory" if s.path is None else f"on disk at {s.path}"
        return f"{where}{'' if s.max_side is None else f', images reduced to max_side={s.max_side}'}: {s.note}"

    def describe(self) -> list:
        if self.store.ready():
            return [(self.label, "cache", f"replays the cached elements; upstream does not run ({self.what()})")]
        return super().describe()

    def open(self) -> Iterator:
        store = self.store
        if store.ready():
            yield from store.read()
            return
        with store._lock:
            fill = not store.writing and not store.over_budget
            store.writing = store.writing or fill
        w = store.writer() if fill else None
        it = self.up.open()
        done = False
        try:
            for el in it:
                el = store.prepare(el)
                yield w.add(el) if w is not None else el
            done = True
        finally:
            ops.close(it)
            if w is not None:
                try:
                    if done:
                        w.commit()
                    else:
                        w.abort()
                finally:
                    store.writing = False


class CacheFill(ops.Unary):
    """The pass of an engine stage over a :class:`CachedImages` that fills its cache
    (NOTE [ Filling through the engine ])."""

    def __init__(self, head: ops.Node, label: str, images: CachedImages) -> None:
        super().__init__(head, label)
        self.images = images

    def describe(self) -> list:
        return self.up.describe()

    def open(self) -> Iterator:
        self.images.begin()
        done = False
        it = self.up.open()
        try:
            yield from it
            done = True
        finally:
            try:
                ops.close(it)
            finally:
                self.images.end(done)


class CachedImages(Dataset):
    """A cache of ``(HWC uint8 image, int label)`` (or image) elements as a dataset whose images
    the native engine transforms straight from memory (NOTE [ Cached pixels ]); given the
    ``source`` it caches, it also fills the cache (NOTE [ Filling through the engine ]).

    NOTE [ Cached pixels ]
    Once a cache of decoded images is complete, the steps after it (index steps, loaderlib
    transforms, batch) are compiled like a pipeline head (NOTE [ Pipeline compilation ] in
    ``pipeline.py``) on a source of kind ``"pixels"``: the fused chain runs on the cached
    pixels in one kernel pass per batch (``ll_chain_run_pixels``: the same stages and keyed
    randomness as from a JPEG, without the decode), straight into the batch arena. The
    output equals the transforms applied step by step to the cached image.

    NOTE [ Filling through the engine ]
    A ``cache`` right after an image source (a folder, an image list, record files) is filled
    by the same engine stage that later replays it: the pass that fills it runs the steps after
    the cache on this dataset too, and for each batch :meth:`images` reads the samples not held
    yet, decodes them at full resolution in one parallel ``decode_batch`` call on the kernel
    threads (the decoder ``dataset[i]`` uses, so the pixels are the same), stores them (reduced
    to ``max_side`` if asked) and hands them to the fused chain. No element goes through Python
    one by one, so the filling epoch costs a full decode plus the pixel chain. That is more than
    the uncached fused chain, whose crop-window, DCT-scaled decode a full-resolution cache cannot
    use: on photos of about 500x375 px, one thread, 0.87 ms (full decode) + 0.60 ms (pixel chain)
    per image against 1.17 ms; ``benchmarks/pipeline.py`` (b) ran the filling epoch at 0.63x to
    0.72x an uncached epoch (2 shared cores), where the per-element path it replaces ran at 0.43x
    to 0.51x. Elements may come
    in any order (a ``shuffle`` after the cache): the writer records where each one goes. The
    pass that completes with every element held commits the cache (NOTE [ Pipeline cache ]); a
    pass that stops early, fails or runs over ``ram_budget`` leaves nothing, and later passes
    still decode on demand, as the uncached pipeline would. The output is the replay's: the
    transforms keyed by ``(seed, iteration, sample index)`` on the decoded image, equal to the
    uncached native pipeline's.

    Parameters
    ----------
    store : CacheStore
        The cache.
    labelled : bool
        Whether a complete cache's elements are ``(image, label)`` (with ``source``, the
        source's labels say).
    source : dataset, optional
        The image source the cache is filled from (an ``ImageFolderDataset``,
        ``ImageListDataset`` or ``RecordFileDataset``: ``read(i)``, ``source(i)``, ``labels``).
    """

    def __init__(self, store: CacheStore, labelled: bool, source: Any = None) -> None:
        self.store = store
        self.upstream = source
        self.complete = source is None or store.ready()
        if source is not None:
            self.n = len(source)
            self.labels = None if source.labels is None else np.asarray(source.labels, np.int64)
        else:
            self.n = len(store)
            self.labels = None
            if labelled:
                self.labels = np.asarray([int(store.element(i)[1]) for i in range(self.n)], np.int64)
        self._lock = threading.Lock()
        self._passes = 0
        self._writer: _MemoryWriter | _DiskWriter | None = None
        self._held: np.ndarray | None = None

    def __len__(self) -> int:
        return self.n

    def native_source(self) -> NativeSource:
        """PIXELS: the fused chain runs on the cached images (NOTE [ Cached pixels ])."""
        return NativeSource(SourceKind.PIXELS, stage=f"{self!r}: decoded pixels in memory, no decode", dataset=self,
                            labels=self.labels, description=repr(self))

    def __getitem__(self, i: int) -> Any:
        i = int(i)
        if self.complete:
            el = self.store.element(i)
            return (el[0], int(el[1])) if self.labels is not None else el
        img = self._decode([i], 1)[0]
        return (img, int(self.labels[i])) if self.labels is not None else img

    def images(self, indices: list, num_threads: int = 1) -> list:
        """The images of ``indices``: the cached ones (not copied), or while filling, decoded
        on ``num_threads`` threads and stored (NOTE [ Filling through the engine ])."""
        if not self.complete:
            return self._decode(indices, num_threads)
        if self.labels is None:
            return [self.store.element(i) for i in indices]
        return [self.store.element(i)[0] for i in indices]

    def source(self, i: int) -> str | None:
        where = f"{self.store.label}, element {int(i)}"
        return where if self.upstream is None else f"{where} ({self.upstream.source(int(i))})"

    # -- filling (NOTE [ Filling through the engine ]) --------------------------------------
    def begin(self) -> None:
        """A pass over the source starts; the first one while the cache is open gets a writer."""
        with self._lock:
            self._passes += 1
            if self.complete or self.store.ready():
                self.complete = True
                return
            if self._writer is None and not self.store.over_budget:
                self._writer = self.store.writer(self.n)
                self._held = np.zeros(self.n, bool)
                self.store.writing = True

    def end(self, done: bool) -> None:
        """A pass ended (``done``: it ran to its end). The cache is committed once it holds every
        element at the end of a pass, and dropped when no pass is left to complete it."""
        with self._lock:
            self._passes -= 1
            w = self._writer
            if w is None:
                return
            if done and not w.given_up and w.count == self.n:
                w.commit()
                self.complete = True
            elif self._passes and not w.given_up:
                return
            else:
                w.abort()
                if not self.store.over_budget:
                    self.store.note = "empty: fills on the first full pass"
            self._writer = None
            self._held = None
            self.store.writing = False

    def _decode(self, indices: list, num_threads: int) -> list:
        src = self.upstream
        idx = [int(i) for i in indices]
        res = decode_batch([src.read(i) for i in idx], num_threads=max(1, min(num_threads, len(idx))),
                           sources=[src.source(i) for i in idx], on_error="return")
        if res.errors:
            j = min(res.errors)
            raise DecodeError(res.errors[j].reason, idx[j], src.source(idx[j]))
        out = []
        for i, img in zip(idx, res.images):
            el = self.store.prepare((img, int(self.labels[i])) if self.labels is not None else img)
            out.append(self._keep(i, el))
        return out

    def _keep(self, i: int, el: Any) -> np.ndarray:
        """Hand element ``i`` to the writer (once); its image."""
        with self._lock:
            w, held = self._writer, self._held   # set together (begin, end)
            if w is not None and held is not None and not held[i]:
                el = w.put(i, el, owned=True)
                if not w.given_up:
                    held[i] = True
        return el[0] if self.labels is not None else el

    def reading(self) -> str:
        """What reading a sample does now (``explain()``)."""
        if self.complete:
            where = "" if self.store.path is None else f" (memory-mapped from {self.store.path})"
            return f"{self!r}: decoded pixels in memory{where}, no decode"
        return (f"{self!r}: each image read and decoded once at full resolution (libjpeg-turbo, one parallel call "
                "per batch) into the cache, then the steps below run on its pixels")

    def __repr__(self) -> str:
        if not self.complete:
            return f"CachedImages({self.store.label}: filling from {self.upstream!r})"
        return f"CachedImages({self.store.label}: {self.n} decoded images)"
