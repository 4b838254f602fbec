"""Exact resume: after load_state_dict the remaining batches equal an uninterrupted run's.

The reference is the same loader iterated without interruption; the resumed loader is a
fresh object (or a fresh process) that only sees the JSON state.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys

import cv2
import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T
from loaderlib.loader import STATE_VERSION
from loaderlib.sampler import ShardedSampler, WeightedRandomSampler

N = 23          # not a multiple of the batch size: keep / discard / rollover differ
BATCH = 4
BAD = (5, 14)   # samples that fail (on_error="skip" rows)


def _fail_some(x, y):
    if int(y) in BAD:
        raise ValueError(f"broken sample {int(y)}")
    return x * 2, y


@pytest.fixture(scope="module")
def image_list(tmp_path_factory):
    """N small JPEGs (BAD ones truncated to a few bytes) and their labels."""
    root = tmp_path_factory.mktemp("resume_images")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(N):
        img = rng.integers(0, 256, (20 + i % 5, 24 + i % 3, 3), dtype=np.uint8)
        _ok, buf = cv2.imencode(".jpg", img)
        data = buf.tobytes()
        if i in BAD:
            data = data[:2]
        p = root / f"img{i:02d}.jpg"
        p.write_bytes(data)
        paths.append(str(p))
    return paths, np.arange(N, dtype=np.int64)


def _dataset(engine: str, skip: bool, images):
    if engine == "native":
        paths, labels = images
        if not skip:
            paths = [p for i, p in enumerate(paths) if i not in BAD] + [paths[0]] * len(BAD)
        ds = ll.ImageListDataset(paths, labels)
        return ds.transform_first(T.Compose([T.RandomResizedCrop(8), T.RandomHorizontalFlip(), T.ToCHW()]))
    x = np.arange(N * 3, dtype=np.float32).reshape(N, 3)
    ds = ll.ArrayDataset(x, np.arange(N, dtype=np.int64))
    return ds.transform(_fail_some) if skip else ds.transform(lambda a, b: (a * 2, b))


def _sampler(kind: str):
    if kind == "sequential":
        return {}
    if kind == "random":
        return {"shuffle": True}
    if kind == "weighted":
        return {"sampler": WeightedRandomSampler(np.linspace(1, 3, N), num_samples=N, seed=3)}
    return {"sampler": ShardedSampler(2, 1, shuffle=True, seed=5)}


def _loader(engine, threads, sampler, last_batch, skip, images):
    kwargs = {"num_workers": 2} if engine == "processes" else {"num_threads": threads}
    return ll.DataLoader(_dataset(engine, skip, images), batch_size=BATCH, last_batch=last_batch, seed=11,
                         on_error="skip" if skip else "raise", timeout=60, **_sampler(sampler), **kwargs)


def _copy(batch):
    return tuple(np.array(a) for a in batch) if isinstance(batch, tuple) else np.array(batch)


def _epochs(loader, n):
    out = []
    for _ in range(n):
        out.append([_copy(b) for b in loader])
    return out


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)


def _check_resume(make, stop_epoch, stop_batch):
    reference = _epochs(make(), stop_epoch + 2)
    first = make()
    for _ in range(stop_epoch):
        list(first)
    it = iter(first)
    for _ in range(stop_batch):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    second = make()
    second.load_state_dict(state)
    rest = [_copy(b) for b in second]
    _assert_same(rest, reference[stop_epoch][stop_batch:])
    _assert_same([_copy(b) for b in second], reference[stop_epoch + 1])   # the epoch after, too
    second.close()


@pytest.mark.parametrize("last_batch", ["keep", "discard", "rollover"])
@pytest.mark.parametrize("sampler", ["sequential", "random", "weighted", "sharded"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("engine", ["native", "threads"])
@pytest.mark.parametrize("skip", [False, True], ids=["raise", "skip"])
def test_resume_matrix(engine, threads, sampler, last_batch, skip, image_list):
    _check_resume(lambda: _loader(engine, threads, sampler, last_batch, skip, image_list), 1, 2)


@pytest.mark.parametrize(("sampler", "last_batch", "skip"),
                         [("sequential", "keep", False), ("random", "rollover", True), ("weighted", "discard", True),
                          ("sharded", "keep", True)])
def test_resume_processes(sampler, last_batch, skip, image_list):
    _check_resume(lambda: _loader("processes", None, sampler, last_batch, skip, image_list), 1, 1)


def test_skip_keeps_batches_whole_and_discard_drops_short(image_list):
    loader = _loader("threads", 2, "sequential", "discard", True, image_list)
    sizes = [len(b[1]) for b in loader]
    # 21 good samples: five full batches, the short sixth is dropped under "discard".
    assert sizes == [4, 4, 4, 4, 4]
    labels = np.concatenate([b[1] for b in _loader("threads", 2, "sequential", "keep", True, image_list)])
    assert labels.tolist() == [i for i in range(N) if i not in BAD]


def test_state_counts_delivered_not_prefetched(image_list):
    loader = _loader("threads", 2, "random", "keep", False, image_list)
    it = iter(loader)
    next(it)
    next(it)
    state = loader.state_dict()
    assert state["delivered"] == 2 and state["position"] == 2 * BATCH and state["epoch"] == 0
    assert state["version"] == STATE_VERSION
    json.dumps(state)   # plain JSON


def test_state_between_epochs_points_at_next_epoch(image_list):
    loader = _loader("native", 2, "random", "rollover", False, image_list)
    list(loader)
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["delivered"] == 0
    assert len(state["carry"]) == N % BATCH
    again = _loader("native", 2, "random", "rollover", False, image_list)
    again.load_state_dict(state)
    assert again.epoch == 1
    _assert_same([_copy(b) for b in again], _epochs(_loader("native", 2, "random", "rollover", False, image_list), 2)[1])


@pytest.mark.parametrize(("field", "change", "message"), [
    ("seed", 12, "seed"),
    ("dataset_length", N + 1, "dataset length"),
    ("batch_size", 5, "batch size"),
    ("version", 99, "version"),
])
def test_state_from_another_loader_is_refused(field, change, message, image_list):
    loader = _loader("threads", 1, "random", "keep", False, image_list)
    state = loader.state_dict()
    state[field] = change
    with pytest.raises(ll.StateError, match=message):
        _loader("threads", 1, "random", "keep", False, image_list).load_state_dict(state)


def test_iterator_pickles_through_its_state(image_list):
    make = lambda: _loader("native", 2, "random", "keep", False, image_list)
    reference = _epochs(make(), 1)[0]
    it = iter(make())
    next(it)
    next(it)
    clone = pickle.loads(pickle.dumps(it))
    _assert_same([_copy(b) for b in clone], reference[2:])
    _assert_same([_copy(b) for b in it], reference[2:])


def test_set_epoch_chooses_the_epoch(image_list):
    make = lambda: _loader("native", 1, "random", "keep", False, image_list)
    reference = _epochs(make(), 3)
    loader = make()
    loader.set_epoch(2)
    assert loader.epoch == 2
    _assert_same([_copy(b) for b in loader], reference[2])
    loader.set_epoch(0)
    _assert_same([_copy(b) for b in loader], reference[0])
    with pytest.raises(ValueError, match="epoch"):
        loader.set_epoch(-1)


def test_set_epoch_keeps_a_loaded_mid_epoch_state(image_list):
    make = lambda: _loader("threads", 2, "random", "keep", False, image_list)
    reference = _epochs(make(), 2)
    first = make()
    list(first)
    it = iter(first)
    next(it)
    state = first.state_dict()
    second = make()
    second.load_state_dict(state)
    second.set_epoch(1)    # the DistributedSampler habit before each epoch
    _assert_same([_copy(b) for b in second], reference[1][1:])


def test_flush_applies_new_weights_and_resume_stays_exact(image_list):
    def make():
        return ll.DataLoader(_dataset("threads", False, image_list), batch_size=BATCH, seed=1,
                             sampler=WeightedRandomSampler(np.ones(N), num_samples=40, seed=2), num_threads=2)

    loader = make()
    it = iter(loader)
    before = [_copy(next(it)) for _ in range(2)]
    only_seven = np.zeros(N)
    only_seven[7] = 1.0
    loader.sampler.set_weights(only_seven)
    loader.flush()
    third = _copy(next(it))
    assert (third[1] == 7).all()             # new weights from the next batch drawn
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [_copy(b) for b in it]
    assert all((b[1] == 7).all() for b in rest)
    again = make()
    again.load_state_dict(state)
    _assert_same([_copy(b) for b in again], rest)
    assert before[0][1].tolist() != [7] * BATCH


_SCRIPT = r"""
import json, os, signal, sys
import numpy as np
import loaderlib as ll

state_path, log_path, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
x = np.arange(60 * 2, dtype=np.float32).reshape(60, 2)
loader = ll.DataLoader(ll.ArrayDataset(x, np.arange(60)).transform(lambda a, b: (a + 1, b)), batch_size=4,
                       shuffle=True, seed=7, num_threads=2)
if os.path.exists(state_path):
    with open(state_path) as f:
        loader.load_state_dict(json.load(f))
done = 0
for epoch in range(loader.epoch, 2):
    for images, labels in loader:
        with open(log_path, "a") as f:
            f.write(json.dumps([loader.epoch, labels.tolist(), images.sum().item()]) + "\n")
        tmp = state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(loader.state_dict(), f)
        os.replace(tmp, state_path)
        done += 1
        if done == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("kill_at", [3, 17])
def test_sigkilled_training_script_resumes_exactly(tmp_path, kill_at):
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}

    def run(state, log, kill):
        return subprocess.run([sys.executable, str(script), str(state), str(log), str(kill)], env=env,
                              capture_output=True, text=True, timeout=120, check=False)

    never = 10**6
    ref_log = tmp_path / "ref.log"
    r = run(tmp_path / "ref.json", ref_log, never)   # the uninterrupted run
    assert r.returncode == 0, r.stderr
    state, log = tmp_path / "state.json", tmp_path / "run.log"
    r = run(state, log, kill_at)
    assert r.returncode == -signal.SIGKILL
    r = run(state, log, never)      # restarted from the saved state: runs to the end
    assert r.returncode == 0, r.stderr
    got = [json.loads(line)[1:] for line in log.read_text().splitlines()]
    want = [json.loads(line)[1:] for line in ref_log.read_text().splitlines()]
    assert got == want


def test_resume_in_a_fresh_process(tmp_path, image_list):
    make = lambda: _loader("native", 2, "random", "keep", True, image_list)
    reference = _epochs(make(), 1)[0]
    loader = make()
    it = iter(loader)
    for _ in range(3):
        next(it)
    (tmp_path / "state.json").write_text(json.dumps(loader.state_dict()))
    paths, _labels = image_list
    code = f"""
import json, sys, numpy as np, loaderlib as ll
from loaderlib import transforms as T
ds = ll.ImageListDataset({paths!r}, np.arange({N})).transform_first(
    T.Compose([T.RandomResizedCrop(8), T.RandomHorizontalFlip(), T.ToCHW()]))
loader = ll.DataLoader(ds, batch_size={BATCH}, shuffle=True, seed=11, on_error="skip", num_threads=1)
loader.load_state_dict(json.load(open(sys.argv[1])))
out = [b for b in loader]
np.savez(sys.argv[2], *[a for b in out for a in b])
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "state.json"), str(tmp_path / "out.npz")],
                       env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    data = np.load(tmp_path / "out.npz")
    arrays = [data[f"arr_{i}"] for i in range(len(data.files))]
    got = list(zip(arrays[0::2], arrays[1::2]))
    _assert_same(got, reference[3:])


def test_loader_without_seed_adopts_the_saved_seed():
    ds = ll.ArrayDataset(np.arange(40, dtype=np.float32), np.arange(40))
    first = ll.DataLoader(ds, batch_size=4, shuffle=True)    # seed drawn at random
    reference = [_copy(b) for b in ll.DataLoader(ds, batch_size=4, shuffle=True, seed=first.seed)]
    it = iter(first)
    next(it)
    state = first.state_dict()
    second = ll.DataLoader(ds, batch_size=4, shuffle=True)   # another random seed
    assert second.seed != first.seed
    second.load_state_dict(state)
    assert second.seed == first.seed
    _assert_same([_copy(b) for b in second], reference[1:])


def test_skips_are_summarised_once_per_epoch(image_list, caplog):
    loader = _loader("threads", 2, "sequential", "keep", True, image_list)
    with pytest.warns(ll.SkipWarning, match=r"2 samples skipped in epoch 0 .* first: sample 5"):
        list(loader)
    assert "2 samples skipped in epoch 0" in caplog.text
    assert [e.index for e in loader.errors] == list(BAD)


def test_plain_list_sampler_epochs_are_numbered():
    """A sampler that is a plain list still gets epoch 0, 1, ... (the augmentation key and the state)."""
    loader = ll.DataLoader(ll.ArrayDataset(np.arange(6, dtype=np.float32)), batch_size=2, sampler=[5, 4, 3, 2, 1, 0])
    for epoch in range(2):
        it = iter(loader)
        assert it.epoch == epoch
        next(it)
        assert loader.state_dict()["epoch"] == epoch
        list(it)
