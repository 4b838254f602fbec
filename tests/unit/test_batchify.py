import numpy as np
import pytest

from loaderlib.batchify import Pad, Shards, Stack, Tuple, default_batchify_fn


def test_stack_equals_np_stack():
    xs = [np.random.default_rng(i).random((3, 4)).astype(np.float32) for i in range(5)]
    out = Stack()(xs)
    np.testing.assert_array_equal(out, np.stack(xs))
    assert out.dtype == np.float32


def test_stack_ints_and_dtype():
    assert Stack()([1, 2, 3]).dtype == np.int64
    assert Stack(dtype=np.float32)([1, 2]).dtype == np.float32


def test_mismatched_and_empty_batches_name_the_sample():
    with pytest.raises(ValueError, match=r"Stack: sample 2 has shape \(4,\) but sample 0 has shape \(3,\); use Pad"):
        Stack()([np.zeros(3), np.zeros(3), np.zeros(4)])
    with pytest.raises(ValueError, match="Pad: sample 1 has ndim 2 but sample 0 has ndim 1"):
        Pad()([np.zeros(3), np.zeros((2, 2))])
    with pytest.raises(ValueError, match="cannot stack an empty batch"):
        Stack()([])
    with pytest.raises(ValueError, match="cannot pad an empty batch"):
        Pad()([])
    with pytest.raises(ValueError, match="default_batchify_fn: sample 1 is not a 2-tuple like sample 0"):
        default_batchify_fn([(1, 2), (3,)])


def test_stack_shards_are_views_without_copy():
    xs = [np.full((2,), i, np.int32) for i in range(5)]
    shards = Stack(num_shards=2)(xs)
    assert isinstance(shards, Shards) and len(shards) == 2
    assert [len(s) for s in shards] == [2, 3]
    np.testing.assert_array_equal(np.concatenate(shards), np.stack(xs))
    for s in shards:
        assert np.shares_memory(s, shards.batch)
        assert s.flags.c_contiguous


def test_pad():
    xs = [np.arange(n) for n in (2, 4, 1)]
    out = Pad(val=-1)(xs)
    np.testing.assert_array_equal(out, [[0, 1, -1, -1], [0, 1, 2, 3], [0, -1, -1, -1]])
    out, lengths = Pad(val=0, ret_length=True)(xs)
    assert lengths.tolist() == [2, 4, 1]


def test_pad_2d_axis():
    xs = [np.ones((2, 3)), np.ones((4, 3))]
    out = Pad(axis=0, val=7)(xs)
    assert out.shape == (2, 4, 3)
    assert (out[0, 2:] == 7).all() and (out[1] == 1).all()
    with pytest.raises(ValueError, match="axis 1"):
        Pad(axis=0)([np.ones((2, 3)), np.ones((2, 4))])


def test_tuple_and_default():
    samples = [(np.full((2, 2), i, np.uint8), i) for i in range(3)]
    a, b = Tuple(Stack(), Stack())(samples)
    np.testing.assert_array_equal(a, np.stack([s[0] for s in samples]))
    assert b.tolist() == [0, 1, 2] and b.dtype == np.int64
    a2, b2 = default_batchify_fn(samples)
    np.testing.assert_array_equal(a2, a)
    np.testing.assert_array_equal(b2, b)
    with pytest.raises(ValueError, match="2-tuple"):
        Tuple(Stack(), Stack())([(1,), (2,)])


def test_collate_into_writes_caller_memory():
    xs = [np.full((3,), i, np.float64) for i in range(4)]
    s = Stack()
    shape, dtype = s.plan(xs)
    out = np.empty(shape, dtype)
    res = s.collate_into(xs, out)
    assert res is out
    np.testing.assert_array_equal(out, np.stack(xs))
