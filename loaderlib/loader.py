"""The DataLoader: picks an engine for a dataset, transform chain and batchify function.

Engines (how each one runs: NOTE [ Engine stages ] in ``_engine_base.py``):

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

import json
import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _threads
from . import transforms as T
from ._chain import compile_chain
from ._engine_base import HeldRecorder, LoaderIterator, RunState, _Knobs, _Run
from ._engine_local import (
    HybridProducer,
    NativeProducer,
    PythonPool,
    ThreadsProducer,
    kernel_threads,
)
from ._iterable import (
    IterableProducer,
    IterableRunState,
    cannot_resume,
    default_rank,
    is_iterable_dataset,
    is_stateful,
    resume_source,
)
from ._source import NativeSource, SourceKind, announce_order, native_source_of
from ._tree import tree_map
from ._worker_info import WorkerInfo, set_thread_info, worker_seed
from .arena import BatchArena, HostRegistrar, pinned_allocator
from .batchify import Pad, Stack, Tuple, default_batchify_fn
from .datasets import (
    ArrayDataset,
    SimpleDataset,
    TupleDataset,
    _TransformDataset,
)
from .errors import StateError
from .sampler import (
    LAST_BATCH_MODES,
    BatchSampler,
    EpochOrder,
    RandomSampler,
    Sampler,
    SequentialSampler,
    ShardedSampler,
    draw_seed,
)

__all__ = ["DataLoader", "LoaderIterator", "TorchLoaderIterator"]

ENGINES = ("native", "threads", "processes")


def _make_recorder(enabled: bool) -> Any:
    from ._recorder import StageRecorder

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


# NOTE [ Naming Python steps ]
# explain() names every step the engine cannot fuse by its qualified name (module.qualname for
# functions, lambdas included; the repr otherwise) wherever it stands: first in the chain (no
# native prefix at all), after a native prefix, in a .transform(fn) layer, or as the batchify
# function; and each reason says which step made the engine leave the kernels.
def _describe(fn: Any) -> str:
    """A step's name for explain(): its qualified name for functions (never cut), else its repr
    (long reprs are shortened in the middle, so both ends stay readable)."""
    name = getattr(fn, "__qualname__", None)
    if name is not None and callable(fn) and not isinstance(fn, type):
        module = getattr(fn, "__module__", None)
        full = f"{module}.{name}" if module and module not in ("__main__", "builtins") else name
        code = getattr(fn, "__code__", None)
        if "<lambda>" in name and code is not None:   # where it was written: lambdas share one name
            full += f" ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"
        return full
    r = repr(fn)
    return r if len(r) <= 120 else r[:70] + " ... " + r[-45:]


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
    """Per output part, num_shards (Stack) or the Pad (NOTE [ Native Pad ]) if ``fn`` collates
    natively, else None."""
    if fn is None or fn is default_batchify_fn:
        return (None,) * nparts
    if isinstance(fn, (Stack, Pad)) and fn.dtype is None and nparts == 1:
        return (fn.num_shards if isinstance(fn, Stack) else fn,)
    if isinstance(fn, Tuple) and len(fn.fns) == nparts:
        out = []
        for f in fn.fns:
            if f is default_batchify_fn:
                out.append(None)
            elif isinstance(f, Stack) and f.dtype is None:
                out.append(f.num_shards)
            elif isinstance(f, Pad) and f.dtype is None:
                out.append(f)
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

    src = native_source_of(base)
    if src is not None and src.kind is SourceKind.ARRAYS and layers:
        src = None   # a Python transform of array rows: gathered and transformed from Python
    if src is not None:
        stages.append(("read", "native", src.stage))
        nparts = src.parts
    else:
        what = getattr(base, "python_read", None)
        if what:
            stages.append(("read", "python", what))
            why_py.append(what)
        else:
            stages.append(("read", "python", f"{type(base).__name__}: dataset[i] is Python code"))
            why_py.append(f"the dataset ({type(base).__name__}) is indexed from Python")

    hybrid = None
    plan_spec = None
    plan = None
    if src is not None and src.kind is not SourceKind.ARRAYS:
        steps = _steps(firsts) if ordered else []
        k, plan = _native_prefix(steps) if ordered else (0, None)
        if plan is None:
            from . import transforms as T

            chain = _steps(firsts)
            stages.append(("decode", "python", "dataset[i] decodes each sample, called from Python"))
            for fn in chain:   # every step by name, wherever it stands (NOTE [ Naming Python steps ])
                native = isinstance(fn, T.Transform)
                stages.append(("transform", "native" if native else "python",
                               f"{_describe(fn)} (per sample, " + ("a kernel called from Python)" if native
                                                                    else "Python code)")))
            for fn in others:
                stages.append(("transform", "python", f".transform({_describe(fn)}) on whole samples"))
            py = [_describe(fn) for fn in chain if not isinstance(fn, T.Transform)]
            if not ordered:
                why_py.append(".transform(fn) layers sit below transform_first ones")
            elif chain and not isinstance(chain[0], T.Transform):
                why_py.append(f"the chain starts with a Python step ({py[0]}): the native engine fuses a leading run "
                              "of loaderlib transforms that ends in a fixed size, and none comes before it")
            else:
                why_py.append("no leading run of loaderlib transforms gives a fixed output size (add a crop or "
                              "Resize((h, w)))" + (f"; the chain holds Python steps ({', '.join(py)})" if py else ""))
            if others:
                why_py.append(".transform(fn) applies a Python function to whole samples")
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
        plain = batchify_fn in (None, default_batchify_fn) or isinstance(batchify_fn, (Stack, Pad, Tuple))
        name = "default (Stack per field)" if batchify_fn in (None, default_batchify_fn) else _describe(batchify_fn)
        if plain:
            stages.append(("collate", "native", f"{name}, into arena slots when shapes allow"))
        else:
            # A user function is called on the list of samples and its result handed over as it
            # returns it (engines' collate(): only Stack/Pad/Tuple are planned into slots).
            what = (f"{name}: Python code called on each batch's list of samples; its result is handed over "
                    "as returned (not an arena slot)")
            stages.append(("collate", "python", what))
        if src is not None and not why_py:
            why_py.append(f"the batchify function {name} is Python code (loaderlib collates natively only the "
                          "default, Stack, Pad and a Tuple of those)" if not plain else
                          f"the batchify function {name} cannot collate this dataset's fields natively")

    if src is not None and not why_py:
        reason = "every stage runs in native kernels (zero Python per sample)"
        if num_workers > 0:
            reason += (f"; no worker process is needed, so num_workers={num_workers} sets the kernel thread count "
                       "(num_threads overrides it)")
        return _Analysis("native", reason, stages, src, plan_spec, shards, None, plan)
    reason = "; ".join(why_py)
    if fallback == "processes" and hybrid is not None:
        # NOTE [ Native prefix in workers ]: each worker runs the fused native prefix on its
        # batch in one kernel call (read, DCT-scaled or cropped decode, resize) with the run's
        # (seed, epoch) keys, and only the Python tail per sample, so a worker pays what the
        # native engine pays for decode + crop and the samples equal the threads engine's.
        reason += (f"; num_workers={num_workers}: each worker process runs the native steps in the kernels and "
                   "the Python steps after them")
        worker = [(st, "worker" if kind == "native" and st != "collate" else kind, d) for st, kind, d in stages
                  if st != "collate"]
        worker.append(("collate", "worker", "batchify in the worker, into a shared-memory slot when shapes allow"))
        return _Analysis(fallback, reason, worker, src, plan_spec, None, hybrid, plan)
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


def _single_array(d: Any) -> np.ndarray | None:
    """The array behind a one-array ArrayDataset or a bare array (items are its rows)."""
    if isinstance(d, np.ndarray) and d.ndim >= 1 and d.dtype != object:
        return d
    if type(d) is ArrayDataset and len(d.arrays) == 1 and isinstance(d.arrays[0], np.ndarray) \
            and d.arrays[0].dtype != object:
        return d.arrays[0]
    return None


def _as_dataset(dataset: Any) -> Any:
    if is_iterable_dataset(dataset):
        return dataset   # consumed lazily (NOTE [ Iterable shards ])
    if isinstance(dataset, np.ndarray) and dataset.ndim >= 1 and dataset.dtype != object:
        return ArrayDataset(dataset)   # runs natively: rows gathered with take
    if isinstance(dataset, TupleDataset):
        arrays = [_single_array(d) for d in dataset.datasets]
        if all(a is not None for a in arrays):
            return ArrayDataset(*arrays)   # the same items, gathered natively
    if hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__"):
        return dataset
    if hasattr(dataset, "__iter__"):
        return SimpleDataset(list(dataset))
    raise TypeError(f"dataset must have __len__ and __getitem__ (or be iterable), got {type(dataset).__name__}")


#: Version of the dict :meth:`DataLoader.state_dict` returns; bumped when its meaning changes.
STATE_VERSION = 1

_MP_CONTEXTS = (None, "spawn", "forkserver")
_LOAD_BALANCE = ("round_robin", "least_loaded")


def _positive_int(value: Any, name: str, *, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _seed_from_generator(generator: Any) -> int:
    """A 63-bit seed drawn from a ``torch.Generator`` or ``numpy.random.Generator``."""
    if isinstance(generator, np.random.Generator):
        return int(generator.integers(0, 1 << 63, dtype=np.int64))
    if type(generator).__module__.startswith("torch") and hasattr(generator, "initial_seed"):
        import torch

        # What torch's RandomSampler does with a generator: draw a seed from it.
        return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item()) & ((1 << 63) - 1)
    raise ValueError(f"generator must be a torch.Generator or numpy.random.Generator, got {type(generator).__name__}")


def _mp_context_name(ctx: Any) -> str | None:
    if ctx is None or isinstance(ctx, str):
        name = ctx
    elif hasattr(ctx, "get_start_method"):
        name = ctx.get_start_method()
    else:
        raise ValueError(f"multiprocessing_context must be a start method name or a multiprocessing context, "
                         f"got {ctx!r}")
    if name not in _MP_CONTEXTS:
        raise ValueError(f"multiprocessing_context={name!r} cannot be honoured: loaderlib workers are always fresh "
                         "interpreters (like 'spawn'); 'fork' would inherit an OpenMP pool that hangs "
                         "(use 'spawn', 'forkserver' or None)")
    return name


def _iterable_analysis(dataset: Any, rank: int, world_size: int, num_workers: int) -> _Analysis:
    if num_workers > 0:
        what = (f"{type(dataset).__name__}: each of {num_workers} worker processes iterates its own copy and keeps "
                f"one item of every {num_workers} (of this rank's share)")
        stages = [("read", "worker", what), ("collate", "worker", "batchify in the worker, into shared memory")]
        return _Analysis("processes", f"an iterable dataset is read by {num_workers} worker processes; batch k "
                                      f"comes from worker k mod {num_workers}", stages)
    what = f"{type(dataset).__name__}: items pulled from one iterator as each batch is made"
    if world_size > 1:
        what += f"; rank {rank} keeps one item of every {world_size} (NOTE [ Iterable shards ])"
    stages = [("read", "python", what), ("collate", "native", "into arena slots when shapes allow")]
    return _Analysis("threads", "an iterable dataset is read lazily, in order, by the producing thread", stages)


class DataLoader:
    """Load batches from a dataset with the fastest engine its steps allow.

    Parameters
    ----------
    dataset : Dataset, sequence or iterable
        Any object with ``__len__``/``__getitem__``, or any iterable (infinite ones included),
        which is consumed lazily, batch by batch, never materialised (NOTE [ Iterable shards ]
        in ``_iterable.py``).
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
        Batches kept ready ahead of the consumer (default ``max(2, 2 * num_workers)``).
        Settable while iterating.
    pin_memory : bool
        Page-lock the arena slots once, when they are allocated, so batches copy to a GPU
        asynchronously at no per-batch cost: torch's pinned allocator on the in-process
        engines, ``cudaHostRegister`` of each shared-memory slot on the processes engine.
        Without torch with CUDA it warns once, naming the keyword, and loads unpinned, as
        PyTorch's DataLoader does (NOTE [ pin_memory without CUDA ]).
    timeout : float
        Seconds any wait for a batch may take before :class:`LoaderTimeoutError` (None or 0:
        wait forever).
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
        Accepted for PyTorch compatibility: workers are always fresh interpreters; "fork"
        raises ``ValueError``.
    in_order : bool
        PyTorch's keyword. ``False`` permits out-of-order batches; loaderlib always delivers
        in order (exact resume depends on it), which satisfies both settings.
    pin_memory_device : str
        Device the pinned memory is for (requires ``pin_memory=True``): slots are allocated or
        registered with it current.
    load_balance : {"round_robin", "least_loaded"}
        Processes engine: which worker gets the next batch.
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
        leave (at least an eighth; NOTE [ Read-ahead memory ] in ``_readahead.py``).
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
        from ._autotune import AUTOTUNE, parse_bytes

        if batch_transform is not None and not isinstance(batch_transform, T.BatchTransform):
            raise TypeError("batch_transform must be a loaderlib.transforms MixUp, CutMix or RandomChoice of them, "
                            f"got {type(batch_transform).__name__}")
        self.batch_transform = batch_transform
        tune_threads = num_threads is not None and not isinstance(num_threads, bool) and num_threads == AUTOTUNE
        tune_prefetch = prefetch is not None and not isinstance(prefetch, bool) and prefetch == AUTOTUNE
        num_threads = None if tune_threads else num_threads
        prefetch = None if tune_prefetch else prefetch
        self._tune_io = io_depth is not None and not isinstance(io_depth, bool) and io_depth == AUTOTUNE
        if self._tune_io:
            io_depth = None   # the adaptive depth is the tuner (NOTE [ Read-ahead depth ])
        elif io_depth is not None and (isinstance(io_depth, bool) or not isinstance(io_depth, (int, np.integer))
                                       or io_depth < 0):
            raise ValueError(f"io_depth must be a non-negative integer (reads in flight; 0 reads inside the "
                             f"decode threads), None (adapt) or ll.AUTOTUNE, got {io_depth!r}")
        self.ram_budget = None if ram_budget is None else parse_bytes(ram_budget)
        self.dataset = _as_dataset(dataset)
        self._iterable = is_iterable_dataset(self.dataset)
        if self._iterable:
            self._check_iterable(batch_size, shuffle, sampler, batch_sampler, num_workers, rank, world_size)
            n = 0
        elif rank is not None or world_size is not None:
            raise ValueError("rank and world_size shard iterable datasets; a map-style dataset is sharded by "
                             "sampler=ShardedSampler(world_size, rank)")
        else:
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
        if batch_size is not None:
            _positive_int(batch_size, "batch_size")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or timeout < 0):
            raise ValueError(f"timeout must be a non-negative number of seconds (0 or None: wait forever), "
                             f"got {timeout!r}")
        if max_skipped is not None:
            ok = (isinstance(max_skipped, (int, np.integer)) and not isinstance(max_skipped, bool)
                  and max_skipped >= 0) or (isinstance(max_skipped, float) and 0 < max_skipped < 1)
            if not ok:
                raise ValueError(f"max_skipped must be a count (int >= 0) or a fraction of the epoch (0 < float < "
                                 f"1), got {max_skipped!r}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be a non-negative integer, got {num_workers!r}")
        if num_threads == 0 and not isinstance(num_threads, bool):
            if num_workers > 0:
                raise ValueError(f"num_threads=0 runs everything in the calling thread; it conflicts with "
                                 f"num_workers={num_workers}")
        elif num_threads is not None:
            _threads.resolve_num_threads(num_threads)  # validates
        _positive_int(prefetch, "prefetch")
        _positive_int(prefetch_factor, "prefetch_factor")
        if prefetch is not None and prefetch_factor is not None:
            raise ValueError("prefetch and prefetch_factor both set the prefetch depth: pass only one")
        if batchify_fn is not None and not callable(batchify_fn):
            raise TypeError(f"batchify_fn must be callable, got {batchify_fn!r}")
        if generator is not None and seed is not None:
            raise ValueError("seed and generator both seed the loader: pass only one")
        if not isinstance(persistent_workers, bool):
            raise ValueError(f"persistent_workers must be a bool, got {persistent_workers!r}")  # noqa: TRY004
        if not isinstance(in_order, bool):
            raise ValueError(f"in_order must be a bool, got {in_order!r}")  # noqa: TRY004
        if pin_memory_device and not pin_memory:
            raise ValueError(f"pin_memory_device={pin_memory_device!r} needs pin_memory=True")
        if load_balance not in _LOAD_BALANCE:
            raise ValueError(f"load_balance must be one of {_LOAD_BALANCE}, got {load_balance!r}")
        _positive_int(max_in_flight, "max_in_flight")
        self.multiprocessing_context = _mp_context_name(multiprocessing_context)
        self.output = _output_kind(output, self.dataset)
        if pin_memory_device:
            _pin_device(pin_memory_device)   # validates the spelling before anything runs

        self.seed = (_seed_from_generator(generator) if generator is not None
                     else draw_seed() if seed is None else int(seed))
        self._seed_given = seed is not None or generator is not None
        self.on_error = on_error
        self.max_skipped = max_skipped
        self.timeout = timeout if timeout else None
        self.num_workers = num_workers
        self.worker_init_fn = worker_init_fn
        self.batchify_fn = batchify_fn
        self.persistent_workers = persistent_workers
        self.in_order = in_order
        self.load_balance = load_balance
        self.prefetch_factor = prefetch_factor
        self.max_in_flight = max_in_flight if max_in_flight is not None else (prefetch_factor or 2) * max(1, num_workers)
        self.pin_memory = bool(pin_memory)
        self.pin_memory_device = pin_memory_device
        self._own_sampler = False
        if self._iterable:
            self._batch_size = int(batch_size)
            self._batch_sampler = None
        elif batch_sampler is not None:
            self._batch_sampler = batch_sampler
            bs = getattr(batch_sampler, "batch_size", None)
            self._batch_size = int(bs) if bs else max((len(b) for b in batch_sampler), default=1)
        else:
            self._batch_size = int(batch_size)
            self._own_sampler = sampler is None
            if sampler is None:
                sampler = RandomSampler(n, seed=self.seed) if shuffle else SequentialSampler(n)
            elif isinstance(sampler, ShardedSampler) and sampler._length is None:
                sampler._length = n   # bound in place: the caller's set_epoch keeps acting on it
            self._batch_sampler = BatchSampler(sampler, self._batch_size, last_batch or "keep")
        self._last_batch = (last_batch or "keep") if self._iterable else getattr(self._batch_sampler, "last_batch",
                                                                                "keep")
        self._analysis = (_iterable_analysis(self.dataset, self.rank, self.world_size, num_workers)
                          if self._iterable else _analyze(self.dataset, batchify_fn, num_workers))
        if num_threads is None and num_workers > 0 and self._analysis.engine == "native":
            num_threads = num_workers   # explain() says so
        depth = prefetch if prefetch is not None else (
            prefetch_factor * max(1, num_workers) if prefetch_factor is not None else max(2, 2 * num_workers))
        self._knobs = _Knobs(num_threads, depth, None if io_depth is None else int(io_depth))
        self.recorder = _make_recorder(profile)
        self._errors: list = []
        self._init_runtime()
        if self.pin_memory:
            self._check_pin()
        self._tuner = None
        if tune_threads or tune_prefetch or self.ram_budget is not None:
            from ._autotune import attach

            # NOTE [ Autotune ]: with a budget alone nothing is tuned, but one batch must fit.
            attach(self, num_threads=tune_threads, prefetch=tune_prefetch, ram_budget=self.ram_budget)

    def _check_iterable(self, batch_size: Any, shuffle: bool, sampler: Any, batch_sampler: Any, num_workers: int,
                        rank: int | None, world_size: int | None) -> None:
        clash = [name for name, bad in (("shuffle", bool(shuffle)), ("sampler", sampler is not None),
                                        ("batch_sampler", batch_sampler is not None)) if bad]
        if clash:
            raise ValueError(f"an iterable dataset decides its own order; it conflicts with {', '.join(clash)}")
        if batch_size is None:
            raise ValueError("batch_size is required for an iterable dataset")
        r, w = default_rank()
        self.rank = r if rank is None else rank
        self.world_size = w if world_size is None else world_size
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size must be a positive integer, got {self.world_size!r}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank!r}")

    def _init_runtime(self) -> None:
        """Fields that belong to this process only (rebuilt after unpickling)."""
        self._epoch = 0            # epochs of a sampler that is not a loaderlib Sampler
        self._lock = threading.RLock()
        self._workers = None       # processes engine: the worker pool, created on first use
        self._pool = None          # threads engine: the Python pool, created on first use
        self._arena_ring: BatchArena | None = None
        self._current: Any = None  # weak reference to the newest iterator
        self._warm: _Run | None = None   # the next epoch, started early (NOTE [ Warm epochs ])
        self._resume: dict | None = None
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
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"prefetch must be a positive integer, got {value!r}")
        self._knobs.prefetch = value

    @property
    def batch_size(self) -> int:
        return self._batch_size

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
    def stats(self) -> Any:
        """Per-stage timings of the current or last epoch (the recorder's snapshot); with
        ``AUTOTUNE``, ``stats.autotune`` lists the tuner's decisions, timed in seconds since the
        loader was created (on the profiling clock, as ``stats.started_s``)."""
        import dataclasses

        snap = self.recorder.snapshot()
        tuner = getattr(self, "_tuner", None)
        if tuner is not None and tuner.decisions:
            snap = dataclasses.replace(snap, autotune=tuple(tuner.decisions))
        return dataclasses.replace(snap, memory=self.memory())

    def memory(self) -> dict:
        """Bytes this loader holds now, by part: ``"batch slots"`` (the arena's ring, the warm
        next epoch's slots included; NOTE [ Warm slots ]) and ``"read-ahead"`` (the buffers of
        the read-ahead stages of the runs alive; NOTE [ Read-ahead memory ])."""
        ring = self._arena_ring
        parts = {"batch slots": int(ring.stats["capacity_bytes"]) if ring is not None else 0, "read-ahead": 0}
        for run in (self._warm, self._current_run()):
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
        lines = [f"engine: {a.engine} ({a.reason})"]
        if self._knobs.num_threads == 0:
            lines.append("  num_threads=0: every stage runs in the calling thread, one batch per next()")
        for stage, kind, detail in a.stages:
            if stage == "read" and kind == "native":
                extract = self._extract_line()
                if extract is not None:
                    lines.append(f"  {'read-ahead':<17} {'native':<7} {extract}")
            lines.append(f"  {stage:<17} {kind:<7} {detail}")
        if self.batch_transform is not None:
            lines.append(f"  {'batch transform':<17} {'numpy':<7} {self.batch_transform.describe()}")
        return "\n".join(lines)

    def _read_waiting(self) -> float:
        """Share of the last turn the current run's kernel threads waited for bytes (0 without
        a read-ahead stage)."""
        run = self._current_run()
        reader = run.producer.reader if run is not None else None
        return float(reader.waiting) if reader is not None else 0.0

    def _extract_line(self) -> str | None:
        """What explain() says of the read-ahead stage (NOTE [ Read-ahead ]), or None when
        this loader has none (not files or byte ranges, or a Python engine)."""
        a = self._analysis
        src = a.native_source
        # A store's samples are read ahead too (NOTE [ Remote read-ahead ] in _remote/readahead.py).
        remote = src is not None and src.kind is SourceKind.BUFFERS and getattr(src.dataset, "_remote", None) is not None
        if src is None or (src.kind not in (SourceKind.FILES, SourceKind.SHARDS) and not remote) or a.plan is None:
            return None
        if a.engine == "processes":
            return None
        depth = self._knobs.io_depth
        if depth == 0:
            return ("off (io_depth=0): each batch's requests go out when the batch is produced" if remote else
                    "off (io_depth=0): each decode thread reads its own samples")
        if remote and self._current_run() is None:
            return "read-ahead from the store: requests issued ahead in the sampler's order by Python threads"
        run = self._current_run()
        reader = run.producer.reader if run is not None else None
        if reader is not None:
            return reader.describe()
        if depth is None:
            return ("reads issued ahead in the sampler's order by native IO threads; depth adapts to the measured "
                    "read latency and decode rate (Little's law), within ram_budget")
        return f"reads issued ahead in the sampler's order by native IO threads, io_depth={depth} in flight"

    def __repr__(self) -> str:
        return (f"DataLoader(engine={self.engine!r}, batch_size={self._batch_size}, batches={len(self)}, "
                f"num_threads={self.num_threads}, prefetch={self.prefetch})")

    def __len__(self) -> int:
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
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        with self._lock:
            if self._resume is not None and int(self._resume["epoch"]) != int(epoch):
                self._resume = None
            s = self._pure_sampler()
            target = s if s is not None else self.dataset if self._iterable else self._batch_sampler
            if hasattr(target, "set_epoch"):
                target.set_epoch(int(epoch))
            self._epoch = int(epoch)

    def _header(self) -> dict:
        s = self.sampler
        if self._iterable:
            return {"version": STATE_VERSION, "dataset_length": None, "seed": int(self.seed),
                    "batch_size": self._batch_size, "last_batch": self._last_batch, "sampler": "iterable",
                    "rank": self.rank, "world_size": self.world_size}
        return {"version": STATE_VERSION, "dataset_length": len(self.dataset), "seed": int(self.seed),
                "batch_size": self._batch_size, "last_batch": self._last_batch,
                "sampler": type(s).__name__ if s is not None else type(self._batch_sampler).__name__}

    def _state_of(self, state: Any) -> dict:
        """The loader state that continues after the last batch ``state`` (a RunState) delivered."""
        if self._iterable and (self.num_workers > 0 or not is_stateful(self.dataset)):
            raise cannot_resume(self.dataset, self.num_workers)
        run = state.state_dict()
        if self._iterable:
            if run.pop("finished"):
                return self._state_between(state.epoch + 1)
            return {**self._header(), **run}
        s = self._pure_sampler()
        if run.pop("finished"):
            return self._state_between(state.epoch + 1, state.order.carry_out)
        d = {**self._header(), **run}
        if s is not None:
            d["sampler_state"] = s.state_dict()
        else:
            # Not a pure function of the epoch: the rest of the epoch travels explicitly.
            order = state.order
            d["stream"] = order.stream[state.position:].tolist()
            d["targets"] = list(order.targets[state.delivered:])
        return d

    def _state_between(self, epoch: int | None = None, carry: np.ndarray | None = None) -> dict:
        if self._iterable:
            if self.num_workers > 0 or not is_stateful(self.dataset):
                raise cannot_resume(self.dataset, self.num_workers)
            return {**self._header(), "epoch": int(self._epoch if epoch is None else epoch), "delivered": 0,
                    "position": 0, "carry": [], "order_key": {}, "source_state": self.dataset.state_dict()}
        s = self._pure_sampler()
        bsamp = self._batch_sampler
        if carry is None:
            carry = bsamp._carry if isinstance(bsamp, BatchSampler) else np.zeros(0, np.int64)
        d = {**self._header(), "epoch": int(self.epoch if epoch is None else epoch), "delivered": 0, "position": 0,
             "carry": np.asarray(carry, np.int64).tolist(), "order_key": s.order_key() if s is not None else {}}
        if s is not None:
            d["sampler_state"] = s.state_dict()
            d["sampler_state"]["epoch"] = d["epoch"]
        return d

    def state_dict(self) -> dict:
        """The position in the data as plain JSON (never pickle).

        Counts batches delivered to the user, not prefetched ones: after
        :meth:`load_state_dict` the next ``iter()`` continues with the first batch not yet
        delivered, bitwise equal to an uninterrupted run. Between epochs it points at the
        start of the next one.
        """
        with self._lock:
            if self._resume is not None:
                return json.loads(json.dumps(self._resume))
            it = self._current() if self._current is not None else None
            if it is not None and not it._run.closed:
                return self._state_of(it._run.state)
            last = self._last_state
            return self._state_of(last) if last is not None else self._state_between()

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (from :meth:`state_dict`) at the next ``iter()``.

        Raises
        ------
        StateError
            The state is from another version, dataset length, seed, batch size,
            ``last_batch`` mode or sampler; the message says which.
        """
        if not isinstance(state, dict):
            raise StateError(f"a loader state is a dict, got {type(state).__name__}")
        if state.get("version") != STATE_VERSION:
            raise StateError(f"state version {state.get('version')!r} is not {STATE_VERSION} (this loaderlib)")
        mine = self._header()
        for key, what in (("dataset_length", "dataset length"), ("seed", "seed"), ("batch_size", "batch size"),
                          ("last_batch", "last_batch mode"), ("sampler", "sampler"), ("rank", "rank"),
                          ("world_size", "world size")):
            if key == "seed" and state.get(key) != mine[key] and not self._seed_given and state.get(key) is not None:
                continue   # this loader drew its seed: it takes the saved run's (adopted below)
            if key in mine and state.get(key) != mine[key]:
                raise StateError(f"the state is for {what} {state.get(key)!r}, this loader has {mine[key]!r}")
        for key in ("epoch", "delivered", "position", "carry"):
            if key not in state:
                raise StateError(f"the state has no {key!r} entry")
        s = self._pure_sampler()
        if self._iterable:
            if state.get("source_state") is not None and not is_stateful(self.dataset):
                raise StateError(f"the state holds an iterable's position, but {type(self.dataset).__name__} "
                                 "has no load_state_dict()")
        elif s is None and "stream" not in state and (state["delivered"] or state["position"]):
            raise StateError("a mid-epoch state of a sampler that is not a loaderlib Sampler needs its 'stream'")
        with self._lock:
            self._drop_warm()
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
    def _next_order(self) -> EpochOrder:
        """The next epoch's order; moves the sampler (and the rollover carry) on."""
        bsamp = self._batch_sampler
        if isinstance(bsamp, BatchSampler):
            if self._pure_sampler() is not None:
                return bsamp.next_epoch()
            e = self._epoch
            self._epoch += 1
            return bsamp.next_epoch(e)
        e = self._epoch
        self._epoch += 1
        if hasattr(bsamp, "set_epoch"):
            bsamp.set_epoch(e)
        batches = [np.asarray(list(b), dtype=np.int64).reshape(-1) for b in bsamp]
        stream = np.concatenate(batches) if batches else np.zeros(0, np.int64)
        empty = np.zeros(0, np.int64)
        return EpochOrder(e, stream, [b.size for b in batches], False, empty, empty, {})

    def _resumed_order(self, d: dict) -> tuple[EpochOrder, int, int]:
        bsamp = self._batch_sampler
        epoch = int(d["epoch"])
        if "stream" in d:
            empty = np.zeros(0, np.int64)
            order = EpochOrder(epoch, np.asarray(d["stream"], np.int64), [int(t) for t in d["targets"]],
                               self._last_batch == "discard", empty, empty, {})
            self._epoch = epoch + 1
            return order, 0, 0
        order = bsamp.plan_epoch(epoch, key=d.get("order_key") or None, carry=np.asarray(d["carry"], np.int64))
        bsamp._carry = order.carry_out
        bsamp.sampler.set_epoch(epoch + 1)
        return order, int(d["delivered"]), int(d["position"])

    def __iter__(self) -> LoaderIterator:
        if self._closed:
            raise RuntimeError("this DataLoader is closed")
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
                    order, delivered, position = self._resumed_order(resume)
                else:
                    order, delivered, position = self._next_order(), 0, 0
                run = self._take_warm(order) if resume is None else None
                if run is None:
                    run = self._new_run(RunState(order, self.seed, delivered=delivered, position=position))
        if isinstance(run.recorder, HeldRecorder):
            run.recorder.release()
        if self.output == "torch":
            cls = TorchLoaderIterator if self.batch_transform is None else _TorchBatchTransformIterator
        else:
            cls = LoaderIterator if self.batch_transform is None else _BatchTransformIterator
        it = cls(run, self)
        self._current = weakref.ref(it)   # never keep an abandoned iterator alive
        if self._last_state is not None:
            self._errors.extend(self._last_state.skipped)
        self._last_state = run.state
        return it

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
            state.live.clear()   # NOTE [ Warm slots ] in _engine_base.py
        announce_order(self._analysis.native_source, state.order.stream, state.cursor)   # NOTE [ Epoch order to the dataset ]
        producer = self._make_producer(state, recorder)
        run = _Run(state=state, producer=producer, knobs=self._knobs, recorder=recorder, timeout=self.timeout,
                   threaded=self._knobs.num_threads != 0)
        if warm and self._arena_ring is not None:
            run.room = self._arena_ring.has_room
        if self.worker_init_fn is not None and self.engine == "native" and not self._native_init_done:
            self._native_init_done = True
            run.on_start = self._native_worker_init
        run.start()
        return run

    def _native_worker_init(self) -> None:
        # The native engine has no Python workers and its kernel threads persist: as with
        # persistent workers, worker_init_fn runs once per kernel thread slot, before the
        # first batch, on the driver thread, with that slot's worker info.
        n = kernel_threads(self._knobs)
        try:
            for wid in range(n):
                set_thread_info(WorkerInfo(wid, n, worker_seed(self.seed, wid), self.dataset))
                self.worker_init_fn(wid)
        finally:
            set_thread_info(None)

    # NOTE [ Warm epochs ]
    # A loader iterated epoch after epoch would idle the model at every epoch start while
    # the prefetch queue refills. So once every batch of the current epoch has been planned
    # (the consumer is taking the last, already prefetched ones), the next epoch's run is
    # started: its first batches are ready when the user calls iter() again. This needs an
    # order that is a pure function of the epoch (a loaderlib Sampler), and the warm run is
    # used only if iter() asks for exactly that epoch, carry and order key; otherwise (a
    # set_epoch to another epoch, new sampler weights, load_state_dict, flush) it is closed.
    # close() and dropping the loader release it.

    #: Start the next epoch early (NOTE [ Warm epochs ]); benchmarks/epochs.py turns it off on
    #: one loader to measure what it saves.
    _warm_epochs = True

    def _epoch_nearly_done(self, run: _Run) -> None:
        if self._warm is not None or self._closed or not self._warm_epochs:
            return
        s = self._pure_sampler()
        if s is None or self._resume is not None:
            return
        it = self._current() if self._current is not None else None
        if it is None or it._run is not run:
            return
        with self._lock:
            if self._warm is not None:
                return
            order = self._batch_sampler.plan_epoch(s.epoch)
            if not order.targets:
                return
            self._warm = self._new_run(RunState(order, self.seed), warm=True)

    def _take_warm(self, order: EpochOrder) -> _Run | None:
        warm, self._warm = self._warm, None
        if warm is None:
            return None
        w = warm.state.order
        if (w.epoch == order.epoch and w.key == order.key and np.array_equal(w.carry_in, order.carry_in)
                and not warm.closed):
            w_state = warm.state
            w_state.live.set()
            return warm
        warm.close()
        return None

    def _drop_warm(self) -> None:
        warm, self._warm = self._warm, None
        if warm is not None:
            warm.close()

    def _iterator_closed(self, run: _Run) -> None:
        """An iterator ended (exhausted, closed or dropped): unless a warm next epoch uses
        them, the Python pool's threads go too, so an idle loader holds no threads."""
        if not run.state.exhausted or run.failed or run.interrupted:
            self._drop_warm()   # an early break or an error: nothing of this loader keeps running
        it = self._current() if self._current is not None else None
        busy = self._warm is not None or (it is not None and not it._run.closed)
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
            self._drop_warm()
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
        self._arena_ring.num_slots = slots
        return self._arena_ring

    def _read_budget(self) -> int | None:
        """Bytes the read-ahead buffers may hold (NOTE [ Read-ahead memory ]): what
        ``ram_budget`` leaves after the arena's slots (at least an eighth of it); None without
        a budget."""
        if self.ram_budget is None:
            return None
        from ._autotune import batch_nbytes

        per_batch = batch_nbytes(self) or 0
        slots = self._arena_ring.num_slots if self._arena_ring is not None else 0
        return max(self.ram_budget // 8, self.ram_budget - slots * per_batch)

    def _python_pool(self) -> PythonPool:
        if self._pool is None:
            self._pool = PythonPool(self._knobs, worker_init_fn=self.worker_init_fn, seed=self.seed,
                                    dataset=self.dataset)
        return self._pool

    def _make_producer(self, state: RunState, recorder: Any) -> Any:
        a = self._analysis
        if self.max_skipped is not None:
            n = state.order.stream.size if not self._iterable else 0
            state.max_skipped = (int(self.max_skipped) if isinstance(self.max_skipped, (int, np.integer))
                                 else max(1, int(self.max_skipped * n)) if n else None)
        common = {"recorder": recorder, "on_error": self.on_error, "state": state}
        if self._iterable and self.num_workers == 0:
            return IterableProducer(dataset=self.dataset, rank=self.rank, world_size=self.world_size,
                                    pad=self._last_batch != "discard", batchify_fn=self.batchify_fn,
                                    arena=self._arena(), **common)
        if a.engine == "native":
            plan = None if a.native_source.kind is SourceKind.ARRAYS else compile_chain(a.chain)
            if recorder.enabled:
                recorder.python_gil("python", False)
            return NativeProducer(src=a.native_source, plan=plan, shards=a.shards, arena=self._arena(),
                                  knobs=self._knobs, batch_size=self._batch_size, timeout=self.timeout,
                                  read_budget=self._read_budget(), **common)
        if recorder.enabled:
            recorder.python_gil("python", True)
        if a.engine == "threads" and a.hybrid is not None:
            native = NativeProducer(src=a.native_source, plan=compile_chain(a.chain), shards=(None, None),
                                    arena=self._arena(), knobs=self._knobs, batch_size=self._batch_size,
                                    timeout=self.timeout, read_budget=self._read_budget(), **common)
            return HybridProducer(native=native, suffix=a.hybrid["suffix"], suffix_position=a.hybrid["position"],
                                  others=a.hybrid["others"], batchify_fn=self.batchify_fn, arena=self._arena(),
                                  pool=self._python_pool(), **common)
        if a.engine == "threads":
            return ThreadsProducer(dataset=self.dataset, batchify_fn=self.batchify_fn, arena=self._arena(),
                                   pool=self._python_pool(), io_depth=self._knobs.io_depth,
                                   batch_size=self._batch_size, timeout=self.timeout,
                                   read_budget=self._read_budget(), read_hint=self._knobs.read_hint, **common)
        from ._engine_procs import NativePrefix, ProcessesProducer, WorkerPool

        if self._workers is None or self._workers.closed:
            prefix = None
            if a.hybrid is not None:
                prefix = NativePrefix(src=a.native_source, chain=a.chain, suffix=a.hybrid["suffix"],
                                      position=a.hybrid["position"], others=a.hybrid["others"],
                                      io_depth=self._knobs.io_depth, timeout=self.timeout)
            self._workers = WorkerPool(self.num_workers, self.dataset, self.batchify_fn, self.worker_init_fn,
                                       self.on_error, self.seed, load_balance=self.load_balance, prefix=prefix,
                                       registrar=self._host_registrar())
        else:
            self._workers.revive()   # a worker that died or timed out gets a fresh process
        if self._iterable:
            from ._engine_procs import IterableProcessesProducer

            return IterableProcessesProducer(pool=self._workers, timeout=self.timeout, knobs=self._knobs,
                                             max_in_flight=self.max_in_flight, rank=self.rank,
                                             world_size=self.world_size, pad=self._last_batch != "discard",
                                             batch_size=self._batch_size, **common)
        return ProcessesProducer(pool=self._workers, timeout=self.timeout, knobs=self._knobs,
                                 max_in_flight=self.max_in_flight, **common)

    def close(self) -> None:
        """Stop threads and workers and free arena slots. Idempotent."""
        current = self._current() if self._current is not None else None
        if current is not None:
            current.close()
        self._current = None
        self._drop_warm()
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
            self._drop_warm()
            if self._pool is not None:
                self._pool.close(wait=False)
            if self._workers is not None:
                self._workers.close()
        except Exception:  # noqa: BLE001, S110
            pass

    # -- pickling: configuration travels, running state does not ------------------------
    _RUNTIME = ("_analysis", "_errors", "_epoch", "_lock", "_workers", "_pool", "_arena_ring", "_current", "_warm", "_resume", "_closed", "_tuner",
                "_last_state")

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
        self.recorder = _make_recorder(enabled)
        self._errors = []
        self._init_runtime()
        self.load_state_dict(saved)

    def _check_pin(self) -> None:
        # NOTE [ pin_memory without CUDA ]: pinned memory only speeds up copies to a GPU, so on a
        # machine without one there is nothing to honour: like PyTorch's DataLoader, warn (once per
        # loader, naming the keyword) and load into ordinary memory, so a script written for GPU
        # nodes runs unchanged on a CPU laptop or CI. What cannot be honoured where CUDA exists (a
        # device index it does not have, a device that is not CUDA) still raises.
        try:
            import torch

            cuda = torch.cuda.is_available()
        except ImportError:
            cuda = False
        if not cuda:
            keyword = "pin_memory=True" + (f", pin_memory_device={self.pin_memory_device!r}"
                                           if self.pin_memory_device else "")
            warnings.warn(f"{keyword}: no CUDA device (or no torch with CUDA) here, so batches are loaded into "
                          "ordinary, unpinned memory (pinned memory only speeds up copies to a GPU)",
                          UserWarning, stacklevel=3)
            self.pin_memory = False
            self.pin_memory_device = ""
            return
        if self.pin_memory_device:
            dev = _pin_device(self.pin_memory_device)
            if dev.index is not None and dev.index >= torch.cuda.device_count():
                raise ValueError(f"pin_memory_device={self.pin_memory_device!r}: this machine has "
                                 f"{torch.cuda.device_count()} CUDA device(s)")

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
        from . import transforms as T

        _, layers = _unwrap(self.dataset)
        name = None
        for first, fn in layers:
            if not first and not isinstance(fn, T.Transform):
                continue
            for t in _steps([fn]):
                if isinstance(t, (T.Normalize, T.Cast)):
                    name = t.dtype
        return name == "bfloat16"


# NOTE [ Batch output ]
# output="torch" converts at the last moment, in the consumer's thread: every numpy leaf of
# the batch becomes ``torch.from_numpy(leaf)``, which shares the slot's memory and keeps the
# numpy view (and so the slot's lease, NOTE [ Slot leases ]) alive for as long as the tensor
# lives. Nothing is copied and the engines stay framework-free. A torch Dataset gets tensors
# back without asking: its samples were tensors, and PyTorch code expects tensors.


def _output_kind(output: str | None, dataset: Any) -> str:
    if output is None:
        base = _unwrap(dataset)[0]
        base = getattr(base, "_data", base)   # SimpleDataset wraps plain sequences
        torch_ds = any(c.__name__ in ("Dataset", "IterableDataset") and c.__module__.startswith("torch")
                       for c in type(base).__mro__)
        return "torch" if torch_ds else "numpy"
    if output not in ("numpy", "torch"):
        raise ValueError(f"output must be 'numpy' or 'torch', got {output!r}")
    if output == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ValueError("output='torch' needs PyTorch (pip install torch)") from None
    return output


def _pin_device(spelling: str) -> Any:
    """``pin_memory_device`` as a torch.device; only CUDA devices can be pinned for."""
    try:
        import torch

        dev = torch.device(spelling)
    except ImportError:
        return None  # nothing to pin for without torch: _check_pin warns and loads unpinned
    except (RuntimeError, TypeError):
        raise ValueError(f"pin_memory_device={spelling!r} is not a device (e.g. 'cuda' or 'cuda:1')") from None
    if dev.type != "cuda":
        raise ValueError(f"pin_memory_device={spelling!r}: slots can be pinned for CUDA devices only ('cuda', "
                         "'cuda:N')")
    return dev


def _torch_leaf(x: Any, bf16: bool) -> Any:
    import torch

    if not isinstance(x, np.ndarray):
        return x
    if any(s < 0 for s in x.strides):
        x = np.ascontiguousarray(x)   # torch rejects negative strides (a user batchify's view)
    t = torch.from_numpy(x)
    return t.view(torch.bfloat16) if bf16 and x.dtype == np.uint16 else t


def to_torch(batch: Any, bfloat16_first: bool = False) -> Any:
    """A batch's numpy leaves as torch tensors sharing their memory (NOTE [ Batch output ])."""
    if isinstance(batch, (tuple, list)) and batch and type(batch) in (tuple, list):
        return type(batch)(tree_map(lambda x, k=k: _torch_leaf(x, bfloat16_first and k == 0), b)
                           for k, b in enumerate(batch))
    return tree_map(lambda x: _torch_leaf(x, bfloat16_first), batch)


class TorchLoaderIterator(LoaderIterator):
    """A :class:`LoaderIterator` whose batches are torch tensors (``output="torch"``)."""

    def __init__(self, run: Any, owner: Any = None) -> None:
        super().__init__(run, owner)
        self._bf16 = owner._bfloat16_first() if owner is not None else False

    def __next__(self) -> Any:
        return to_torch(super().__next__(), self._bf16)


class _BatchTransformIterator(LoaderIterator):
    """A LoaderIterator that applies the loader's ``batch_transform`` to each delivered batch
    with the key (seed, epoch, index of the batch in the epoch)."""

    def __next__(self) -> Any:
        batch = super().__next__()
        st = self._run.state
        op = self._owner.batch_transform
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise TypeError(f"batch_transform {type(op).__name__} needs (images, labels) batches, got "
                            f"{type(batch).__name__}")
        images, soft = op(batch[0], batch[1], seed=self._owner.seed, epoch=st.epoch, batch_index=st.delivered - 1)
        return type(batch)((images, soft)) if isinstance(batch, tuple) else [images, soft]


class _TorchBatchTransformIterator(_BatchTransformIterator):
    """The loader's ``batch_transform`` on each batch, then torch tensors (``output="torch"``)."""

    def __init__(self, run: Any, owner: Any = None) -> None:
        super().__init__(run, owner)
        self._bf16 = owner._bfloat16_first() if owner is not None else False

    def __next__(self) -> Any:
        return to_torch(super().__next__(), self._bf16)
