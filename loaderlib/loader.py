"""The DataLoader: picks an engine for a dataset, transform chain and batchify function.

Engines (how each one runs: NOTE [ Engine stages ] in ``_engines/base.py``):

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

import dataclasses
import json
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _threads
from ._autotune import attach, batch_nbytes
from ._checks import check_int
from ._datasets.iterable import IterableRunState, default_rank, resume_source
from ._datasets.mixture import source_counts
from ._engines.base import LoaderIterator, Producer, RunState, WarmStart, _Knobs, _Run
from ._engines.depth import depth_for
from ._engines.handoff import HeldRecorder
from ._engines.native import kernel_threads, native_worker_init
from ._engines.threads import PythonPool
from ._extract.source import announce_order
from ._loader.analysis import _analyze, _iterable_analysis, driver_lines, read_ahead_line, reads_lines
from ._loader.options import check_options
from ._loader.output import (
    BatchTransformStep,
    TorchStep,
    _pin_device,
    _pin_usable,
    bfloat16_first,
    to_torch,  # noqa: F401 - public: loaderlib.loader.to_torch
)
from ._loader.producers import make_producer
from ._loader.sharding import own_batches
from ._loader.state import (
    STATE_VERSION,  # noqa: F401 - what state_dict()'s "version" is
    check_state,
    next_order,
    resumed_order,
    state_between,
    state_of,
)
from ._observe.recorder import Recorder, StageRecorder
from ._observe.stats import Stats
from .arena import BatchArena, HostRegistrar, pinned_allocator
from .sampler import BatchSampler, EpochOrder, RandomSampler, Sampler, ShardedSampler

if TYPE_CHECKING:   # imported where used: the processes engine needs cloudpickle
    from ._engines.processes import WorkerPool

__all__ = ["DataLoader", "LoaderIterator", "TorchLoaderIterator"]

ENGINES = ("native", "threads", "processes")


def _make_recorder(enabled: bool) -> StageRecorder:
    return StageRecorder(enabled=enabled)


class DataLoader:
    """Load batches from a dataset with the fastest engine its steps allow.

    Parameters
    ----------
    dataset : Dataset, sequence or iterable
        Any object with ``__len__``/``__getitem__``, or any iterable (infinite ones included),
        which is consumed lazily, batch by batch, never materialised (NOTE [ Iterable shards ]
        in ``_datasets/iterable.py``).
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
        PyTorch spelling of "discard". "discard" never delivers a short batch, also when
        ``on_error="skip"`` dropped samples.
    batch_sampler : iterable of index lists, optional
        Gives whole batches (excludes batch_size, shuffle, sampler, last_batch).
    batchify_fn : callable, optional
        Collates a list of samples (default: stack arrays field by field). ``collate_fn`` is
        the PyTorch alias.
    num_threads : int, optional
        Threads of the native kernels and of the Python thread pool. Default: ``num_workers``
        when every stage is native and ``num_workers > 0``, else the CPUs this process may use
        (affinity mask, cgroup quota, divided by ``LOCAL_WORLD_SIZE``) or
        ``LOADERLIB_NUM_THREADS``. ``0`` runs everything in the calling thread (same output;
        ``pdb`` works). Settable while iterating.
    num_workers : int
        Worker processes for Python steps (0: threads engine). When every stage is native no
        process is needed, and ``num_workers`` sets the thread count instead (``explain()``
        says so).
    prefetch : int, optional
        Batches kept ready ahead of the consumer (``max(2, 2 * num_workers)`` when not given).
        Not given, the native engine keeps at most the batch you hold and one more (two with
        many threads per batch) in memory, up to that depth only when a deeper queue would
        have saved you waiting or you keep batches (NOTE [ Batches in memory ] in
        ``_engines/depth.py``; ``explain()`` shows it). Settable while iterating.
    pin_memory : bool
        Page-lock the arena slots once, when they are allocated, so batches copy to a GPU
        asynchronously at no per-batch cost: torch's pinned allocator on the in-process
        engines, ``cudaHostRegister`` of each shared-memory slot on the processes engine.
        Without torch with CUDA it warns once, naming the keyword, and loads unpinned, as
        PyTorch's DataLoader does (NOTE [ pin_memory without CUDA ]).
    timeout : float
        Seconds a wait for a batch may take before :class:`LoaderTimeoutError` (None, 0: forever).
    seed : int, optional
        Seeds shuffling and augmentation (drawn once when None). Output is identical for any
        thread count.
    worker_init_fn : callable, optional
        ``worker_init_fn(worker_id)``, PyTorch's signature, called on every engine: once per
        worker process, once per pool thread (threads engine), once per kernel thread slot
        before the native engine's first batch (on the driver thread). :func:`loaderlib.get_worker_info`
        works inside it.
    on_error : {"raise", "skip"}
        "raise": a failing sample raises in the consumer, naming its index and path. "skip":
        it is dropped, the batch is filled from the next samples, and the failure is recorded
        in :attr:`errors`.
    drop_last, collate_fn
        PyTorch aliases of ``last_batch="discard"`` and ``batchify_fn``.
    persistent_workers : bool
        PyTorch's keyword. Workers always persist across epochs here, and the next epoch's
        first batches are prepared while the last ones of the current epoch are consumed
        (no cold start at epoch boundaries); this keyword asks for it explicitly.
    prefetch_factor : int, optional
        PyTorch's keyword: batches prefetched per worker; ``prefetch = prefetch_factor *
        max(1, num_workers)`` (excludes ``prefetch``).
    generator : torch.Generator or numpy.random.Generator, optional
        Seeds shuffling and augmentation from the generator's stream (excludes ``seed``).
    multiprocessing_context : {None, "spawn", "forkserver"} or a context
        Accepted for PyTorch compatibility: workers are fresh interpreters ("fork" raises).
    in_order : bool
        PyTorch's keyword; batches always come in order (exact resume needs it).
    pin_memory_device : str
        Device the pinned memory is for (requires ``pin_memory=True``): slots are allocated or
        registered with it current.
    load_balance : {"round_robin", "least_loaded"}
        Processes engine: which worker gets the next batch.
    rank, world_size : int, optional
        This process's place in a job: the loader's own order (no ``sampler=``) and iterable
        datasets are sharded by them; default from ``torch.distributed`` (else torchrun's
        ``RANK``/``WORLD_SIZE``) until the first epoch (NOTE [ Map-style loaders shard under torch.distributed ]).
    max_in_flight : int, optional
        Processes engine: batches sent to workers and not yet collected (default
        ``prefetch_factor * num_workers``, i.e. 2 per worker).
    max_skipped : int or float, optional
        With ``on_error="skip"``, a circuit breaker: more skipped samples in one epoch than
        this count (or this fraction of the epoch) raises :class:`LoaderError` listing them,
        instead of training on a mostly broken dataset.
    profile : bool
        Enable the stage recorder (``loader.stats``) from the start.
    batch_transform : loaderlib.transforms.BatchTransform, optional
        MixUp, CutMix or a RandomChoice of them, applied in place to each ``(images,
        labels)`` batch as it is delivered; the batch then carries ``(N, num_classes)``
        float32 soft labels. Keyed by (seed, epoch, batch index): any engine and thread
        count gives the same mix, and a resumed epoch reproduces it.
    ram_budget : int or str, optional
        Bytes (or a string such as ``"2GB"``) the loader may hold: the prefetched batches'
        slots (``AUTOTUNE`` keeps the prefetch depth within it, and a budget smaller than one
        batch raises ``ValueError``) and the read-ahead buffers, which get what the slots
        leave (at least an eighth; NOTE [ Read-ahead memory ] in ``_extract/readahead.py``).
        ``num_threads`` and ``prefetch`` also take ``loaderlib.AUTOTUNE``: they are then
        tuned online from the delivered throughput (NOTE [ Autotune ] in ``_autotune.py``);
        the output does not change, only the speed.
    output : {"numpy", "torch"}, optional
        What batches are made of. "torch": tensors sharing the arena slot's memory
        (``torch.from_numpy``, zero-copy; the slot is reused only after every tensor viewing
        it is gone), labels as int64 tensors, bfloat16 images as ``torch.bfloat16``. Default:
        "torch" for a ``torch.utils.data.Dataset`` (whose samples are tensors), else "numpy"
        (NOTE [ Batch output ]).
    io_depth : int, None or AUTOTUNE
        Reads in flight of the read-ahead stage, which reads the samples of files and byte
        ranges ahead of the decode threads, in the sampler's order, on native IO threads
        (NOTE [ Read-ahead ] in ``pyx/include/ll_readahead.h``). ``None`` (default) and
        ``AUTOTUNE`` adapt the depth to the measured read latency and decode rate (NOTE
        [ Read-ahead depth ]) and let the decode threads read when reads are CPU work (NOTE
        [ Reads that are work ]); an integer fixes it; ``0`` turns the stage off (each decode
        thread reads its own samples). The output never depends on it.

    Attributes
    ----------
    engine : str
        "native", "threads" or "processes".
    errors : list of SampleFailure
        Samples skipped with ``on_error="skip"``.
    recorder : StageRecorder
        Per-stage timings (``loader.stats`` is its snapshot).

    Notes
    -----
    :meth:`state_dict` / :meth:`load_state_dict` save and restore the position in the data:
    the next ``iter()`` after a load continues with the first batch not yet delivered,
    bitwise equal to an uninterrupted run (NOTE [ Iterator state ]).
    """

    def __init__(self, dataset: Any, batch_size: int | None = None, shuffle: bool = False, sampler: Any = None,
                 last_batch: str | None = None, batch_sampler: Any = None, batchify_fn: Callable | None = None,
                 num_threads: int | None = None, num_workers: int = 0, prefetch: int | None = None,
                 pin_memory: bool = False, timeout: float | None = 120, seed: int | None = None,
                 worker_init_fn: Callable | None = None, on_error: str = "raise", *,
                 drop_last: bool | None = None, collate_fn: Callable | None = None,
                 persistent_workers: bool = False, prefetch_factor: int | None = None, generator: Any = None,
                 multiprocessing_context: Any = None, in_order: bool = True, pin_memory_device: str = "",
                 load_balance: str = "round_robin", max_in_flight: int | None = None,
                 rank: int | None = None, world_size: int | None = None, max_skipped: float | None = None,
                 profile: bool = False, batch_transform: Any = None,
                 ram_budget: int | str | None = None, output: str | None = None,
                 io_depth: int | None = None) -> None:
        o = check_options(dataset, batch_size, shuffle, sampler, last_batch, batch_sampler, batchify_fn, num_threads,
                          num_workers, prefetch, pin_memory, timeout, seed, worker_init_fn, on_error,
                          drop_last=drop_last, collate_fn=collate_fn, persistent_workers=persistent_workers,
                          prefetch_factor=prefetch_factor, generator=generator,
                          multiprocessing_context=multiprocessing_context, in_order=in_order,
                          pin_memory_device=pin_memory_device, load_balance=load_balance,
                          max_in_flight=max_in_flight, rank=rank, world_size=world_size, max_skipped=max_skipped,
                          profile=profile, batch_transform=batch_transform, ram_budget=ram_budget, output=output,
                          io_depth=io_depth)
        self.batch_transform = o.batch_transform
        self._tune_io = o.tune_io
        self.ram_budget = o.ram_budget
        self.dataset = o.dataset
        self._iterable = o.iterable
        if self._iterable:
            assert o.rank is not None and o.world_size is not None   # check_options sets both for an iterable
            self.rank, self.world_size = o.rank, o.world_size
        # NOTE [ Rank at the first iter() ]; map-style: NOTE [ Map-style loaders shard under torch.distributed ]
        own = self._iterable or (sampler is None and batch_sampler is None)
        self._rank_auto = own and rank is None and world_size is None
        n = 0 if self._iterable else len(self.dataset)
        self.multiprocessing_context = o.multiprocessing_context
        self.output = o.output
        self.seed = o.seed
        self._seed_given = o.seed_given
        self.on_error = o.on_error
        self.max_skipped = o.max_skipped
        self.timeout = o.timeout if o.timeout else None
        self.num_workers = num_workers = o.num_workers
        self.worker_init_fn = o.worker_init_fn
        self.batchify_fn = o.batchify_fn
        self.persistent_workers = o.persistent_workers
        self.in_order = o.in_order
        self.load_balance = o.load_balance
        self.prefetch_factor = prefetch_factor = o.prefetch_factor
        self.max_in_flight = (o.max_in_flight if o.max_in_flight is not None
                              else (prefetch_factor or 2) * max(1, num_workers))
        self.pin_memory = o.pin_memory
        self.pin_memory_device = o.pin_memory_device
        self._own_sampler = False
        sampler, batch_sampler, last_batch = o.sampler, o.batch_sampler, o.last_batch
        # A BatchSampler over the sampler, the user's batch_sampler (any iterable of index
        # lists), or None for an iterable dataset.
        self._batch_sampler: Any
        self._batch_size: int
        if batch_sampler is not None:   # never with an iterable dataset (check_options)
            self._batch_sampler = batch_sampler
            bs = getattr(batch_sampler, "batch_size", None)
            self._batch_size = int(bs) if bs else max((len(b) for b in batch_sampler), default=1)
        elif self._iterable:
            assert o.batch_size is not None   # check_options requires it unless a batch_sampler is given
            self._batch_size = o.batch_size
            self._batch_sampler = None
        else:
            assert o.batch_size is not None
            self._batch_size = o.batch_size
            self._own_sampler = sampler is None
            self._shuffle = o.shuffle
            self.rank, self.world_size = (o.rank or 0, o.world_size or 1)   # both or neither (check_options)
            if isinstance(sampler, ShardedSampler) and sampler._length is None:
                sampler._length = n   # bound in place: the caller's set_epoch keeps acting on it
            self._batch_sampler = (BatchSampler(sampler, self._batch_size, last_batch or "keep") if sampler is not None
                                   else own_batches(n, self._batch_size, last_batch or "keep", o.shuffle, self.seed,
                                                    self._seed_given, self.rank, self.world_size))
        self._last_batch = (last_batch or "keep") if self._iterable else getattr(self._batch_sampler, "last_batch",
                                                                                "keep")
        self._analysis = (_iterable_analysis(self.dataset, self.rank, self.world_size, num_workers)
                          if self._iterable else _analyze(self.dataset, self.batchify_fn, num_workers))
        num_threads, prefetch = o.num_threads, o.prefetch
        if num_threads is None and num_workers > 0 and self._analysis.engine == "native":
            num_threads = num_workers   # explain() says so
        depth = prefetch if prefetch is not None else (
            prefetch_factor * max(1, num_workers) if prefetch_factor is not None else max(2, 2 * num_workers))
        self._knobs = _Knobs(num_threads, depth, o.io_depth)
        # NOTE [ Batches in memory ] (_engines/depth.py): the default prefetch caps the batches
        # resident at once; an explicit prefetch (or AUTOTUNE) is a fixed queue.
        self._adaptive_depth = prefetch is None and prefetch_factor is None and not o.tune_prefetch
        self.recorder = _make_recorder(o.profile)
        self._errors: list = []
        self._init_runtime()
        if self.pin_memory and not _pin_usable(self.pin_memory_device):
            self.pin_memory = False
            self.pin_memory_device = ""
        self._tuner = None
        self._knobs.depth = depth_for(self)
        if o.tune_threads or o.tune_prefetch or self.ram_budget is not None:
            # NOTE [ Autotune ]: with a budget alone nothing is tuned, but one batch must fit.
            attach(self, num_threads=o.tune_threads, prefetch=o.tune_prefetch, ram_budget=self.ram_budget)

    def _init_runtime(self) -> None:
        """Fields that belong to this process only (rebuilt after unpickling)."""
        self._epoch = 0            # epochs of a sampler that is not a loaderlib Sampler
        self._lock = threading.RLock()
        self._workers: WorkerPool | None = None   # processes engine: the worker pool, created on first use
        self._pool: PythonPool | None = None      # threads engine: the Python pool, created on first use
        self._arena_ring: BatchArena | None = None
        self._current: weakref.ref[LoaderIterator] | None = None  # weak reference to the newest iterator
        self._warm = WarmStart()   # the next epoch, started early (NOTE [ Warm epochs ])
        # Dropped when the loader is collected or, if it outlives the script, at exit while its
        # threads still run (NOTE [ Threads at interpreter exit ] in _engines/base.py).
        weakref.finalize(self, self._warm.drop_at_exit)
        self._resume: dict | None = None
        self._applied: str | None = None   # how the last loaded state was applied, if not as this rank's own
        self._native_init_done = False   # worker_init_fn ran for the native engine's thread slots
        self._last_state: RunState | None = None   # the newest run's state (state_dict after it ends)
        self._closed = False

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
        self._knobs.prefetch = check_int(value, "prefetch", minimum=1)
        self._adaptive_depth = False   # a fixed queue from now on (NOTE [ Batches in memory ])
        self._knobs.depth = None

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def drop_last(self) -> bool:
        """PyTorch's name: whether a short last batch is dropped (``last_batch="discard"``)."""
        return self._last_batch == "discard"

    @property
    def collate_fn(self) -> Callable | None:
        """PyTorch's name of :attr:`batchify_fn`."""
        return self.batchify_fn

    @property
    def sampler(self) -> Any:
        """The sampler that orders sample indices (None with a custom ``batch_sampler``)."""
        bs = self._batch_sampler
        return bs.sampler if isinstance(bs, BatchSampler) else None

    @property
    def batch_sampler(self) -> Any:
        return self._batch_sampler

    @property
    def engine(self) -> str:
        """The engine this loader runs: "native", "threads" or "processes"."""
        return self._analysis.engine

    @property
    def stats(self) -> Stats:
        """Per-stage timings of the current or last epoch (the recorder's snapshot); with
        ``AUTOTUNE``, ``stats.autotune`` lists the tuner's decisions, timed in seconds since the
        loader was created (on the profiling clock, as ``stats.started_s``)."""
        snap = self.recorder.snapshot()
        tuner = getattr(self, "_tuner", None)
        auto = tuple(tuner.decisions) if tuner is not None and tuner.decisions else snap.autotune
        # NOTE [ Mixture epochs ] in _datasets/mixture.py
        sources = source_counts(self.dataset, self._last_state)
        return dataclasses.replace(snap, autotune=auto, memory=self.memory(), sources=sources)

    def memory(self) -> dict[str, int]:
        """Bytes this loader holds now, by part: ``"batch slots"`` (the arena's ring, the warm
        next epoch's slots included; NOTE [ Warm slots ]) and ``"read-ahead"`` (the buffers of
        the read-ahead stages of the runs alive; NOTE [ Read-ahead memory ])."""
        ring = self._arena_ring
        parts = {"batch slots": int(ring.stats["capacity_bytes"]) if ring is not None else 0, "read-ahead": 0}
        for run in (self._warm.run, self._current_run()):
            if run is not None and not run.closed and run.producer.reader is not None:
                parts["read-ahead"] += int(run.producer.reader.buffer_bytes())
        return parts

    def _current_run(self) -> _Run | None:
        """The newest iterator's run, or None."""
        it = self._current() if self._current is not None else None
        return it._run if it is not None else None

    @property
    def errors(self) -> list:
        """Samples skipped with ``on_error="skip"`` (:class:`SampleFailure`), in the order
        they were met, over the epochs this loader delivered (a warm next epoch's count once
        it is iterated)."""
        last = self._last_state
        return self._errors + (list(last.skipped) if last is not None else [])

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (a closed loader cannot be iterated)."""
        return self._closed

    def dashboard(self, **kwargs: Any) -> Any:
        """A live bottleneck dashboard for this loader (Jupyter; see
        :class:`loaderlib.profiling.Dashboard`, which takes ``kwargs``)."""
        from .profiling import Dashboard

        return Dashboard(self, **kwargs)

    def preview(self, index: int, epoch: int | None = None) -> Any:
        """Sample ``index`` exactly as this loader delivers it in ``epoch``.

        NOTE [ Exact preview ]: the sample goes through the same engine from the dataset's own
        data (for an image dataset, the fused kernel on the file's bytes, with the same
        crop-region and DCT-scaled decode) with the same ``(seed, epoch, index)`` key, so the
        result is bitwise what the loader writes into that sample's batch slot, for any thread
        count. A transform called on an already decoded array (``train(img, seed=0, epoch=3,
        index=17)``) is the same only where the fused chain decodes at full resolution; where
        it decodes at 1/2, 1/4 or 1/8 scale (a chain that shrinks the image at least 2x, with
        ``Decode(dct_scaling=True)``, the default) its resampling starts from other pixels and
        can differ by a few levels (docs/preview.md).

        Parameters
        ----------
        index : int
            The dataset index of the sample.
        epoch : int, optional
            The epoch whose randomness to use (default: :attr:`epoch`, the next one).

        Returns
        -------
        The sample's fields as the loader collates them (a tuple of arrays, one per field, with
        the batch dimension removed), before any ``batch_transform``.
        """
        if self._iterable:
            raise TypeError("preview(index) needs a dataset with __len__/__getitem__; an iterable has no index")
        n = len(self.dataset)
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < n:
            raise IndexError(f"index must be an integer in [0, {n}), got {index!r}")
        probe = DataLoader(self.dataset, batch_size=1, sampler=[int(index)], seed=self.seed, num_threads=0,
                           output=self.output)
        try:
            probe.set_epoch(self.epoch if epoch is None else epoch)
            batch = next(iter(probe))
            if isinstance(batch, (tuple, list)):
                return tuple(np.array(part[0]) if self.output == "numpy" else part[0].clone() for part in batch)
            return np.array(batch[0]) if self.output == "numpy" else batch[0].clone()
        finally:
            probe.close()

    def explain(self) -> str:
        """Which engine runs, why, and what each stage runs as."""
        a = self._analysis
        lines = [f"engine: {a.engine} ({a.reason})", *driver_lines(a, self._knobs.num_threads, self._knobs.prefetch)]
        for stage, kind, detail in a.stages:
            if stage == "read" and kind == "native":
                extract = read_ahead_line(self._analysis, self._knobs.io_depth, self._current_run())
                if extract is not None:
                    lines.append(f"  {'read-ahead':<17} {'native':<7} {extract}")
            lines.append(f"  {stage:<17} {kind:<7} {detail}")
        if self.batch_transform is not None:
            lines.append(f"  {'batch transform':<17} {'numpy':<7} {self.batch_transform.describe()}")
        if self._knobs.depth is not None:
            lines.append(f"  {'batches':<17} {'native':<7} {self._knobs.depth.describe(kernel_threads(self._knobs))}")
        lines += reads_lines(self.recorder)
        if self._applied is not None:
            lines.append(f"  resume: {self._applied}")
        return "\n".join(lines)

    def _read_waiting(self) -> float:
        """Share of the last turn the current run's kernel threads waited for bytes (0 without
        a read-ahead stage)."""
        run = self._current_run()
        reader = run.producer.reader if run is not None else None
        return float(reader.waiting) if reader is not None else 0.0

    def __repr__(self) -> str:
        return (f"DataLoader(engine={self.engine!r}, batch_size={self._batch_size}, batches={len(self)}, "
                f"num_threads={self.num_threads}, prefetch={self.prefetch})")

    def __len__(self) -> int:
        self._auto_rank()
        if self._iterable:
            if not hasattr(self.dataset, "__len__"):
                raise TypeError(f"{type(self.dataset).__name__} is an iterable dataset without __len__: the number "
                                "of batches is unknown")
            n, w = len(self.dataset), self.world_size
            per = n // w if self._last_batch == "discard" else -(-n // w)
            return per // self._batch_size if self._last_batch == "discard" else -(-per // self._batch_size)
        return len(self._batch_sampler)

    # -- epochs and state -------------------------------------------------------------
    def _pure_sampler(self) -> Sampler | None:
        """The loaderlib Sampler whose order is a pure function of the epoch, if any."""
        s = self.sampler
        return s if isinstance(s, Sampler) else None

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` starts (the one in progress, after ``load_state_dict``)."""
        if self._resume is not None:
            return int(self._resume["epoch"])
        s = self._pure_sampler()
        return s.epoch if s is not None else self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` run ``epoch`` (as ``DistributedSampler.set_epoch``).

        Setting the epoch a loaded state is in keeps that state's mid-epoch position.
        """
        epoch = check_int(epoch, "epoch")
        with self._lock:
            if self._resume is not None and int(self._resume["epoch"]) != int(epoch):
                self._resume = None
            s = self._pure_sampler()
            target = s if s is not None else self.dataset if self._iterable else self._batch_sampler
            if hasattr(target, "set_epoch"):
                target.set_epoch(int(epoch))
            self._epoch = int(epoch)

    #: ``_state_of(run_state)``: the loader state that continues after the last batch it delivered.
    _state_of = state_of

    def state_dict(self) -> dict:
        """The position in the data as plain JSON (never pickle).

        Counts batches delivered to the user, not prefetched ones: after
        :meth:`load_state_dict` the next ``iter()`` continues with the first batch not yet
        delivered, bitwise equal to an uninterrupted run. Between epochs it points at the
        start of the next one.
        """
        self._auto_rank()
        with self._lock:
            if self._resume is not None:
                return json.loads(json.dumps(self._resume))
            it = self._current() if self._current is not None else None
            if it is not None and not it._run.closed:
                return self._state_of(it._run.state)
            last = self._last_state
            return self._state_of(last) if last is not None else state_between(self)

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (:meth:`state_dict`, or :func:`loaderlib.merge_state_dicts` of
        every rank's, which resumes on any layout: NOTE [ Elastic resume ]) at the next ``iter()``.

        Any rank's state resumes every rank, on any layout, when it was saved in lockstep
        (``on_error="raise"``, no rollover carry) by a job whose ranks ran in step, as
        frameworks that save rank 0's state only assume (NOTE [ One state for every rank ];
        ``explain()`` says so). An empty dict loads nothing.

        Raises
        ------
        StateError
            The state is from another version, dataset length, seed, batch size,
            ``last_batch`` mode, sampler or global order, or another rank's that cannot
            locate this one; the message says which.
        """
        if isinstance(state, dict) and not state:
            return   # DCP and torchdata pass {} for "nothing saved"
        self._auto_rank()
        state, applied = check_state(self, state)
        s = self._pure_sampler()
        with self._lock:
            self._applied = applied
            self._warm.drop()
            if int(state["seed"]) != self.seed:
                self._adopt_seed(int(state["seed"]))
            if s is not None and "sampler_state" in state:
                s.load_state_dict(state["sampler_state"])
            self._resume = json.loads(json.dumps(state))

    def _adopt_seed(self, seed: int) -> None:
        """Take a saved run's seed (only when this loader's own seed was drawn, not given)."""
        self.seed = seed
        s = self._pure_sampler()
        if self._own_sampler and isinstance(s, RandomSampler):
            s.seed = seed
        if self._pool is not None:
            self._pool.seed = seed

    # -- iteration --------------------------------------------------------------------
    # NOTE [ Lazy iter ]
    # ``iter(loader)`` only makes a handle: the epoch is chosen (a loaded state, the sampler's
    # epoch), the run planned and its threads started at the first ``next()``, as torch's
    # DataLoader, whose sampler is iterated only then. Trainers rely on it: Lightning calls
    # ``iter()`` once to check that a loader is iterable and drops it, and calls the epoch's
    # ``iter()`` before ``set_epoch`` on the sampler; an iterator that began at ``iter()`` would
    # have run the epoch before the one asked for, with threads started for nothing.
    def __iter__(self) -> LoaderIterator:
        if self._closed:
            raise RuntimeError("this DataLoader is closed")
        post: tuple = ()
        if self.batch_transform is not None:
            post += (BatchTransformStep(self.batch_transform),)
        if self.output == "torch":
            post += (TorchStep(self._bfloat16_first()),)
        return LoaderIterator(None, self, post, start=self._start_run)

    # NOTE [ Rank at the first iter() ]
    # An iterable dataset's loader built without rank= and world_size= takes them from
    # torch.distributed (else RANK/WORLD_SIZE) until its first run starts, not only when it is
    # built: trainers (Lightning) build loaders before or apart from the process group.
    def _auto_rank(self) -> None:
        if self._rank_auto and self._last_state is None:
            r, w = default_rank()
            if (r, w) != (self.rank, self.world_size):
                self.rank, self.world_size = r, w
                if self._iterable:
                    self._analysis = _iterable_analysis(self.dataset, r, w, self.num_workers)
                else:
                    bs = self._batch_sampler
                    self._batch_sampler = own_batches(len(self.dataset), bs.batch_size, bs.last_batch, self._shuffle,
                                                      self.seed, self._seed_given, r, w)

    def _start_run(self, it: LoaderIterator) -> _Run:
        """The run of iterator ``it``, at its first ``next()`` (NOTE [ Lazy iter ])."""
        if self._closed:
            raise RuntimeError("this DataLoader is closed")
        self._auto_rank()
        if self.recorder.enabled:
            # Before the run starts: its driver records from its first batch on.
            self.recorder.epoch_started(self.num_threads if self.engine != "processes" else self.num_workers,
                                        self._batch_size)
        with self._lock:
            resume, self._resume = self._resume, None
            if self._iterable:
                run = self._iterable_run(resume)
            else:
                if resume is not None:
                    order, delivered, position, epoch = resumed_order(self._batch_sampler, resume,
                                                                      self._last_batch == "discard")
                    self._epoch = self._epoch if epoch is None else epoch
                else:
                    order, self._epoch = next_order(self._batch_sampler, self._pure_sampler() is not None,
                                                    self._epoch)
                    delivered = position = 0
                run = self._take_warm(order) if resume is None else None
                if run is None:
                    run = self._new_run(RunState(order, self.seed, delivered=delivered, position=position))
        if isinstance(run.recorder, HeldRecorder):
            run.recorder.release()
        self._current = weakref.ref(it)   # never keep an abandoned iterator alive
        if self._last_state is not None:
            self._errors.extend(self._last_state.skipped)
        self._last_state = run.state
        return run

    def _iterable_run(self, resume: dict | None) -> _Run:
        if resume is not None:
            resume_source(self.dataset, resume)
            epoch = int(resume["epoch"])
        else:
            epoch = self._epoch
        self._epoch = epoch + 1
        state = IterableRunState(epoch, self.seed, self._batch_size, self._last_batch == "discard",
                                 length=None)
        if resume is not None:
            state.delivered = state.next_batch = state.produced = int(resume["delivered"])
            state.position = state.cursor = int(resume["position"])
            state.source_state = resume.get("source_state")
        return self._new_run(state)

    def _new_run(self, state: RunState, warm: bool = False) -> _Run:
        recorder = HeldRecorder(self.recorder) if warm else self.recorder
        if warm:
            state.live.clear()   # NOTE [ Warm slots ] in _engines/base.py
        announce_order(self._analysis.native_source, state.order.stream, state.cursor)   # NOTE [ Epoch order to the dataset ]
        producer = self._make_producer(state, recorder)
        run = _Run(state=state, producer=producer, knobs=self._knobs, recorder=recorder, timeout=self.timeout,
                   threaded=self._knobs.num_threads != 0 and not self._analysis.token_batches)   # no driver thread
        if warm:   # the epoch after the one being consumed
            run.after_epoch(getattr(self._current and self._current(), "_run", None), self._arena_ring)
        if self.worker_init_fn is not None and self.engine == "native" and not self._native_init_done:
            self._native_init_done = True
            run.on_start = self._native_worker_init
        run.start()
        return run

    def _native_worker_init(self) -> None:
        assert self.worker_init_fn is not None   # _new_run sets this hook only with a worker_init_fn
        native_worker_init(self.worker_init_fn, kernel_threads(self._knobs), self.seed, self.dataset)

    # NOTE [ Warm epochs ]
    # A loader iterated epoch after epoch would idle the model at every epoch start while the
    # prefetch queue refills. So once every batch of the current epoch is planned, or once its
    # read-ahead has queued the epoch's last reads (``Producer.reads_issued``; the next epoch's
    # reads continue these), the next epoch's run is started: its first batches are ready when
    # the user calls iter() again. It needs an order that is a pure function of the epoch (a
    # loaderlib Sampler); it is used only if iter() asks for exactly that epoch, carry and order
    # key, else closed (set_epoch, new weights, load_state_dict, flush, close, loader dropped).

    #: Start the next epoch early (NOTE [ Warm epochs ]); benchmarks/epochs.py turns it off on
    #: one loader to measure what it saves.
    _warm_epochs = True

    def _epoch_nearly_done(self, run: _Run) -> None:
        if self._warm.run is not None or self._closed or not self._warm_epochs:
            return
        s = self._pure_sampler()
        if s is None or self._resume is not None:
            return
        it = self._current() if self._current is not None else None
        if it is None or it._run is not run:
            return
        with self._lock:
            if self._warm.run is not None:
                return
            order = self._batch_sampler.plan_epoch(s.epoch)
            if order.targets:
                self._warm.put(order, self._new_run(RunState(order, self.seed), warm=True))

    def _take_warm(self, order: EpochOrder) -> _Run | None:
        run = self._warm.take(lambda w, r: (w.epoch == order.epoch and w.key == order.key and not r.closed
                                            and np.array_equal(w.carry_in, order.carry_in)))
        if run is not None:
            run.state.live.set()
        return run

    def _iterator_closed(self, run: _Run) -> None:
        """An iterator ended (exhausted, closed or dropped): unless a warm next epoch uses
        them, the Python pool's threads go too, so an idle loader holds no threads."""
        if not run.state.exhausted or run.failed or run.interrupted:
            self._warm.drop()   # an early break or an error: nothing of this loader keeps running
        it = self._current() if self._current is not None else None
        busy = self._warm.run is not None or (it is not None and not it._run.closed)
        if not busy and self._pool is not None:
            # Never wait after a timeout or Ctrl-C: a pool thread may be stuck in user code.
            self._pool.close(wait=not run.interrupted and threading.current_thread() is not run.thread)

    def flush(self) -> None:
        """Drop prefetched batches not yet delivered and prepare them again.

        Call it after ``WeightedRandomSampler.set_weights`` to apply the new weights from
        the next batch on (otherwise they apply from the next epoch). Exact resume holds:
        the state records the weights the rest of the epoch is drawn with.
        """
        with self._lock:
            self._warm.drop()
            it = self._current() if self._current is not None else None
            if it is None or it._run.closed:
                return
            old = it._run.state
            bsamp = self._batch_sampler
            s = self._pure_sampler()
            if s is not None:
                new = bsamp.plan_epoch(old.epoch, carry=old.order.carry_in)
                stream = np.concatenate([old.order.stream[:old.position], new.stream[old.position:]])
                order = EpochOrder(old.epoch, stream, new.targets, new.drop_short, new.carry_in, new.carry_out,
                                   new.key)
                bsamp._carry = new.carry_out
            else:
                order = old.order
            it._swap(self._new_run(RunState(order, self.seed, delivered=old.delivered, position=old.position)))
            self._errors.extend(f for f in old.skipped if f.index in set(old.order.stream[:old.position].tolist()))
            self._last_state = it._run.state

    def _arena(self) -> BatchArena:
        # One ring per loader, reused by every epoch: slots are allocated once. The queue,
        # the batch being produced and the one the user holds; with warm epochs (NOTE [ Warm
        # epochs ]) also the next epoch's queue and batch in production. The native engine
        # has two batches in production (NOTE [ One queue across batches ]).
        per_run = self._knobs.prefetch + (3 if self.engine == "native" else 2)
        slots = per_run
        if self._pure_sampler() is not None and self.engine != "processes":
            slots += 2   # room for a warm next epoch's first batches, taken from written slots (NOTE [ Warm slots ])
        if self._arena_ring is None:
            self._arena_ring = BatchArena(slots, allocator=self._pinned_allocator())
            if self._knobs.depth is not None:
                self._arena_ring.on_release = self._knobs.depth.wake
        self._arena_ring.num_slots = slots
        return self._arena_ring

    def _read_budget(self) -> int | None:
        """Bytes the read-ahead buffers may hold (NOTE [ Read-ahead memory ]): what
        ``ram_budget`` leaves after the arena's slots (at least an eighth of it); None without
        a budget."""
        if self.ram_budget is None:
            return None
        per_batch = batch_nbytes(self) or 0
        slots = self._arena_ring.num_slots if self._arena_ring is not None else 0
        return max(self.ram_budget // 8, self.ram_budget - slots * per_batch)

    def _python_pool(self) -> PythonPool:
        if self._pool is None:
            self._pool = PythonPool(self._knobs, worker_init_fn=self.worker_init_fn, seed=self.seed,
                                    dataset=self.dataset)
        return self._pool

    def _make_producer(self, state: RunState, recorder: Recorder) -> Producer:
        return make_producer(self, state, recorder)

    def close(self) -> None:
        """Stop threads and workers and free arena slots. Idempotent."""
        current = self._current() if self._current is not None else None
        if current is not None:
            current.close()
        self._current = None
        self._warm.drop()
        if self._pool is not None:
            self._pool.close()
            self._pool = None
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
            self._warm.drop_at_exit()   # bounded: the driver may be inside user code
            if self._pool is not None:
                self._pool.close(wait=False)
            if self._workers is not None:
                self._workers.close()
        except Exception:  # noqa: BLE001, S110
            pass

    # -- pickling: configuration travels, running state does not ------------------------
    _RUNTIME = ("_analysis", "_errors", "_epoch", "_lock", "_workers", "_pool", "_arena_ring", "_current", "_warm",
                "_resume", "_applied", "_closed", "_tuner", "_last_state")

    def __getstate__(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in self._RUNTIME}
        d["_knobs"] = (self._knobs.num_threads, self._knobs.prefetch, self._knobs.io_depth)
        d["recorder"] = self.recorder.enabled
        d["_saved_position"] = self.state_dict()
        return d

    def __setstate__(self, d: dict) -> None:
        saved = d.pop("_saved_position")
        num_threads, prefetch, io_depth = d.pop("_knobs")
        enabled = d.pop("recorder")
        self.__dict__.update(d)
        self._analysis = _analyze(self.dataset, self.batchify_fn, self.num_workers)
        self._knobs = _Knobs(num_threads, prefetch, io_depth)
        self._knobs.depth = depth_for(self)
        self.recorder = _make_recorder(enabled)
        self._errors = []
        self._init_runtime()
        self.load_state_dict(saved)

    def _pinned_allocator(self) -> Callable[[int], Any] | None:
        """With ``pin_memory``, arena slots are page-locked once, when allocated (NOTE [ Pinned
        slots ] in arena.py), so pinning costs nothing per batch."""
        if not self.pin_memory:
            return None
        return pinned_allocator(self._pin_target())

    def _pin_target(self) -> Any:
        return _pin_device(self.pin_memory_device) if self.pin_memory_device else None

    def _host_registrar(self) -> HostRegistrar | None:
        """With ``pin_memory``, the processes engine's shared-memory slots are registered with
        CUDA once, when made (NOTE [ Registering shared-memory slots ] in arena.py)."""
        return HostRegistrar(self._pin_target()) if self.pin_memory else None

    def _bfloat16_first(self) -> bool:
        """Whether the batch's first field holds bfloat16 bits (NOTE [ bfloat16 as uint16 bits ])."""
        return bfloat16_first(self.dataset)


#: ``output="torch"`` iterators are :class:`LoaderIterator` objects whose last post-step turns
#: each batch into torch tensors; the name stays for code written against it.
TorchLoaderIterator = LoaderIterator
