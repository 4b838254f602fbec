"""What training frameworks expect of a loader (NOTE [ Lazy iter ]): ``iter()`` starts nothing
until the first ``next()``, ``set_epoch`` on ``loader.sampler`` after ``iter()`` still chooses
the epoch, ``len()`` is exact per rank and unchanged by a resume, and PyTorch's attribute names
are readable.

The reference for the batches is the documented order: a ``ShardedSampler``'s shard of epoch
``e`` is slots ``r, r + k, ...`` of the one-shard order of ``e`` (padded by wrapping around).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import loaderlib as ll

from .._threads import threads

N, BATCH, ORDER_SEED = 30, 4, 7


def _order(epoch: int) -> list[int]:
    return ll.ShardedSampler(1, 0, N, shuffle=True, seed=ORDER_SEED).order(epoch).tolist()


def _shard_batches(epoch: int, world: int, rank: int) -> list[list[int]]:
    order, per = _order(epoch), -(-N // world)
    shard = [order[(rank + j * world) % N] for j in range(per)]
    return [shard[i:i + BATCH] for i in range(0, per, BATCH)]


def _loader(world=2, rank=1, threads_=2, **kw):
    return ll.DataLoader(ll.ArrayDataset(np.arange(N, dtype=np.int64)), batch_size=BATCH, num_threads=threads_,
                         seed=0, sampler=ll.ShardedSampler(world, rank, shuffle=True, seed=ORDER_SEED), **kw)


class _Counting(ll.ArrayDataset):
    """Counts the samples read through ``__getitem__`` (a Python dataset: the threads engine)."""

    reads: list = []

    def __getitem__(self, i):
        type(self).reads.append(int(i))
        return super().__getitem__(i)


@pytest.mark.parametrize("threads_", [1, 2])
def test_iter_starts_nothing_before_the_first_next(threads_):
    ds = _Counting(np.arange(N, dtype=np.int64)).transform(lambda x: x)
    ld = ll.DataLoader(ds, batch_size=BATCH, num_threads=threads_, seed=0,
                       sampler=ll.ShardedSampler(2, 1, shuffle=True, seed=ORDER_SEED))
    assert ld.engine == "threads"
    before = set(threads())
    _Counting.reads = []
    it = iter(ld)
    iter(ld)                                  # Lightning's check that the loader is iterable
    assert set(threads()) <= before           # no thread started
    assert _Counting.reads == []              # nothing read
    assert ld.epoch == 0 and ld.sampler.epoch == 0   # no epoch drawn
    assert len(it) == len(ld) == 4
    ld.sampler.set_epoch(2)                   # Lightning: set_epoch after the epoch's iter()
    got = [b.tolist() for b in it]
    assert got == _shard_batches(2, 2, 1)
    # the epoch's 15 samples, and at most the first batches of epoch 3, which the loader may have
    # started while the last ones were consumed (NOTE [ Warm epochs ])
    read, epoch = Counter(_Counting.reads), Counter(v for b in _shard_batches(2, 2, 1) for v in b)
    assert read & epoch == epoch
    assert not (read - epoch) - Counter(v for b in _shard_batches(3, 2, 1)[:2] for v in b), read - epoch
    ld.close()


def test_an_iterator_closed_before_its_first_batch_ends():
    ld = _loader()
    it = iter(ld)
    it.close()
    assert list(it) == []
    assert [b.tolist() for b in ld] == _shard_batches(0, 2, 1)   # the loader's epoch 0 is untouched
    ld.close()


def test_a_state_loaded_after_iter_applies_at_the_first_next():
    src = _loader()
    first = iter(src)
    next(first)
    state = src.state_dict()
    src.close()
    ld = _loader()
    it = iter(ld)
    ld.load_state_dict(state)
    assert [b.tolist() for b in it] == _shard_batches(0, 2, 1)[1:]
    ld.close()


def test_len_is_exact_per_rank_and_unchanged_by_a_resume():
    for world, rank in ((1, 0), (2, 1), (4, 3)):
        ld = _loader(world, rank)
        want = _shard_batches(0, world, rank)
        assert len(ld) == len(want)
        it = iter(ld)
        next(it)
        ld2 = _loader(world, rank)
        ld2.load_state_dict(ld.state_dict())
        assert len(ld2) == len(want)
        it2 = iter(ld2)
        assert len(it2) == len(want) - 1
        assert len(list(it2)) == len(want) - 1
        ld.close()
        ld2.close()


def test_pytorch_attribute_names_are_readable():
    collate = ll.batchify.Stack()
    ld = ll.DataLoader(ll.ArrayDataset(np.arange(N)), batch_size=BATCH, drop_last=True, collate_fn=collate,
                       num_workers=0, seed=0)
    assert (ld.batch_size, ld.drop_last, ld.num_workers, ld.collate_fn) == (BATCH, True, 0, collate)
    assert ld.sampler is not None and ld.batch_sampler is not None
    assert ld.batch_sampler.sampler is ld.sampler
    assert not _loader().drop_last


class _Count:
    """An iterable of the numbers 0 .. n-1."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(np.arange(self.n, dtype=np.int64))

    def __len__(self) -> int:
        return self.n


def test_an_iterables_rank_comes_from_the_job_at_the_first_iter(monkeypatch):
    """NOTE [ Rank at the first iter() ]: built before the process group (here: before torchrun's
    RANK and WORLD_SIZE are known), the loader shards as the job does once it runs; its rank is
    fixed from then on."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ld = ll.DataLoader(_Count(12), batch_size=2, num_threads=1, seed=0)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    it = iter(ld)
    assert len(ld) == 2
    assert [b.tolist() for b in it] == [[1, 4], [7, 10]]   # item 1 of each round of 3
    monkeypatch.setenv("RANK", "0")
    assert (ld.rank, ld.world_size) == (1, 3)
    assert [b.tolist() for b in ld] == [[1, 4], [7, 10]]
    given = ll.DataLoader(_Count(12), batch_size=2, num_threads=1, seed=0, rank=0, world_size=1)
    assert len(list(given)) == 6                           # given: kept


def test_a_map_style_loaders_own_order_is_sharded_by_the_job(monkeypatch):
    """NOTE [ Map-style loaders shard under torch.distributed ]: a loader without sampler= built
    before the job's rank is known shards as a ShardedSampler(world, rank, shuffle=True, seed=)
    does once it runs (the documented order, _shard_batches), len() included; the ranks'
    shards cover the dataset; rank= and world_size= given shard by them; a sampler of one's own
    is left alone."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ds = ll.ArrayDataset(np.arange(N, dtype=np.int64))
    loaders = [ll.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=ORDER_SEED, num_threads=1) for _ in range(3)]
    seen = []
    for rank, ld in enumerate(loaders):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        assert len(ld) == len(_shard_batches(0, 3, rank)) == 3
        got = [b.tolist() for b in ld]
        assert got == _shard_batches(0, 3, rank)
        seen += [v for b in got for v in b]
        monkeypatch.setenv("WORLD_SIZE", "1")    # fixed once its first epoch ran
        ld.set_epoch(1)
        assert [b.tolist() for b in ld] == _shard_batches(1, 3, rank)
    assert sorted(seen) == list(range(N))
    given = ll.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=ORDER_SEED, num_threads=1, rank=1, world_size=2)
    assert [b.tolist() for b in given] == _shard_batches(0, 2, 1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    own = ll.DataLoader(ds, batch_size=BATCH, num_threads=1, sampler=ll.SequentialSampler(N))
    assert [v for b in own for v in b.tolist()] == list(range(N))
    unseeded = [ll.DataLoader(ds, batch_size=BATCH, shuffle=True, num_threads=1) for _ in range(2)]
    for rank, ld in enumerate(unseeded):       # without seed= the ranks still agree (seed 0)
        monkeypatch.setenv("RANK", str(rank))
        assert [v for b in ld for v in b.tolist()] == [v for b in _seed0_shard(2, rank) for v in b]
    with pytest.raises(ValueError, match=r"rank and world_size shard the loader's own order; they conflict "
                                         r"with sampler"):
        ll.DataLoader(ds, batch_size=BATCH, sampler=ll.SequentialSampler(N), rank=0, world_size=2)
    with pytest.raises(ValueError, match=r"give both rank and world_size, or neither"):
        ll.DataLoader(ds, batch_size=BATCH, rank=0)


def _seed0_shard(world: int, rank: int) -> list[list[int]]:
    order = ll.ShardedSampler(1, 0, N, shuffle=True, seed=0).order(0).tolist()
    per = -(-N // world)
    return [[order[(rank + j * world) % N] for j in range(per)]]


def test_the_scale_out_guides_snippets_run(monkeypatch):
    """docs/guide/scale-out.md: its two loader examples, the second one's assertion included (the
    third starts a Ray runtime: not run here)."""
    import os
    import re

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "guide", "scale-out.md"), encoding="utf-8") as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    for k, code in enumerate(blocks[:2]):
        exec(compile(code, f"scale-out.md[{k}]", "exec"), {"__name__": "__doc_snippet__"})  # noqa: S102


def test_a_map_style_loader_takes_its_rank_from_an_initialised_process_group(monkeypatch):
    """NOTE [ Map-style loaders shard under torch.distributed ]: with torch.distributed
    initialised (a stand-in with its four calls, rank 2 of 4) the process group wins over the
    environment, read at the first iter()."""
    import sys
    import types

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    ld = ll.DataLoader(ll.ArrayDataset(np.arange(N, dtype=np.int64)), batch_size=BATCH, shuffle=True,
                       seed=ORDER_SEED, num_threads=1)
    dist = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, get_rank=lambda: 2,
                                 get_world_size=lambda: 4)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)   # the group exists once the loader is built
    assert [b.tolist() for b in ld] == _shard_batches(0, 4, 2)
    assert (ld.rank, ld.world_size) == (2, 4)
