import numpy as np
import pytest

from loaderlib.sampler import (
    BatchSampler,
    RandomSampler,
    SequentialSampler,
    ShardedSampler,
    WeightedRandomSampler,
)


def test_sequential():
    s = SequentialSampler(5)
    assert list(s) == [0, 1, 2, 3, 4]
    assert len(s) == 5
    assert list(SequentialSampler(0)) == []


def test_random_covers_every_index_once_and_differs_by_epoch():
    s = RandomSampler(100, seed=3)
    e0, e1 = list(s), list(s)
    assert sorted(e0) == list(range(100)) and sorted(e1) == list(range(100))
    assert e0 != e1
    # A pure function of (seed, epoch): recomputable, independent of iteration history.
    assert RandomSampler(100, seed=3).order(1).tolist() == e1
    assert RandomSampler(100, seed=4).order(0).tolist() != e0


def test_random_set_epoch():
    s = RandomSampler(50, seed=1)
    s.set_epoch(7)
    assert list(s) == RandomSampler(50, seed=1).order(7).tolist()
    assert s.epoch == 8


def test_batch_keep_discard():
    assert list(BatchSampler(SequentialSampler(7), 3, "keep")) == [[0, 1, 2], [3, 4, 5], [6]]
    assert len(BatchSampler(SequentialSampler(7), 3, "keep")) == 3
    assert list(BatchSampler(SequentialSampler(7), 3, "discard")) == [[0, 1, 2], [3, 4, 5]]
    assert len(BatchSampler(SequentialSampler(7), 3, "discard")) == 2


def test_batch_rollover_order():
    # Gluon semantics: the short tail is carried to the front of the next epoch.
    b = BatchSampler(SequentialSampler(7), 3, "rollover")
    assert len(b) == 2
    assert list(b) == [[0, 1, 2], [3, 4, 5]]
    assert len(b) == 2  # (1 carried + 7) // 3
    assert list(b) == [[6, 0, 1], [2, 3, 4]]
    assert len(b) == 3  # (2 carried + 7) // 3
    assert list(b) == [[5, 6, 0], [1, 2, 3], [4, 5, 6]]
    assert list(b) == [[0, 1, 2], [3, 4, 5]]


def test_batch_state_roundtrip():
    b = BatchSampler(RandomSampler(10, seed=0), 4, "rollover")
    list(b)
    state = b.state_dict()
    b2 = BatchSampler(RandomSampler(10, seed=0), 4, "rollover")
    b2.load_state_dict(state)
    assert list(b) == list(b2)


def test_batch_invalid():
    with pytest.raises(ValueError, match="last_batch"):
        BatchSampler(SequentialSampler(3), 2, "drop")
    with pytest.raises(ValueError, match="batch_size"):
        BatchSampler(SequentialSampler(3), 0)


@pytest.mark.parametrize("n", [10, 11, 13, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sharded_equal_counts(n, drop_last):
    shards = [ShardedSampler(4, k, n, shuffle=True, seed=5, drop_last=drop_last) for k in range(4)]
    orders = [s.order(0) for s in shards]
    assert len({len(o) for o in orders}) == 1
    assert all(len(o) == len(s) for o, s in zip(orders, shards))
    allidx = np.concatenate(orders)
    if drop_last:
        assert len(set(allidx.tolist())) == len(allidx)   # disjoint
    else:
        assert set(allidx.tolist()) == set(range(n))        # every sample somewhere
    # equal batch counts on every shard
    counts = {len(BatchSampler(s, 2, "keep")) for s in shards}
    assert len(counts) == 1


def test_sharded_bind_and_validation():
    s = ShardedSampler(2, 1)
    with pytest.raises(TypeError, match="length"):
        len(s)
    assert s.bind(5).order(0).tolist() == [1, 3, 0]
    with pytest.raises(ValueError):
        ShardedSampler(2, 2)


def test_weighted():
    w = np.zeros(10)
    w[3] = 1.0
    s = WeightedRandomSampler(w, num_samples=20, seed=0)
    assert list(s) == [3] * 20
    w2 = np.zeros(10)
    w2[7] = 2.0
    s.set_weights(w2)
    assert set(s) == {7}
    with pytest.raises(ValueError):
        s.set_weights(np.zeros(10))


def test_shard_shuffle_sampler_matches_a_buffer_model():
    """Against a plain-Python model of tf.data's shuffle(buffer_size) over shuffled shards."""
    import numpy as np

    from loaderlib.sampler import ShardShuffleSampler, _rng

    sizes = [5, 0, 7, 3, 9]
    for buffer_size in (1, 4, 100):
        s = ShardShuffleSampler(sizes, buffer_size=buffer_size, seed=3)
        for epoch in (0, 1):
            rng = _rng(3, epoch)
            starts = np.concatenate([[0], np.cumsum(sizes)])
            perm = rng.permutation(len(sizes))
            stream = [i for k in perm for i in range(starts[k], starts[k + 1])]
            b = min(buffer_size, len(stream))
            if b <= 1:
                want = stream
            else:
                buf, want = list(stream[:b]), []
                picks = rng.integers(0, b, size=len(stream) - b)
                for j, k in enumerate(picks):
                    want.append(buf[k])
                    buf[k] = stream[b + j]
                want += [buf[k] for k in rng.permutation(b)]
            got = s.order(epoch).tolist()
            assert got == want and sorted(got) == list(range(24))
    assert len(ShardShuffleSampler(sizes)) == 24
    with pytest.raises(ValueError, match="buffer_size"):
        ShardShuffleSampler(sizes, buffer_size=0)
