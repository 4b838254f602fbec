"""MixtureDataset and the Pipeline's mixing sources against plain-Python models of their
documented semantics (NOTE [ Mixture epochs ] in loaderlib/_datasets/mixture.py, NOTE [ Mixing
pipelines ] in loaderlib/_pipeline/mix.py)."""

import os
import sys

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "kernels"))
from _loader_images import make_image_folder

# -- the model of NOTE [ Mixture epochs ] -----------------------------------------------

def model_counts(lengths, weights, size):
    """Largest remainder, written out: floors, then one each to the largest fractions."""
    w = list(lengths) if weights is None else list(weights)
    total = sum(w)
    exact = [x / total * size for x in w]
    counts = [int(e // 1) for e in exact]
    order = sorted((i for i in range(len(w)) if w[i] > 0), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[:size - sum(counts)]:
        counts[i] += 1
    return counts


def model_walk(n, r, seed, k, upto):
    """Source k's walk, pass after pass from pass 0, as lists and sets."""
    walk, prev, p = [], None, 0
    while len(walk) < upto:
        raw = [int(x) for x in np.random.default_rng([seed, 1, k, p]).permutation(n)]
        t = (p * n) % r if r else 0
        if p == 0 or t == 0:
            order = raw
        else:
            tail = set(prev[n - t:])
            head, passed, i = [], [], 0
            while len(head) < r - t:
                (passed if raw[i] in tail else head).append(raw[i])
                i += 1
            order = head + passed + raw[i:]
        walk += order
        prev, p = order, p + 1
    return walk


def model_epoch(lengths, weights, size, seed, epoch):
    counts = model_counts(lengths, weights, size)
    items = []
    for k, (n, c) in enumerate(zip(lengths, counts)):
        q, r = divmod(c, n)
        items += [(k, j) for _ in range(q) for j in range(n)]
        walk = model_walk(n, r, seed, k, (epoch + 1) * r)
        items += [(k, j) for j in walk[epoch * r:(epoch + 1) * r]]
    perm = np.random.default_rng([seed, 2, epoch]).permutation(size)
    return [items[int(p)] for p in perm]


def _sources(lengths):
    return [ll.ArrayDataset(np.arange(n, dtype=np.int64) + 1000 * k) for k, n in enumerate(lengths)]


@pytest.mark.parametrize("lengths,weights,size", [
    ([10, 3, 7], [0.5, 0.2, 0.3], 20),
    ([10, 3, 7], [0.5, 0.2, 0.3], 41),
    ([10, 3, 7], None, None),
    ([6, 9], [1, 2], 7),
    ([5, 5, 5], [1, 1, 1], 10),      # thirds: the largest remainder gives one source an extra sample
    ([10, 4], [0.0, 1.0], 9),        # a source of weight 0 gets none
])
def test_epochs_match_the_model(lengths, weights, size):
    mix = ll.MixtureDataset(_sources(lengths), weights, size=size, seed=3)
    size = sum(lengths) if size is None else size
    assert len(mix) == size
    counts = model_counts(lengths, weights, size)
    assert mix.counts.tolist() == counts and sum(counts) == size
    for e in range(7):
        want = model_epoch(lengths, weights, size, 3, e)
        ks, js = mix.epoch_indices(e)
        assert list(zip(ks.tolist(), js.tolist())) == want
        assert np.bincount(ks, minlength=len(lengths)).tolist() == counts
        mix.set_epoch(e)
        assert [int(mix[i]) for i in range(size)] == [1000 * k + j for k, j in want]


def test_counts_are_round_when_rounding_sums_to_size():
    w = np.array([0.125, 0.375, 0.5])
    mix = ll.MixtureDataset(_sources([4, 4, 4]), w, size=24)
    assert mix.counts.tolist() == [round(x * 24) for x in w] == [3, 9, 12]


@pytest.mark.parametrize("n,c", [(10, 3), (10, 7), (11, 4), (7, 6)])
def test_walk_without_replacement_across_epochs(n, c):
    """A source larger than its share: no sample twice in an epoch, and every n consecutive
    walked samples (one pass) visit the whole source once."""
    mix = ll.MixtureDataset([ll.ArrayDataset(np.arange(n)), ll.ArrayDataset(np.arange(50))], [c, 50], size=c + 50,
                            seed=11)
    assert mix.counts.tolist() == [c, 50]
    walked = []
    for e in range(3 * n):
        ks, js = mix.epoch_indices(e)
        mine = js[ks == 0].tolist()
        assert len(mine) == c and len(set(mine)) == c, f"epoch {e} took a sample twice"
        walked += sorted(mine)
    seen = np.bincount(walked, minlength=n)
    assert seen.tolist() == [3 * c] * n   # 3n epochs of c samples: each sample 3c times


def test_small_source_repeats():
    mix = ll.MixtureDataset([ll.ArrayDataset(np.arange(3)), ll.ArrayDataset(np.arange(20))], [8, 12], size=20,
                            seed=2)
    assert mix.counts.tolist() == [8, 12]
    for e in range(5):
        ks, js = mix.epoch_indices(e)
        per = np.bincount(js[ks == 0], minlength=3)
        assert sorted(per.tolist()) == [2, 3, 3]       # 8 = 2 full copies + 2 walked
        assert len(set(js[ks == 1].tolist())) == 12


def test_deterministic_in_seed_and_epoch():
    a = ll.MixtureDataset(_sources([10, 7]), [1, 1], size=30, seed=5)
    b = ll.MixtureDataset(_sources([10, 7]), [1, 1], size=30, seed=5)
    c = ll.MixtureDataset(_sources([10, 7]), [1, 1], size=30, seed=6)
    for e in range(3):
        assert all(np.array_equal(x, y) for x, y in zip(a.epoch_indices(e), b.epoch_indices(e)))
    assert not np.array_equal(a.epoch_indices(0)[1], a.epoch_indices(1)[1])
    assert not np.array_equal(a.epoch_indices(0)[1], c.epoch_indices(0)[1])
    # Asked out of order (a resume at epoch 9 in a fresh process) gives the same epochs.
    d = ll.MixtureDataset(_sources([10, 7]), [1, 1], size=30, seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(d.epoch_indices(9), a.epoch_indices(9)))


def _epochs(loader, n):
    out = []
    for _ in range(n):
        out.append([np.array(b).copy() for b in loader])
    return out


@pytest.mark.parametrize("python", [False, True])
def test_loader_reads_the_epochs_for_any_thread_count(python):
    lengths = [13, 5]
    srcs = _sources(lengths) if not python else [ll.SimpleDataset(list(range(1000 * k, 1000 * k + n)))
                                                 for k, n in enumerate(lengths)]
    mix = ll.MixtureDataset(srcs, [0.7, 0.3], size=16, seed=4)
    runs = []
    for threads in (1, 2):
        loader = ll.DataLoader(mix, batch_size=5, num_threads=threads, seed=0)
        assert loader.engine == ("threads" if python else "native")
        runs.append(_epochs(loader, 3))
        loader.close()
    assert all(np.array_equal(x, y) for ex, ey in zip(*runs) for x, y in zip(ex, ey))
    for e, batches in enumerate(runs[0]):
        want = [1000 * k + j for k, j in model_epoch(lengths, [0.7, 0.3], 16, 4, e)]
        assert np.concatenate(batches).tolist() == want


@pytest.mark.parametrize("seed", [7, None])
def test_resume_mid_epoch_is_exact(seed):
    mix = ll.MixtureDataset(_sources([11, 6, 4]), [0.5, 0.3, 0.2], size=24, seed=seed)
    full = ll.DataLoader(mix, batch_size=4, shuffle=True, seed=9, num_threads=2)
    whole = _epochs(full, 2)[1]
    part = ll.DataLoader(mix, batch_size=4, shuffle=True, seed=9, num_threads=2)
    _epochs(part, 1)
    it = iter(part)
    first = [np.array(next(it)).copy() for _ in range(2)]
    state = part.state_dict()
    it.close()
    again = ll.DataLoader(mix, batch_size=4, shuffle=True, seed=9, num_threads=1)
    again.load_state_dict(state)
    rest = [np.array(b).copy() for b in again]
    assert all(np.array_equal(x, y) for x, y in zip(first + rest, whole))
    assert len(first + rest) == len(whole)


def test_processes_engine_reads_the_epoch():
    mix = ll.MixtureDataset([ll.SimpleDataset(list(range(9))), ll.SimpleDataset(list(range(100, 104)))],
                            [2, 1], size=12, seed=1)
    with ll.DataLoader(mix, batch_size=4, num_workers=2, seed=0) as loader:
        assert loader.engine == "processes"
        got = [np.concatenate(e).tolist() for e in _epochs(loader, 2)]
    for e in range(2):
        ks, js = mix.epoch_indices(e)
        assert got[e] == [100 * k + j for k, j in zip(ks.tolist(), js.tolist())]


# -- native image folders -----------------------------------------------------------------

@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    a = make_image_folder(tmp_path_factory.mktemp("mix_a"), num_classes=2, per_class=5, seed=1)
    b = make_image_folder(tmp_path_factory.mktemp("mix_b"), num_classes=3, per_class=2, seed=2)
    return ll.ImageFolderDataset(a), ll.ImageFolderDataset(b)


CHAIN = T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(),
                   T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), T.ToCHW()])


def test_two_image_folders_stay_native_and_read_the_items(folders):
    a, b = folders
    mix = ll.MixtureDataset([a, b], [0.4, 0.6], size=14, seed=8)
    loader = ll.DataLoader(mix.transform_first(CHAIN), batch_size=4, seed=2, num_threads=2)
    assert loader.engine == "native"
    text = loader.explain()
    assert "MixtureDataset of 2 sources" in text and repr(a)[:30] in text and repr(b)[:30] in text
    one = ll.DataLoader(mix.transform_first(CHAIN), batch_size=4, seed=2, num_threads=1)
    for e in range(3):
        got = [tuple(np.array(p).copy() for p in batch) for batch in loader]
        assert all(np.array_equal(x[0], y[0]) for x, y in zip(got, [tuple(np.array(p) for p in q) for q in one]))
        # The reference: the epoch's items listed in mixture order, read as an image list;
        # index i keys the same augmentation in both.
        ks, js = mix.epoch_indices(e)
        srcs = (a, b)
        paths = [srcs[k].paths[j] for k, j in zip(ks.tolist(), js.tolist())]
        labels = [int(srcs[k].labels[j]) for k, j in zip(ks.tolist(), js.tolist())]
        ref = ll.DataLoader(ll.ImageListDataset(paths, labels).transform_first(CHAIN), batch_size=4, seed=2)
        ref.set_epoch(e)
        want = [tuple(np.array(p) for p in batch) for batch in ref]
        assert len(got) == len(want)
        for x, y in zip(got, want):
            assert np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1])
        assert loader.stats.sources == {name: c for name, c in zip(mix.source_names, mix.counts.tolist())}


def test_mixture_native_equals_threads_engine(folders):
    a, b = folders
    mix = ll.MixtureDataset([a, b], seed=1)
    native = ll.DataLoader(mix.transform_first(CHAIN), batch_size=6, seed=3)
    tail = ll.DataLoader(mix.transform_first(T.Compose([*CHAIN.steps, lambda x: x])), batch_size=6, seed=3)
    assert (native.engine, tail.engine) == ("native", "threads")
    for x, y in zip(native, tail):
        assert np.array_equal(np.array(x[0]), np.array(y[0])) and np.array_equal(np.array(x[1]), np.array(y[1]))


def test_sources_with_their_own_transforms_run_on_threads(folders):
    a, b = folders
    mix = ll.MixtureDataset([a.transform_first(CHAIN), b.transform_first(CHAIN)], seed=1)
    loader = ll.DataLoader(mix, batch_size=4, seed=0)
    assert loader.engine == "threads"
    assert "source 0" in loader.explain() and "has its own transforms" in loader.explain()
    ref = ll.DataLoader(ll.MixtureDataset([a, b], seed=1).transform_first(CHAIN), batch_size=4, seed=0)
    first = next(iter(loader))
    assert np.array(first[0]).shape == np.array(next(iter(ref))[0]).shape


def test_a_corrupt_file_names_the_source_and_the_sample(folders, tmp_path):
    a, _b = folders
    bad = tmp_path / "bad"
    make_image_folder(bad, num_classes=1, per_class=2, seed=3)
    victim = sorted((bad / "class0").iterdir())[1]
    victim.write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    b = ll.ImageFolderDataset(bad)
    mix = ll.MixtureDataset([a, b], [1, 1], size=8, seed=0)
    ks, js = mix.epoch_indices(0)
    j = 1 if os.path.basename(b.paths[1]) == victim.name else 0
    with pytest.raises(ll.DecodeError, match=r"source 1 \[1\] ImageFolderDataset") as info:
        for _ in ll.DataLoader(mix.transform_first(CHAIN), batch_size=8, seed=0):
            pass
    assert f"sample {j}: " in str(info.value) and victim.name in str(info.value)

    def boom(x):
        raise RuntimeError("no")

    broken = ll.MixtureDataset([ll.SimpleDataset([1, 2]), ll.SimpleDataset([3]).transform(boom)], size=4, seed=0)
    with pytest.raises(RuntimeError, match="no") as info:
        next(iter(ll.DataLoader(broken, batch_size=4)))
    assert "source 1" in info.value.sample_source and "sample 0" in info.value.sample_source


# -- bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    ({"weights": [1, -1]}, "weights must not be negative"),
    ({"weights": [1, float("nan")]}, "weights must be finite"),
    ({"weights": [0, 0]}, "weights are all zero"),
    ({"weights": [1, 2, 3]}, "weights has 3 entries for 2 datasets"),
    ({"size": 0}, "size must be at least 1"),
])
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ll.MixtureDataset(_sources([3, 4]), **kwargs)


def test_empty_source_raises():
    with pytest.raises(ValueError, match=r"datasets\[1\] .* is empty"):
        ll.MixtureDataset([ll.SimpleDataset([1]), ll.SimpleDataset([])])
    with pytest.raises(ValueError, match="datasets is empty"):
        ll.MixtureDataset([])


# -- Pipeline.sample_from_datasets / choose_from_datasets ----------------------------------

def model_sample(sources, weights, seed, iteration, stop):
    """tf.data's sample_from_datasets with NOTE [ Mixing pipelines ]'s draws."""
    w = [x / sum(weights) for x in weights]
    live = list(w)
    its = [iter(s) for s in sources]
    uniforms = np.random.default_rng([seed, 3, iteration]).random(100_000).tolist()
    out, u = [], 0
    while sum(live) > 0:
        x = uniforms[u] * sum(live)
        u += 1
        acc, k = 0.0, 0
        for k, lw in enumerate(live):
            acc += lw
            if x < acc:
                break
        try:
            out.append(next(its[k]))
        except StopIteration:
            if stop:
                return out
            live[k] = 0.0
    return out


@pytest.mark.parametrize("stop", [False, True])
def test_sample_from_datasets_matches_tf_semantics(stop):
    a, b, c = list(range(12)), list(range(100, 104)), list(range(200, 207))
    P = ll.Pipeline
    pipe = P.sample_from_datasets([P.from_arrays(np.array(s)) for s in (a, b, c)], [0.5, 0.2, 0.3], seed=4,
                                  stop_on_empty_dataset=stop)
    for iteration in range(3):
        got = [int(x) for x in pipe]
        assert got == model_sample([a, b, c], [0.5, 0.2, 0.3], 4, iteration, stop)
        if stop:
            assert len(got) < len(a) + len(b) + len(c)
        else:
            assert sorted(got) == sorted(a + b + c)
        for s in (a, b, c):   # each pipeline's own order is kept
            mine = [x for x in got if x in s]
            assert mine == s[:len(mine)]


def test_choose_from_datasets_both_ways():
    P = ll.Pipeline
    a, b = P.from_arrays(np.arange(0, 3)), P.from_arrays(np.arange(100, 102))
    choices = P.from_arrays(np.array([0, 1, 1, 1, 0, 0, 0, 1]))
    assert [int(x) for x in P.choose_from_datasets([a, b], choices)] == [0, 100, 101]
    assert [int(x) for x in P.choose_from_datasets([a, b], choices, stop_on_empty_dataset=False)] == [
        0, 100, 101, 1, 2]
    bad = P.choose_from_datasets([a, b], P.from_arrays(np.array([0, 2])))
    with pytest.raises(ValueError, match=r"choices: element 1 is 2, not in \[0, 2\)"):
        list(bad)


@pytest.mark.parametrize("which", ["sample", "choose"])
def test_pipeline_mixing_resumes_exactly(which):
    P = ll.Pipeline

    def make():
        parts = [P.from_arrays(np.arange(0, 20)).shuffle(8, seed=1), P.from_arrays(np.arange(100, 110))]
        if which == "sample":
            return P.sample_from_datasets(parts, [2, 1]).with_options(seed=5)
        return P.choose_from_datasets(parts, P.from_arrays(np.arange(30) % 3 % 2))

    p = make()
    list(p)
    whole = [int(x) for x in p]   # iteration 1
    q = make()
    list(q)
    it = iter(q)
    head = [int(next(it)) for _ in range(7)]
    state = q.state_dict()
    it.close()
    r = make()
    r.load_state_dict(state)
    assert head + [int(x) for x in r] == whole


@pytest.mark.parametrize("weights,match", [
    ([1, -1], "weights must not be negative"), ([float("nan"), 1], "weights must be finite"),
    ([0, 0], "weights are all zero"), ([1], "weights has 1 entries for 2 pipelines"),
])
def test_sample_from_datasets_bad_weights(weights, match):
    P = ll.Pipeline
    with pytest.raises(ValueError, match=match):
        P.sample_from_datasets([P.from_arrays(np.arange(3)), P.from_arrays(np.arange(3))], weights)
    with pytest.raises(ValueError, match="pipelines is empty"):
        P.sample_from_datasets([])


def test_dashboard_counts_per_source(folders):
    pytest.importorskip("ipywidgets")
    import re

    from loaderlib.profiling import Dashboard

    a, b = folders
    mix = ll.MixtureDataset([a, b], [0.25, 0.75], size=12, seed=0)
    loader = ll.DataLoader(mix.transform_first(CHAIN), batch_size=4, profile=True)
    dash = Dashboard(loader, autostart=False)
    for _ in loader:
        pass
    dash.update()
    cells = dict(re.findall(r"<div class='loaderlib-kpi'[^>]*><div[^>]*>(.*?)</div><div>(.*?)</div></div>",
                            dash.figures.value))
    assert cells["per source"] == "[0] 3, [1] 9"
    assert list(loader.stats.sources.values()) == [3, 9]
    dash.close()
    loader.close()


def test_record_shards_mix_natively(folders, tmp_path):
    """Two record files (one of them in two shards): the SHARDS reads of both go through one
    kernel pass, and equal the threads engine's (each record read from Python)."""
    a, b = folders
    ra = ll.RecordFileDataset(ll.write_records(tmp_path / "a", a.paths, a.labels.tolist(), shard_size=20_000))
    rb = ll.RecordFileDataset(ll.write_records(tmp_path / "b", b.paths, b.labels.tolist()))
    mix = ll.MixtureDataset([ra, rb], [0.5, 0.5], size=12, seed=3)
    native = ll.DataLoader(mix.transform_first(CHAIN), batch_size=4, seed=1, num_threads=2)
    tail = ll.DataLoader(mix.transform_first(T.Compose([*CHAIN.steps, lambda x: x])), batch_size=4, seed=1)
    assert (native.engine, tail.engine) == ("native", "threads")
    for _ in range(2):
        got = [tuple(np.array(p).copy() for p in q) for q in native]
        want = [tuple(np.array(p) for p in q) for q in tail]
        assert len(got) == len(want) == 3
        assert all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(got, want))


def test_mixed_kinds_run_on_threads(folders, tmp_path):
    a, b = folders
    rb = ll.RecordFileDataset(ll.write_records(tmp_path / "b", b.paths, b.labels.tolist()))
    loader = ll.DataLoader(ll.MixtureDataset([a, rb], seed=0).transform_first(CHAIN), batch_size=4)
    assert loader.engine == "threads"
    assert "read in different ways (0: files, 1: shards)" in loader.explain()
    assert sum(len(x) for x, _ in loader) == len(a) + len(rb)


def test_workers_with_a_native_prefix_read_the_epoch(folders):
    """num_workers=2 with a Python tail: each worker binds the mixture's native source to the
    task's epoch and gives the threads engine's samples."""
    a, b = folders
    mix = ll.MixtureDataset([a, b], [1, 2], size=12, seed=2)
    chain = T.Compose([*CHAIN.steps, lambda x: x])
    with ll.DataLoader(mix.transform_first(chain), batch_size=4, seed=0, num_workers=2) as workers:
        threads = ll.DataLoader(mix.transform_first(chain), batch_size=4, seed=0)
        assert (workers.engine, threads.engine) == ("processes", "threads")
        for _ in range(2):
            pairs = list(zip(workers, threads))
            assert len(pairs) == 3
            assert all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in pairs)
