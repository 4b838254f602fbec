"""Ray Data integration: map_batches_fn against the plain loader, and streaming_split loaders
on a local 2-CPU cluster (loopback)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import loaderlib as ll
from benchmarks._synth import encode_jpeg, photo_like
from loaderlib import transforms as T
from loaderlib.errors import LoaderError

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
N = 24


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray-jpegs")
    paths, blobs = [], []
    for i in range(N):
        w = 120 + 7 * i
        data = encode_jpeg(photo_like(w, int(w * 0.75), seed=i), quality=88)
        p = root / f"{i:03d}.jpg"
        p.write_bytes(data)
        paths.append(str(p))
        blobs.append(data)
    return paths, blobs


def _chain(random: bool):
    geo = [T.RandomResizedCrop(48), T.RandomHorizontalFlip()] if random else [T.Resize(56), T.CenterCrop(48)]
    return T.Compose([*geo, T.Normalize(MEAN, STD), T.ToCHW()])


def _loader_images(paths, chain, seed=0):
    ds = ll.ImageListDataset(paths, labels=list(range(len(paths)))).transform_first(chain)
    loader = ll.DataLoader(ds, batch_size=8, seed=seed, num_threads=2)
    assert loader.engine == "native"
    return np.concatenate([x.copy() for x, _ in loader])


@pytest.mark.parametrize("random", [False, True], ids=["deterministic", "random"])
def test_map_batches_fn_equals_the_plain_loader(jpegs, random):
    from loaderlib.integrations.ray import map_batches_fn

    paths, blobs = jpegs
    ref = _loader_images(paths, _chain(random), seed=11)
    batch = {"bytes": np.array(blobs[5:17], dtype=object), "id": np.arange(5, 17), "label": np.arange(5, 17) % 3}
    outs = []
    for threads in (1, 2):
        fn = map_batches_fn(_chain(random), index_column="id", seed=11, num_threads=threads)
        res = fn(dict(batch))
        assert sorted(res) == ["id", "image", "label"]                  # bytes replaced, the rest kept
        np.testing.assert_array_equal(res["label"], batch["label"])
        assert res["image"].shape == (12, 3, 48, 48) and res["image"].dtype == np.float32
        outs.append(res["image"])
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], ref[5:17])


def _address(a):
    return a.__array_interface__["data"][0]


def test_map_batches_fn_reuses_an_output_slot_only_once_its_batch_is_gone(jpegs, monkeypatch):
    from loaderlib.integrations import ray as llray

    monkeypatch.setattr(llray, "_output_arena", None)     # this test's own slots
    paths, blobs = jpegs
    ref = _loader_images(paths, _chain(False))
    fn = llray.map_batches_fn(_chain(False))

    def call(f, lo, hi):
        return f({"bytes": np.array(blobs[lo:hi], dtype=object)})["image"]

    kept = call(fn, 0, 8)              # a block Ray (or a fused next step) still holds
    first = _address(kept)
    b = call(fn, 8, 16)
    assert _address(b) != first
    np.testing.assert_array_equal(kept, ref[0:8])       # not overwritten by the next call
    np.testing.assert_array_equal(b, ref[8:16])
    del kept
    c = call(fn, 16, 24)
    assert _address(c) == first                         # its slot, once it was dropped
    np.testing.assert_array_equal(c, ref[16:24])
    del b, c
    made = llray._output_arena.stats["allocations"]
    for lo in range(0, N, 8):
        np.testing.assert_array_equal(call(fn, lo, lo + 8), ref[lo:lo + 8])
    assert llray._output_arena.stats["allocations"] == made == 2    # steady state: no new memory
    fresh = call(llray.map_batches_fn(_chain(False), reuse_output=False), 0, 8)
    np.testing.assert_array_equal(fresh, ref[0:8])
    assert fresh.base is None and llray._output_arena.stats["leased"] == 0   # its own array


def test_map_batches_fn_bad_input(jpegs):
    from loaderlib.integrations.ray import map_batches_fn

    _, blobs = jpegs
    fn = map_batches_fn(_chain(False))
    with pytest.raises(LoaderError, match="no 'bytes' column"):
        fn({"data": np.array(blobs[:2], dtype=object)})
    with pytest.raises(ll.DecodeError, match=r"bytes\[1\]"):
        fn({"bytes": np.array([blobs[0], blobs[1][:300] + b"\x00" * 10], dtype=object)})
    with pytest.raises(LoaderError, match="is empty"):
        fn({"bytes": np.array([blobs[0], b""], dtype=object)})
    with pytest.raises(ValueError, match="runs natively"):
        map_batches_fn(T.Compose([T.Resize((8, 8)), lambda x: x]))
    with pytest.raises(LoaderError, match="index_column 'id' is not in the batch"):
        map_batches_fn(_chain(False), index_column="id")({"bytes": np.array(blobs[:1], dtype=object)})


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    yield ray
    ray.shutdown()


@pytest.mark.slow   # starts a Ray cluster: about 20 s on 2 cores
def test_streaming_split_loaders_get_equal_shards_of_kernel_output(jpegs, ray_cluster):
    from loaderlib.integrations.ray import map_batches_fn, streaming_loaders

    ray = ray_cluster
    paths, blobs = jpegs
    ref = _loader_images(paths, _chain(False))
    ds = ray.data.from_items([{"bytes": b, "id": i, "label": i % 3} for i, b in enumerate(blobs)])
    ds = ds.map_batches(map_batches_fn(_chain(False)), batch_format="numpy", batch_size=8)
    loaders = streaming_loaders(ds, 2, batch_size=4, columns=("image", "id", "label"))
    got: list[list] = [[], []]
    errors: list = []

    def consume(k):
        try:
            for images, ids, labels in loaders[k]:
                got[k].append((images.copy(), ids.copy(), labels.copy()))
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            errors.append(e)

    threads = [threading.Thread(target=consume, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    ids = [np.concatenate([b[1] for b in g]) for g in got]
    assert len(ids[0]) == len(ids[1]) == N // 2                          # equal shards
    assert sorted(np.concatenate(ids).tolist()) == list(range(N))        # union = the epoch, disjoint
    for g in got:
        for images, idx, labels in g:
            np.testing.assert_array_equal(images, ref[idx])               # the kernels' output
            np.testing.assert_array_equal(labels, idx % 3)
