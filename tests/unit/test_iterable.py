"""Iterable datasets: lazy consumption, rank sharding, resume of stateful iterables."""

from __future__ import annotations

import functools
import itertools
import json
import operator

import numpy as np
import pytest

import loaderlib as ll


def _labels(loader):
    return [b.tolist() for b in loader]


class Counter:
    """A re-iterable, stateful stream of ``n`` integers (torchdata's Stateful protocol)."""

    def __init__(self, n):
        self.n = n
        self.start = 0

    def __iter__(self):
        i = self.start
        self.start = 0
        while i < self.n:
            self._pos = i + 1   # where a resumed stream continues once this item is taken
            yield np.int64(i)
            i += 1

    def state_dict(self):
        return {"pos": int(getattr(self, "_pos", 0))}

    def load_state_dict(self, state):
        self.start = int(state["pos"])


def test_infinite_generator_yields_first_batches():
    def forever():
        for i in itertools.count():
            yield np.int64(i)

    loader = ll.DataLoader(forever(), batch_size=4)
    it = iter(loader)
    assert [next(it).tolist() for _ in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    it.close()
    assert "iterable dataset" in loader.explain()


def test_torch_iterable_dataset_is_streamed():
    torch = pytest.importorskip("torch")

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(np.arange(10))

        def __len__(self):
            return 10

    loader = ll.DataLoader(Stream(), batch_size=4)
    assert _labels(loader) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert len(loader) == 3


@pytest.mark.parametrize("drop_last", [True, False])
def test_ranks_get_equal_counts_and_disjoint_union(drop_last):
    n, world = 10, 3
    got = []
    for rank in range(world):
        loader = ll.DataLoader(Counter(n), batch_size=2, rank=rank, world_size=world, drop_last=drop_last)
        items = functools.reduce(operator.iadd, _labels(loader), [])
        got.append(items)
    flat = functools.reduce(operator.iadd, got, [])
    if drop_last:
        # Only whole rounds of 3 items: 9 items, each once; then whole batches of 2 per rank.
        assert all(len(g) == 2 for g in got)
        assert len(set(flat)) == len(flat)
    else:
        # 10 items padded to 12 (wrapping to item 0, 1): every item at least once.
        assert [len(g) for g in got] == [4, 4, 4]
        assert set(flat) == set(range(n))
        assert sorted(flat) == sorted(list(range(n)) + [0, 1])


def test_rank_stride_model():
    # A plain-Python model of NOTE [ Iterable shards ]: rank r keeps item r of every round.
    from loaderlib._datasets.iterable import RankStride

    for n in range(12):
        for world in (1, 2, 3, 4):
            for pad in (False, True):
                shares = [list(RankStride(iter(range(n)), r, world, pad)) for r in range(world)]
                full = n // world
                rounds = [list(range(k * world, (k + 1) * world)) for k in range(full)]
                rest = list(range(full * world, n))
                if rest and pad:
                    rounds.append((rest + list(range(n)) * world)[:world])
                want = [[rd[r] for rd in rounds] for r in range(world)]
                assert shares == want, (n, world, pad)


def test_stateful_iterable_resumes_mid_stream():
    ref = _labels(ll.DataLoader(Counter(23), batch_size=4))
    first = ll.DataLoader(Counter(23), batch_size=4)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    assert state["position"] == 12 and state["source_state"] == {"pos": 12}
    second = ll.DataLoader(Counter(23), batch_size=4)
    second.load_state_dict(state)
    assert _labels(second) == ref[3:]


def test_plain_iterable_says_it_cannot_resume():
    loader = ll.DataLoader(iter(range(10)), batch_size=2)
    it = iter(loader)
    next(it)
    with pytest.raises(ll.StateError, match="can resume only if it has state_dict"):
        loader.state_dict()


def test_iterable_arguments_checked():
    with pytest.raises(ValueError, match="conflicts with shuffle"):
        ll.DataLoader(iter(range(3)), batch_size=2, shuffle=True)
    with pytest.raises(ValueError, match=r"rank must be a non-negative integer <= 1, got 3"):
        ll.DataLoader(iter(range(3)), batch_size=2, rank=3, world_size=2)
    # a map-style dataset: rank= and world_size= shard the loader's own order (test_framework_protocol.py)
    assert [b.tolist() for b in ll.DataLoader(list(range(3)), batch_size=2, rank=1, world_size=2)] == [[1, 0]]
    with pytest.raises(TypeError, match="without __len__"):
        len(ll.DataLoader(iter(range(3)), batch_size=2))


def test_rank_defaults_from_environment(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = ll.DataLoader(Counter(8), batch_size=2)
    assert (loader.rank, loader.world_size) == (1, 2)
    assert _labels(loader) == [[1, 3], [5, 7]]


class _Stream:
    """A re-iterable stream of n integers (picklable: it travels to worker processes)."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(np.arange(self.n, dtype=np.int64))


def test_two_workers_by_three_threads_deliver_each_item_once():
    loader = ll.DataLoader(_Stream(53), batch_size=4, num_workers=2, num_threads=3, timeout=60)
    assert loader.engine == "processes" and "worker k mod 2" in loader.explain()
    for _ in range(2):   # two epochs: each worker reopens its share
        items = functools.reduce(operator.iadd, _labels(loader), [])
        assert sorted(items) == list(range(53))
    loader.close()


def test_workers_and_ranks_together():
    got = []
    for rank in range(3):
        loader = ll.DataLoader(_Stream(40), batch_size=3, num_workers=2, rank=rank, world_size=3, drop_last=True,
                               timeout=60)
        got.append(functools.reduce(operator.iadd, _labels(loader), []))
        loader.close()
    flat = functools.reduce(operator.iadd, got, [])
    assert len(flat) == len(set(flat)) and set(flat) <= set(range(39))
    assert all(len(g) == len(got[0]) for g in got)   # 13 items per rank: whole batches


def test_workers_batch_order_is_round_robin():
    loader = ll.DataLoader(_Stream(20), batch_size=3, num_workers=2, timeout=60)
    batches = _labels(loader)
    # worker 0 holds items 0, 2, 4, ..., worker 1 items 1, 3, 5, ...; batches alternate.
    assert batches[:4] == [[0, 2, 4], [1, 3, 5], [6, 8, 10], [7, 9, 11]]
    with pytest.raises(ll.StateError, match="worker processes"):
        loader.state_dict()
    loader.close()
