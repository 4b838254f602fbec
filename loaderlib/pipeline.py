"""A tf.data-style functional pipeline compiled onto loaderlib's engines.

``Pipeline.from_folder(root).shuffle(1000).map(T.Compose([...])).batch(256).prefetch(2)``
is a plan: nothing runs until it is iterated, every ``iter()`` is one pass (with a fresh
shuffle, like tf.data's ``reshuffle_each_iteration``), and the output is a pure function of
the seed and the iteration number, whatever the thread count.

NOTE [ Pipeline compilation ]
A pipeline over an indexable source (a folder, record files, numpy arrays, a map-style
dataset) is compiled in two parts. Its *head* is the longest run of steps that only choose
and order samples (``shuffle``, ``repeat``, ``take``, ``skip``) or change one element into
one element (``map``), optionally ending with ``batch``. Steps that choose samples act on
sample indices: the head's stream of indices is computed by the same operators the Python
path uses, but on integers, and the DataLoader engine then loads exactly those samples. So
``map`` with loaderlib transforms on a folder or record files runs fused into decode on the
native engine, built by a private ``DataLoader`` whose runs take the pipeline's index stream
(one :class:`~loaderlib._engines.base.RunState` per segment of the stream): the same engine
objects, the same arena, the same kernels and keyed randomness, no second implementation.
A map step holding a Python callable moves the head to the threads engine (its calls run on
the loader's Python pool). Every step after the head runs as a Python node
(NOTE [ Pipeline nodes ] in ``_pipeline/ops.py``). ``explain()`` lists both parts.

NOTE [ Pipeline resume ]
``state_dict()`` records the iteration number and how many elements the user took. A
resumed iteration recomputes the same deterministic stream and drops those elements. When
everything after the head keeps the element count (``map``, ``prefetch``), the head starts
its engine at the first batch not yet delivered (an index computation, nothing is loaded
again); otherwise the elements before the resume point are produced again and dropped,
which costs their compute but is exact for every operator, shuffle buffers and interleave
cycles included. The state holds the seed: a pipeline whose seed was drawn (no
``with_options(seed=...)``) takes the saved one, as ``DataLoader`` does, so a restarted
script resumes without knowing the seed; a pipeline given a seed refuses a different one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, cast

import numpy as np

from ._autotune import AUTOTUNE, attach, decisions_of, profiling_seconds, tune_knob
from ._checks import check_int
from ._datasets.images import ArrayDataset, ImageFolderDataset
from ._datasets.mixture import check_weights
from ._datasets.records import RecordFileDataset
from ._pipeline import ops
from ._pipeline.cache import CachedImages, CacheFill, CacheNode, CacheStore
from ._pipeline.engine import COUNT_KEEPING, _decodes, _Engine, _Head, _Source, _top_head, _warm_caller
from ._pipeline.options import PipelineOptions
from ._pipeline.plan import (
    INDEX_STEPS,
    Step,
    check_parallel,
    draws_random,
    plan_digest,
    step_kwargs,
    step_label,
    steps_key,
)
from ._pipeline.spec import TensorSpec, step_spec
from ._threads import default_num_threads
from .errors import StateError
from .sampler import draw_seed

__all__ = ["Pipeline", "PipelineIterator", "TensorSpec"]

#: Version of the dict :meth:`Pipeline.state_dict` returns.
STATE_VERSION = 1


# --------------------------------------------------------------------------- the pipeline


class Pipeline:
    """A lazy, re-iterable chain of steps over a source, run on loaderlib's engines.

    Build one with a ``from_*`` constructor and chain steps; each step returns a new
    pipeline (the plan is immutable). Semantics follow tf.data operator by operator.
    Iterating yields elements (tuples of numpy arrays for ``(image, label)`` sources).

    A pipeline whose steps are native (a folder, record files or arrays, ``map`` with
    loaderlib transforms, ``batch``) runs on the native engine with the transforms fused into
    decode, exactly like :class:`~loaderlib.DataLoader` (NOTE [ Pipeline compilation ]).
    :meth:`explain` says where every stage runs.

    Examples
    --------
    >>> import loaderlib as ll                                   # doctest: +SKIP
    >>> from loaderlib import transforms as T                    # doctest: +SKIP
    >>> pipe = (ll.Pipeline.from_folder("train/").shuffle(10_000)
    ...         .map(T.Compose([T.RandomResizedCrop(224), T.ToCHW()])).batch(256).prefetch(2))
    >>> for images, labels in pipe: ...                          # doctest: +SKIP
    """

    def __init__(self, source: _Source, steps: tuple = (), options: PipelineOptions | None = None) -> None:
        self._src = source
        self._steps = tuple(steps)
        options = options if options is not None else PipelineOptions()
        if options.seed is None:
            # A resumed state may replace a drawn seed (NOTE [ Pipeline resume ]).
            options = dataclasses.replace(options, seed=draw_seed(), seed_drawn=True)
        self._options = options
        # Every AUTOTUNE decision of this pipeline is timed from here (NOTE [ Autotune ]).
        self._tune_origin = (options.autotune_clock or profiling_seconds)()
        self._tuners: list = []
        self._iteration = 0
        self._resume: dict | None = None
        self._current: Any = None
        self._last: PipelineIterator | None = None
        self._spec: Any = ops.EMPTY
        self._engines: dict = {}
        self._caches: dict = {}
        self._step_knobs: dict = {}
        self._lock = threading.RLock()

    # -- sources ---------------------------------------------------------------------
    @classmethod
    def from_folder(cls, root: str | os.PathLike, extensions: Sequence[str] | None = None, *,
                    storage_options: dict | None = None) -> Pipeline:
        """Elements ``(HWC uint8 RGB image, int64 label)`` of an image folder (``root/class/img``),
        as :class:`~loaderlib.ImageFolderDataset` (an object-store prefix too, with
        ``storage_options``)."""
        ds = ImageFolderDataset(root, extensions, storage_options=storage_options)
        return cls(_Source("folder", ds, what=repr(ds)))

    @classmethod
    def from_records(cls, paths: str | os.PathLike | Sequence[str | os.PathLike], *,
                     storage_options: dict | None = None, cache_dir: str | os.PathLike | None = None,
                     cache_limit: int | str | None = None) -> Pipeline:
        """Elements ``(image, label)`` of record files written by :func:`~loaderlib.write_records`
        (one file, a list or a glob; URLs too, with the options of
        :class:`~loaderlib.RecordFileDataset`)."""
        ds = RecordFileDataset(paths, storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit)
        return cls(_Source("records", ds, what=repr(ds)))

    @classmethod
    def from_arrays(cls, *arrays: np.ndarray) -> Pipeline:
        """Elements are the rows of the arrays (one array: the row; several: a tuple of rows),
        as tf.data's ``from_tensor_slices``."""
        if not arrays:
            raise ValueError("from_arrays needs at least one array")
        arrs = [np.asarray(a) for a in arrays]
        for a in arrs:
            if a.ndim < 1:
                raise ValueError(f"from_arrays takes arrays with a leading dimension, got a scalar {a!r}")
        ds = ArrayDataset(*arrs)
        return cls(_Source("arrays", ds, what=f"{len(arrs)} array(s) of {len(ds)} rows"))

    @classmethod
    def from_dataset(cls, dataset: Any) -> Pipeline:
        """Elements ``dataset[i]`` of a map-style dataset (anything with ``__len__`` and
        ``__getitem__``; loaderlib's datasets run natively where DataLoader would)."""
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise TypeError(f"from_dataset needs __len__ and __getitem__, got {type(dataset).__name__}; use "
                            "from_iterable for iterables")
        return cls(_Source("dataset", dataset, what=repr(dataset) if len(repr(dataset)) < 100 else
                           type(dataset).__name__))

    @classmethod
    def from_iterable(cls, iterable: Iterable | Callable[[], Iterable]) -> Pipeline:
        """Elements of an iterable, consumed lazily (infinite ones too).

        A re-iterable object (a list, an ``IterableDataset``) or a function returning a fresh
        iterator is iterated again on every pass; a one-shot iterator (a generator) can be
        passed over once only.
        """
        if callable(iterable) and not hasattr(iterable, "__iter__"):
            return cls(_Source("iterable", None, make=lambda: iter(iterable()),
                               what=f"iterable from {getattr(iterable, '__qualname__', repr(iterable))}()"))
        if not hasattr(iterable, "__iter__"):
            raise TypeError(f"from_iterable needs an iterable or a function returning one, got "
                            f"{type(iterable).__name__}")
        items = cast(Iterable, iterable)   # it has __iter__ (checked above)
        state = {"used": False}
        one_shot = iter(items) is items

        def make() -> Iterator:
            if one_shot:
                if state["used"]:
                    raise ValueError(f"from_iterable got a one-shot iterator ({type(iterable).__name__}), which was "
                                     "already consumed: pass a re-iterable object or a function returning a fresh "
                                     "iterator to iterate the pipeline again")
                state["used"] = True
            return iter(items)

        return cls(_Source("iterable", iterable, make=make, what=f"iterable {type(iterable).__name__}"))

    @staticmethod
    def zip(*pipelines: Pipeline, **named: Pipeline) -> Pipeline:
        """Tuples (or dicts, with keywords) of the pipelines' i-th elements, stopping at the
        shortest, as ``tf.data.Dataset.zip``. Each part keeps its own seed."""
        parts = list(pipelines) + list(named.values())
        if not parts or (pipelines and named):
            raise ValueError("Pipeline.zip takes pipelines either all positional or all by keyword, at least one")
        for p in parts:
            if not isinstance(p, Pipeline):
                raise TypeError(f"Pipeline.zip takes pipelines, got {type(p).__name__}")
        return Pipeline(_Source("zip", None, parts=parts, keys=list(named) if named else None,
                                what=f"zip of {len(parts)}"))

    @staticmethod
    def sample_from_datasets(pipelines: Sequence[Pipeline], weights: Sequence[float] | None = None,
                             seed: int | None = None, stop_on_empty_dataset: bool = False) -> Pipeline:
        """Elements drawn at random from ``pipelines``, pipeline ``k`` with probability
        ``weights[k]``, as ``tf.data.Dataset.sample_from_datasets``.

        Parameters
        ----------
        pipelines : sequence of Pipeline
            Pipelines with compatible element specs.
        weights : sequence of float, optional
            Non-negative, finite, not all zero; normalised (default: uniform).
        seed : int, optional
            Keys the draws (default: this pipeline's seed); each iteration draws afresh.
        stop_on_empty_dataset : bool
            True: the output ends when a drawn pipeline has no element left. False (default):
            that pipeline leaves the draw and the others continue with their weights
            renormalised, until every pipeline of positive weight is used up.

        Resume is exact (NOTE [ Mixing pipelines ] in ``_pipeline/mix.py``).
        """
        parts = _mix_parts(pipelines, "sample_from_datasets")
        w = check_weights(weights, len(parts), what="pipelines", one="pipeline")
        if seed is not None:
            check_int(seed, "seed")
        what = (f"sample_from_datasets of {len(parts)}, weights {[round(float(x), 6) for x in w]}, seed {seed}, "
                f"stop_on_empty_dataset={bool(stop_on_empty_dataset)}")
        return Pipeline(_Source("sample", None, parts=parts, what=what,
                                mix={"weights": w, "seed": seed, "stop": bool(stop_on_empty_dataset)}))

    @staticmethod
    def choose_from_datasets(pipelines: Sequence[Pipeline], choices: Pipeline,
                             stop_on_empty_dataset: bool = True) -> Pipeline:
        """For each integer ``c`` of ``choices``, the next element of ``pipelines[c]``, as
        ``tf.data.Dataset.choose_from_datasets``.

        A choice outside ``[0, len(pipelines))`` or not an integer raises, naming its position.
        With ``stop_on_empty_dataset`` (default) the output ends when a chosen pipeline has no
        element left; without it that choice is passed over. Resume is exact.
        """
        parts = _mix_parts(pipelines, "choose_from_datasets")
        if not isinstance(choices, Pipeline):
            raise TypeError(f"choose_from_datasets: choices must be a Pipeline of integers, got {type(choices).__name__}")
        what = f"choose_from_datasets of {len(parts)}, stop_on_empty_dataset={bool(stop_on_empty_dataset)}"
        return Pipeline(_Source("choose", None, parts=parts, what=what,
                                mix={"choices": choices, "stop": bool(stop_on_empty_dataset)}))

    # -- steps -----------------------------------------------------------------------
    def _then(self, step: Step) -> Pipeline:
        return Pipeline(self._src, (*self._steps, step), self._options)

    def map(self, fn: Callable, num_parallel_calls: int | None = None, *, output_spec: Any = None) -> Pipeline:
        """Apply ``fn`` to every element.

        A loaderlib transform (or ``transforms.Compose``) applies to the image of an
        ``(image, ...)`` element, as ``transform_first``, and runs fused into decode on the
        native engine where the source allows; any other callable gets the element's
        components as arguments. ``num_parallel_calls`` (an int or ``AUTOTUNE``) runs calls
        on a thread pool, order kept. ``output_spec`` states a Python function's output spec;
        without it the spec is traced on the first element (ranks and dtypes; dimensions
        None).
        """
        if not callable(fn):
            raise TypeError(f"map takes a callable, got {type(fn).__name__}")
        check_parallel(num_parallel_calls)
        args: tuple = ()
        if num_parallel_calls is not None:
            args += (("num_parallel_calls", num_parallel_calls),)
        if output_spec is not None:
            args += (("output_spec", output_spec),)
        return self._then(Step("map", fn, args))

    def filter(self, predicate: Callable[..., Any]) -> Pipeline:
        """Keep the elements for which ``predicate(*components)`` is true."""
        if not callable(predicate):
            raise TypeError(f"filter takes a callable, got {type(predicate).__name__}")
        return self._then(Step("filter", predicate))

    def flat_map(self, fn: Callable[..., Any]) -> Pipeline:
        """Replace every element by the elements of the pipeline (or iterable) ``fn`` returns."""
        if not callable(fn):
            raise TypeError(f"flat_map takes a callable, got {type(fn).__name__}")
        return self._then(Step("flat_map", fn))

    def interleave(self, fn: Callable[..., Any], cycle_length: int, block_length: int = 1) -> Pipeline:
        """tf.data's interleave: ``cycle_length`` of the pipelines ``fn`` returns are open at once
        and give ``block_length`` elements each in turn."""
        if not callable(fn):
            raise TypeError(f"interleave takes a callable, got {type(fn).__name__}")
        check_int(cycle_length, "cycle_length", minimum=1)
        check_int(block_length, "block_length", minimum=1)
        return self._then(Step("interleave", fn, (int(cycle_length), ("block_length", int(block_length)))))

    def shuffle(self, buffer_size: int, seed: int | None = None, reshuffle_each_iteration: bool = True) -> Pipeline:
        """tf.data's buffered shuffle: each element comes from a buffer of ``buffer_size``
        upcoming elements (a buffer at least the data's size gives a uniform permutation);
        a new order every iteration unless ``reshuffle_each_iteration=False``."""
        check_int(buffer_size, "buffer_size", minimum=1)
        check_int(seed, "seed", minimum=0, allow_none=True)
        args: tuple = (int(buffer_size),)
        if seed is not None:
            args += (("seed", int(seed)),)
        if not reshuffle_each_iteration:
            args += (("reshuffle_each_iteration", False),)
        return self._then(Step("shuffle", None, args))

    def repeat(self, count: int | None = None) -> Pipeline:
        """Pass over the input ``count`` times (None or -1: for ever)."""
        if count is not None and count != -1:
            check_int(count, "count", minimum=0)
        return self._then(Step("repeat", None, () if count in (None, -1) else (int(count),)))

    def take(self, count: int) -> Pipeline:
        """The first ``count`` elements (-1: all)."""
        if count != -1:
            check_int(count, "count", minimum=0)
        return self._then(Step("take", None, (int(count),)))

    def skip(self, count: int) -> Pipeline:
        """All but the first ``count`` elements (-1: none)."""
        if count != -1:
            check_int(count, "count", minimum=0)
        return self._then(Step("skip", None, (int(count),)))

    def batch(self, batch_size: int, drop_remainder: bool = False) -> Pipeline:
        """Stack ``batch_size`` consecutive elements component-wise; the last batch may be
        short unless ``drop_remainder``."""
        check_int(batch_size, "batch_size", minimum=1)
        args: tuple = (int(batch_size),)
        if drop_remainder:
            args += (("drop_remainder", True),)
        return self._then(Step("batch", None, args))

    def padded_batch(self, batch_size: int, padded_shapes: Any = None, padding_values: Any = None,
                     drop_remainder: bool = False) -> Pipeline:
        """Like :meth:`batch`, padding every component at the end of each axis to
        ``padded_shapes`` (per component; None or -1 dimensions: the batch's largest) with
        ``padding_values`` (per component or one scalar; default 0)."""
        check_int(batch_size, "batch_size", minimum=1)
        args: tuple = (int(batch_size),)
        if padded_shapes is not None:
            args += (("padded_shapes", padded_shapes),)
        if padding_values is not None:
            args += (("padding_values", padding_values),)
        if drop_remainder:
            args += (("drop_remainder", True),)
        return self._then(Step("padded_batch", None, args))

    def unbatch(self) -> Pipeline:
        """Split every element along its leading dimension into rows."""
        return self._then(Step("unbatch"))

    def prefetch(self, buffer_size: int) -> Pipeline:
        """Keep ``buffer_size`` elements ready on a background thread (``AUTOTUNE``: tuned)."""
        if buffer_size != AUTOTUNE:
            check_int(buffer_size, "buffer_size", minimum=1)
        return self._then(Step("prefetch", None, (int(buffer_size),)))

    def cache(self, path: str | os.PathLike | None = None, *, max_side: int | None = None) -> Pipeline:
        """Keep the elements of the first full pass and replay them afterwards.

        ``path=None`` keeps them in memory (within ``ram_budget``); a path stores them in
        memory-mapped files (``path + ".llcache"``), written atomically and reused across runs
        until the upstream steps or the source files change (NOTE [ Pipeline cache ] in
        ``_pipeline/cache.py``). Cache decoded images before the random crop: later passes then run the
        crop fused on the native engine from the cached pixels, at full crop quality.

        ``max_side`` stores uint8 HWC images reduced so their longer side is at most
        ``max_side`` (area filter). Measured cost on the final ``RandomResizedCrop(224)`` +
        flip crops of photos of about 460x350 px, mean absolute difference vs the full
        resolution cache: 9.3 uint8 levels at ``max_side=128``, 5.3 at 256, 3.8 at 384
        (``benchmarks/pipeline.py``).
        """
        args: tuple = ()
        if path is not None:
            args += (os.fspath(path),)
        if max_side is not None:
            check_int(max_side, "max_side", minimum=8)
            args += (("max_side", int(max_side)),)
        return self._then(Step("cache", None, args))

    def concatenate(self, other: Pipeline) -> Pipeline:
        """This pipeline's elements, then ``other``'s (the element specs must be compatible)."""
        if not isinstance(other, Pipeline):
            raise TypeError(f"concatenate takes a Pipeline, got {type(other).__name__}")
        return self._then(Step("concatenate", None, (other,)))

    def reduce(self, initial_state: Any, reduce_func: Callable[[Any, Any], Any]) -> Any:
        """Fold every element into a state: ``state = reduce_func(state, element)``."""
        state = initial_state
        for el in self:
            state = reduce_func(state, el)
        return state

    def with_options(self, *, seed: int | None = None, num_threads: int | None = None,
                     prefetch: int | None = None, ram_budget: int | str | None = None, num_workers: int | None = None,
                     autotune_clock: Callable[[], float] | None = None, io_depth: int | None = None) -> Pipeline:
        """The same plan with run options.

        Parameters
        ----------
        seed : int, optional
            Seeds shuffles and augmentation (drawn once per source when not given).
        num_threads : int or AUTOTUNE, optional
            Threads of the engine that runs the head (kernels or Python pool).
        prefetch : int or AUTOTUNE, optional
            Batches the head's engine keeps ready.
        ram_budget : int or str, optional
            Bytes (or "2GB", "512MB") that memory caches and tuned buffers may hold.
        num_workers : int, optional
            Worker processes for an engine stage holding Python functions (the processes
            engine, as ``DataLoader(num_workers=...)``); 0 (default): the threads engine.
        autotune_clock : callable, optional
            The clock ``AUTOTUNE`` reads (seconds); for tests.
        io_depth : int or AUTOTUNE, optional
            Reads in flight of the head's read-ahead stage (as ``DataLoader(io_depth=...)``):
            0 reads inside the decode threads; unset or ``AUTOTUNE``: adapts to the measured
            read latency (NOTE [ Read-ahead depth ] in ``_extract/readahead.py``).
        """
        given = {"seed": seed, "num_threads": num_threads, "prefetch": prefetch, "ram_budget": ram_budget,
                 "num_workers": num_workers, "autotune_clock": autotune_clock, "io_depth": io_depth}
        changes: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
        if seed is not None:
            changes["seed_drawn"] = False
        return Pipeline(self._src, self._steps, dataclasses.replace(self._options, **changes))

    # -- properties ------------------------------------------------------------------
    @property
    def seed(self) -> int:
        seed = self._options.seed
        assert seed is not None   # drawn in __init__ when not given
        return int(seed)

    @property
    def element_spec(self) -> Any:
        """The structure, shapes and dtypes of the elements (a nest of :class:`TensorSpec`),
        computed from the source's spec and each step's, before the first element.

        Loaderlib transforms are planned without data; a Python function without
        ``output_spec`` is traced on the first element of its input (its output's ranks and
        dtypes; dimensions None). Raises ValueError naming the step whose spec fails.
        """
        with self._lock:
            if self._spec is ops.EMPTY:
                self._spec = self._compute_spec()
            return self._spec

    def _compute_spec(self) -> Any:
        spec = self._src.spec()
        for k, step in enumerate(self._steps, 1):
            spec = step_spec(self, k, step, spec)
        return spec

    def _fingerprint(self, upto: int | None = None) -> list:
        """What identifies the elements of steps ``1..upto``: the source's data, the steps and,
        when a step draws random numbers (or may: Python code), the seed."""
        steps = self._steps if upto is None else self._steps[:upto]
        return [self._src.fingerprint(), self.seed if draws_random(steps) else None, steps_key(steps)]

    # -- compilation -----------------------------------------------------------------
    def _build(self, iteration: int, skip: int = 0) -> ops.Node:
        ctx = ops.Context(self.seed, iteration)
        steps = self._steps
        node: ops.Node | None = None
        k = 0
        if self._src.indexable and steps and steps[0].kind == "cache":
            node, k = self._cached_head(ctx, 0)
        if self._src.indexable and node is None:
            node, k = self._build_head(ctx, 0, lambda: self._src.dataset, "source")
        if node is None:
            node = self._src.node(ctx)
        while k < len(steps):
            if steps[k].kind == "cache":
                head, after = self._cached_head(ctx, k)
                if head is not None:
                    node, k = head, after
                    continue
            node = self._node(node, k + 1, steps[k], ctx)
            k += 1
        if skip:
            rest = node
            while isinstance(rest, COUNT_KEEPING):
                rest = rest.up
            if isinstance(rest, _Head):
                rest.start = skip
            else:
                node = ops.Skipped(node, skip)
        return node

    def _cached_head(self, ctx: ops.Context, k: int) -> tuple[ops.Node | None, int]:
        """The steps after cache step ``k`` (0-based) on the engine, over the cached pixels
        once the cache of decoded images is complete (NOTE [ Cached pixels ] in ``_pipeline/cache.py``),
        and while a cache right after an image source is not, over the source's images
        decoded into it as the pass goes (NOTE [ Filling through the engine ])."""
        store = self._cache_store(k + 1, self._steps[k])
        label = f"step {k + 1} .cache()"
        if store.ready():
            if not len(store):
                return None, k
            first = store.element(0)
            image = first[0] if isinstance(first, tuple) and len(first) == 2 else first
            if not (isinstance(image, np.ndarray) and image.ndim == 3 and image.dtype == np.uint8
                    and image.shape[2] == 3):
                return None, k
            labelled = image is not first
            if labelled and not (isinstance(first[1], (int, np.integer)) or (
                    isinstance(first[1], np.ndarray) and first[1].ndim == 0 and first[1].dtype.kind in "iu")):
                return None, k
            return self._build_head(ctx, k + 1, lambda: CachedImages(store, labelled), label)
        src = self._src.dataset
        if k or not self._src.indexable or not _decodes(src) or not len(src):
            return None, k
        head, after = self._build_head(ctx, k + 1, lambda: CachedImages(store, False, src), label)
        images = head.engine.base if head is not None else None
        if head is None or not isinstance(images, CachedImages) or images.complete:
            return head, after
        return CacheFill(head, label, images), after

    def _build_head(self, ctx: ops.Context, start: int, base: Callable[[], Any],
                    what: str) -> tuple[_Head | None, int]:
        """The engine stage over ``base()`` for steps ``start..`` (0-based; NOTE [ Pipeline compilation ])."""
        steps = self._steps
        h = start
        while h < len(steps) and steps[h].kind in (*INDEX_STEPS, "map"):
            h += 1
        batch = None
        drop = False
        if h < len(steps) and steps[h].kind == "batch":
            batch = steps[h].args[0]
            drop = bool(step_kwargs(steps[h]).get("drop_remainder", False))
            h += 1
        maps = [s for s in steps[start:h] if s.kind == "map"]
        if not maps and batch is None and not (start == 0 and _decodes(self._src.dataset)):
            return None, start   # nothing for an engine to do (an image source still decodes in parallel)
        index = [(k, s) for k, s in enumerate(steps[start:h], start + 1) if s.kind in INDEX_STEPS]
        opts = self._options
        par = [step_kwargs(s).get("num_parallel_calls") for s in maps]
        par = [p for p in par if p is not None]
        if opts.num_threads is None and par:
            opts = dataclasses.replace(opts, num_threads=max(par))
        absorbed = None
        if h < len(steps) and steps[h].kind == "prefetch":
            # The engine's own prefetch queue is that step (no second queue behind it).
            absorbed = step_label(h + 1, steps[h])
            if opts.prefetch is None:
                opts = dataclasses.replace(opts, prefetch=steps[h].args[0])
            h += 1
        tuned = {k for k in ("num_threads", "prefetch") if getattr(opts, k) == AUTOTUNE}
        unset: dict[str, Any] = dict.fromkeys(tuned)
        opts = dataclasses.replace(opts, **unset)   # the tuner sets them
        key = (start, h)
        with self._lock:
            engine = self._engines.get(key)
            if engine is None:
                labels = [step_label(k, s) for k, s in enumerate(steps[start:h], start + 1) if s.kind == "map"]
                engine = self._engines[key] = _Engine(base(), [s.fn for s in maps], labels, batch, opts, self.seed)
                if tuned:
                    attach(engine.loader, num_threads=("num_threads" in tuned), prefetch=("prefetch" in tuned),
                           ram_budget=opts.ram_budget, clock=opts.autotune_clock,
                           origin=self._tune_origin)
        n = engine.n

        def index_nodes(src: ops.Node) -> ops.Node:
            node = src
            for k, s in index:
                node = self._node(node, k, s, ctx)
            return node

        rows = [step_label(k, s) for k, s in index]
        last = step_label(h, steps[h - 1])
        head = _Head(engine, index_nodes if index else None, n, ctx.iteration, drop, f"{what} to {last}", rows,
                     absorbed)
        return head, h

    def _node(self, up: ops.Node, k: int, step: Step, ctx: ops.Context) -> ops.Node:

        label = step_label(k, step)
        kw = step_kwargs(step)
        kind = step.kind
        if kind == "map":
            par = kw.get("num_parallel_calls")
            knob = None
            if par is not None and par != 0:
                knob = self._knob(k, label, "num_parallel_calls", par)
            return ops.Map(up, label, step.fn, ctx, knob)
        if kind == "filter":
            return ops.Filter(up, label, step.fn)
        if kind == "flat_map":
            return ops.FlatMap(up, label, step.fn, ctx)
        if kind == "interleave":
            return ops.Interleave(up, label, step.fn, step.args[0], kw.get("block_length", 1), ctx)
        if kind == "shuffle":
            return ops.Shuffle(up, label, k, step.args[0], kw.get("seed", self.seed), ctx,
                               kw.get("reshuffle_each_iteration", True))
        if kind == "repeat":
            return ops.Repeat(up, label, step.args[0] if step.args else None)
        if kind == "take":
            return ops.Take(up, label, step.args[0])
        if kind == "skip":
            return ops.Skip(up, label, step.args[0])
        if kind == "batch":
            return ops.Batch(up, label, step.args[0], kw.get("drop_remainder", False))
        if kind == "padded_batch":
            return ops.Batch(up, label, step.args[0], kw.get("drop_remainder", False),
                             (kw.get("padded_shapes"), kw.get("padding_values")))
        if kind == "unbatch":
            return ops.Unbatch(up, label)
        if kind == "prefetch":
            return ops.Prefetch(up, label, self._knob(k, label, "prefetch", step.args[0]))
        if kind == "cache":
            store = self._cache_store(k, step)
            return CacheNode(up, label, store)
        if kind == "concatenate":
            return ops.Concatenate(up, label, step.args[0], ctx)
        raise ValueError(f"{label}: unknown step")  # pragma: no cover

    def _knob(self, k: int, label: str, kind: str, value: int) -> ops.Knob:
        """Step ``k``'s live setting, kept across iterations (an AUTOTUNE tuner keeps tuning it)."""
        with self._lock:
            knob = self._step_knobs.get(k)
            if knob is None:
                if kind == "prefetch":
                    knob = ops.Knob(2 if value == AUTOTUNE else int(value), 64)
                else:
                    cpus = max(1, default_num_threads())
                    knob = ops.Knob(cpus if value == AUTOTUNE else int(value), max(cpus, int(value)))
                if value == AUTOTUNE:
                    self._tuners.append(tune_knob(knob, label, kind=kind, clock=self._options.autotune_clock,
                                                  origin=self._tune_origin))
                self._step_knobs[k] = knob
            return knob

    def _cache_store(self, k: int, step: Step) -> Any:
        """The store of cache step ``k``, kept by this pipeline across iterations."""
        with self._lock:
            store = self._caches.get(k)
            if store is None:
                path = step.args[0] if step.args and isinstance(step.args[0], str) else None
                store = self._caches[k] = CacheStore(path, max_side=step_kwargs(step).get("max_side"),
                                                     fingerprint=json.dumps(self._fingerprint(k - 1)),
                                                     ram_budget=self._options.ram_budget,
                                                     label=step_label(k, step))
            return store

    def _open_nested(self, iteration: int) -> Iterator:
        """Elements of one pass of this pipeline inside another (flat_map, interleave, zip,
        concatenate), as iteration ``iteration`` (``ops.nested_key`` in ``_pipeline/ops.py``)."""
        return self._build(iteration).open()

    def _upstream(self, k: int) -> Pipeline:
        """This pipeline's source and options with its first ``k`` steps only."""
        return Pipeline(self._src, self._steps[:k], self._options)

    # -- iteration and state ---------------------------------------------------------
    def __iter__(self) -> PipelineIterator:
        with self._lock:
            resume, self._resume = self._resume, None
            if resume is not None:
                e, skip = int(resume["iteration"]), int(resume["delivered"])
            else:
                e, skip = self._iteration, 0
            self._iteration = e + 1
        node = self._build(e, skip)
        head = _top_head(node)
        if head is not None and not any(s.kind == "cache" for s in self._steps):
            head.warm_next = _warm_caller(self, e + 1)
        it = PipelineIterator(self, node, e, skip)
        self._current = weakref.ref(it)
        return it

    # NOTE [ Warm iterations ]
    # As DataLoader's warm epochs (NOTE [ Warm epochs ] in loader.py): once every batch of an
    # iteration's engine stage is planned, the next iteration's first segment (its order is
    # a pure function of the seed and the iteration number) starts on the same engine, so a
    # loop over iterations does not wait for the queue to refill at each start. The run is
    # used only by exactly that iteration starting from its beginning; otherwise (a resumed
    # state, another iteration) it is closed. Pipelines with a cache step are not warmed
    # (their next iteration runs on another engine).
    def _warm_iteration(self, iteration: int) -> None:
        with self._lock:
            if self._resume is not None or self._iteration != iteration:
                return
        head = _top_head(self._build(iteration))
        if head is None or head.start:
            return
        segments = head.segments()
        try:
            first = next(segments, None)
        finally:
            segments.close()
        if first is not None and first[0].targets:
            head.engine.warm(first[0], iteration)

    def state_dict(self) -> dict:
        """The position as plain JSON: the iteration in progress and the elements the user
        took from it (NOTE [ Pipeline resume ]). Between iterations it points at the next one."""
        with self._lock:
            if self._resume is not None:
                return json.loads(json.dumps(self._resume))
            it = self._current() if self._current is not None else None
            if it is not None and not it.finished:
                e, k = it.iteration, it.delivered
            else:
                e, k = self._iteration, 0
            return {"version": STATE_VERSION, "seed": self.seed, "plan": plan_digest(self._src.kind, self._src.what, self._steps), "iteration": int(e),
                    "delivered": int(k)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (from :meth:`state_dict` of an equal pipeline) at the next ``iter()``.

        Raises
        ------
        StateError
            The state is from another version, seed or plan.
        """
        if not isinstance(state, dict):
            raise StateError(f"a pipeline state is a dict, got {type(state).__name__}")
        if state.get("version") != STATE_VERSION:
            raise StateError(f"state version {state.get('version')!r} is not {STATE_VERSION} (this loaderlib)")
        seed: Any = state.get("seed")   # JSON, checked before it is adopted
        adopt = seed != self.seed and self._options.seed_drawn
        if adopt and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise StateError(f"the state's 'seed' must be a non-negative integer, got {seed!r}")
        if seed != self.seed and not adopt:
            raise StateError(f"the state is for seed {seed!r}, this pipeline was given seed {self.seed} "
                             "(with_options(seed=...)); a pipeline whose seed was drawn takes the state's")
        if state.get("plan") != plan_digest(self._src.kind, self._src.what, self._steps):
            raise StateError("the state is for another pipeline (its steps or source differ)")
        for key in ("iteration", "delivered"):
            if not isinstance(state.get(key), int) or state[key] < 0:
                raise StateError(f"the state's {key!r} must be a non-negative integer, got {state.get(key)!r}")
        engines = []
        with self._lock:
            if adopt:
                # This pipeline drew its seed: it takes the saved run's, as DataLoader does
                # (_adopt_seed). Engines were made with the old seed, so they are made again.
                self._options = dataclasses.replace(self._options, seed=int(seed))
                engines, self._engines = list(self._engines.values()), {}
            self._resume = json.loads(json.dumps(state))
        for e in engines:
            e.close()

    # -- reporting -------------------------------------------------------------------
    def explain(self) -> str:
        """The compiled plan: which stages run on which engine, and why."""
        node = self._build(self._iteration)
        rows = node.describe()
        lines = [f"Pipeline: {len(self._steps)} step(s) after the source"]
        for stage, kind, detail in rows:
            lines.append(f"  {stage:<34} {kind:<8} {detail}")
        return "\n".join(lines)

    @property
    def engine(self) -> str:
        """The engine of the head ("native", "threads"), or "python" when no step runs on one."""
        node = self._build(self._iteration)
        while not isinstance(node, _Head) and hasattr(node, "up"):
            node = node.up
        return node.engine.engine if isinstance(node, _Head) else "python"

    @property
    def head_loader(self) -> Any:
        """The ``DataLoader`` that runs the head's engine stage of the next iteration, or None
        when no step runs on an engine. Its ``recorder``, ``stats``, ``num_threads`` and
        ``prefetch`` are that stage's (the dashboard watches it). After a ``cache`` step is
        complete, later iterations run on another one (the stage over the cached pixels), except
        after a cache right after an image source, which that same stage fills."""
        node = self._build(self._iteration)
        while not isinstance(node, _Head) and hasattr(node, "up"):
            node = node.up
        return node.engine.loader if isinstance(node, _Head) else None

    def dashboard(self, **kwargs: Any) -> Any:
        """A live bottleneck dashboard for this pipeline's engine stage, with the tuner's
        decisions (Jupyter; see :class:`loaderlib.profiling.Dashboard`, which takes ``kwargs``)."""
        # Lazy: loaderlib.profiling imports ipywidgets and matplotlib, which `import loaderlib`
        # never needs (and profiling reads the core, not the reverse).
        from .profiling import Dashboard

        return Dashboard(self, **kwargs)

    @property
    def stats(self) -> dict:
        """Per-stage timings of the head's engine (``stats["engine"]``), every tuner's decisions
        (``stats["autotune"]``: ``(time_s, knob, old, new, reason)``, oldest first) and
        :meth:`cache_info`.

        Every decision time, the engine stages' tuners' included, is in seconds since this
        pipeline object was made (by its last step or ``with_options``), read on the clock
        ``AUTOTUNE`` uses: the profiling clock (``loaderlib.stats.clock_ns``, the clock of
        ``Stats.started_s``) unless ``autotune_clock`` was given (NOTE [ Autotune ])."""
        engines = list(self._engines.values())
        return {"engine": engines[0].loader.stats if engines else None,
                "autotune": decisions_of(self, *(e.loader for e in engines)), "cache": self.cache_info()}

    def cache_info(self) -> list[dict]:
        """What each ``cache`` step holds: kind, elements, bytes, whether complete, and why not."""
        return [self._cache_store(k, s).info() for k, s in enumerate(self._steps, 1) if s.kind == "cache"]

    def close(self) -> None:
        """Stop the engines' threads and free their arenas (a later ``iter()`` starts them again)."""
        with self._lock:
            engines, self._engines = list(self._engines.values()), {}
        for e in engines:
            e.close()

    def __del__(self) -> None:
        try:
            for e in self._engines.values():
                e.close()
        except Exception:  # noqa: BLE001, S110
            pass

    def __repr__(self) -> str:
        steps = "".join(s.describe() for s in self._steps)
        return f"Pipeline({self._src.what}){steps}"


class PipelineIterator:
    """One pass over a pipeline; counts the elements it returned (for ``state_dict``)."""

    def __init__(self, pipe: Pipeline, node: ops.Node, iteration: int, delivered: int) -> None:
        self._pipe = pipe
        self._it = node.open()
        self.iteration = iteration
        self.delivered = delivered
        self.finished = False

    def __iter__(self) -> PipelineIterator:
        return self

    def __next__(self) -> Any:
        if self.finished:
            raise StopIteration
        try:
            el = next(self._it)
        except StopIteration:
            self.finished = True
            raise
        except BaseException:
            self.finished = True
            ops.close(self._it)
            raise
        self.delivered += 1
        return el

    def state_dict(self) -> dict:
        """The pipeline state after the last element this iterator returned."""
        d = self._pipe.state_dict()
        if not self.finished:
            d["iteration"], d["delivered"] = self.iteration, self.delivered
        return d

    def close(self) -> None:
        """Stop the pass: its threads stop and its engine run ends."""
        self.finished = True
        ops.close(self._it)

    def __del__(self) -> None:
        try:
            ops.close(self._it)
        except Exception:  # noqa: BLE001, S110
            pass


def _mix_parts(pipelines: Any, name: str) -> list[Pipeline]:
    """The pipelines of a mixing source, checked (NOTE [ Mixing pipelines ] in ``_pipeline/mix.py``)."""
    if isinstance(pipelines, Pipeline) or not hasattr(pipelines, "__iter__"):
        raise TypeError(f"{name}: pipelines must be a sequence of Pipelines, got {type(pipelines).__name__}")
    parts = list(pipelines)
    if not parts:
        raise ValueError(f"{name}: pipelines is empty")
    for k, p in enumerate(parts):
        if not isinstance(p, Pipeline):
            raise TypeError(f"{name}: pipelines[{k}] is a {type(p).__name__}, not a Pipeline")
    return parts
