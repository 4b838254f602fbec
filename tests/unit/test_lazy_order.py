"""Orders too large to hold (NOTE [ Orders too large to hold ] in loaderlib/_layout.py): a
LazyPermutation is a permutation, a pure function of (seed, epoch), sliced as its
materialised array; with LAZY_MIN lowered, loaders over such orders deliver every sample
once, shard, and resume exactly."""

from __future__ import annotations

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import _layout
from loaderlib._layout import LazyPermutation, LazyRange, LazyShard, shard_of


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 17, 64, 65, 1000, 4097, 100_003])
def test_a_lazy_permutation_is_a_permutation(n):
    p = LazyPermutation(n, 11, 2)
    a = np.asarray(p)
    np.testing.assert_array_equal(np.sort(a), np.arange(n))
    np.testing.assert_array_equal(p[n // 3:n // 2], a[n // 3:n // 2])
    np.testing.assert_array_equal(LazyPermutation(n, 11, 2)[0:n], a)   # a pure function of (seed, epoch)
    assert p[n - 1] == a[-1] and p[-1] == a[-1]


def test_epochs_and_seeds_give_other_orders():
    a = np.asarray(LazyPermutation(10_000, 1, 0))
    assert not np.array_equal(a, np.asarray(LazyPermutation(10_000, 1, 1)))
    assert not np.array_equal(a, np.asarray(LazyPermutation(10_000, 2, 0)))
    # a shuffle, not a rotation: few items stay near where they were
    assert np.mean(np.abs(a - np.arange(10_000)) < 100) < 0.05


def test_a_huge_order_costs_nothing_to_make_and_slice():
    n = 10 ** 12 // 2048
    p = LazyPermutation(n, 5, 0)
    head = p[:1000]
    assert head.min() >= 0 and head.max() < n and np.unique(head).size == 1000


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("k", [1, 3, 4])
def test_lazy_shards_equal_shard_of(drop_last, k):
    base = LazyPermutation(103, 3, 1)
    for r in range(k):
        lazy = shard_of(base, k, r, drop_last)
        assert isinstance(lazy, LazyShard)
        np.testing.assert_array_equal(np.asarray(lazy), shard_of(np.asarray(base), k, r, drop_last))
    np.testing.assert_array_equal(np.asarray(LazyRange(5, 2)), [2, 3, 4, 5, 6])


@pytest.fixture
def lazy_from_64(monkeypatch):
    monkeypatch.setattr(_layout, "LAZY_MIN", 64)


@pytest.mark.parametrize("last_batch", ["keep", "discard", "rollover"])
def test_a_loader_over_a_lazy_order(lazy_from_64, last_batch):
    data = np.arange(1000, dtype=np.int64)
    loader = ll.DataLoader(ll.ArrayDataset(data), batch_size=64, shuffle=True, seed=4, last_batch=last_batch)
    got = np.concatenate([b for b in loader])
    expect = np.asarray(LazyPermutation(1000, 4, 0))
    n = {"keep": 1000, "discard": 960, "rollover": 960}[last_batch]
    assert got.size == n and np.unique(got).size == n
    np.testing.assert_array_equal(got, expect[:n])
    if last_batch == "rollover":   # the next epoch starts with the 40 carried over
        np.testing.assert_array_equal(next(iter(loader))[:40], expect[960:])


def test_resume_and_shards_over_a_lazy_order(lazy_from_64):
    ds = ll.ArrayDataset(np.arange(500, dtype=np.int64))
    full = np.concatenate(list(ll.DataLoader(ds, batch_size=16, shuffle=True, seed=9)))
    loader = ll.DataLoader(ds, batch_size=16, shuffle=True, seed=9)
    it = iter(loader)
    head = [next(it) for _ in range(5)]
    state = loader.state_dict()
    again = ll.DataLoader(ds, batch_size=16, shuffle=True, seed=9)
    again.load_state_dict(state)
    np.testing.assert_array_equal(np.concatenate(head + list(again)), full)
    seen = []
    for r in range(3):
        sampler = ll.ShardedSampler(3, r, shuffle=True, seed=2)
        seen.append(np.concatenate(list(ll.DataLoader(ds, batch_size=16, sampler=sampler))))
    assert len({s.size for s in seen}) == 1
    assert set(np.concatenate(seen).tolist()) == set(range(500))
