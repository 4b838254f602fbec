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
feeds the native engine directly (NOTE [ Cached pixels ]).

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
import shutil
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import _pipeline_ops as ops
from ._pipeline_spec import leaves, map_structure
from .datasets import Dataset

__all__ = ["CacheNode", "CacheStore", "CachedImages"]

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
    from .transforms import _resize

    s = max_side / max(h, w)
    return _resize(np.ascontiguousarray(x), max(1, round(h * s)), max(1, round(w * s)), "area", False)


def _copy(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        y = np.array(x, copy=True)
        y.flags.writeable = False
        return y
    return x


def _nbytes(el: Any) -> int:
    return sum(x.nbytes if isinstance(x, np.ndarray) else 8 for x in leaves(el))


def _treedef(el: Any) -> Any:
    counter = iter(range(1 << 30))
    if isinstance(el, dict):
        return {"d": [[k, _sub(v, counter)] for k, v in el.items()]}
    return _sub(el, counter)


def _sub(el: Any, counter: Iterator) -> Any:
    if isinstance(el, dict):
        return {"d": [[k, _sub(v, counter)] for k, v in el.items()]}
    if isinstance(el, tuple):
        return {"t": [_sub(v, counter) for v in el]}
    if isinstance(el, list):
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

    def read(self) -> Iterator:
        if self.path is None:
            yield from self._elements
            return
        for i in range(len(self)):
            yield self.element(i)

    def element(self, i: int) -> Any:
        """Cached element ``i`` (memory: the kept copy; disk: views of the mapped file)."""
        if self.path is None:
            return self._elements[i]
        meta, idx, mm = self._meta, self._index, self._mm
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
            return len(self._elements)
        return int(self._meta["count"])

    # -- writing ---------------------------------------------------------------------
    def prepare(self, el: Any) -> Any:
        return el if self.max_side is None else map_structure(lambda x: reduce_image(x, self.max_side), el)

    def writer(self) -> _MemoryWriter | _DiskWriter:
        return _MemoryWriter(self) if self.path is None else _DiskWriter(self)

    def info(self) -> dict:
        """What the cache holds (``Pipeline.cache_info()``)."""
        if self.path is None:
            els = self._elements
            return {"step": self.label, "kind": "memory", "path": None, "max_side": self.max_side,
                    "complete": els is not None, "elements": 0 if els is None else len(els),
                    "bytes": 0 if els is None else sum(_nbytes(e) for e in els), "ram_budget": self.ram_budget,
                    "note": self.note}
        ready = self.ready()
        meta = self._meta or {}
        return {"step": self.label, "kind": "disk", "path": self.path, "max_side": self.max_side, "complete": ready,
                "elements": meta.get("count", 0), "bytes": meta.get("bytes", 0), "ram_budget": self.ram_budget,
                "note": self.note}


class _MemoryWriter:
    def __init__(self, store: CacheStore) -> None:
        self.store = store
        self.items: list | None = []
        self.nbytes = 0

    def add(self, el: Any) -> Any:
        if self.items is None:
            return el
        kept = map_structure(_copy, el)
        self.nbytes += _nbytes(kept)
        budget = self.store.ram_budget
        if budget is not None and self.nbytes > budget:
            self.store.note = (f"not cached: the elements passed ram_budget={budget} bytes after "
                               f"{len(self.items)} elements; the pipeline runs uncached")
            self.store.over_budget = True
            self.items = None
            return el
        self.items.append(kept)
        return kept

    def commit(self) -> None:
        if self.items is not None:
            self.store._elements = self.items
            self.store.note = f"complete: {len(self.items)} elements, {self.nbytes} bytes in memory"

    def abort(self) -> None:
        self.items = None


class _DiskWriter:
    def __init__(self, store: CacheStore) -> None:
        self.store = store
        parent = os.path.dirname(os.path.abspath(store.path))
        os.makedirs(parent, exist_ok=True)
        self.tmp = tempfile.mkdtemp(prefix=os.path.basename(store.path) + ".tmp-", dir=parent)
        self.f = open(os.path.join(self.tmp, "data.bin"), "wb")  # noqa: SIM115 - closed in commit/abort
        self.pos = 0
        self.count = 0
        self.tree: Any = None
        self.dtypes: list | None = None
        self.offsets: list[list[int]] = []
        self.shapes: list[list[tuple]] = []

    def add(self, el: Any) -> Any:
        parts = leaves(el)
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
            self.offsets = [[] for _ in arrays]
            self.shapes = [[] for _ in arrays]
        elif [a.dtype.str for a in arrays] != self.dtypes or len(arrays) != len(self.dtypes):
            raise TypeError(f"{self.store.label}: element {self.count} has dtypes {[a.dtype.str for a in arrays]}, "
                            f"the first had {self.dtypes}; a disk cache needs one structure and dtype per component")
        for j, a in enumerate(arrays):
            pad = (-self.pos) % _ALIGN
            if pad:
                self.f.write(b"\0" * pad)
                self.pos += pad
            self.offsets[j].append(self.pos)
            self.shapes[j].append(a.shape)
            self.f.write(a.tobytes())
            self.pos += a.nbytes
        self.count += 1
        return el

    def commit(self) -> None:
        self.f.close()
        index = {}
        for j in range(len(self.offsets)):
            ndim = len(self.shapes[j][0]) if self.shapes[j] else 0
            index[f"offset{j}"] = np.asarray(self.offsets[j], np.int64)
            index[f"shape{j}"] = np.asarray(self.shapes[j], np.int64).reshape(len(self.shapes[j]), ndim)
        np.savez(os.path.join(self.tmp, "index.npz"), **index)
        meta = {"version": _VERSION, "fingerprint": self.store.fingerprint, "count": self.count, "bytes": self.pos,
                "dtypes": self.dtypes or [], "tree": self.tree or {"t": []}, "max_side": self.store.max_side}
        with open(os.path.join(self.tmp, "meta.json"), "w") as f:
            json.dump(meta, f)
        final = self.store.path
        if os.path.exists(final):
            old = final + f".old-{os.getpid()}"
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(self.tmp, final)
        self.store._meta = None
        self.store.ready()
        self.store.note = f"complete: {self.count} elements, {self.pos} bytes at {final} (memory-mapped)"

    def abort(self) -> None:
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


class CachedImages(Dataset):
    """A complete cache of ``(HWC uint8 image, int label)`` (or image) elements as a dataset
    whose images the native engine transforms straight from memory (NOTE [ Cached pixels ]).

    NOTE [ Cached pixels ]
    Once a cache of decoded images is complete, the steps after it (index steps, loaderlib
    transforms, batch) are compiled like a pipeline head (NOTE [ Pipeline compilation ] in
    ``pipeline.py``) on a source of kind ``"pixels"``: the fused chain runs on the cached
    pixels in one kernel pass per batch (``ll_chain_run_pixels``: the same stages and keyed
    randomness as from a JPEG, without the decode), straight into the batch arena. The
    output equals the transforms applied step by step to the cached image.
    """

    native_pixels = True

    def __init__(self, store: CacheStore, labelled: bool) -> None:
        self.store = store
        self.n = len(store)
        self.labels = None
        if labelled:
            self.labels = np.asarray([int(store.element(i)[1]) for i in range(self.n)], np.int64)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        el = self.store.element(int(i))
        return (el[0], int(el[1])) if self.labels is not None else el

    def images(self, indices: list) -> list:
        """The cached images of ``indices`` (not copied)."""
        if self.labels is None:
            return [self.store.element(i) for i in indices]
        return [self.store.element(i)[0] for i in indices]

    def source(self, i: int) -> str | None:
        return f"{self.store.label}, element {int(i)}"

    def __repr__(self) -> str:
        return f"CachedImages({self.store.label}: {self.n} decoded images)"
