"""The Python operators of a Pipeline: one small node per step, tf.data's semantics.

NOTE [ Pipeline nodes ]
A compiled pipeline is a chain of nodes built afresh for every iteration. A node's
``open()`` returns an iterator over its elements; a node that passes over its input more
than once (``repeat``) opens its input again. Nothing random is drawn from global state:
``shuffle`` keys its generator by ``(seed, step, iteration, pass)`` and a loaderlib
transform given to ``map`` keys each element's randomness by ``(seed, iteration, ordinal
of the element at that step)``, so the output is a pure function of the seed and the
iteration, whatever the thread count or timing. Iterators are generators that close their
input in ``finally``: dropping an iterator stops every thread below it.
"""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .. import transforms as T
from .._chain import compile_chain
from .._engines.threads import _DaemonThreadPool
from .._threads import name_native_thread
from .._tree import is_namedtuple, tree_leaves, tree_map
from ..errors import _add_context
from .plan import PipelineLike

_BLOCK = 1024   # shuffle draws this many uniforms at a time (the sequence does not depend on it)

#: "No element": an empty input's first element.
EMPTY = object()


def annotate(exc: BaseException, label: str) -> BaseException:
    """Name the step that raised (once, at the innermost step that saw it)."""
    if not getattr(exc, "_loaderlib_step", None):
        _add_context(exc, f"loaderlib: raised in {label} of the pipeline", _loaderlib_step=label)
    return exc


def close(it: Any) -> None:
    c = getattr(it, "close", None)
    if c is not None:
        c()


class Knob:
    """A live setting read by the nodes while they run (``value``), tunable by AUTOTUNE
    (``observe``: the tuner's hook, called per element delivered)."""

    def __init__(self, value: int, limit: int, observe: Callable | None = None) -> None:
        self.value = value
        self.limit = limit
        self.observe = observe


class Context:
    """What every node of one iteration shares: the seed and the iteration number."""

    def __init__(self, seed: int, iteration: int, knobs: Any = None) -> None:
        self.seed = int(seed)
        self.iteration = int(iteration)
        self.knobs = knobs


class Node:
    """One step (or the source) of a compiled pipeline (NOTE [ Pipeline nodes ])."""

    label = "source"

    def open(self) -> Iterator:
        raise NotImplementedError

    def describe(self) -> list[tuple[str, str, str]]:
        """(stage, where it runs, detail) rows for ``explain()``, upstream first."""
        return []


class Unary(Node):
    def __init__(self, up: Node, label: str) -> None:
        self.up = up
        self.label = label

    def describe(self) -> list:
        return [*self.up.describe(), (self.label, "python", self.what())]

    def what(self) -> str:
        return "in the consuming thread"


def call(fn: Callable, el: Any) -> Any:
    """A Python step's call: the element's components are the arguments (tf.data's rule)."""
    return fn(*el) if isinstance(el, tuple) else fn(el)


_plans = threading.local()


def _fused(fn: Any) -> Any:
    """This thread's compiled plan of transform ``fn`` (None when it cannot run fused)."""
    cache = getattr(_plans, "cache", None)
    if cache is None:
        cache = _plans.cache = {}
    key = id(fn)
    hit = cache.get(key)
    if hit is None or hit[0] is not fn:
        try:
            plan = compile_chain(fn)
        except (TypeError, ValueError):
            plan = None
        hit = cache[key] = (fn, plan if plan is not None and plan.sample_shape is not None else None)
    return hit[1]


def transform_image(fn: Any, img: Any, ctx: Context, ordinal: int) -> Any:
    """A loaderlib transform on one image, keyed by ``(seed, iteration, ordinal)``.

    NOTE [ Fused single images ]
    A decoded RGB image (a cache's, say) goes through the chain's fused kernel
    (``run_pixels_into``, one image), which computes exactly what the transforms compute
    step by step, many times faster; anything else is transformed step by step.
    """
    if isinstance(img, np.ndarray) and img.ndim == 3 and img.dtype == np.uint8 and img.shape[2] == 3:
        plan = _fused(fn)
        if plan is not None:
            out = np.empty((1, *plan.sample_shape), plan.dtype)
            st = plan.run_pixels_into([img], out, np.asarray([ordinal], np.int64), seed=ctx.seed,
                                      epoch=ctx.iteration, num_threads=1)
            if st.ok.all():
                return out[0]
    return fn(img, seed=ctx.seed, epoch=ctx.iteration, index=ordinal)


def apply_map(fn: Any, el: Any, ctx: Context, ordinal: int) -> Any:
    """``map``'s call: a loaderlib transform applies to the image of an ``(image, ...)``
    element with keyed randomness (NOTE [ Pipeline nodes ]); anything else gets the components."""
    if isinstance(fn, T.Transform):
        if isinstance(el, tuple):
            return (transform_image(fn, el[0], ctx, ordinal), *el[1:])
        return transform_image(fn, el, ctx, ordinal)
    return call(fn, el)


class Map(Unary):
    """``map(fn, num_parallel_calls)``: order kept; parallel calls run on a thread pool."""

    def __init__(self, up: Node, label: str, fn: Any, ctx: Context, parallel: Knob | None) -> None:
        super().__init__(up, label)
        self.fn = fn
        self.ctx = ctx
        self.parallel = parallel   # None: in the consuming thread

    def what(self) -> str:
        if self.parallel is None:
            return "per element, in the consuming thread"
        return f"per element, {self.parallel.value} calls in flight on a thread pool (order kept)"

    def open(self) -> Iterator:
        if self.parallel is None:
            return self._serial()
        return self._parallel()

    def _serial(self) -> Iterator:
        it = self.up.open()
        try:
            for k, el in enumerate(it):
                try:
                    out = apply_map(self.fn, el, self.ctx, k)
                except Exception as e:
                    annotate(e, self.label)
                    raise
                yield out
        finally:
            close(it)

    def _parallel(self) -> Iterator:
        knob = self.parallel
        assert knob is not None   # open() runs this only with num_parallel_calls
        pool = _DaemonThreadPool(max(1, knob.limit))
        stream = object()   # this pass, for an AUTOTUNE tuner (NOTE [ Autotune ])
        it = self.up.open()
        pending: collections.deque = collections.deque()
        try:
            counter = itertools.count()
            done = False
            while True:
                while not done and len(pending) < max(1, knob.value) * 2:
                    try:
                        el = next(it)
                    except StopIteration:
                        done = True
                        break
                    pending.append(pool.submit(apply_map, self.fn, el, self.ctx, next(counter)))
                if not pending:
                    return
                f = pending.popleft()
                try:
                    out = f.result()
                except Exception as e:
                    annotate(e, self.label)
                    raise
                if knob.observe is not None:
                    knob.observe(1, stream)
                yield out
        finally:
            for f in pending:
                f.cancel()
            pool.shutdown(wait=False, cancel_futures=True)
            close(it)


class Filter(Unary):
    def __init__(self, up: Node, label: str, pred: Callable) -> None:
        super().__init__(up, label)
        self.pred = pred

    def open(self) -> Iterator:
        it = self.up.open()
        try:
            for el in it:
                try:
                    keep = call(self.pred, el)
                    keep = bool(keep.item() if isinstance(keep, np.ndarray) else keep)
                except Exception as e:
                    annotate(e, self.label)
                    raise
                if keep:
                    yield el
        finally:
            close(it)


def nested_key(ctx: Context, ordinal: int) -> int:
    """The iteration number a nested pipeline runs as: a function of the outer iteration and
    of which opening this is (never of how often that pipeline object ran before)."""
    return (ctx.iteration << 24) | (int(ordinal) & 0xFFFFFF)


def _as_iterator(obj: Any, label: str, ctx: Context, ordinal: int) -> Iterator:
    if isinstance(obj, PipelineLike):
        return obj._open_nested(nested_key(ctx, ordinal))
    try:
        return iter(obj)
    except TypeError:
        raise TypeError(f"{label}: the function must return a Pipeline (or an iterable), got "
                        f"{type(obj).__name__}") from None


class FlatMap(Unary):
    def __init__(self, up: Node, label: str, fn: Callable, ctx: Context) -> None:
        super().__init__(up, label)
        self.fn = fn
        self.ctx = ctx

    def open(self) -> Iterator:
        it = self.up.open()
        try:
            for k, el in enumerate(it):
                try:
                    inner = _as_iterator(call(self.fn, el), self.label, self.ctx, k)
                except Exception as e:
                    annotate(e, self.label)
                    raise
                try:
                    yield from inner
                finally:
                    close(inner)
        finally:
            close(it)


class Interleave(Unary):
    """tf.data's interleave: ``cycle_length`` inputs open at once, ``block_length`` elements
    from each in turn; an exhausted slot takes the next input element when its turn comes."""

    def __init__(self, up: Node, label: str, fn: Callable, cycle_length: int, block_length: int,
                 ctx: Context) -> None:
        super().__init__(up, label)
        self.fn = fn
        self.ctx = ctx
        self.cycle_length = cycle_length
        self.block_length = block_length

    def open(self) -> Iterator:
        it = self.up.open()
        slots: list = [None] * self.cycle_length
        try:
            cycle = block = 0
            open_count = 0
            inputs = 0
            end_of_input = False
            while not end_of_input or open_count > 0:
                cur = slots[cycle]
                if cur is not None:
                    try:
                        el = next(cur)
                    except StopIteration:
                        slots[cycle] = None
                        open_count -= 1
                        cycle, block = (cycle + 1) % self.cycle_length, 0
                        continue
                    block += 1
                    if block == self.block_length:
                        cycle, block = (cycle + 1) % self.cycle_length, 0
                    yield el
                elif not end_of_input:
                    try:
                        x = next(it)
                    except StopIteration:
                        end_of_input = True
                        continue
                    try:
                        slots[cycle] = _as_iterator(call(self.fn, x), self.label, self.ctx, inputs)
                        inputs += 1
                    except Exception as e:
                        annotate(e, self.label)
                        raise
                    open_count += 1
                else:
                    cycle, block = (cycle + 1) % self.cycle_length, 0
        finally:
            for s in slots:
                if s is not None:
                    close(s)
            close(it)


def shuffle_rng(seed: int, step: int, iteration: int, npass: int, reshuffle: bool) -> np.random.Generator:
    words = [int(seed) & ((1 << 64) - 1), int(step)] + ([int(iteration), int(npass)] if reshuffle else [])
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))


def buffer_shuffle(it: Iterator, buffer_size: int, rng: np.random.Generator) -> Iterator:
    """tf.data's shuffle: fill a buffer of ``buffer_size`` elements; each output is a uniformly
    chosen buffer element, whose place the next input element takes; at the end the buffer
    drains in random order. Draw k is ``floor(u_k * len(buffer))`` with ``u_k`` the
    generator's k-th ``random()``; a chosen slot that cannot be refilled takes the last one."""
    buf: list = []
    u = rng.random(_BLOCK)
    k = 0

    def draw(m: int) -> int:
        nonlocal u, k
        if k == _BLOCK:
            u, k = rng.random(_BLOCK), 0
        j = int(u[k] * m)
        k += 1
        return j

    for x in it:
        if len(buf) < buffer_size:
            buf.append(x)
            continue
        j = draw(buffer_size)
        out, buf[j] = buf[j], x
        yield out
    while buf:
        j = draw(len(buf))
        out = buf[j]
        last = buf.pop()
        if j < len(buf):
            buf[j] = last
        yield out


class Shuffle(Unary):
    def __init__(self, up: Node, label: str, step: int, buffer_size: int, seed: int, ctx: Context,
                 reshuffle: bool) -> None:
        super().__init__(up, label)
        self.step = step
        self.buffer_size = buffer_size
        self.seed = seed
        self.ctx = ctx
        self.reshuffle = reshuffle
        self.opens = 0

    def what(self) -> str:
        return f"buffer of {self.buffer_size} elements, in the consuming thread"

    def open(self) -> Iterator:
        rng = shuffle_rng(self.seed, self.step, self.ctx.iteration, self.opens, self.reshuffle)
        self.opens += 1
        it = self.up.open()
        try:
            yield from buffer_shuffle(it, self.buffer_size, rng)
        finally:
            close(it)


class Repeat(Unary):
    def __init__(self, up: Node, label: str, count: int | None) -> None:
        super().__init__(up, label)
        self.count = count

    def open(self) -> Iterator:
        passes = itertools.count() if self.count is None else range(self.count)
        for _ in passes:
            it = self.up.open()
            got = False
            try:
                for el in it:
                    got = True
                    yield el
            finally:
                close(it)
            if not got:
                return   # an empty input repeated for ever is empty, not a hang


class Take(Unary):
    def __init__(self, up: Node, label: str, count: int) -> None:
        super().__init__(up, label)
        self.count = count

    def open(self) -> Iterator:
        if self.count == 0:
            return
        it = self.up.open()
        try:
            for k, el in enumerate(it):
                yield el
                if self.count >= 0 and k + 1 >= self.count:
                    return
        finally:
            close(it)


class Skip(Unary):
    def __init__(self, up: Node, label: str, count: int) -> None:
        super().__init__(up, label)
        self.count = count

    def open(self) -> Iterator:
        it = self.up.open()
        try:
            if self.count < 0:
                for _ in it:
                    pass
                return
            for k, el in enumerate(it):
                if k >= self.count:
                    yield el
        finally:
            close(it)


def stack(elements: list, label: str) -> Any:
    """A batch of elements: each component stacked on a new leading axis."""
    try:
        return tree_map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *elements)
    except ValueError as e:
        raise ValueError(f"{label}: cannot stack the elements of a batch ({e}); use padded_batch for "
                         "components whose shapes differ") from None


def pad_stack(elements: list, shapes: Any, values: Any, label: str) -> Any:
    """A padded batch: every component padded at the end of each axis to ``shapes`` (None:
    the batch's largest) with ``values``."""

    def leaf(shape: Any, value: Any, *xs: Any) -> np.ndarray:
        arrs = [np.asarray(x) for x in xs]
        ndim = arrs[0].ndim
        if any(a.ndim != ndim for a in arrs):
            raise ValueError(f"{label}: components of one position have different ranks")
        big = [max(a.shape[d] for a in arrs) for d in range(ndim)]
        shape = shape.dims if isinstance(shape, _Shape) else shape
        if shape is not None:
            if len(shape) != ndim:
                raise ValueError(f"{label}: padded shape {shape} has rank {len(shape)}, the component has {ndim}")
            for d, (want, have) in enumerate(zip(shape, big)):
                if want is not None and want >= 0:
                    if have > want:
                        raise ValueError(f"{label}: a component of size {have} on axis {d} does not fit the padded "
                                         f"shape {shape}")
                    big[d] = int(want)
        out = np.full((len(arrs), *big), 0 if value is None else value, dtype=arrs[0].dtype)
        for k, a in enumerate(arrs):
            out[(k,) + tuple(slice(0, s) for s in a.shape)] = a
        return out

    struct = elements[0]
    shapes = tree_map(lambda _: _Shape(None), struct) if shapes is None else as_leaves(shapes, struct)
    if values is None or not isinstance(values, (tuple, list, dict)):
        values = tree_map(lambda _, v=values: v, struct)
    return tree_map(leaf, shapes, values, *elements)


def as_leaves(shapes: Any, struct: Any) -> Any:
    """Shapes given per component of ``struct`` (its containers, as ``_tree.py`` defines
    them), one :class:`_Shape` leaf each; a bare shape (a tuple of ints) for a single component."""
    t = type(struct)
    if t is dict:
        return {k: as_leaves(shapes[k], struct[k]) for k in struct}
    if t is tuple or t is list or is_namedtuple(struct):
        out = [as_leaves(s, c) for s, c in zip(shapes, struct)]
        return t(out) if t is tuple or t is list else t(*out)
    return _Shape(shapes)


class _Shape:
    """A padded shape carried as one leaf through ``tree_map`` (None: the batch's largest)."""

    def __init__(self, shape: Any) -> None:
        self.dims = None if shape is None else tuple(shape)


class Batch(Unary):
    def __init__(self, up: Node, label: str, size: int, drop_remainder: bool, padded: tuple | None = None) -> None:
        super().__init__(up, label)
        self.size = size
        self.drop_remainder = drop_remainder
        self.padded = padded

    def what(self) -> str:
        return "numpy stack in the consuming thread" if self.padded is None else "padded, in the consuming thread"

    def _make(self, group: list) -> Any:
        if self.padded is None:
            return stack(group, self.label)
        shapes, values = self.padded
        return pad_stack(group, shapes, values, self.label)

    def open(self) -> Iterator:
        it = self.up.open()
        try:
            group: list = []
            for el in it:
                group.append(el)
                if len(group) == self.size:
                    yield self._make(group)
                    group = []
            if group and not self.drop_remainder:
                yield self._make(group)
        finally:
            close(it)


class Unbatch(Unary):
    def open(self) -> Iterator:
        it = self.up.open()
        try:
            for el in it:
                parts = [np.asarray(x) for x in tree_leaves(el)]
                n = {p.shape[0] if p.ndim else -1 for p in parts}
                if len(n) != 1 or -1 in n:
                    raise ValueError(f"{self.label}: every component needs the same leading dimension to unbatch, "
                                     f"got {sorted(p.shape for p in parts)}")
                for k in range(n.pop()):
                    yield tree_map(lambda x, k=k: x[k], el)
        finally:
            close(it)


class Prefetch(Unary):
    """A background thread keeps up to ``depth.value`` elements ready (order kept)."""

    def __init__(self, up: Node, label: str, depth: Knob) -> None:
        super().__init__(up, label)
        self.depth = depth

    def what(self) -> str:
        return f"{self.depth.value} elements ready ahead, on a background thread"

    def open(self) -> Iterator:
        cond = threading.Condition()
        items: collections.deque = collections.deque()
        stop = threading.Event()
        end = object()
        depth = self.depth

        def fill() -> None:
            name_native_thread("ll-prefetch")   # NOTE [ Thread names ] in pyx/include/ll_pool.h
            it = self.up.open()
            try:
                for el in it:
                    with cond:
                        while len(items) >= max(1, depth.value) and not stop.is_set():
                            cond.wait(0.2)
                        if stop.is_set():
                            return
                        items.append((True, el))
                        cond.notify_all()
                with cond:
                    items.append((True, end))
                    cond.notify_all()
            except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
                with cond:
                    items.append((False, e))
                    cond.notify_all()
            finally:
                close(it)

        t = threading.Thread(target=fill, name="loaderlib-pipeline-prefetch", daemon=True)
        t.start()
        stream = object()   # this pass, for an AUTOTUNE tuner (NOTE [ Autotune ])
        try:
            while True:
                with cond:
                    while not items:
                        cond.wait(0.2)
                    ok, el = items.popleft()
                    cond.notify_all()
                if not ok:
                    raise el
                if el is end:
                    return
                if depth.observe is not None:
                    depth.observe(1, stream)
                yield el
        finally:
            stop.set()
            with cond:
                cond.notify_all()
            if t is not threading.current_thread():
                t.join()


class Concatenate(Unary):
    def __init__(self, up: Node, label: str, other: PipelineLike, ctx: Context) -> None:
        super().__init__(up, label)
        self.other = other
        self.ctx = ctx
        self.opens = 0

    def describe(self) -> list:
        return [*self.up.describe(), (self.label, "python", "then every element of the other pipeline")]

    def open(self) -> Iterator:
        it = self.up.open()
        try:
            yield from it
        finally:
            close(it)
        other = self.other._open_nested(nested_key(self.ctx, self.opens))
        self.opens += 1
        try:
            yield from other
        finally:
            close(other)


class Zip(Node):
    """``Pipeline.zip(a, b, ...)``: tuples of the i-th elements, stopping at the shortest."""

    label = "source Pipeline.zip"

    def __init__(self, parts: Sequence[PipelineLike], structure: Any, ctx: Context) -> None:
        self.parts = parts
        self.structure = structure   # "tuple" or the dict keys
        self.ctx = ctx
        self.opens = 0

    def describe(self) -> list:
        return [("source", "python", f"zip of {len(self.parts)} pipelines, stopping at the shortest")]

    def open(self) -> Iterator:
        key = nested_key(self.ctx, self.opens)
        self.opens += 1
        its = [p._open_nested(key) for p in self.parts]
        try:
            for els in zip(*its):
                yield tuple(els) if self.structure == "tuple" else dict(zip(self.structure, els))
        finally:
            for it in its:
                close(it)


class IterableSource(Node):
    def __init__(self, make: Callable[[], Iterator], what: str) -> None:
        self.make = make
        self.what = what

    def describe(self) -> list:
        return [("source", "python", self.what)]

    def open(self) -> Iterator:
        it = self.make()
        try:
            yield from it
        finally:
            close(it)


class Skipped(Node):
    """The first ``count`` elements of ``up`` dropped (a resumed iteration, NOTE [ Pipeline resume ])."""

    def __init__(self, up: Node, count: int) -> None:
        self.up = up
        self.count = count
        self.label = up.label

    def describe(self) -> list:
        return self.up.describe()

    def open(self) -> Iterator:
        it = self.up.open()
        try:
            for _ in range(self.count):
                try:
                    next(it)
                except StopIteration:
                    return
            yield from it
        finally:
            close(it)
