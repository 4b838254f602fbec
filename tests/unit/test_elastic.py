"""Elastic resume (NOTE [ Elastic resume ]): the states of every rank of a ShardedSampler run,
merged with ``ll.merge_state_dicts``, resume on any world size, thread and worker count and
engine; one rank's state loaded into another layout is refused.

The reference for what the new ranks deliver is a plain-Python model of the documented rule
(``_model``): the global order is a fresh one-shard run's epoch; old shard ``r`` delivered
slots ``r, r + k, ...`` of it (padded by wrapping around, or cut with ``drop_last``); what is
left, in global order, is padded or cut again to a multiple of the new world size and dealt
out the same way, then cut into batches by ``last_batch``. The torchrun test that kills a job
with SIGKILL and restarts it on another number of ranks is in ``test_distributed.py``.
"""

from __future__ import annotations

import json
import os
import random
import re

import cv2
import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T

from .test_recordio import _write as write_mxnet_rec

N = 30          # a multiple of neither 4 nor the world sizes 4 and 7: padding and drop_last differ
BATCH = 4
SEED = 11       # the loader's seed (augmentation)
ORDER_SEED = 5  # the ShardedSampler's (the global order)

wds = pytest.importorskip("webdataset")


def _jpeg(i: int) -> bytes:
    rng = np.random.default_rng(i)
    img = rng.integers(0, 256, (10 + i % 4, 12 + i % 3, 3), dtype=np.uint8)
    return cv2.imencode(".jpg", img)[1].tobytes()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The kinds of dataset read by index, each of N samples whose label is its index (the
    Hugging Face one is made in ``_dataset``, only when a test needs it)."""
    root = tmp_path_factory.mktemp("elastic")
    folder = root / "folder"
    for i in range(N):
        (folder / f"c{i:02d}").mkdir(parents=True)
        (folder / f"c{i:02d}" / "img.jpg").write_bytes(_jpeg(i))
    ll.write_records(root / "rec", [_jpeg(i) for i in range(N)], list(range(N)), shard_size=2000)
    shards = []
    for s in range(3):
        path = root / f"wds-{s}.tar"
        with wds.TarWriter(str(path)) as sink:
            for i in range(s * 10, s * 10 + 10):
                sink.write({"__key__": f"k{i:03d}", "jpg": _jpeg(i), "cls": str(i).encode()})
        shards.append(str(path))
    mxrec = write_mxnet_rec(root, "mx", list(range(N)), [_jpeg(i) for i in range(N)])
    return {"folder": str(folder), "records": str(root / "rec-*.llrec"), "wds": shards, "mxrec": str(mxrec)}


def _dataset(kind: str, engine: str, data):
    """Dataset ``kind`` with a chain that ``engine`` runs (a Python step for threads/processes)."""
    if kind == "arrays":
        ds = ll.ArrayDataset(np.arange(N * 2, dtype=np.float32).reshape(N, 2), np.arange(N, dtype=np.int64))
    else:
        if kind == "folder":
            ds = ll.ImageFolderDataset(data["folder"])
        elif kind == "records":
            ds = ll.RecordFileDataset(data["records"])
        elif kind == "mxrec":
            ds = ll.ImageRecordDataset(data["mxrec"])
        elif kind == "hf":
            datasets = pytest.importorskip("datasets")
            from loaderlib.integrations.huggingface import HFImageDataset

            features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
            ds = HFImageDataset(datasets.Dataset.from_dict(
                {"image": [{"bytes": _jpeg(i), "path": None} for i in range(N)], "label": list(range(N))},
                features=features))
        else:
            ds = ll.WebDataset(data["wds"])
        ds = ds.transform_first(T.Compose([T.RandomResizedCrop(6), T.RandomHorizontalFlip(), T.ToCHW()]))
    if engine == "native":
        return ds
    # A lambda travels to worker processes by value: they need not import this module (and
    # webdataset and torch with it).
    return ds.transform(lambda x, y: (x + 1, y))


def _loader(kind, data, world, rank, engine="native", threads=1, workers=0, drop_last=False, last_batch="keep"):
    kw = {"num_workers": 2} if engine == "processes" else {"num_threads": threads, "num_workers": workers}
    ld = ll.DataLoader(_dataset(kind, engine, data), batch_size=BATCH, last_batch=last_batch, seed=SEED,
                       sampler=ll.ShardedSampler(world, rank, shuffle=True, seed=ORDER_SEED, drop_last=drop_last),
                       timeout=60, **kw)
    assert ld.engine == ("native" if engine == "native" else engine)
    return ld


def _copy(batch):
    return tuple(np.array(a) for a in batch)


def _global_order(epoch: int) -> list[int]:
    return ll.ShardedSampler(1, 0, N, shuffle=True, seed=ORDER_SEED).order(epoch).tolist()


def _slots(size: int, world: int, drop: bool) -> list[int]:
    per = size // world if drop else -(-size // world)
    return [i % size for i in range(per * world)]


def _batches(stream: list[int], last_batch: str) -> list[list[int]]:
    out = [stream[i:i + BATCH] for i in range(0, len(stream), BATCH)]
    return [b for b in out if len(b) == BATCH] if last_batch == "discard" else out


def _model(epoch, old_world, consumed, new_world, drop, last_batch):
    """What each new rank delivers after old rank r consumed ``consumed[r]`` samples of its shard."""
    order = _global_order(epoch)
    old = _slots(N, old_world, drop)
    done = {old[r + j * old_world] for r in range(old_world) for j in range(consumed[r])}
    owed = set(old) if any(consumed) else set(range(N))
    left = [p for p in range(N) if p in owed and p not in done]
    new = _slots(len(left), new_world, drop)
    return [_batches([order[left[new[r + j * new_world]]] for j in range(len(new) // new_world)], last_batch)
            for r in range(new_world)]


def _run_old(kind, data, world, stops, **kw):
    """Each rank of the old layout delivers ``stops[r]`` batches; their labels and states."""
    labels, states = [], []
    for r in range(world):
        ld = _loader(kind, data, world, r, **kw)
        it = iter(ld)
        for _ in range(stops[r]):
            labels += next(it)[1].tolist()
        states.append(json.loads(json.dumps(ld.state_dict())))
        ld.close()
    return labels, states


# Every value of every axis, and the pairs that matter: each world size to and from each
# other, every engine and dataset on both sides, 1 and 2 threads, 0 and 2 workers.
CASES = [
    # kind,    old, new, old engine/threads/workers, new engine/threads/workers, batches per old rank, drop_last,
    # last_batch
    ("arrays", 4, 2, ("native", 1, 0), ("native", 2, 0), (1, 1, 1, 1), False, "keep"),
    ("arrays", 2, 1, ("threads", 2, 0), ("processes", 1, 2), (2, 1), False, "keep"),
    ("arrays", 3, 4, ("native", 1, 2), ("threads", 1, 0), (1, 1, 1), True, "discard"),
    ("folder", 1, 4, ("native", 2, 0), ("threads", 2, 0), (3,), False, "keep"),
    ("folder", 4, 3, ("threads", 1, 0), ("native", 1, 2), (1, 1, 1, 1), False, "discard"),
    ("folder", 1, 2, ("processes", 1, 2), ("native", 2, 0), (2,), True, "keep"),
    ("records", 2, 1, ("native", 1, 0), ("native", 1, 2), (2, 2), True, "keep"),
    ("records", 3, 2, ("native", 2, 0), ("threads", 1, 0), (1, 2, 2), False, "keep"),
    ("records", 1, 3, ("threads", 2, 0), ("native", 2, 0), (4,), False, "discard"),
    ("wds", 4, 1, ("native", 1, 0), ("threads", 2, 0), (1, 1, 1, 1), False, "keep"),
    ("wds", 2, 3, ("native", 1, 2), ("native", 1, 0), (3, 3), True, "keep"),
    ("wds", 2, 4, ("threads", 1, 0), ("native", 2, 0), (2, 2), False, "discard"),
    ("mxrec", 2, 3, ("native", 2, 0), ("threads", 1, 0), (2, 1), False, "keep"),
    ("hf", 3, 2, ("native", 1, 0), ("native", 2, 0), (1, 1, 1), True, "keep"),
]


@pytest.mark.parametrize(("kind", "old", "new", "old_run", "new_run", "stops", "drop", "last_batch"), CASES,
                         ids=[f"{c[0]}-{c[1]}to{c[2]}-{c[3][0]}{c[3][1]}w{c[3][2]}-{c[4][0]}{c[4][1]}w{c[4][2]}"
                              for c in CASES])
def test_resume_on_another_world_size(kind, old, new, old_run, new_run, stops, drop, last_batch, data):
    opts = {"drop_last": drop, "last_batch": last_batch}
    first, states = _run_old(kind, data, old, stops, engine=old_run[0], threads=old_run[1], workers=old_run[2],
                             **opts)
    random.Random(0).shuffle(states)   # any order
    merged = json.loads(json.dumps(ll.merge_state_dicts(states)))
    consumed = [s * BATCH for s in stops]
    want = _model(0, old, consumed, new, drop, last_batch)
    second, counts = [], []
    for r in range(new):
        ld = _loader(kind, data, new, r, engine=new_run[0], threads=new_run[1], workers=new_run[2], **opts)
        ld.load_state_dict(merged)
        got = [b[1].tolist() for b in ld]
        assert got == want[r], f"new rank {r}"
        counts.append(len(got))
        second += sum(got, [])
        if r == new - 1:   # the next epoch is a fresh run's on the new layout, bitwise
            after = [_copy(b) for b in ld]
            fresh = _loader(kind, data, new, r, engine=new_run[0], threads=new_run[1], workers=new_run[2], **opts)
            fresh.set_epoch(1)
            ref = [_copy(b) for b in fresh]
            fresh.close()
            assert len(after) == len(ref)
            for a, b in zip(after, ref):
                for u, v in zip(a, b):
                    np.testing.assert_array_equal(u, v)
        ld.close()
    assert len(set(counts)) == 1                                  # every rank runs as many batches
    delivered = first + second
    edges = (old - 1) + (new - 1)            # wrapped around (or cut by drop_last) at most, per layout
    assert len(delivered) - len(set(delivered)) <= (0 if drop else edges)       # twice: only padding
    lost = N - len(set(delivered))
    assert lost <= (edges if drop else 0) + (new * (BATCH - 1) if last_batch == "discard" else 0)


@pytest.mark.parametrize(("kind", "old_run", "new_run", "last_batch"), [
    ("arrays", ("threads", 2, 0), ("processes", 1, 2), "rollover"),
    ("folder", ("native", 1, 2), ("native", 2, 0), "keep"),
    ("records", ("threads", 1, 0), ("threads", 2, 0), "discard"),
    ("wds", ("native", 2, 0), ("native", 1, 0), "rollover"),
])
def test_merged_state_on_the_same_layout_resumes_bitwise(kind, old_run, new_run, last_batch, data):
    """Each rank continues exactly as an uninterrupted run (of the old engine: output does not
    depend on the engine, threads or workers) would, into the next epoch."""
    old = {"engine": old_run[0], "threads": old_run[1], "workers": old_run[2], "last_batch": last_batch}
    new = {"engine": new_run[0], "threads": new_run[1], "workers": new_run[2], "last_batch": last_batch}
    world = 2
    refs = []
    for r in range(world):   # uninterrupted: the rest of epoch 0 from batch 2, and epoch 1
        ld = _loader(kind, data, world, r, **old)
        e0 = [_copy(b) for b in ld]
        refs.append(e0[2:] + [_copy(b) for b in ld])
        ld.close()
    _labels, states = _run_old(kind, data, world, (2, 2), **old)
    merged = ll.merge_state_dicts(states[::-1])
    for r in range(world):
        ld = _loader(kind, data, world, r, **new)
        ld.load_state_dict(merged)
        got = [_copy(b) for b in ld] + [_copy(b) for b in ld]
        ld.close()
        assert len(got) == len(refs[r])
        for a, b in zip(got, refs[r]):
            for u, v in zip(a, b):
                np.testing.assert_array_equal(u, v)


def test_rollover_carries_move_to_the_new_ranks(data):
    """At an epoch boundary under "rollover" each rank carries its short tail into the next
    epoch; on another layout those samples are dealt out first, none lost or repeated."""
    kw = {"last_batch": "rollover"}
    states = []
    for r in range(3):
        ld = _loader("arrays", data, 3, r, **kw)
        list(ld)
        states.append(ld.state_dict())
        ld.close()
    carried = sum((s["carry"] for s in states), [])
    assert len(carried) == 3 * (N // 3 % BATCH)
    merged = ll.merge_state_dicts(states)
    assert merged["pending"] == carried
    got, counts, tails = [], [], []
    for r in range(2):
        ld = _loader("arrays", data, 2, r, **kw)
        ld.load_state_dict(merged)
        b = [x[1].tolist() for x in ld]
        counts.append(len(b))
        got += sum(b, [])
        tails += ld.state_dict()["carry"]
        ld.close()
    assert counts[0] == counts[1]
    assert sorted(got + tails) == sorted(carried + list(range(N)))   # the carried samples, then epoch 1


def test_a_second_change_of_layout_in_the_same_epoch(data):
    """4 ranks -> 3 -> 2 within one epoch: the 3 ranks' states (resumed from a merged state)
    merge again."""
    first, states = _run_old("arrays", data, 4, (1, 1, 1, 1))
    merged = ll.merge_state_dicts(states)
    middle, states3 = [], []
    for r in range(3):
        ld = _loader("arrays", data, 3, r)
        ld.load_state_dict(merged)
        it = iter(ld)
        middle += next(it)[1].tolist()
        states3.append(json.loads(json.dumps(ld.state_dict())))
        ld.close()
    again = ll.merge_state_dicts(states3)
    last = []
    for r in range(2):
        ld = _loader("arrays", data, 2, r)
        ld.load_state_dict(again)
        last += [v for b in ld for v in b[1].tolist()]
        ld.close()
    delivered = first + middle + last
    assert set(delivered) == set(range(N))
    assert len(delivered) - N <= 3 + 2 + 1


def test_merged_state_is_compact():
    n, world = 1_280_000, 64
    states = []
    for r in range(world):
        ld = ll.DataLoader(ll.ArrayDataset(np.zeros(n, np.uint8)), batch_size=64,
                           sampler=ll.ShardedSampler(world, r, shuffle=True, seed=1), seed=0)
        st = ld.state_dict()
        st.update(delivered=100 + r % 2, position=(100 + r % 2) * 64)   # ranks one batch apart
        states.append(st)
    merged = ll.merge_state_dicts(states)
    size = len(json.dumps(merged))
    assert size < 40_000, size   # not a list of a million positions
    assert "bitmap" in merged["delivered"] or len(merged["delivered"]["ranges"]) < 20_000


def test_one_ranks_state_in_another_layout_is_refused(data):
    """Unless it was saved in lockstep (then it resumes every rank: test_lockstep.py); a state
    saved with on_error="skip" cannot locate the other ranks."""
    _labels, states = _run_old("arrays", data, 4, (2, 2, 2, 2))
    states = [dict(st, lockstep=False) for st in states]
    with pytest.raises(ll.StateError, match=r"shard 1 of ShardedSampler\(num_shards=4.*shard 1 of "
                                            r"ShardedSampler\(num_shards=2.*merge_state_dicts"):
        _loader("arrays", data, 2, 1).load_state_dict(states[1])
    with pytest.raises(ll.StateError, match=r"shard 2 of .*num_shards=4.*shard 1 of .*num_shards=4"):
        _loader("arrays", data, 4, 1).load_state_dict(states[2])
    with pytest.raises(ll.StateError, match=r"drop_last=False.*drop_last=True.*merge_state_dicts"):
        _loader("arrays", data, 4, 1, drop_last=True).load_state_dict(states[1])
    other = ll.DataLoader(_dataset("arrays", "native", data), batch_size=BATCH, seed=SEED,
                          sampler=ll.ShardedSampler(4, 1, shuffle=True, seed=6))
    with pytest.raises(ll.StateError, match="global order"):
        other.load_state_dict(states[1])
    # threads, workers and engine stay free to change
    ld = _loader("arrays", data, 4, 1, engine="processes")
    ld.load_state_dict(states[1])
    assert len(list(ld)) == 2
    ld.close()


def _states(data, world=2, **kw):
    return _run_old("arrays", data, world, (1,) * world, **kw)[1]


def test_merge_errors_name_the_problem(data):
    states = _states(data, 3)
    with pytest.raises(ll.StateError, match=r"ranks \[1\] are missing"):
        ll.merge_state_dicts([states[0], states[2]])
    with pytest.raises(ll.StateError, match="rank 2 appears twice"):
        ll.merge_state_dicts(states + [states[2]])
    later = dict(states[1], epoch=1)
    with pytest.raises(ll.StateError, match="different epochs: rank 0 is in epoch 0, rank 1 in epoch 1"):
        ll.merge_state_dicts([states[0], later, states[2]])
    with pytest.raises(ll.StateError, match="different seeds"):
        ll.merge_state_dicts([states[0], dict(states[1], seed=99), states[2]])
    with pytest.raises(ll.StateError, match="different runs: rank 0 has dataset length 30, rank 1 has 31"):
        ll.merge_state_dicts([states[0], dict(states[1], dataset_length=31), states[2]])
    with pytest.raises(ll.StateError, match="different runs: .* layout"):
        ll.merge_state_dicts([states[0], states[1]] + _states(data, 2)[1:])
    with pytest.raises(ll.StateError, match="no states"):
        ll.merge_state_dicts([])
    with pytest.raises(ll.StateError, match="already merged"):
        ll.merge_state_dicts([ll.merge_state_dicts(states)])
    plain = ll.DataLoader(_dataset("arrays", "native", data), batch_size=BATCH, shuffle=True, seed=SEED)
    with pytest.raises(ll.StateError, match="no shard layout"):
        ll.merge_state_dicts([plain.state_dict()])
    with pytest.raises(ll.StateError, match="resumes a loader sharded by ShardedSampler"):
        plain.load_state_dict(ll.merge_state_dicts(states))
    with pytest.raises(ll.StateError, match="outside its shard"):
        ll.merge_state_dicts([dict(states[0], position=999)] + states[1:])


def test_corrupt_position_sets_are_refused(data):
    merged = ll.merge_state_dicts(_states(data, 2))
    ld = _loader("arrays", data, 3, 0)
    with pytest.raises(ll.StateError, match="not sorted pairs"):
        ld.load_state_dict(dict(merged, remaining={"ranges": [5, 2]}))
    with pytest.raises(ll.StateError, match="bitmap is corrupt"):
        ld.load_state_dict(dict(merged, remaining={"bitmap": "not base64 zlib", "length": N}))
    with pytest.raises(ll.StateError, match="position set is"):
        ld.load_state_dict(dict(merged, remaining=[1, 2, 3]))
    with pytest.raises(ll.StateError, match="not integers"):
        ld.load_state_dict(dict(merged, remaining={"ranges": ["a", "b"]}))
    with pytest.raises(ll.StateError, match="has no 'remaining' entry"):
        ld.load_state_dict({k: v for k, v in merged.items() if k != "remaining"})
    with pytest.raises(ll.StateError, match="layout has 2 ranks, but it lists the positions of 1"):
        ld.load_state_dict(dict(merged, ranks=merged["ranks"][:1]))


def test_position_sets_round_trip():
    from loaderlib._layout import positions_from_json, positions_to_json

    rng = np.random.default_rng(0)
    for mask in (np.zeros(0, bool), np.ones(7, bool), rng.random(5000) < 0.5, np.arange(100_000) % 3 == 0):
        enc = json.loads(json.dumps(positions_to_json(mask)))
        np.testing.assert_array_equal(positions_from_json(enc, mask.size), mask)
    assert "bitmap" in positions_to_json(np.arange(100_000) % 3 == 0)
    assert positions_to_json(np.arange(10) >= 4) == {"ranges": [4, 10]}


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


def _iter_loader(world, rank):
    return ll.DataLoader(_Counter(N), batch_size=BATCH, rank=rank, world_size=world, num_threads=1, seed=SEED)


def test_iterable_splits_again_after_a_round_every_rank_finished():
    first, states = [], []
    for r in range(2):
        ld = _iter_loader(2, r)
        it = iter(ld)
        for _ in range(2):
            first += next(it).tolist()
        states.append(ld.state_dict())
        ld.close()
    with pytest.raises(ll.StateError, match="rank 0 of world_size 2.*rank 0 of world_size 3.*merge_state_dicts"):
        _iter_loader(3, 0).load_state_dict(dict(states[0], lockstep=False))
    merged = ll.merge_state_dicts(states)
    for r in range(2):   # on the same world size: each rank's own state
        own, again = _iter_loader(2, r), _iter_loader(2, r)
        own.load_state_dict(states[r])
        again.load_state_dict(merged)
        assert [x.tolist() for x in again] == [x.tolist() for x in own]
    second, counts = [], []
    for r in range(3):
        ld = _iter_loader(3, r)
        ld.load_state_dict(merged)
        b = [x.tolist() for x in ld]
        counts.append(len(b))
        second += sum(b, [])
    assert len(set(counts)) == 1
    assert set(first + second) == set(range(N)) and len(first + second) - N <= 2
    assert not set(first) & set(second)


def test_iterable_ranks_at_different_points_cannot_split_again():
    states = []
    for r, steps in ((0, 2), (1, 1)):
        ld = _iter_loader(2, r)
        it = iter(ld)
        for _ in range(steps):
            next(it)
        states.append(ld.state_dict())
        ld.close()
    with pytest.raises(ll.StateError, match=r"different points of its stream \(items taken per rank: \[8, 4\]\)"):
        ll.merge_state_dicts(states)


def _guide_snippets() -> list[str]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "guide", "training-at-scale.md"), encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def test_the_guides_in_process_snippet_runs():
    """docs/guide/training-at-scale.md: the snippets that need no torchrun (the torchrun recipe
    runs in test_distributed.py)."""
    snippets = [s for s in _guide_snippets() if "init_process_group" not in s]
    assert snippets
    for code in snippets:
        exec(compile(code, "training-at-scale.md", "exec"), {"__name__": "__doc_snippet__"})  # noqa: S102


def test_a_mixture_resumes_on_another_world_size():
    """A MixtureDataset's index i of epoch e is a pure function of (seed, e, i): sharded, it
    resumes on another world size like any dataset read by index."""
    a, b = ll.ArrayDataset(np.arange(20)), ll.ArrayDataset(np.arange(1000, 1007))
    mix = ll.MixtureDataset([a, b], weights=[0.6, 0.4], size=N, seed=3)
    sources, samples = mix.epoch_indices(0)
    value = np.where(sources == 0, samples, 1000 + samples)    # what mixture index i reads in epoch 0

    def make(world, rank):
        return ll.DataLoader(mix, batch_size=BATCH, seed=SEED, num_threads=1,
                             sampler=ll.ShardedSampler(world, rank, shuffle=True, seed=ORDER_SEED))

    states = []
    for r in range(3):
        ld = make(3, r)
        next(iter(ld))
        states.append(ld.state_dict())
        ld.close()
    merged = ll.merge_state_dicts(states)
    want = _model(0, 3, [BATCH] * 3, 2, False, "keep")
    for r in range(2):
        ld = make(2, r)
        ld.load_state_dict(merged)
        assert [x.tolist() for x in ld] == [value[w].tolist() for w in want[r]]
        ld.close()
