"""Pipeline operators against a plain-Python model of tf.data's documented semantics.

The model below is written from tf.data's documentation (one function per operator, on
lists); it never calls loaderlib. Every operator runs on two sources: numpy arrays (an
indexable source: index steps are compiled onto the DataLoader engine) and a plain
iterable (every step runs as a Python node), which must agree with the model and so with
each other.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import loaderlib as ll
from loaderlib.errors import StateError
from loaderlib.pipeline import TensorSpec

SEED = 7


# --------------------------------------------------------------------------- the model


def m_shuffle(xs, buffer_size, seed, step, iteration=0, npass=0, reshuffle=True):
    """tf.data shuffle: a buffer of ``buffer_size``; each output is a uniform pick from it,
    replaced by the next input; the buffer drains at the end. Draws: the k-th
    ``random()`` of PCG64(SeedSequence([seed, step, iteration, pass])) (without
    reshuffling: ``[seed, step]``) picks ``floor(u * len(buffer))``; a drained slot takes
    the last element."""
    words = [seed, step, iteration, npass] if reshuffle else [seed, step]
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))
    buf, out = [], []
    for x in xs:
        if len(buf) < buffer_size:
            buf.append(x)
            continue
        j = int(rng.random() * buffer_size)
        out.append(buf[j])
        buf[j] = x
    while buf:
        j = int(rng.random() * len(buf))
        out.append(buf[j])
        last = buf.pop()
        if j < len(buf):
            buf[j] = last
    return out


def m_batch(xs, n, drop=False):
    out = [xs[i:i + n] for i in range(0, len(xs), n)]
    return [b for b in out if len(b) == n] if drop else out


def m_interleave(xs, fn, cycle_length, block_length):
    """tf.data's documented example algorithm (InterleaveDataset): cycle over
    ``cycle_length`` open inputs taking ``block_length`` from each; an exhausted input's
    slot opens the next input when the cycle returns to it."""
    inputs = iter(xs)
    slots = [None] * cycle_length
    out, cycle, block, opened, end = [], 0, 0, 0, False
    while not end or opened:
        if slots[cycle] is not None:
            try:
                out.append(next(slots[cycle]))
                block += 1
                if block == block_length:
                    cycle, block = (cycle + 1) % cycle_length, 0
            except StopIteration:
                slots[cycle] = None
                opened -= 1
                cycle, block = (cycle + 1) % cycle_length, 0
        elif not end:
            try:
                slots[cycle] = iter(fn(next(inputs)))
                opened += 1
            except StopIteration:
                end = True
        else:
            cycle, block = (cycle + 1) % cycle_length, 0
    return out


def plain(x):
    """Elements as plain Python values for comparison."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return [plain(v) for v in x]
    if isinstance(x, (np.ndarray, np.generic)):
        return x.tolist()
    return x


def source(kind, n=10):
    data = np.arange(n, dtype=np.int64)
    if kind == "arrays":
        return ll.Pipeline.from_arrays(data).with_options(seed=SEED)
    return ll.Pipeline.from_iterable(lambda: iter(data.tolist())).with_options(seed=SEED)


KINDS = ["arrays", "iterable"]


# --------------------------------------------------------------------------- operators


@pytest.mark.parametrize("kind", KINDS)
def test_map_filter_take_skip(kind):
    got = plain(list(source(kind).map(lambda x: x * 3).filter(lambda x: x % 2 == 0).skip(1).take(3)))
    ref = [x * 3 for x in range(10) if (x * 3) % 2 == 0][1:4]
    assert got == ref


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("n", "drop"), [(3, False), (3, True), (5, False), (20, False), (20, True)])
def test_batch(kind, n, drop):
    got = plain(list(source(kind).batch(n, drop_remainder=drop)))
    assert got == m_batch(list(range(10)), n, drop)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("buffer_size", [1, 3, 10, 50])
def test_shuffle_matches_model(kind, buffer_size):
    pipe = source(kind).shuffle(buffer_size)
    assert plain(list(pipe)) == m_shuffle(list(range(10)), buffer_size, SEED, 1, 0)
    assert plain(list(pipe)) == m_shuffle(list(range(10)), buffer_size, SEED, 1, 1)   # reshuffled


def test_shuffle_properties():
    pipe = source("arrays", 50).shuffle(50)
    a, b = plain(list(pipe)), plain(list(pipe))
    assert sorted(a) == list(range(50)) and a != b
    assert plain(list(source("arrays").shuffle(1))) == list(range(10))   # buffer 1: input order
    fixed = source("arrays", 30).shuffle(8, seed=3, reshuffle_each_iteration=False)
    assert plain(list(fixed)) == plain(list(fixed)) == m_shuffle(list(range(30)), 8, 3, 1, reshuffle=False)
    # the buffer bounds how far an element moves forward: output k is among inputs < k + 8
    out = plain(list(fixed))
    assert all(x < k + 8 for k, x in enumerate(out))


@pytest.mark.parametrize("kind", KINDS)
def test_repeat_shuffle_reshuffles_each_pass(kind):
    got = plain(list(source(kind).shuffle(4).repeat(3)))
    ref = [x for p in range(3) for x in m_shuffle(list(range(10)), 4, SEED, 1, 0, p)]
    assert got == ref
    # shuffle after repeat: one buffer over the repeated stream
    got = plain(list(source(kind).repeat(2).shuffle(4)))
    assert got == m_shuffle(list(range(10)) * 2, 4, SEED, 2, 0, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_repeat_forever_take(kind):
    assert plain(list(source(kind, 4).repeat().take(10))) == [0, 1, 2, 3] * 2 + [0, 1]
    assert plain(list(source(kind, 4).repeat(-1).skip(3).take(2))) == [3, 0]
    assert plain(list(source(kind, 3).repeat(0))) == []


def test_take_zero_and_empty():
    assert list(source("arrays").take(0)) == []
    assert list(source("iterable").take(0).batch(2)) == []
    assert list(source("arrays").skip(-1)) == []
    assert plain(list(source("arrays").take(-1))) == list(range(10))
    empty = ll.Pipeline.from_arrays(np.zeros((0, 2), np.float32))
    assert list(empty) == [] and list(empty.batch(4)) == [] and list(empty.repeat()) == []
    assert list(source("iterable").filter(lambda x: False).batch(3)) == []
    assert list(source("arrays").filter(lambda x: False).repeat()) == []


@pytest.mark.parametrize("kind", KINDS)
def test_unbatch_and_flat_map(kind):
    assert plain(list(source(kind).batch(4).unbatch())) == list(range(10))
    got = plain(list(source(kind, 4).flat_map(lambda x: ll.Pipeline.from_arrays(np.full(int(x), x)))))
    assert got == [1, 2, 2, 3, 3, 3]


def test_interleave_documented_example():
    # tf.data.Dataset.interleave's documentation example.
    pipe = ll.Pipeline.from_arrays(np.arange(1, 6)).interleave(
        lambda x: ll.Pipeline.from_arrays(np.full(6, x)), cycle_length=2, block_length=4)
    assert plain(list(pipe)) == [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 3, 3, 4, 4,
                                 5, 5, 5, 5, 5, 5]


@pytest.mark.parametrize(("cycle", "block"), [(1, 1), (2, 1), (3, 2), (5, 3)])
def test_interleave_matches_model(cycle, block):
    def fn(x):
        return list(range(x * 10, x * 10 + x % 4))

    pipe = source("iterable", 7).interleave(lambda x: ll.Pipeline.from_iterable(fn(x)), cycle, block)
    assert plain(list(pipe)) == m_interleave(range(7), fn, cycle, block)


def test_zip_concatenate_reduce_nested():
    a = ll.Pipeline.from_arrays(np.arange(5))
    b = ll.Pipeline.from_iterable(lambda: iter([{"k": i, "v": [i, -i]} for i in range(3)]))
    assert plain(list(ll.Pipeline.zip(a, b))) == [[i, {"k": i, "v": [i, -i]}] for i in range(3)]
    assert plain(list(ll.Pipeline.zip(x=a, y=a.skip(2)))) == [{"x": i, "y": i + 2} for i in range(3)]
    assert plain(list(a.concatenate(a.map(lambda x: x + 10)))) == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14]
    assert a.reduce(0, lambda s, x: s + int(x)) == 10
    nested = b.batch(2)
    assert plain(list(nested)) == [{"k": [0, 1], "v": [[0, 1], [0, -1]]}, {"k": [2], "v": [[2], [-2]]}]
    assert plain(list(nested.unbatch())) == plain(list(b))


def test_padded_batch():
    rows = [np.arange(n) + 1 for n in (1, 3, 2, 4, 1)]
    pipe = ll.Pipeline.from_iterable(lambda: iter(rows))
    got = plain(list(pipe.padded_batch(2)))
    assert got == [[[1, 0, 0], [1, 2, 3]], [[1, 2, 0, 0], [1, 2, 3, 4]], [[1]]]
    got = plain(list(pipe.padded_batch(3, padded_shapes=(5,), padding_values=-1, drop_remainder=True)))
    assert got == [[[1, -1, -1, -1, -1], [1, 2, 3, -1, -1], [1, 2, -1, -1, -1]]]
    with pytest.raises(ValueError, match=r"step 1 \.padded_batch.*does not fit"):
        list(pipe.padded_batch(2, padded_shapes=(2,)))
    pairs = ll.Pipeline.from_iterable(lambda: iter([(r, len(r)) for r in rows])).padded_batch(
        5, padding_values=(9, 0))
    imgs, lens = next(iter(pairs))
    assert imgs.shape == (5, 4) and imgs[0].tolist() == [1, 9, 9, 9] and lens.tolist() == [1, 3, 2, 4, 1]


def test_prefetch_and_parallel_map_keep_order_and_output():
    def slow(x):
        return x * x

    ref = [x * x for x in range(40)]
    for threads in (1, 2):
        pipe = source("iterable", 40).map(slow, num_parallel_calls=threads).prefetch(3)
        assert plain(list(pipe)) == ref
    arrays = [plain(list(source("arrays", 40).map(slow).batch(4).with_options(num_threads=t))) for t in (1, 2)]
    assert arrays[0] == arrays[1] == m_batch(ref, 4)


# --------------------------------------------------------------------------- specs and errors


def test_element_spec():
    spec = ll.Pipeline.from_arrays(np.zeros((6, 2, 3), np.float32), np.zeros(6, np.int32)).batch(4).element_spec
    assert spec[0].shape == (None, 2, 3) and spec[0].dtype == np.float32
    assert spec[1].shape == (None,) and spec[1].dtype == np.int32
    spec = ll.Pipeline.from_arrays(np.zeros((6, 2))).batch(4, drop_remainder=True).unbatch().element_spec
    assert spec.shape == (2,)
    assert source("arrays").padded_batch(2, padded_shapes=()).element_spec.shape == (None,)


def test_spec_error_names_the_step():
    def my_fn(x):
        return x

    pipe = ll.Pipeline.from_arrays(np.zeros(4)).map(my_fn).unbatch()
    with pytest.raises(ValueError, match=r"step 2 \.unbatch\(\): cannot unbatch a scalar"):
        _ = pipe.element_spec
    other = ll.Pipeline.from_arrays(np.zeros((4, 2), np.int32))
    with pytest.raises(ValueError, match=r"step 1 \.concatenate\(.*dtypes differ"):
        _ = ll.Pipeline.from_arrays(np.zeros((4, 2))).concatenate(other).element_spec


def test_runtime_error_names_the_step():
    def my_fn(x):
        if x == 3:
            raise KeyError("three")
        return x

    for kind in KINDS:
        with pytest.raises(KeyError, match="three") as info:
            list(source(kind).map(my_fn).batch(2))
        assert any("step 1 .map(" in n and "test_runtime_error_names_the_step.<locals>.my_fn)" in n
                   for n in info.value.__notes__), info.value.__notes__


def test_bad_arguments():
    p = source("arrays")
    with pytest.raises(ValueError, match="buffer_size must be a positive integer, got 0"):
        p.shuffle(0)
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        p.batch(0)
    with pytest.raises(ValueError, match="count must be a non-negative integer, got -2"):
        p.take(-2)
    with pytest.raises(ValueError, match="max_side must be an integer >= 8, got 4"):
        p.cache(max_side=4)
    with pytest.raises(ValueError, match="num_parallel_calls must be a positive integer, got 0"):
        p.map(abs, num_parallel_calls=0)
    with pytest.raises(TypeError, match="map takes a callable"):
        p.map(3)
    with pytest.raises(ValueError, match="cycle_length must be a positive integer, got 0"):
        p.interleave(lambda x: p, 0)
    with pytest.raises(TypeError, match="flat_map.*must return a Pipeline"):
        list(p.flat_map(lambda x: 5))
    gen = ll.Pipeline.from_iterable(iter([1, 2])).map(lambda x: np.full(3, x))
    assert gen.element_spec.shape == (None,)          # traced on the peeked first element, kept
    assert [x.tolist() for x in gen] == [[1, 1, 1], [2, 2, 2]]
    with pytest.raises(ValueError, match="one-shot iterator"):
        _ = ll.Pipeline.from_iterable(iter([1])).filter(bool).map(abs).element_spec
    with pytest.raises(ValueError, match="one-shot iterator"):
        list(gen)


# --------------------------------------------------------------------------- resume


def _rebuild(kind):
    return {
        "shuffle": lambda s: source(s).shuffle(4).repeat(2),
        "interleave": lambda s: source(s, 7).interleave(
            lambda x: ll.Pipeline.from_arrays(np.arange(int(x) % 3 + 1) + 100 * int(x)), 3, 2),
        "batch": lambda s: source(s).map(lambda x: x + 1).batch(3),
        "filter_flat": lambda s: source(s).filter(lambda x: x % 3 != 0).flat_map(
            lambda x: ll.Pipeline.from_arrays(np.arange(2) + 10 * int(x))),
        "padded_unbatch": lambda s: source(s).padded_batch(4).unbatch().skip(1).take(7),
        "zip_concat": lambda s: ll.Pipeline.zip(source(s).shuffle(3), source(s)).concatenate(
            ll.Pipeline.zip(source(s), source(s))).with_options(seed=SEED),
        "prefetch": lambda s: source(s).shuffle(5).batch(2).prefetch(2),
    }[kind]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", ["shuffle", "interleave", "batch", "filter_flat", "padded_unbatch", "zip_concat",
                                "prefetch"])
def test_resume_exact(kind, op):
    make = _rebuild(op)
    first = make(kind)
    list(first)                       # iteration 0
    full = plain(list(first))         # iteration 1, uninterrupted
    for k in (0, 1, len(full) // 2, len(full)):
        p = make(kind)
        list(p)
        it = iter(p)
        head = [plain(next(it)) for _ in range(k)]
        state = json.loads(json.dumps(it.state_dict()))
        fresh = make(kind)
        fresh.load_state_dict(state)
        assert head + plain(list(fresh)) == full, (op, k)
        assert plain(list(fresh)) != [] or full == []   # the next iteration after the resumed one runs


def _plus_one(x):
    return x + 1


@pytest.mark.parametrize("own_seed", [True, False])
def test_resume_adopts_a_drawn_seed(own_seed):
    """No with_options(seed=...): the pipeline drew its seed, and a restarted script takes the saved run's."""
    def make():
        x = np.arange(60, dtype=np.int64)
        return ll.Pipeline.from_arrays(x).shuffle(30, seed=7 if own_seed else None).map(_plus_one).batch(8)

    run = make()
    it = iter(run)
    head = [plain(next(it)) for _ in range(3)]
    state = json.loads(json.dumps(it.state_dict()))
    full = head + plain(list(it))
    fresh = make()
    assert fresh.seed != run.seed
    fresh.load_state_dict(state)
    assert fresh.seed == run.seed
    assert head + plain(list(fresh)) == full
    assert fresh.state_dict()["seed"] == run.seed


def test_state_errors():
    p = source("arrays").batch(2)
    with pytest.raises(StateError, match="another pipeline"):
        p.load_state_dict({**source("arrays").batch(3).state_dict(), "seed": SEED})
    with pytest.raises(StateError, match=r"the state is for seed 8, this pipeline was given seed 7"):
        p.load_state_dict({**p.state_dict(), "seed": SEED + 1})
    drawn = ll.Pipeline.from_arrays(np.arange(10)).batch(2)
    with pytest.raises(StateError, match=r"the state's 'seed' must be a non-negative integer, got 'x'"):
        drawn.load_state_dict({**drawn.state_dict(), "seed": "x"})
    # A seed given after the draw is a given seed.
    given = drawn.with_options(seed=3)
    with pytest.raises(StateError, match="this pipeline was given seed 3"):
        given.load_state_dict({**given.state_dict(), "seed": 4})
    with pytest.raises(StateError, match="version"):
        p.load_state_dict({**p.state_dict(), "version": 99})


def test_with_options_makes_a_new_frozen_options_object():
    import dataclasses

    from loaderlib._pipeline.options import PipelineOptions

    p = source("arrays")
    q = p.with_options(seed=5, num_threads=ll.AUTOTUNE, ram_budget="2MB", io_depth=0)
    assert isinstance(q._options, PipelineOptions) and q._options is not p._options
    assert (q.seed, q._options.num_threads, q._options.ram_budget, q._options.io_depth) == (5, ll.AUTOTUNE, 2_000_000, 0)
    assert not q._options.seed_drawn and p.seed == SEED
    assert q.with_options(prefetch=3)._options.ram_budget == 2_000_000   # the other options are kept
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'seed'"):
        q._options.seed = 1
    with pytest.raises(ValueError, match="prefetch must be a positive integer, got 0"):
        p.with_options(prefetch=0)
    with pytest.raises(ValueError, match="seed must be a non-negative integer, got -1"):
        p.with_options(seed=-1)
    with pytest.raises(ValueError, match="num_workers must be a non-negative integer, got 1.5"):
        p.with_options(num_workers=1.5)
    with pytest.raises(ValueError, match="ram_budget must be a positive number of bytes"):
        p.with_options(ram_budget="lots")
    assert ll.Pipeline.from_arrays(np.arange(3))._options.seed_drawn


def test_namedtuple_elements_keep_their_type_through_map_and_batch():
    import collections

    Pair = collections.namedtuple("Pair", "x y")
    pipe = ll.Pipeline.from_iterable(lambda: (Pair(np.full(2, i), i) for i in range(4))).batch(2)
    batches = list(pipe)
    assert [type(b) for b in batches] == [Pair, Pair]
    np.testing.assert_array_equal(batches[1].x, [[2, 2], [3, 3]])
    np.testing.assert_array_equal(batches[0].y, [0, 1])
    assert type(pipe.element_spec) is Pair and pipe.element_spec.y == TensorSpec((None,), np.int64)
    rows = list(pipe.unbatch())
    assert [type(r) for r in rows] == [Pair] * 4 and [int(r.y) for r in rows] == [0, 1, 2, 3]
