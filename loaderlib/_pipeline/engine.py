"""The engine stage of a Pipeline: sources, the private DataLoader that runs a pipeline's
head, and the head node (NOTE [ Pipeline compilation ] in ``pipeline.py``)."""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import numpy as np

from .. import transforms as T
from .._datasets.base import Dataset
from .._engines.base import LoaderIterator, RunState, WarmStart
from .._extract.source import NativeSource, native_source_of
from .._tree import tree_leaves, tree_map
from ..loader import DataLoader
from ..sampler import EpochOrder
from . import mix, ops
from .options import PipelineOptions
from .plan import PipelineLike, PipelineView
from .spec import relax, spec_of

#: Steps that keep the element count (a resume can skip inside the engine stage below them).
COUNT_KEEPING = (ops.Map, ops.Prefetch)


class _Source:
    """Where a pipeline's elements come from."""

    indexable = True
    native = False

    def __init__(self, kind: str, dataset: Any = None, *, make: Callable | None = None, what: str = "",
                 parts: Sequence[PipelineView] | None = None, keys: Any = None, mix: dict | None = None) -> None:
        self.kind = kind
        self.dataset = dataset
        self.make = make
        self.what = what
        self.parts = list(parts) if parts is not None else None
        self.keys = keys
        self.mix = mix or {}   # sample/choose: weights, seed, stop, choices (NOTE [ Mixing pipelines ])
        self._peeked: list | None = None
        self._lock = threading.Lock()
        if kind in ("iterable", "zip", "sample", "choose"):
            self.indexable = False

    def fingerprint(self) -> Any:
        """What identifies the source's data (files with sizes and mtimes; array digests)."""
        ds = self.dataset
        if self.kind in ("zip", "sample", "choose"):
            extra = ([self.mix["choices"]._fingerprint()] if self.kind == "choose" else
                     [list(map(float, self.mix["weights"])), self.mix["seed"]] if self.kind == "sample" else [])
            return [self.kind, [p._fingerprint() for p in self._parts()], *extra, self.mix.get("stop")]
        paths = getattr(ds, "paths", None)
        if paths is not None:
            files = []
            for p in paths:
                try:
                    st = os.stat(p)
                    files.append([os.fspath(p), st.st_size, st.st_mtime_ns])
                except OSError:
                    files.append([os.fspath(p), -1, -1])
            return [type(ds).__name__, files]
        arrays = getattr(ds, "arrays", None)
        if arrays is not None and all(isinstance(a, np.ndarray) for a in arrays):
            import hashlib  # here, not at import: NOTE [ What import costs ] in loaderlib/__init__.py

            return [type(ds).__name__, [[list(a.shape), a.dtype.str,
                                         hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()]
                                        for a in arrays]]
        n = len(ds) if ds is not None and hasattr(ds, "__len__") else None
        return [self.kind, self.what, n]

    def spec(self) -> Any:
        ds = self.dataset
        if self.kind == "zip":
            specs = [p.element_spec for p in self._parts()]
            return tuple(specs) if self.keys is None else dict(zip(self.keys, specs))
        if self.kind in ("sample", "choose"):
            parts = self._parts()
            spec = parts[0].element_spec
            for k, p in enumerate(parts[1:], 1):
                spec = relax(spec, p.element_spec, f"{self.what}: pipeline {k}'s element spec differs from pipeline 0's: ")
            return spec
        # Each dataset answers for its items (Dataset.element_spec), as for its native source.
        described = getattr(ds, "element_spec", None)
        spec = described() if callable(described) else None
        if spec is not None:
            return spec
        first = self.first()
        if first is ops.EMPTY:
            raise ValueError(f"source {self.what}: the element spec cannot be traced from an empty source")
        return spec_of(first)

    def first(self) -> Any:
        """The first element (traced once; a one-shot iterator keeps it for its first pass)."""
        if self.indexable:
            return self.dataset[0] if len(self.dataset) else ops.EMPTY
        with self._lock:
            if self._peeked is None:
                it = self._make()
                try:
                    self._peeked = [next(it), it]
                except StopIteration:
                    self._peeked = [ops.EMPTY, None]
            return self._peeked[0]

    def node(self, ctx: ops.Context) -> ops.Node:
        if self.kind == "zip":
            return ops.Zip(self._parts(), "tuple" if self.keys is None else list(self.keys), ctx)
        if self.kind == "sample":
            return mix.SampleFrom(self._parts(), self.mix["weights"], self.mix["seed"], self.mix["stop"], ctx)
        if self.kind == "choose":
            return mix.ChooseFrom(self._parts(), self.mix["choices"], self.mix["stop"], ctx)
        if not self.indexable:
            return ops.IterableSource(self._open_iterable, self.what)
        ds = self.dataset
        return ops.IterableSource(lambda: (ds[i] for i in range(len(ds))), f"{self.what}: dataset[i] in order")

    def _open_iterable(self) -> Iterator:
        with self._lock:
            peeked, self._peeked = self._peeked, None
        if peeked is not None and peeked[1] is not None and self.one_shot:
            return itertools.chain([peeked[0]], peeked[1])
        if peeked is not None and peeked[0] is ops.EMPTY and self.one_shot:
            return iter(())
        return self._make()

    def _parts(self) -> list[PipelineView]:
        """A zip's pipelines (a zip source is made with ``parts``)."""
        assert self.parts is not None
        return self.parts

    def _make(self) -> Iterator:
        """A fresh iterator of an iterable source (made with ``make``)."""
        assert self.make is not None
        return self.make()

    @property
    def one_shot(self) -> bool:
        return self.kind == "iterable" and self.dataset is not None and iter(self.dataset) is self.dataset



def _decodes(ds: Any) -> bool:
    """Whether reading an element of ``ds`` decodes an image (worth the engine's threads)."""
    src = native_source_of(ds)
    return src is not None and src.decodes


class _Numbered(Dataset):
    """``base`` read with virtual indices (NOTE [ Virtual indices ] in ``_extract/source.py``): item ``v``
    is ``base[v % n]``, and its native source says so, so the DataLoader a Pipeline's head
    builds reads the right samples without being patched."""

    def __init__(self, base: Any) -> None:
        self.base = base
        self.n = len(base)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, v: int) -> Any:
        return self.base[int(v) % self.n]

    def source(self, v: int) -> str | None:
        return self.base.source(int(v) % self.n)

    def native_source(self) -> NativeSource | None:
        src = native_source_of(self.base)
        return None if src is None else src.with_wrap(self.n)

    def __repr__(self) -> str:
        return repr(self.base)


# --------------------------------------------------------------------------- the head


class _Keyed:
    """A map-style dataset with the head's maps applied, for the threads engine: item ``v``
    is source sample ``v % n`` (NOTE [ Virtual indices ] in ``_extract/source.py``) and each
    loaderlib transform's randomness is keyed by ``(seed, iteration, v)``."""

    def __init__(self, base: Any, maps: list, seed: int, iteration: int, labels: list) -> None:
        self.base = base
        self.n = len(base)
        self.maps = maps
        self.seed = seed
        self.iteration = iteration
        self.labels = labels

    def __len__(self) -> int:
        return self.n

    def source(self, v: int) -> str | None:
        src = getattr(self.base, "source", None)
        if callable(src):
            try:
                return src(int(v) % self.n)
            except Exception:  # noqa: BLE001
                return None
        return None

    def __getitem__(self, v: int) -> Any:
        el = self.base[int(v) % self.n]
        ctx = ops.Context(self.seed, self.iteration)
        for fn, label in zip(self.maps, self.labels):
            try:
                el = ops.apply_map(fn, el, ctx, int(v))
            except Exception as e:
                ops.annotate(e, label)
                raise
        return el


def _listify(samples: list) -> list:
    return samples


class _Engine:
    """The private DataLoader that runs a pipeline's head, kept across iterations (its arena,
    kernel plan and Python pool are reused)."""

    def __init__(self, base: Any, maps: list, labels: list, batch: int | None, opts: PipelineOptions,
                 seed: int) -> None:
        self.base = base
        self.maps = maps
        self.labels = labels
        self.n = len(base)
        self.unbatch = batch is None
        self.batch_size = batch if batch is not None else 64
        kw: dict[str, Any] = {"batch_size": self.batch_size, "seed": seed, "num_threads": opts.num_threads,
                              "prefetch": opts.prefetch, "timeout": None, "io_depth": opts.io_depth}
        self.keyed = True
        self._warm = WarmStart()   # (iteration, order) -> the iteration's first segment
        loader = None
        src = native_source_of(base)
        if src is not None and all(isinstance(m, T.Transform) for m in maps):
            if maps and not src.gathered:
                cand = _Numbered(base).transform_first(T.Compose(list(maps)))
            elif not maps:
                cand = _Numbered(base)
            else:
                cand = None
            if cand is not None:
                loader = DataLoader(cand, **kw)
                a = loader._analysis
                if a.engine == "native" or (a.hybrid is not None and batch is not None):
                    self.keyed = False
                else:
                    loader.close()
                    loader = None
        if loader is None:
            workers = int(opts.num_workers or 0)
            if workers and any(getattr(m, "random", False) for m in maps):
                bad = next(lab for m, lab in zip(maps, labels) if getattr(m, "random", False))
                raise ValueError(f"{bad}: a random loaderlib transform cannot run in worker processes here (its "
                                 "randomness is keyed by the iteration, which workers do not see): use num_workers=0 "
                                 "(threads) or move it into a fused native map")
            loader = DataLoader(_Keyed(base, maps, seed, 0, labels), batchify_fn=None if batch else _listify,
                                num_workers=workers, **kw)
        self.loader = loader

    @property
    def engine(self) -> str:
        return self.loader.engine

    def warm(self, order: EpochOrder, iteration: int) -> None:
        """Start the next iteration's first segment now (NOTE [ Warm iterations ])."""
        self._warm.put((iteration, order), self.run(order, iteration, 0, 0))

    def take_warm(self, iteration: int, order: EpochOrder) -> LoaderIterator | None:
        """The warm run if it is exactly this iteration's first segment, else None."""
        return self._warm.take(lambda k, _run: (k[0] == iteration and k[1].targets == order.targets
                                                and np.array_equal(k[1].stream, order.stream)))

    def drop_warm(self) -> None:
        self._warm.drop()

    def run(self, order: EpochOrder, iteration: int, delivered: int, position: int) -> LoaderIterator:
        ld = self.loader
        if self.keyed:
            ld.dataset = _Keyed(self.base, self.maps, ld.seed, iteration, self.labels)
        return LoaderIterator(ld._new_run(RunState(order, ld.seed, delivered=delivered, position=position)))

    def close(self) -> None:
        self.drop_warm()
        self.loader.close()


class _Head(ops.Node):
    """Source + index steps + maps (+ batch) on the DataLoader engine (NOTE [ Pipeline compilation ])."""

    def __init__(self, engine: _Engine, index_nodes: Callable[[ops.Node], ops.Node] | None, n: int,
                 iteration: int, drop_remainder: bool, label: str, rows: list, prefetch: str | None) -> None:
        self.engine = engine
        self.index_nodes = index_nodes
        self.n = n
        self.iteration = iteration
        self.drop_remainder = drop_remainder
        self.label = label
        self.rows = rows
        self.prefetch = prefetch
        self.start = 0   # outputs (batches, or rows when unbatched) to skip (NOTE [ Pipeline resume ])
        self.warm_next: Callable[[], None] | None = None   # NOTE [ Warm iterations ] in pipeline.py

    def describe(self) -> list:
        ld = self.engine.loader
        a = ld._analysis
        reason = a.reason
        stages = [(f"  {stage}", kind, detail) for stage, kind, detail in a.stages]
        if self.engine.keyed:
            # The loader sees one Python dataset (_Keyed): name the maps it applies instead, each
            # by its step and qualified name (NOTE [ Naming Python steps ] in _loader/analysis.py).
            maps = list(zip(self.engine.labels, self.engine.maps))
            py = [label for label, fn in maps if not isinstance(fn, T.Transform)]
            tail = reason.split("; ", 1)[1] if "; " in reason else ""
            if py:
                reason = f"{', '.join(py)} {'is' if len(py) == 1 else 'are'} Python code" + (f"; {tail}" if tail else "")
            rows = [("  read", "python", f"{self.engine.base!r}: element i, then the map steps, per element")]
            rows += [("  transform", "native" if isinstance(fn, T.Transform) else "python",
                      f"{label}, per element" + (" (a kernel called from Python)" if isinstance(fn, T.Transform)
                                                 else " (Python code)")) for label, fn in maps]
            collate = [r for r in stages[1:] if r[0] == "  collate"]
            if self.engine.unbatch:
                collate = []   # no batch step: elements go on one by one (the unbatch row below)
            stages = rows + collate
        out = [(f"engine: {a.engine}", a.engine, f"{self.label}: {reason}")]
        reading = getattr(self.engine.base, "reading", None)
        if reading is not None and a.engine == "native" and stages and stages[0][0] == "  read":
            stages[0] = (stages[0][0], stages[0][1], reading())   # a cache filling or complete (NOTE [ Cached pixels ])
        index = [(f"  {r}", "native", "on sample indices, before loading") for r in self.rows]
        out += stages[:1] + index + stages[1:]
        if self.prefetch is not None:
            what = f"the engine's queue keeps {ld.prefetch} batches ready (driver thread)"
            out.append((f"  {self.prefetch}", "native", what))
        if self.engine.unbatch:
            out.append(("  unbatch", "python", f"engine batches of {self.engine.batch_size} split into elements"))
        return out

    def _stream_chunks(self) -> Generator[np.ndarray, None, None]:
        n = self.n
        if self.index_nodes is None:
            yield np.arange(n, dtype=np.int64)
            return
        src = _IndexSource(n)
        it = self.index_nodes(src).open()
        chunk = max(n, 4 * self.engine.batch_size, 4096)
        try:
            while True:
                a = np.fromiter(itertools.islice(it, chunk), np.int64)
                if a.size == 0:
                    return
                yield a
        finally:
            ops.close(it)

    def segments(self) -> Generator[tuple[EpochOrder, bool], None, None]:
        """The pass as ``(EpochOrder, last)`` segments of whole batches; a segment's tail that
        fills no batch is carried into the next one, so batches cross chunk boundaries."""
        b = self.engine.batch_size
        empty = np.zeros(0, np.int64)
        carry = empty
        chunks = self._stream_chunks()
        nxt = next(chunks, None)
        try:
            while nxt is not None:
                cur, nxt = nxt, next(chunks, None)
                stream = np.concatenate([carry, cur]) if carry.size else cur
                last = nxt is None
                full = stream.size // b
                rest = stream.size - full * b
                targets = [b] * full
                if last and rest and (self.engine.unbatch or not self.drop_remainder):
                    targets.append(rest)
                carry = empty if last else stream[full * b:]
                if not last:
                    stream = stream[:full * b]
                yield EpochOrder(self.iteration, stream, targets, False, empty, empty, {}), last
        finally:
            chunks.close()

    def open(self) -> Iterator:
        b = self.engine.batch_size
        skip_rows = self.start % b if self.engine.unbatch else 0
        skip = self.start // b if self.engine.unbatch else self.start
        first = True
        segments = self.segments()
        try:
            for order, last in segments:
                targets = order.targets
                if skip >= len(targets):
                    skip -= len(targets)
                    first = False
                    continue
                it = self.engine.take_warm(self.iteration, order) if first and not skip else None
                if it is None:
                    it = self.engine.run(order, self.iteration, skip, skip * b)
                first = False
                skip = 0
                warm_next = self.warm_next if last else None
                try:
                    for batch in it:
                        if warm_next is not None and it._run.state.exhausted:
                            warm_next()   # NOTE [ Warm iterations ]
                            warm_next = None
                        if not self.engine.unbatch:
                            yield batch
                            continue
                        rows = batch if isinstance(batch, list) else _rows(batch)
                        yield from rows[skip_rows:]
                        skip_rows = 0
                finally:
                    it.close()
        finally:
            segments.close()


def _top_head(node: ops.Node) -> _Head | None:
    """The engine stage that feeds ``node`` through count-keeping steps only, if any."""
    while isinstance(node, COUNT_KEEPING):
        node = node.up
    return node if isinstance(node, _Head) else None


def _warm_caller(pipe: PipelineLike, iteration: int) -> Callable[[], None]:
    ref = weakref.ref(pipe)

    def call() -> None:
        p = ref()
        if p is not None:
            p._warm_iteration(iteration)

    return call


def _rows(batch: Any) -> list:
    parts = tree_leaves(batch)
    n = len(parts[0])
    return [tree_map(lambda x, k=k: x[k], batch) for k in range(n)]


class _IndexSource(ops.Node):
    """Sample indices of one pass; pass k numbers sample i as ``k * n + i`` (NOTE [ Virtual indices ])."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.opens = 0

    def open(self) -> Iterator:
        base = self.opens * self.n
        self.opens += 1
        return iter(range(base, base + self.n))
