"""One rank's state resumes every rank (NOTE [ One state for every rank ]): frameworks that save
the loader state of global rank 0 only (Lightning, Accelerate, Composer) load that one state on
every rank, on the same or another world size.

The reference is a plain-Python model of the documented order, written here from the
definitions and not from loaderlib's code: the global order of epoch ``e`` is a fresh one-shard
run's; shard ``r`` of ``k`` takes slots ``r, r + k, ...`` of it (padded by wrapping around to a
multiple of ``k``, or cut with ``drop_last``). Ranks that ran in step all consumed the same
number of samples of their shard, so what is left, in global order, is padded or cut again to a
multiple of the new world size and dealt out the same way, then cut into batches. On the saved
layout each rank continues its own shard: what an uninterrupted run of that rank delivers.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import loaderlib as ll

N = 30
BATCH = 4
ORDER_SEED = 5


def _global_order(epoch: int, n: int = N) -> list[int]:
    # The documented global order: a seeded permutation of range(n) keyed by (seed, epoch),
    # the one every layout shares (a one-shard sampler's).
    return ll.ShardedSampler(1, 0, n, shuffle=True, seed=ORDER_SEED).order(epoch).tolist()


def _slots(size: int, world: int, drop: bool) -> list[int]:
    per = size // world if drop else -(-size // world)
    return [i % size for i in range(per * world)]


def _shard(items: list[int], world: int, rank: int, drop: bool) -> list[int]:
    s = _slots(len(items), world, drop)
    return [items[s[rank + j * world]] for j in range(len(s) // world)]


def _batches(stream: list[int], last_batch: str = "keep") -> list[list[int]]:
    out = [stream[i:i + BATCH] for i in range(0, len(stream), BATCH)]
    return [b for b in out if len(b) == BATCH] if last_batch == "discard" else out


def _model(old: int, consumed: int, new: int, drop: bool, last_batch: str = "keep") -> list[list[list[int]]]:
    """What each new rank delivers in epoch 0 after every old rank consumed ``consumed``
    samples of its shard (ranks in step)."""
    order = _global_order(0)
    slots = _slots(N, old, drop)
    done = {slots[r + j * old] for r in range(old) for j in range(consumed)}
    owed = set(slots) if consumed else set(range(N))
    left = [order[p] for p in range(N) if p in owed and p not in done]
    return [_batches(_shard(left, new, r, drop), last_batch) for r in range(new)]


def _loader(world, rank, threads=1, drop=False, last_batch="keep", **kw):
    kw.setdefault("seed", 3)
    return ll.DataLoader(ll.ArrayDataset(np.arange(N, dtype=np.int64)), batch_size=BATCH, num_threads=threads,
                         last_batch=last_batch,
                         sampler=ll.ShardedSampler(world, rank, shuffle=True, seed=ORDER_SEED, drop_last=drop), **kw)


def _rank0_state(world, steps, **kw) -> dict:
    ld = _loader(world, 0, **kw)
    it = iter(ld)
    for _ in range(steps):
        next(it)
    st = json.loads(json.dumps(ld.state_dict()))
    ld.close()
    return st


def _rest(ld) -> list[list[int]]:
    out = [b.tolist() for b in ld]
    ld.close()
    return out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("old", "new", "steps", "drop", "last_batch"), [
    (2, 2, 2, False, "keep"),      # the same layout: each rank continues its own shard
    (4, 4, 1, True, "keep"),
    (2, 3, 2, False, "keep"),      # another world size
    (4, 2, 1, False, "discard"),
    (3, 2, 2, True, "keep"),
    (1, 4, 3, False, "keep"),
])
def test_rank_zeros_state_resumes_every_rank(old, new, steps, drop, last_batch, threads):
    st = _rank0_state(old, steps, threads=threads, drop=drop, last_batch=last_batch)
    want = _model(old, steps * BATCH, new, drop, last_batch)
    counts = []
    for r in range(new):
        ld = _loader(new, r, threads=threads, drop=drop, last_batch=last_batch)
        ld.load_state_dict(st)
        assert len(ld) == len(_loader(new, r, drop=drop, last_batch=last_batch))   # len() per rank, unchanged
        if (old, r) != (new, 0):
            assert "as ranks in step" in ld.explain()
        got = _rest(ld)
        assert got == want[r], f"rank {r}"
        counts.append(len(got))
    assert len(set(counts)) == 1


@pytest.mark.parametrize("threads", [1, 2])
def test_on_the_same_layout_each_rank_continues_as_an_uninterrupted_run(threads):
    """Rank r loaded with rank 0's state delivers what an uninterrupted rank r delivers from
    the same batch on, into the next epoch (the model: its own shard of each epoch's order)."""
    world, steps = 2, 2
    st = _rank0_state(world, steps, threads=threads)
    for r in range(world):
        want = _batches(_shard(_global_order(0), world, r, False))[steps:] + _batches(
            _shard(_global_order(1), world, r, False))
        ld = _loader(world, r, threads=threads)
        ld.load_state_dict(st)
        got = [b.tolist() for b in ld] + [b.tolist() for b in ld]
        ld.close()
        assert got == want, f"rank {r}"


def test_at_an_epoch_boundary_every_rank_starts_the_next_epoch():
    st = _rank0_state(2, len(_loader(2, 0)))   # the whole epoch
    assert (st["epoch"], st["delivered"]) == (1, 0)
    for new in (2, 3):
        for r in range(new):
            ld = _loader(new, r)
            ld.load_state_dict(st)
            assert ld.epoch == 1
            assert _rest(ld) == _batches(_shard(_global_order(1), new, r, False)), (new, r)


def test_states_that_cannot_locate_the_other_ranks_say_to_merge():
    skip = _rank0_state(2, 1, on_error="skip")
    with pytest.raises(ll.StateError, match=r"shard 0 of .*num_shards=2.*shard 1 of .*on_error='skip'.*"
                                            r"merge_state_dicts"):
        _loader(2, 1, on_error="skip").load_state_dict(skip)
    old = {k: v for k, v in _rank0_state(2, 1).items() if k != "lockstep"}   # an older loaderlib's state
    with pytest.raises(ll.StateError, match="does not record that ranks ran in step.*merge_state_dicts"):
        _loader(3, 1).load_state_dict(old)
    ld = _loader(3, 0, last_batch="rollover")
    list(ld)   # 10 samples per shard: 2 carried into epoch 1
    carried = ld.state_dict()
    ld.close()
    assert len(carried["carry"]) == 2
    with pytest.raises(ll.StateError, match=r"carries 2 samples of its own shard.*rollover.*merge_state_dicts"):
        _loader(3, 1, last_batch="rollover").load_state_dict(carried)
    # its own rank still resumes from it
    own = _loader(3, 0, last_batch="rollover")
    own.load_state_dict(carried)
    assert [v for b in _rest(own) for v in b][:2] == carried["carry"]


def test_a_state_of_another_run_names_what_differs():
    st = _rank0_state(2, 1)
    with pytest.raises(ll.StateError, match=r"global order \{'shuffle': True, 'seed': 5\}.*'seed': 6"):
        ll.DataLoader(ll.ArrayDataset(np.arange(N)), batch_size=BATCH, seed=3,
                      sampler=ll.ShardedSampler(2, 1, shuffle=True, seed=6)).load_state_dict(st)
    with pytest.raises(ll.StateError, match="batch size 4, this loader has 5"):
        ll.DataLoader(ll.ArrayDataset(np.arange(N)), batch_size=5, seed=3,
                      sampler=ll.ShardedSampler(2, 1, shuffle=True, seed=ORDER_SEED)).load_state_dict(st)
    with pytest.raises(ll.StateError, match="dataset length 30, this loader has 31"):
        ll.DataLoader(ll.ArrayDataset(np.arange(N + 1)), batch_size=BATCH, seed=3,
                      sampler=ll.ShardedSampler(2, 1, shuffle=True, seed=ORDER_SEED)).load_state_dict(st)
    with pytest.raises(ll.StateError, match="seed 3, this loader has 4"):
        _loader(2, 1, seed=4).load_state_dict(st)


def test_state_before_the_first_batch_and_the_empty_state():
    ld = _loader(2, 1)
    st = ld.state_dict()
    text = json.dumps(st)
    assert len(text) < 600, text   # small JSON, no list of positions
    assert (st["epoch"], st["delivered"], st["position"]) == (0, 0, 0)
    ld.load_state_dict({})   # nothing saved: nothing changes
    ld.load_state_dict(st)
    assert _rest(ld) == _batches(_shard(_global_order(0), 2, 1, False))
    other = _loader(2, 0)
    other.load_state_dict({})
    assert other.explain().find("resume:") == -1
    assert _rest(other) == _batches(_shard(_global_order(0), 2, 0, False))


def test_states_of_loaders_without_a_seed_merge():
    """Their seed is drawn per rank (it keys augmentation only); the order comes from the
    sampler's seed, so the merged state resumes the order exactly."""
    states = []
    for r in range(2):
        ld = _loader(2, r, seed=None)
        next(iter(ld))
        states.append(ld.state_dict())
        ld.close()
    assert states[0]["seed"] != states[1]["seed"]
    merged = ll.merge_state_dicts(states)
    want = _model(2, BATCH, 3, False)
    for r in range(3):
        ld = _loader(3, r, seed=None)
        ld.load_state_dict(merged)
        assert _rest(ld) == want[r]
    given = [dict(states[0], seed_given=True), states[1]]
    with pytest.raises(ll.StateError, match="different seeds.*same seed="):
        ll.merge_state_dicts(given)


class _Counter:
    """A stateful iterable (torchdata's Stateful protocol): the numbers 0 .. n-1."""

    def __init__(self, n: int) -> None:
        self.n, self.next = n, 0

    def __iter__(self):
        while self.next < self.n:
            self.next += 1
            yield np.int64(self.next - 1)

    def state_dict(self) -> dict:
        return {"next": self.next}

    def load_state_dict(self, state: dict) -> None:
        self.next = int(state["next"])


def test_an_iterables_rank_zero_state_resumes_every_rank():
    """Rank r of w keeps item r of each round of w; after the same rounds on every rank, what
    is left is dealt out again from the next round."""
    ld = ll.DataLoader(_Counter(N), batch_size=BATCH, rank=0, world_size=2, num_threads=1, seed=3)
    it = iter(ld)
    first = next(it).tolist() + next(it).tolist()
    st = ld.state_dict()
    ld.close()
    assert first == [0, 2, 4, 6, 8, 10, 12, 14]
    for world in (2, 3):
        for r in range(world):
            ld = ll.DataLoader(_Counter(N), batch_size=BATCH, rank=r, world_size=world, num_threads=1, seed=3)
            ld.load_state_dict(st)
            got = [v for b in ld for v in b.tolist()]
            rest = list(range(16, N))
            per = -(-len(rest) // world)
            padded = [rest[i % len(rest)] for i in range(per * world)]
            assert got == padded[r::world], (world, r)
