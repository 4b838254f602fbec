"""Pipeline.cache(): in memory and on disk, replayed exactly, invalidated when the plan or files change."""

from __future__ import annotations

import os
import threading

import cv2
import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T

SEED = 5


class Counter:
    """A map step that counts its calls (the upstream work a cache must save)."""

    def __init__(self):
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, img, label):
        with self._lock:
            self.calls += 1
        return img, label


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "imgs"
    rng = np.random.default_rng(2)
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
    for i in range(6):
        cv2.imwrite(str(root / f"c{i % 2}" / f"{i}.png"), rng.integers(0, 256, (40 + i, 64, 3), dtype=np.uint8))
    return str(root)


def _plain(els):
    return [(np.array(x), int(y)) for x, y in els]


def _same(a, b):
    assert len(a) == len(b)
    for (x, y), (u, v) in zip(a, b):
        assert np.array_equal(x, u) and y == v


def test_memory_cache_replays_without_upstream(folder):
    count = Counter()
    pipe = ll.Pipeline.from_folder(folder).map(count).cache().with_options(seed=SEED)
    assert pipe.cache_info()[0]["complete"] is False
    first = _plain(pipe)
    assert count.calls == 6
    info = pipe.cache_info()[0]
    assert info["kind"] == "memory" and info["complete"] and info["elements"] == 6
    assert info["bytes"] == sum(x.nbytes + 8 for x, _ in first)
    _same(_plain(pipe), first)
    assert count.calls == 6                       # the second pass read the cache
    assert "replays the cached elements" in pipe.explain()
    ref = [ll.ImageFolderDataset(folder)[i] for i in range(6)]
    _same(first, [(x, int(y)) for x, y in ref])


def test_partial_pass_leaves_no_cache(folder):
    count = Counter()
    pipe = ll.Pipeline.from_folder(folder).map(count).cache()
    it = iter(pipe)
    next(it)
    it.close()
    assert not pipe.cache_info()[0]["complete"]
    assert len(list(pipe.take(2))) == 2            # a take downstream: another pipeline, its own cache
    _same(_plain(pipe), [(x, int(y)) for x, y in (ll.ImageFolderDataset(folder)[i] for i in range(6))])
    assert pipe.cache_info()[0]["complete"]


def test_ram_budget_too_small_runs_uncached(folder):
    count = Counter()
    pipe = ll.Pipeline.from_folder(folder).map(count).cache().with_options(ram_budget=5000)
    a = _plain(pipe)
    b = _plain(pipe)
    _same(a, b)
    info = pipe.cache_info()[0]
    assert not info["complete"] and "ram_budget=5000" in info["note"]
    assert count.calls == 12


def test_disk_cache_reused_across_runs_and_invalidated(folder, tmp_path):
    path = str(tmp_path / "cache" / "decoded")
    count = Counter()

    def make(fn=count):
        return ll.Pipeline.from_folder(folder).map(fn).cache(path).with_options(seed=SEED)

    first = _plain(make())
    assert count.calls == 6
    assert os.listdir(tmp_path / "cache") == ["decoded.llcache"]   # renamed into place, no temp left
    run2 = make()                                                  # a new run: a new pipeline object
    els = list(run2)
    assert count.calls == 6
    _same(_plain(els), first)
    assert isinstance(els[0][0].base, (np.memmap, memoryview)) or not els[0][0].flags.owndata
    info = run2.cache_info()[0]
    assert info["kind"] == "disk" and info["complete"] and info["elements"] == 6

    # a source file changes: rebuilt
    img = cv2.imread(ll.ImageFolderDataset(folder).paths[0])
    cv2.imwrite(ll.ImageFolderDataset(folder).paths[0], 255 - img[:30])
    changed = _plain(make())
    assert count.calls == 12 and changed[0][0].shape[0] == 30
    # the upstream steps change: rebuilt
    other = Counter()

    def twice(img, label):
        other(img, label)
        return img // 2, label

    halves = _plain(make(twice))
    assert other.calls == 6
    _same(halves, [(x // 2, y) for x, y in changed])
    _same(_plain(make(twice)), halves)
    assert other.calls == 6


def test_disk_cache_of_deterministic_steps_needs_no_seed(folder, tmp_path):
    path = str(tmp_path / "plain")
    first = _plain(ll.Pipeline.from_folder(folder).map(T.Resize((8, 8))).cache(path))
    again = ll.Pipeline.from_folder(folder).map(T.Resize((8, 8))).cache(path)   # another drawn seed
    assert again.cache_info()[0]["complete"]
    _same(_plain(again), first)
    def random(**seed):
        return ll.Pipeline.from_folder(folder).map(T.RandomHorizontalFlip()).cache(path + "r").with_options(**seed)

    list(random(seed=1))
    assert random(seed=1).cache_info()[0]["complete"]
    assert not random(seed=2).cache_info()[0]["complete"]   # a random step: keyed by the seed too


def test_disk_cache_interrupted_write_leaves_nothing(folder, tmp_path):
    path = str(tmp_path / "c" / "x")
    it = iter(ll.Pipeline.from_folder(folder).cache(path))
    next(it)
    it.close()
    assert os.listdir(tmp_path / "c") == []


def test_max_side_reduces_images(folder, tmp_path):
    for where in (None, str(tmp_path / "small")):
        pipe = ll.Pipeline.from_folder(folder).cache(where, max_side=32)
        assert pipe.element_spec[0].shape == (None, None, 3)
        els = list(pipe)
        ref = ll.ImageFolderDataset(folder)
        for k, (img, _lab) in enumerate(els):
            h, w = ref[k][0].shape[:2]
            assert max(img.shape[:2]) == 32 and abs(img.shape[0] / img.shape[1] - h / w) < 0.05
        assert max(next(iter(pipe))[0].shape[:2]) == 32
        # the crops after the cache run as usual
        crops = list(pipe.map(T.Compose([T.RandomResizedCrop(16), T.ToCHW()])).batch(3))
        assert crops[0][0].shape == (3, 3, 16, 16)


def test_disk_cache_refuses_python_objects(tmp_path):
    pipe = ll.Pipeline.from_iterable(lambda: iter([("a", 1)])).cache(str(tmp_path / "s"))
    with pytest.raises(TypeError, match=r"step 1 \.cache.*numeric arrays"):
        list(pipe)
    assert list(ll.Pipeline.from_iterable(lambda: iter([("a", 1)])).cache()) == [("a", 1)]


@pytest.mark.parametrize("on_disk", [False, True])
def test_cached_images_run_fused_on_the_native_engine(folder, tmp_path, on_disk):
    chain = T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.Normalize((0.5,) * 3, (0.25,) * 3),
                       T.ToCHW()])
    where = str(tmp_path / "px") if on_disk else None
    pipe = ll.Pipeline.from_folder(folder).cache(where).map(chain).batch(4).with_options(seed=SEED, num_threads=2)
    ds = ll.ImageFolderDataset(folder)
    runs = []
    for iteration in range(3):
        if iteration:
            assert "decoded pixels in memory" in pipe.explain() and pipe.engine == "native"
        got = [(x.copy(), y.copy()) for x, y in pipe]
        runs.append(got)
        # the reference: the transforms applied step by step to the decoded image, keyed by
        # (seed, iteration, element index), whether the pass filled the cache or read it
        for k in range(len(ds)):
            img, lab = ds[k]
            ref = chain(img, seed=SEED, epoch=iteration, index=k)
            assert np.array_equal(got[k // 4][0][k % 4], ref) and got[k // 4][1][k % 4] == lab
    one = ll.Pipeline.from_folder(folder).cache(where).map(chain).batch(4).with_options(seed=SEED, num_threads=1)
    list(one)                                   # fills (or, on disk, finds) the cache
    again = [x.copy() for x, _ in one]          # iteration 1 from the cache, one thread
    assert len(again) == len(runs[1]) and all(np.array_equal(a, b[0]) for a, b in zip(again, runs[1]))


# --------------------------------------------------------------------------- the filling pass
# NOTE [ Filling through the engine ] in loaderlib/_pipeline/cache.py


@pytest.fixture
def photos(tmp_path):
    """Photo-like JPEGs (4:2:0, 4:4:4, progressive) of several sizes in 3 classes."""
    from benchmarks._synth import encode_jpeg, photo_like

    root = tmp_path / "photos"
    kinds = [("420", False), ("444", False), ("420", True)]
    for i in range(14):
        d = root / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        sampling, progressive = kinds[i % 3]
        img = photo_like(64 + 9 * i, 48 + 5 * i, seed=i)
        (d / f"{i:02d}.jpg").write_bytes(encode_jpeg(img, 90, sampling, progressive))
    return str(root)


def _chain():
    return T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.Normalize((0.5,) * 3, (0.25,) * 3),
                      T.ToCHW()])


def _batches(pipe):
    return [(x.copy(), y.copy()) for x, y in pipe]


def _same_batches(a, b):
    assert len(a) == len(b)
    for (x, y), (u, v) in zip(a, b):
        assert x.shape == u.shape and np.array_equal(x, u) and np.array_equal(y, v)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("on_disk", [False, True])
def test_filling_epoch_equals_the_uncached_pipeline(photos, tmp_path, threads, on_disk):
    where = str(tmp_path / "px") if on_disk else None
    cached = ll.Pipeline.from_folder(photos).cache(where).map(_chain()).batch(4).with_options(seed=SEED,
                                                                                          num_threads=threads)
    plain = ll.Pipeline.from_folder(photos).map(_chain()).batch(4).with_options(seed=SEED, num_threads=threads)
    assert not cached.cache_info()[0]["complete"]
    assert "decoded once at full resolution" in cached.explain()
    for _ in range(3):   # the filling pass, then two from the cache; each equals the uncached one
        _same_batches(_batches(cached), _batches(plain))
        assert cached.cache_info()[0]["complete"] and cached.cache_info()[0]["elements"] == 14
    ref = ll.ImageFolderDataset(photos)
    for k in range(14):  # the cache holds exactly dataset[i]
        img, lab = cached._caches[1].element(k)
        assert np.array_equal(img, ref[k][0]) and int(lab) == ref[k][1]
    cached.close()
    plain.close()


def test_filling_runs_batches_through_the_engine(photos, monkeypatch):
    """The filling pass decodes each batch in one call and never indexes the dataset per element."""
    from loaderlib._datasets import images
    from loaderlib._pipeline import cache as _cache

    calls = []
    decode = _cache.CachedImages._decode

    def counted(self, indices, num_threads):
        calls.append((len(indices), num_threads))
        return decode(self, indices, num_threads)

    def per_element(self, idx):
        raise AssertionError("the filling pass indexed the dataset one element at a time")

    monkeypatch.setattr(_cache.CachedImages, "_decode", counted)
    monkeypatch.setattr(images._ImageFiles, "__getitem__", per_element)
    pipe = ll.Pipeline.from_folder(photos).cache().map(_chain()).batch(4).with_options(seed=SEED, num_threads=2)
    assert [len(y) for _, y in pipe] == [4, 4, 4, 2]
    assert calls == [(4, 2), (4, 2), (4, 2), (2, 2)]
    assert pipe.engine == "native" and pipe.cache_info()[0]["complete"]
    list(pipe)
    assert len(calls) == 4                    # the next pass reads the cache
    pipe.close()


def test_filling_in_shuffled_order_equals_a_replay(photos, tmp_path):
    """A shuffle after the cache asks for the images in any order; the pass that fills the
    cache gives what a pass over the complete cache gives (another run reusing its files)."""
    path = str(tmp_path / "shuffled")

    def make():
        return (ll.Pipeline.from_folder(photos).cache(path).shuffle(14).map(_chain()).batch(3)
                .with_options(seed=SEED, num_threads=2))

    first = make()
    filled = _batches(first)
    assert first.cache_info()[0]["complete"]
    again = make()
    assert again.cache_info()[0]["complete"] and "decoded pixels in memory" in again.explain()
    _same_batches(_batches(again), filled)       # iteration 0 again, from the files
    order = sorted(int(v) for _, y in filled for v in y)
    assert order == sorted(ll.ImageFolderDataset(photos).labels.tolist())
    first.close()
    again.close()


def test_filling_pass_that_stops_early_leaves_nothing(photos, tmp_path):
    path = str(tmp_path / "c" / "x")
    for where in (None, path):
        pipe = ll.Pipeline.from_folder(photos).cache(where).map(_chain()).batch(4).with_options(seed=SEED)
        it = iter(pipe)
        next(it)
        info = pipe.cache_info()[0]       # what the pass holds so far (the engine may be ahead)
        assert not info["complete"] and info["note"].startswith("filling:") and 4 <= info["elements"] <= 14
        assert info["bytes"] >= sum(ll.ImageFolderDataset(photos)[k][0].nbytes for k in range(4))
        it.close()
        assert not pipe.cache_info()[0]["complete"] and pipe.cache_info()[0]["note"].startswith("empty")
        if where is not None:
            assert os.listdir(tmp_path / "c") == []
        # a take after the cache never asks for every image: the pass ends, nothing is kept
        assert len(list(pipe.take(1))) == 1
        short = ll.Pipeline.from_folder(photos).cache(where).take(5).map(_chain()).batch(4).with_options(seed=SEED)
        _same_batches(_batches(short), _batches(
            ll.Pipeline.from_folder(photos).take(5).map(_chain()).batch(4).with_options(seed=SEED)))
        assert not short.cache_info()[0]["complete"]
        # the next full pass (iteration 1) fills it
        plain = ll.Pipeline.from_folder(photos).map(_chain()).batch(4).with_options(seed=SEED)
        list(plain)
        _same_batches(_batches(pipe), _batches(plain))
        assert pipe.cache_info()[0]["complete"]
        pipe.close()


def test_filling_over_ram_budget_keeps_decoding_on_the_engine(photos):
    budget = 20_000     # a few of the images
    pipe = (ll.Pipeline.from_folder(photos).cache().map(_chain()).batch(4)
            .with_options(seed=SEED, num_threads=2, ram_budget=budget))
    plain = ll.Pipeline.from_folder(photos).map(_chain()).batch(4).with_options(seed=SEED, num_threads=2)
    for _ in range(2):
        _same_batches(_batches(pipe), _batches(plain))
        info = pipe.cache_info()[0]
        assert not info["complete"] and f"ram_budget={budget}" in info["note"] and info["bytes"] == 0
        assert pipe.engine == "native"


def test_filling_names_a_corrupt_image_and_leaves_no_files(photos, tmp_path):
    bad = os.path.join(photos, "c2", "05.jpg")
    with open(bad, "rb") as f:
        data = f.read()
    with open(bad, "wb") as f:
        f.write(data[:200])                                    # truncated inside the scan
    path = str(tmp_path / "d" / "x")
    pipe = ll.Pipeline.from_folder(photos).cache(path).map(_chain()).batch(4).with_options(seed=SEED)
    with pytest.raises(ll.DecodeError, match=r"05\.jpg"):
        list(pipe)
    assert os.listdir(tmp_path / "d") == [] and not pipe.cache_info()[0]["complete"]
    with pytest.raises(ll.DecodeError, match=r"05\.jpg"):   # the uncached pipeline refuses it too
        list(ll.Pipeline.from_folder(photos).map(_chain()).batch(4).with_options(seed=SEED))
    pipe.close()
