"""What runs where: a dataset, its transform chain and batchify function analysed into an
engine, the stages ``explain()`` lists, and the native plan the engine runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import transforms as T
from .._chain import NativePlan, compile_chain
from .._datasets.base import Dataset, SimpleDataset
from .._datasets.images import ArrayDataset
from .._datasets.iterable import is_iterable_dataset
from .._extract.source import NativeSource, SourceKind, native_source_of
from ..batchify import Pad, Stack, Tuple, default_batchify_fn


@dataclass
class _Analysis:
    engine: str
    reason: str
    stages: list = field(default_factory=list)     # (stage, "native"/"python", detail)
    native_source: NativeSource | None = None
    chain: T.Compose | None = None                 # the transform spec handed to compile_chain
    shards: tuple | None = ()
    hybrid: dict | None = None                     # threads engine after a native prefix
    plan: NativePlan | None = None                 # the compiled plan (lent to the first iterator)

    @property
    def token_batches(self) -> bool:
        """Token batches on the native engine, made on the consumer's thread (NOTE [ Token
        batches driven by the consumer ] in _engines/native.py)."""
        return self.engine == "native" and self.native_source is not None and \
            self.native_source.kind is SourceKind.TOKENS


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
    if not isinstance(dataset, Dataset):
        return dataset, []
    base, layers = dataset.unwrap()
    return base, [(layer.first, layer.fn) for layer in layers]


def _steps(fns: list) -> list:
    out: list = []
    for fn in fns:
        out.extend(fn.steps if isinstance(fn, T.Compose) else [fn])
    return out


def _native_prefix(steps: list) -> tuple[int, NativePlan | None]:
    """Longest prefix of ``steps`` that compiles to a plan with a fixed sample shape."""
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
        out: list[int | Pad | None] = []
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
    if src is not None and src.gathered and layers:
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
    if src is not None and not src.gathered:
        steps = _steps(firsts) if ordered else []
        k, plan = _native_prefix(steps) if ordered else (0, None)
        if plan is None:
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


def _as_dataset(dataset: Any) -> Any:
    if is_iterable_dataset(dataset):
        return dataset   # consumed lazily (NOTE [ Iterable shards ])
    if isinstance(dataset, np.ndarray) and dataset.ndim >= 1 and dataset.dtype != object:
        return ArrayDataset(dataset)   # runs natively: rows gathered with take
    arrays = dataset.zipped_arrays() if isinstance(dataset, Dataset) else None
    if arrays is not None:
        return ArrayDataset(*arrays)   # the same items, gathered natively
    if hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__"):
        return dataset
    if hasattr(dataset, "__iter__"):
        return SimpleDataset(list(dataset))
    raise TypeError(f"dataset must have __len__ and __getitem__ (or be iterable), got {type(dataset).__name__}")


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


def reads_lines(recorder: Any) -> list[str]:
    """``explain()``'s line of the reads so far this epoch, the report's Extract line (NOTE [
    Every read counts ] in ``pyx/include/ll_readahead.h``); none when not profiling or nothing
    was read."""
    ex = recorder.snapshot().extract if recorder.enabled else None
    return [f"  {'reads this epoch':<17} {'':<7} {ex.line()}"] if ex is not None and ex.reads else []


def driver_lines(a: _Analysis, num_threads: int | None, prefetch: int) -> list[str]:
    """What ``explain()`` says of the thread that makes the batches, when it is not a driver
    thread of the loader's own: the caller's (``num_threads=0``), or for token batches the
    consumer's (NOTE [ Token batches driven by the consumer ] in _engines/native.py)."""
    if num_threads == 0:
        return ["  num_threads=0: every stage runs in the calling thread, one batch per next()"]
    if a.token_batches:
        return [f"  no driver thread: next() queues token batches on the kernel team, which writes {prefetch} "
                "ahead of the one it returns"]
    return []


def read_ahead_line(a: _Analysis, depth: int | None, run: Any) -> str | None:
    """What ``explain()`` says of the read-ahead stage (NOTE [ Read-ahead ]) of a loader with
    analysis ``a``, ``io_depth`` ``depth`` and current run ``run`` (or None); None when it has
    none (not files, byte ranges or a store's samples, or a Python engine)."""
    src = a.native_source
    # A store's samples are read ahead too (NOTE [ Remote read-ahead ] in _extract/remote/readahead.py).
    remote = src is not None and src.kind is SourceKind.BUFFERS and getattr(src.dataset, "_remote", None) is not None
    if src is None or (src.kind not in (SourceKind.FILES, SourceKind.SHARDS) and not remote) or a.plan is None:
        return None
    if a.engine == "processes":
        return None
    if depth == 0:
        return ("off (io_depth=0): each batch's requests go out when the batch is produced" if remote else
                "off (io_depth=0): each decode thread reads its own samples")
    if remote and run is None:
        return "read-ahead from the store: requests issued ahead in the sampler's order by Python threads"
    reader = run.producer.reader if run is not None else None
    if reader is not None:
        return reader.describe()
    if depth is None:
        return ("reads issued ahead in the sampler's order by native IO threads; depth adapts to the measured "
                "read latency and decode rate (Little's law), within ram_budget")
    return f"reads issued ahead in the sampler's order by native IO threads, io_depth={depth} in flight"
