"""The DataLoader: picks an engine for a dataset, transform chain and batchify function.

Engines (see DESIGN.md):

* ``native``: the dataset's bytes, every transform and collation run in nogil kernels, one
  parallel pass per batch, straight into an arena slot. Zero Python per sample.
* ``threads``: some step is Python. For image datasets, the longest native prefix of the
  chain still runs in the kernels (one pass per batch) and only the Python tail, the
  ``.transform(fn)`` layers and a user batchify function run on a Python thread pool; other
  datasets are loaded by ``dataset[i]`` on the pool (loaderlib's decoder and transforms
  called there release the GIL).
* ``processes``: ``num_workers > 0`` with Python steps; persistent worker processes write
  batches into shared-memory arena slots.

``loader.explain()`` says, stage by stage, what runs natively and why the engine was chosen.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _threads
from ._engine_base import LoaderIterator, _EpochPlan, _Knobs, _Run
from ._engine_local import HybridProducer, NativeProducer, NativeSource, ThreadsProducer
from .arena import BatchArena
from .batchify import Stack, Tuple, default_batchify_fn
from .datasets import (
    ArrayDataset,
    ImageFolderDataset,
    ImageListDataset,
    RecordFileDataset,
    SimpleDataset,
    _TransformDataset,
)
from .sampler import (
    LAST_BATCH_MODES,
    BatchSampler,
    RandomSampler,
    SequentialSampler,
    ShardedSampler,
    draw_seed,
)

__all__ = ["DataLoader", "LoaderIterator"]

ENGINES = ("native", "threads", "processes")


def _make_recorder(enabled: bool) -> Any:
    from .profiling.recorder import StageRecorder

    return StageRecorder(enabled=enabled)


@dataclass
class _Analysis:
    engine: str
    reason: str
    stages: list = field(default_factory=list)     # (stage, "native"/"python", detail)
    native_source: NativeSource | None = None
    chain: Any = None                              # the transform spec handed to compile_chain
    shards: tuple | None = ()
    hybrid: dict | None = None                     # threads engine after a native prefix
    plan: Any = None                               # the compiled plan (lent to the first iterator)


def _describe(fn: Any) -> str:
    r = repr(fn)
    return r if len(r) <= 80 else r[:77] + "..."


def _unwrap(dataset: Any) -> tuple[Any, list]:
    """Peel transform layers: (base dataset, [(is_first, fn), ...] innermost first)."""
    layers: list = []
    ds = dataset
    while isinstance(ds, _TransformDataset):
        layers.append((ds.first, ds.fn))
        ds = ds.base
    layers.reverse()
    return ds, layers


def _steps(fns: list) -> list:
    from . import transforms as T

    out: list = []
    for fn in fns:
        out.extend(fn.steps if isinstance(fn, T.Compose) else [fn])
    return out


def _native_prefix(steps: list) -> tuple[int, Any]:
    """Longest prefix of ``steps`` that compiles to a plan with a fixed sample shape."""
    from . import transforms as T
    from .pipeline import compile_chain

    for k in range(len(steps), 0, -1):
        head = steps[:k]
        if not all(isinstance(t, T.Transform) for t in head):
            continue
        try:
            plan = compile_chain(T.Compose(head))
        except (TypeError, ValueError):
            continue
        if plan is not None and plan.sample_shape is not None:
            return k, plan
    return 0, None


def _is_native_batchify(fn: Any, nparts: int) -> tuple | None:
    """num_shards per output part if ``fn`` collates natively, else None."""
    if fn is None or fn is default_batchify_fn:
        return (None,) * nparts
    if isinstance(fn, Stack) and fn.dtype is None and nparts == 1:
        return (fn.num_shards,)
    if isinstance(fn, Tuple) and len(fn.fns) == nparts:
        out = []
        for f in fn.fns:
            if f is default_batchify_fn:
                out.append(None)
            elif isinstance(f, Stack) and f.dtype is None:
                out.append(f.num_shards)
            else:
                return None
        return tuple(out)
    return None


def _analyze(dataset: Any, batchify_fn: Any, num_workers: int) -> _Analysis:
    stages: list = []
    base, layers = _unwrap(dataset)
    nfirst = 0
    while nfirst < len(layers) and layers[nfirst][0]:
        nfirst += 1
    firsts = [fn for _, fn in layers[:nfirst]]
    others = [fn for _, fn in layers[nfirst:]]
    ordered = all(not first for first, _ in layers[nfirst:])   # transform_first layers innermost
    fallback = "processes" if num_workers > 0 else "threads"
    why_py: list[str] = []
    src: NativeSource | None = None
    nparts = 0

    if isinstance(base, (ImageFolderDataset, ImageListDataset)):
        labels = base.labels
        src = NativeSource("files", paths=base.paths, labels=labels, description=repr(base))
        stages.append(("read", "native", f"{type(base).__name__}: POSIX reads inside the kernel"))
        nparts = 1 if labels is None else 2
    elif isinstance(base, RecordFileDataset) and not base.raw:
        src = NativeSource("records", dataset=base, labels=base.labels, description=repr(base))
        stages.append(("read", "native", "RecordFileDataset: pread inside the kernel"))
        nparts = 2
    elif isinstance(base, ArrayDataset) and not layers and all(
            isinstance(a, np.ndarray) and a.dtype != object and a.ndim >= 1 for a in base.arrays):
        src = NativeSource("arrays", arrays=[np.ascontiguousarray(a) for a in base.arrays],
                           description=repr(base))
        stages.append(("read", "native", "ArrayDataset of numpy arrays: gathered with numpy take"))
        nparts = len(base.arrays)
    else:
        stages.append(("read", "python", f"{type(base).__name__}: dataset[i] is Python code"))
        why_py.append(f"the dataset ({type(base).__name__}) is indexed from Python")

    hybrid = None
    plan_spec = None
    plan = None
    if src is not None and src.kind != "arrays":
        steps = _steps(firsts) if ordered else []
        k, plan = _native_prefix(steps) if ordered else (0, None)
        if plan is None:
            stages.append(("decode", "python", "no native prefix of the chain gives a fixed output size"))
            why_py.append("the transform chain cannot run natively (a Python step first, or no fixed output "
                          "size: add a crop or Resize((h, w)))" if ordered else
                          ".transform(fn) layers sit below transform_first ones")
        else:
            for step in plan.describe():
                stages.append(("decode+transform", "native", step))
            from . import transforms as T

            suffix = steps[k:]
            if suffix:
                for fn in suffix:
                    stages.append(("transform", "python", f"{_describe(fn)} (per sample)"))
                bad = next((fn for fn in suffix if not isinstance(fn, T.Transform)), None)
                why_py.append(f"the chain holds a Python step ({_describe(bad)})" if bad is not None else
                              f"the chain's steps from {_describe(suffix[0])} on cannot be fused")
            for fn in others:
                stages.append(("transform", "python", f".transform({_describe(fn)}) on whole samples"))
            if others:
                why_py.append(".transform(fn) applies a Python function to whole samples")
            plan_spec = T.Compose(steps[:k])
            hybrid = {
                "suffix": T.Compose(suffix) if suffix else None,
                "position": sum(1 for t in steps[:k] if not isinstance(t, T.Decode)),
                "others": others,
            }
    elif src is None:
        for fn in firsts + others:
            stages.append(("transform", "python", _describe(fn)))

    shards = None
    if src is not None and not why_py:
        shards = _is_native_batchify(batchify_fn, nparts)
    if src is not None and not why_py and shards is not None:
        stages.append(("collate", "native", "into a pre-planned arena slot (labels with numpy take)"))
    else:
        plain = batchify_fn in (None, default_batchify_fn) or isinstance(batchify_fn, (Stack, Tuple))
        name = "default (Stack per field)" if batchify_fn in (None, default_batchify_fn) else _describe(batchify_fn)
        stages.append(("collate", "native" if plain else "python", f"{name}, into arena slots when shapes allow"))
        if src is not None and not why_py:
            why_py.append("the batchify function is not one loaderlib runs natively (default, Stack, Tuple of "
                          "Stack) on this dataset")

    if src is not None and not why_py:
        reason = "every stage runs in native kernels (zero Python per sample)"
        if num_workers > 0:
            reason += f"; num_workers={num_workers} is not needed and is ignored"
        return _Analysis("native", reason, stages, src, plan_spec, shards, None, plan)
    reason = "; ".join(why_py)
    if fallback == "processes":
        reason += f"; num_workers={num_workers}: Python steps run in worker processes"
        # In a worker every sample goes through dataset[i]: say so instead of listing fused steps.
        what = (f"dataset[i] per sample in {num_workers} worker processes (loaderlib's decoder and "
                "transforms called one sample at a time)")
        worker = [("load", "worker", what)]
        worker += [(st, "python", d) for st, kind, d in stages if kind == "python" and st != "collate"]
        worker.append(("collate", "worker", "batchify in the worker, into a shared-memory slot when shapes allow"))
        return _Analysis(fallback, reason, worker)
    if hybrid is not None:
        reason += "; native steps run in the kernels, the Python steps after them on a thread pool"
        return _Analysis(fallback, reason, stages, src, plan_spec, None, hybrid, plan)
    reason += "; Python steps run on a thread pool (set num_workers > 0 for processes)"
    return _Analysis(fallback, reason, stages)


def _as_dataset(dataset: Any) -> Any:
    if hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__"):
        return dataset
    if hasattr(dataset, "__iter__"):
        return SimpleDataset(list(dataset))
    raise TypeError(f"dataset must have __len__ and __getitem__ (or be iterable), got {type(dataset).__name__}")


class DataLoader:
    """Load batches from a dataset with the fastest engine its steps allow.

    Parameters
    ----------
    dataset : Dataset, sequence or iterable
        Any object with ``__len__``/``__getitem__`` (an iterable is materialised).
    batch_size : int
        Samples per batch (required unless ``batch_sampler`` is given).
    shuffle : bool
        Visit samples in a random order, different every epoch (a pure function of
        ``(seed, epoch)``).
    sampler : Sampler or iterable of int, optional
        Order of sample indices (excludes ``shuffle``). A :class:`ShardedSampler` without a
        length is bound to ``len(dataset)``.
    last_batch : {"keep", "discard", "rollover"}
        What happens to a final short batch (default "keep"). ``drop_last=True`` is the
        PyTorch spelling of "discard".
    batch_sampler : iterable of index lists, optional
        Gives whole batches (excludes batch_size, shuffle, sampler, last_batch).
    batchify_fn : callable, optional
        Collates a list of samples (default: stack arrays field by field). ``collate_fn`` is
        the PyTorch alias.
    num_threads : int, optional
        Threads of the native kernels and of the Python thread pool (default: available CPUs,
        or ``LOADERLIB_NUM_THREADS``). Settable while iterating.
    num_workers : int
        Worker processes for Python steps (0: threads engine). Ignored when everything is
        native.
    prefetch : int, optional
        Batches kept ready ahead of the consumer (default ``max(2, 2 * num_workers)``).
        Settable while iterating.
    pin_memory : bool
        Page-lock batches for faster GPU copies (needs torch with CUDA; otherwise a warning
        and no effect).
    timeout : float
        Seconds any wait for a batch may take before :class:`LoaderTimeoutError` (None or 0:
        wait forever).
    seed : int, optional
        Seeds shuffling and augmentation (drawn once when None). Output is identical for any
        thread count.
    worker_init_fn : callable, optional
        Called with the worker id in each worker process (or pool thread).
    on_error : {"raise", "skip"}
        "raise": a failing sample raises in the consumer, naming its index and path. "skip":
        it is dropped, the batch is filled from the next samples, and the failure is recorded
        in :attr:`errors`.
    drop_last, collate_fn
        PyTorch aliases of ``last_batch="discard"`` and ``batchify_fn``.
    profile : bool
        Enable the stage recorder (``loader.stats``) from the start.

    Attributes
    ----------
    engine : str
        "native", "threads" or "processes".
    errors : list of SampleFailure
        Samples skipped with ``on_error="skip"``.
    recorder : StageRecorder
        Per-stage timings (``loader.stats`` is its snapshot).
    """

    def __init__(self, dataset: Any, batch_size: int | None = None, shuffle: bool = False, sampler: Any = None,
                 last_batch: str | None = None, batch_sampler: Any = None, batchify_fn: Callable | None = None,
                 num_threads: int | None = None, num_workers: int = 0, prefetch: int | None = None,
                 pin_memory: bool = False, timeout: float | None = 120, seed: int | None = None,
                 worker_init_fn: Callable | None = None, on_error: str = "raise", *,
                 drop_last: bool | None = None, collate_fn: Callable | None = None, profile: bool = False) -> None:
        self.dataset = _as_dataset(dataset)
        n = len(self.dataset)
        # -- argument conflicts, PyTorch aliases ---------------------------------------
        if collate_fn is not None:
            if batchify_fn is not None and batchify_fn is not collate_fn:
                raise ValueError("batchify_fn and collate_fn are the same argument: pass only one")
            batchify_fn = collate_fn
        if drop_last is not None:
            implied = "discard" if drop_last else "keep"
            if last_batch is not None and last_batch != implied:
                raise ValueError(f"drop_last={drop_last} conflicts with last_batch={last_batch!r}: pass only one")
            last_batch = implied
        if last_batch is not None and last_batch not in LAST_BATCH_MODES:
            raise ValueError(f"last_batch must be one of {LAST_BATCH_MODES}, got {last_batch!r}")
        if batch_sampler is not None:
            clash = [name for name, bad in (("batch_size", batch_size is not None), ("shuffle", bool(shuffle)),
                                            ("sampler", sampler is not None),
                                            ("last_batch/drop_last", last_batch is not None)) if bad]
            if clash:
                raise ValueError(f"batch_sampler gives whole batches; it conflicts with {', '.join(clash)}")
        elif batch_size is None:
            raise ValueError("batch_size is required unless batch_sampler is given")
        if sampler is not None and shuffle:
            raise ValueError("shuffle=True conflicts with sampler: the sampler decides the order")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be a non-negative integer, got {num_workers!r}")
        if num_threads is not None:
            _threads.resolve_num_threads(num_threads)  # validates
        if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1):
            raise ValueError(f"prefetch must be a positive integer, got {prefetch!r}")
        if batchify_fn is not None and not callable(batchify_fn):
            raise TypeError(f"batchify_fn must be callable, got {batchify_fn!r}")

        self.seed = draw_seed() if seed is None else int(seed)
        self.on_error = on_error
        self.timeout = timeout if timeout else None
        self.num_workers = num_workers
        self.worker_init_fn = worker_init_fn
        self.batchify_fn = batchify_fn
        self.pin_memory = bool(pin_memory)
        if batch_sampler is not None:
            self._batch_sampler = batch_sampler
            bs = getattr(batch_sampler, "batch_size", None)
            self._batch_size = int(bs) if bs else max((len(b) for b in batch_sampler), default=1)
            self._own_sampler = False
        else:
            self._batch_size = int(batch_size)
            if sampler is None:
                sampler = RandomSampler(n, seed=self.seed) if shuffle else SequentialSampler(n)
                self._own_sampler = True
            else:
                self._own_sampler = False
                if isinstance(sampler, ShardedSampler) and sampler._length is None:
                    sampler = sampler.bind(n)
            self._batch_sampler = BatchSampler(sampler, self._batch_size, last_batch or "keep")
        self._knobs = _Knobs(num_threads, prefetch or max(2, 2 * num_workers))
        self.recorder = _make_recorder(profile)
        self.errors: list = []
        self._epoch = 0
        self._lock = threading.Lock()
        self._analysis = _analyze(self.dataset, batchify_fn, num_workers)
        self._workers = None      # processes engine: the worker pool, created on first use
        self._arena_ring: BatchArena | None = None
        self._plans: list = [self._analysis.plan] if self._analysis.plan is not None else []
        self._current: Any = None
        self._closed = False
        if self.pin_memory:
            self._check_pin()

    # -- live knobs -------------------------------------------------------------------
    @property
    def num_threads(self) -> int:
        """Threads used per batch (settable while iterating; applies from the next batch)."""
        n = self._knobs.num_threads
        return _threads.default_num_threads() if n is None else n

    @num_threads.setter
    def num_threads(self, value: int | None) -> None:
        if value is not None:
            _threads.resolve_num_threads(value)
        self._knobs.num_threads = value

    @property
    def prefetch(self) -> int:
        """Batches kept ready ahead of the consumer (settable while iterating; applies at once)."""
        return self._knobs.prefetch

    @prefetch.setter
    def prefetch(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"prefetch must be a positive integer, got {value!r}")
        self._knobs.prefetch = value

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def engine(self) -> str:
        """The engine this loader runs: "native", "threads" or "processes"."""
        return self._analysis.engine

    @property
    def stats(self) -> Any:
        """Per-stage timings of the current or last epoch (the recorder's snapshot)."""
        return self.recorder.snapshot()

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` starts."""
        return self._epoch

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (a closed loader cannot be iterated)."""
        return self._closed

    def dashboard(self, **kwargs: Any) -> Any:
        """A live bottleneck dashboard for this loader (Jupyter; see
        :class:`loaderlib.profiling.Dashboard`, which takes ``kwargs``)."""
        from .profiling import Dashboard

        return Dashboard(self, **kwargs)

    def explain(self) -> str:
        """Which engine runs, why, and what each stage runs as."""
        a = self._analysis
        lines = [f"engine: {a.engine} ({a.reason})"]
        for stage, kind, detail in a.stages:
            lines.append(f"  {stage:<17} {kind:<7} {detail}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"DataLoader(engine={self.engine!r}, batch_size={self._batch_size}, batches={len(self)}, "
                f"num_threads={self.num_threads}, prefetch={self.prefetch})")

    def __len__(self) -> int:
        return len(self._batch_sampler)

    # -- iteration --------------------------------------------------------------------
    def _epoch_batches(self, epoch: int) -> list:
        bsamp = self._batch_sampler
        if isinstance(bsamp, BatchSampler):
            return bsamp.epoch_batches(epoch if self._own_sampler else None)
        return [np.asarray(list(b), dtype=np.int64) for b in bsamp]

    def __iter__(self) -> LoaderIterator:
        if self._closed:
            raise RuntimeError("this DataLoader is closed")
        with self._lock:
            epoch = self._epoch
            self._epoch += 1
        batches = self._epoch_batches(epoch)
        plan = _EpochPlan(batches)
        info = {"seed": self.seed, "epoch": epoch, "plan": plan}
        producer = self._make_producer(info)
        run = _Run(epoch=epoch, seed=self.seed, plan=plan, producer=producer, knobs=self._knobs,
                   recorder=self.recorder, timeout=self.timeout, total=len(batches))
        info["stop"] = run.stop
        if self.recorder.enabled:
            self.recorder.epoch_started(self.num_threads if self.engine != "processes" else self.num_workers,
                                        self._batch_size)
        run.start()
        it = LoaderIterator(run, self)
        self._current = weakref.ref(it)   # never keep an abandoned iterator alive
        return it

    def _arena(self) -> BatchArena:
        # One ring per loader, reused by every epoch: slots are allocated once.
        if self._arena_ring is None:
            self._arena_ring = BatchArena(self._knobs.prefetch + 2)
        self._arena_ring.num_slots = self._knobs.prefetch + 2
        return self._arena_ring

    def _make_producer(self, info: dict) -> Any:
        a = self._analysis
        common = {"knobs": self._knobs, "recorder": self.recorder, "on_error": self.on_error,
                  "errors": self.errors, "run_info": info}
        info["give_plan"] = weakref.WeakMethod(self._give_plan)
        if a.engine == "native":
            plan = None if a.native_source.kind == "arrays" else self._take_plan()
            if self.recorder.enabled:
                self.recorder.python_gil("python", False)
            return NativeProducer(src=a.native_source, plan=plan, shards=a.shards, arena=self._arena(),
                                  batch_size=self._batch_size, **common)
        if self.recorder.enabled:
            self.recorder.python_gil("python", True)
        if a.engine == "threads" and a.hybrid is not None:
            native = NativeProducer(src=a.native_source, plan=self._take_plan(), shards=(None, None),
                                    arena=self._arena(), batch_size=self._batch_size, **common)
            return HybridProducer(native=native, suffix=a.hybrid["suffix"], suffix_position=a.hybrid["position"],
                                  others=a.hybrid["others"], batchify_fn=self.batchify_fn, arena=self._arena(),
                                  worker_init_fn=self.worker_init_fn, **common)
        if a.engine == "threads":
            return ThreadsProducer(dataset=self.dataset, batchify_fn=self.batchify_fn, arena=self._arena(),
                                   worker_init_fn=self.worker_init_fn, **common)
        from ._engine_procs import ProcessesProducer

        if self._workers is None or not self._workers.alive():
            from ._engine_procs import WorkerPool

            if self._workers is not None:
                self._workers.close()
            self._workers = WorkerPool(self.num_workers, self.dataset, self.batchify_fn, self.worker_init_fn,
                                       self.on_error, self.seed)
        else:
            # Workers are shared by the loader's iterators: only one may run at a time.
            current = self._current() if self._current is not None else None
            if current is not None:
                current.close()
        return ProcessesProducer(pool=self._workers, timeout=self.timeout, **common)

    def _take_plan(self) -> Any:
        """A compiled plan for one iterator: plans run one batch at a time, so concurrent
        iterators each get their own; finished iterators give theirs back, so later epochs
        reuse its decoders and scratch buffers."""
        with self._lock:
            if self._plans:
                return self._plans.pop()
        from .pipeline import compile_chain

        return compile_chain(self._analysis.chain)

    def _give_plan(self, plan: Any) -> None:
        with self._lock:
            if len(self._plans) < 4:
                self._plans.append(plan)

    def close(self) -> None:
        """Stop threads and workers and free arena slots. Idempotent."""
        current = self._current() if self._current is not None else None
        if current is not None:
            current.close()
        self._current = None
        if self._workers is not None:
            self._workers.close()
            self._workers = None
        if self._arena_ring is not None:
            self._arena_ring.clear()
        self._closed = True

    def __enter__(self) -> DataLoader:  # noqa: PYI034 - DataLoader is not meant to be subclassed
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if self._workers is not None:
                self._workers.close()
        except Exception:  # noqa: BLE001, S110
            pass

    def _check_pin(self) -> None:
        try:
            import torch

            cuda = torch.cuda.is_available()
        except ImportError:
            cuda = False
        why = ("page-locking arena slots is not implemented yet" if cuda
               else "it needs torch with CUDA, which is not available here")
        warnings.warn(f"pin_memory=True: batches are not pinned ({why})", RuntimeWarning, stacklevel=3)
        self.pin_memory = False

