"""Argument checks, the skip circuit breaker, step names in explain(), negative indices, and an
interpreter that can exit while a dataset call is stuck."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import loaderlib as ll


def _arrays(n=12):
    return ll.ArrayDataset(np.arange(n, dtype=np.float32), np.arange(n))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"batch_size": 2.5}, "batch_size must be a positive integer"),
    ({"batch_size": "4"}, "batch_size must be a positive integer"),
    ({"batch_size": True}, "batch_size must be a positive integer"),
    ({"batch_size": 2, "seed": 1.7}, "seed must be a non-negative integer"),
    ({"batch_size": 2, "timeout": -1}, "timeout must be a non-negative number"),
    ({"batch_size": 2, "on_error": "skip", "max_skipped": 1.5}, "max_skipped must be a count"),
])
def test_arguments_are_checked_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ll.DataLoader(_arrays(), **kwargs)


def test_negative_sampler_indices_are_refused():
    loader = ll.DataLoader(_arrays(), batch_size=2, sampler=[0, 1, -1, 3])
    with pytest.raises(ValueError, match="negative index"):
        list(loader)


def _broken_mostly(a, b):
    if int(b) % 4:
        raise ValueError(f"bad sample {int(b)}")
    return a, b


@pytest.mark.parametrize("limit", [3, 0.25])
def test_max_skipped_circuit_breaker(limit):
    loader = ll.DataLoader(_arrays(16).transform(_broken_mostly), batch_size=2, on_error="skip", max_skipped=limit,
                           num_threads=1)
    with pytest.raises(ll.LoaderError, match=r"more than max_skipped=(3|4): the dataset looks broken\. 1: "):
        list(loader)
    ok = ll.DataLoader(_arrays(16).transform(_broken_mostly), batch_size=2, on_error="skip", max_skipped=12,
                       num_threads=1)
    with pytest.warns(ll.SkipWarning, match="12 samples skipped"):
        assert np.concatenate([b for _, b in ok]).tolist() == [0, 4, 8, 12]


def test_explain_names_python_steps_by_qualified_name():
    def a_rather_long_and_descriptive_step_name_that_used_to_be_cut_off_in_explain_output(a, b):
        return a, b

    loader = ll.DataLoader(_arrays().transform(
        a_rather_long_and_descriptive_step_name_that_used_to_be_cut_off_in_explain_output), batch_size=2)
    assert ("test_explain_names_python_steps_by_qualified_name.<locals>."
            "a_rather_long_and_descriptive_step_name_that_used_to_be_cut_off_in_explain_output") in loader.explain()



def _two_images(tmp_path):
    import cv2

    os.makedirs(tmp_path / "a")
    for i in range(2):
        cv2.imwrite(str(tmp_path / "a" / f"{i}.jpg"), np.full((40, 50, 3), 30 * i, np.uint8))
    return ll.ImageFolderDataset(str(tmp_path))


def _first_step(img):
    return img


def test_explain_names_a_python_step_first_in_the_chain(tmp_path):
    from loaderlib import transforms as T

    ds = _two_images(tmp_path).transform_first(T.Compose([_first_step, T.RandomResizedCrop(16)]))
    text = ll.DataLoader(ds, batch_size=2).explain()
    name = f"{_first_step.__module__}._first_step"
    head, *rows = text.splitlines()
    assert f"the chain starts with a Python step ({name})" in head
    assert f"  transform         python  {name} (per sample, Python code)" in rows
    assert any(r.startswith("  transform         native  RandomResizedCrop(size=16") and
               r.endswith("(per sample, a kernel called from Python)") for r in rows), rows
    assert "no native prefix" not in text


def test_explain_of_a_python_batchify_fn_that_returns_a_list(tmp_path):
    from loaderlib import transforms as T

    listify = lambda samples: list(samples)
    loader = ll.DataLoader(_two_images(tmp_path).transform_first(T.RandomResizedCrop(16)), batch_size=2,
                           batchify_fn=listify)
    head, *rows = loader.explain().splitlines()
    name = (f"{listify.__module__}.test_explain_of_a_python_batchify_fn_that_returns_a_list.<locals>.<lambda> "
            f"(test_hardening.py:{listify.__code__.co_firstlineno})")
    collate = next(r for r in rows if r.lstrip().startswith("collate"))
    assert collate == (f"  collate           python  {name}: Python code called on each batch's list of samples; "
                       "its result is handed over as returned (not an arena slot)")
    assert f"the batchify function {name} is Python code" in head
    batch = next(iter(loader))
    assert isinstance(batch, list) and len(batch) == 2


def test_pipeline_explain_names_its_python_maps(tmp_path):
    _two_images(tmp_path)
    text = ll.Pipeline.from_folder(str(tmp_path)).map(_first_step).batch(2).explain()
    assert "step 1 .map(" + f"{_first_step.__module__}._first_step) is Python code" in text
    assert f"    transform                        python   step 1 .map({_first_step.__module__}._first_step), per " \
           "element (Python code)" in text
    assert "_Keyed" not in text

_STUCK = r"""
import gc, sys, threading, warnings, numpy as np, loaderlib as ll

engine, fifo = sys.argv[1], sys.argv[2]


class Stuck:
    def __len__(self):
        return 8

    def source(self, i):
        return fifo if i == 0 else f"ok{i}.jpg"

    def __getitem__(self, i):
        if fifo == "-":
            threading.Event().wait()      # a call that never returns
        if i == 0:
            with open(fifo, "rb") as f:   # a FIFO named .jpg (a hung network mount): blocks for ever
                return np.frombuffer(f.read(), np.uint8)
        return np.full(3, i, np.uint8)


kw = {"num_workers": 1} if engine == "processes" else {"num_threads": 2}
loader = ll.DataLoader(Stuck(), batch_size=2, timeout=1, **kw)
assert loader.engine == engine, loader.engine
it = iter(loader)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    try:
        next(it)
    except ll.LoaderTimeoutError as e:
        print("timed out:", e)
print("warned:", " | ".join(str(w.message) for w in seen if w.category is RuntimeWarning))
del it, loader
gc.collect()
print("released")
"""


@pytest.mark.parametrize(("engine", "what"), [("threads", "fifo"), ("processes", "fifo"), ("threads", "never")])
def test_stuck_reads_can_be_released_and_the_interpreter_exits(tmp_path, engine, what):
    """NOTE [ Stuck user code ]: a dataset whose read never returns (a FIFO named .jpg, or a
    call that waits for ever) times out, the iterator and loader can be released, and the
    interpreter exits; the threads engine warns naming the sample left on its daemon thread,
    the processes engine kills the stuck worker. The subprocess timeout only guards against a
    hang (which is the failure), it measures nothing."""
    fifo = tmp_path / "stuck.jpg"
    os.mkfifo(fifo)
    script = tmp_path / "stuck.py"
    script.write_text(_STUCK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    arg = str(fifo) if what == "fifo" else "-"
    r = subprocess.run([sys.executable, str(script), engine, arg], capture_output=True, text=True, timeout=120,
                       env=env, check=False)
    assert r.returncode == 0, r.stderr
    assert "timed out: no batch within timeout=1 s" in r.stdout and "released" in r.stdout
    if engine == "threads":   # the stuck samples, named by the dataset's source(i)
        named = f"sample 0 ({str(fifo)!r})" if what == "fifo" else "samples 0 ('-'), 1 ('ok1.jpg')"
        assert f"warned: dataset[i] is still running for {named}; it is left on a daemon thread" in r.stdout
    else:
        assert "worker 0 was still on batch 0 and was killed" in r.stdout


def test_chw_input_is_refused_with_the_fix():
    from loaderlib import transforms as T

    chw = np.zeros((3, 64, 48), np.uint8)
    with pytest.raises(ValueError, match=r"looks like CHW: pass img.transpose\(1, 2, 0\)"):
        T.RandomResizedCrop(32)(chw, seed=0)
    assert T.RandomResizedCrop(32)(chw.transpose(1, 2, 0).copy(), seed=0).shape == (32, 32, 3)


def test_normalize_in_0_255_scale_is_refused():
    from loaderlib import transforms as T

    with pytest.raises(ValueError, match="0-1 scale mean and std .* divide them by 255"):
        T.Normalize(mean=(123.7, 116.3, 103.5), std=(58.4, 57.1, 57.4))
    T.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def test_tuple_of_arrays_and_bare_arrays_run_natively():
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    y = np.arange(10)
    tup = ll.TupleDataset(ll.ArrayDataset(x), ll.ArrayDataset(y))
    loader = ll.DataLoader(tup, batch_size=4, shuffle=True, seed=1)
    assert loader.engine == "native"
    order = ll.sampler.RandomSampler(10, seed=1).order(0)
    got = list(loader)
    np.testing.assert_array_equal(np.concatenate([a for a, _ in got]), x[order])
    np.testing.assert_array_equal(np.concatenate([b for _, b in got]), y[order])
    bare = ll.DataLoader(x, batch_size=3)
    assert bare.engine == "native"
    np.testing.assert_array_equal(np.concatenate(list(bare)), x)


def test_pad_runs_natively_and_equals_python_pad(tmp_path):
    """NOTE [ Native Pad ]: Pad (alone, or in a Tuple, with shards and ret_length) keeps the
    native engine, and every batch equals what batchify.Pad itself returns for the same
    samples (taken from a Stack run), for 1 and 2 threads."""
    from loaderlib import transforms as T
    from loaderlib.batchify import Pad, Stack, Tuple
    from tests.kernels._loader_images import make_image_folder

    ds = ll.ImageFolderDataset(make_image_folder(tmp_path, num_classes=2, per_class=5)).transform_first(
        T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip()]))
    ref_loader = ll.DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_threads=1)
    stacked = [(x.copy(), y.copy()) for x, y in ref_loader]
    fns = [Tuple(Pad(val=255, ret_length=True), Pad(val=-1)), Tuple(Pad(axis=1, num_shards=2), Stack())]
    for fn in fns:
        want = [fn([(x[i], y[i]) for i in range(len(y))]) for x, y in stacked]
        for threads in (1, 2):
            loader = ll.DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_threads=threads, batchify_fn=fn)
            assert loader.engine == "native", loader.explain()
            got = list(loader)
            assert len(got) == len(want) == 3
            for g, w in zip(got, want):
                _assert_same_structure(g, w)
    x = np.arange(30, dtype=np.float32).reshape(10, 3)
    arrays = ll.DataLoader(ll.ArrayDataset(x, np.arange(10)), batch_size=4, batchify_fn=Tuple(Pad(ret_length=True), Pad()))
    assert arrays.engine == "native"
    for (batch, lengths), labels in arrays:
        start = int(labels[0])
        ref_batch, ref_len = Pad(ret_length=True)([x[i] for i in range(start, start + len(labels))])
        np.testing.assert_array_equal(batch, ref_batch)
        np.testing.assert_array_equal(lengths, ref_len)
        assert lengths.dtype == ref_len.dtype == np.int64


def _assert_same_structure(got, want):
    assert type(got) is type(want) or (isinstance(got, list) and isinstance(want, list)), (type(got), type(want))
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _assert_same_structure(g, w)
    else:
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_a_file_larger_than_the_sample_limit_is_refused_by_both_readers(tmp_path):
    # NOTE [ One sample's file size limit ]: a sparse file costs no disk, yet declares 1 GiB + 1.
    from loaderlib import datasets as D
    from loaderlib import transforms as T
    from loaderlib._ext import _chain

    assert D.MAX_FILE_BYTES == _chain.MAX_FILE_BYTES == 1 << 30
    big = tmp_path / "huge.jpg"
    with open(big, "wb") as f:
        f.truncate(D.MAX_FILE_BYTES + 1)
    ds = ll.ImageListDataset([str(big)], [0])
    with pytest.raises(OSError, match="larger than the 1073741824-byte limit"):
        ds[0]                                                  # the Python reader
    loader = ll.DataLoader(ds.transform_first(T.Resize((8, 8))), batch_size=1)
    assert loader.engine == "native"
    with pytest.raises(ll.DecodeError, match="huge.jpg.*larger than the 1073741824-byte limit"):
        next(iter(loader))                                     # the native reader


def test_special_files_are_read_only_when_asked(tmp_path, monkeypatch):
    import threading

    import cv2

    from loaderlib import transforms as T
    from loaderlib._datasets import images  # the reader reads its limit there

    img = np.random.default_rng(0).integers(0, 256, (24, 32, 3), dtype=np.uint8)
    ok, enc = cv2.imencode(".jpg", img)
    assert ok
    fifo = str(tmp_path / "pipe.jpg")
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file.*special_files=True"):
        ll.ImageListDataset([fifo], [3])[0]                  # refused without blocking

    def writer():
        with open(fifo, "wb") as f:                          # blocks until the reader opens it
            f.write(enc.tobytes())

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    ds = ll.ImageListDataset([fifo], [3], special_files=True)
    got, label = ds[0]
    t.join(timeout=60)
    np.testing.assert_array_equal(got, ll.decode(enc.tobytes()))   # the same decoder as a file
    assert label == 3
    loader = ll.DataLoader(ds.transform_first(T.Resize((8, 8))), batch_size=1)
    assert loader.engine == "threads" and "special_files=True" in loader.explain()
    # a device that never ends is cut at the size limit
    monkeypatch.setattr(images, "MAX_FILE_BYTES", 1 << 16)
    with pytest.raises(OSError, match="more than the 65536-byte limit"):
        ll.ImageListDataset(["/dev/zero"], special_files=True)[0]
    with pytest.raises(TypeError, match="special_files must be True or False"):
        ll.ImageListDataset([fifo], special_files="yes")
