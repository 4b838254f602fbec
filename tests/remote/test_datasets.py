"""Datasets named by URLs (nginx over HTTP, moto over S3) give exactly what the same files
give locally: same samples, same order, bitwise, on the native, threads and processes
engines, with and without the shard cache, and resume from a state_dict exactly."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T
from loaderlib.errors import RemoteReadError
from tests.remote.conftest import BUCKET, FAST, N


def _base(server, nginx, moto):
    if server == "http":
        return f"{nginx.url}/ds", dict(FAST)
    return f"s3://{BUCKET}/ds", {**moto.storage_options, **FAST}


def _make(kind, base, so, cache=None):
    """(local dataset, remote dataset) of one kind."""
    local_root = base[0]
    url_root, kw = base[1], {}
    if so is not None:
        kw["storage_options"] = so
    if kind == "records":
        n = len([f for f in os.listdir(os.path.join(local_root, "rec")) if f.endswith(".llrec")])
        spec = f"part-{{00000..{n - 1:05d}}}.llrec"
        return (ll.RecordFileDataset(os.path.join(local_root, "rec", "part-*.llrec")),
                ll.RecordFileDataset(f"{url_root}/rec/{spec}", cache_dir=cache, **kw))
    if kind in ("recordio", "multi", "noidx"):
        name = {"recordio": "train"}.get(kind, kind)
        return (ll.ImageRecordDataset(os.path.join(local_root, "mx", f"{name}.rec")),
                ll.ImageRecordDataset(f"{url_root}/mx/{name}.rec", cache_dir=cache, **kw))
    if kind == "webdataset":
        return (ll.WebDataset(os.path.join(local_root, "wds", "train-{0000..0002}.tar")),
                ll.WebDataset(f"{url_root}/wds/train-{{0000..0002}}.tar", cache_dir=cache, **kw))
    if kind == "list":
        local = ll.ImageFolderDataset(os.path.join(local_root, "folder"))
        rel = [os.path.relpath(p, local_root) for p in local.paths]
        return (ll.ImageListDataset(local.paths, local.labels),
                ll.ImageListDataset(rel, local.labels, root=url_root, **kw))
    if kind == "folder":
        return ll.ImageFolderDataset(os.path.join(local_root, "folder")), ll.ImageFolderDataset(
            f"{url_root}/folder/", **kw)
    raise AssertionError(kind)


CHAIN = [T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToCHW()]


def _loader(ds, engine, **kw):
    if engine == "native":
        ds = ds.transform_first(T.Compose(CHAIN))
        return ll.DataLoader(ds, batch_size=5, shuffle=True, seed=4, num_threads=2, timeout=60, **kw)
    # A Python step after the native chain: threads, or 2 worker processes.
    ds = ds.transform_first(T.Compose([*CHAIN, _plus_one]))
    extra = {"num_workers": 2} if engine == "processes" else {"num_threads": 2}
    return ll.DataLoader(ds, batch_size=5, shuffle=True, seed=4, timeout=60, **extra, **kw)


def _plus_one(x):
    return x + 1


def _batches(loader):
    return [tuple(np.array(a) for a in b) for b in loader]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            assert u.dtype == v.dtype and u.shape == v.shape
            np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("server", ["http", "s3"])
@pytest.mark.parametrize("kind, cache", [("records", False), ("records", True), ("webdataset", False),
                                         ("webdataset", True), ("list", False), ("recordio", False),
                                         ("recordio", True), ("multi", False), ("noidx", True)])
def test_url_dataset_equals_local_native(ds_root, nginx, moto, tmp_path, server, kind, cache):
    url_root, so = _base(server, nginx, moto)
    local, remote = _make(kind, (ds_root, url_root), so, str(tmp_path / "cache") if cache else None)
    assert len(remote) == len(local) == N
    np.testing.assert_array_equal(np.asarray(remote.labels), np.asarray(local.labels))
    if kind != "multi":             # float label vectors: no native collation
        a, b = _loader(local, "native"), _loader(remote, "native")
        assert a.engine == b.engine == "native"
        _same(_batches(a), _batches(b))
    np.testing.assert_array_equal(remote[5][0], local[5][0])          # the Python read path too
    getattr(remote, "close", lambda: None)()


def test_folder_over_a_prefix(ds_root, moto):
    local, remote = _make("folder", (ds_root, f"s3://{BUCKET}/ds"), {**moto.storage_options, **FAST})
    assert remote.synsets == local.synsets and remote.labels.tolist() == local.labels.tolist()
    assert [os.path.basename(p) for p in remote.paths] == [os.path.basename(p) for p in local.paths]
    _same(_batches(_loader(local, "native")), _batches(_loader(remote, "native")))


@pytest.mark.parametrize("engine", ["threads", "processes"])
@pytest.mark.parametrize("server, kind, cache", [("http", "records", False), ("s3", "records", True),
                                                 ("s3", "webdataset", False), ("http", "list", False)])
def test_url_dataset_equals_local_other_engines(ds_root, nginx, moto, tmp_path, engine, server, kind, cache):
    url_root, so = _base(server, nginx, moto)
    local, remote = _make(kind, (ds_root, url_root), so, str(tmp_path / "cache") if cache else None)
    a, b = _loader(local, engine), _loader(remote, engine)
    assert a.engine == b.engine == engine
    _same(_batches(a), _batches(b))


@pytest.mark.parametrize("server, kind, cache", [("http", "records", False), ("s3", "webdataset", True),
                                                 ("s3", "list", False)])
def test_resume_from_state_dict_is_exact(ds_root, nginx, moto, tmp_path, server, kind, cache):
    url_root, so = _base(server, nginx, moto)
    _, remote = _make(kind, (ds_root, url_root), so, str(tmp_path / "cache") if cache else None)
    reference = _batches(_loader(remote, "native"))
    first = _loader(remote, "native")
    it = iter(first)
    head = [tuple(np.array(a) for a in next(it)) for _ in range(2)]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    second = _loader(remote, "native")
    second.load_state_dict(state)
    _same(head + _batches(second), reference)


def test_cached_shards_are_slices_of_local_copies(ds_root, nginx, tmp_path):
    # NOTE [ Shards held by a dataset ]: the kernels get slices of the mapped copies.
    ds = ll.WebDataset(f"{nginx.url}/ds/wds/train-{{0000..0002}}.tar", storage_options=FAST,
                       cache_dir=tmp_path, cache_limit="1GB")
    assert all(p.startswith(str(tmp_path)) for p in ds.paths)
    assert ds.native_source().kind.name == "BUFFERS"
    local = ll.WebDataset(os.path.join(ds_root, "wds", "train-*.tar"))
    assert [bytes(b) for b in ds.buffers([0, 9, 23])] == [local.read(i) for i in (0, 9, 23)]
    assert ds.source(9) == f"{nginx.url}/ds/wds/train-0001.tar:s0009.jpg"
    ranges = ll.WebDataset(f"{nginx.url}/ds/wds/train-{{0000..0002}}.tar", storage_options=FAST)
    assert ranges.native_source().kind.name == "BUFFERS"
    ds.close()


def test_recordio_without_idx_needs_the_cache(ds_root, nginx):
    with pytest.raises(ll.LoaderError, match=r"noidx\.idx is missing; over URLs the \.idx is needed"):
        ll.ImageRecordDataset(f"{nginx.url}/ds/mx/noidx.rec", storage_options=FAST)


def test_missing_shard_is_one_error_naming_the_url(nginx):
    with pytest.raises(RemoteReadError, match=r"cannot read .*/ds/rec/nope\.llrec \(HTTP 404\)"):
        ll.RecordFileDataset(f"{nginx.url}/ds/rec/nope.llrec", storage_options=FAST)


def test_read_failure_mid_epoch_names_url_status_and_sample(ds_root, proxy):
    ds = ll.RecordFileDataset(f"{proxy.url}/ds/rec/part-{{00000..00002}}.llrec", storage_options=FAST)
    loader = ll.DataLoader(ds.transform_first(T.Compose(CHAIN)), batch_size=5, num_threads=2, timeout=60)
    proxy.add("status", status=403, match=".llrec", method="GET", times=1000)
    with pytest.raises(RemoteReadError, match=r"sample \d+: cannot read .*part-0000\d\.llrec \(HTTP 403\)"):
        list(loader)


def test_options_need_urls(tmp_path):
    with pytest.raises(ValueError, match="apply to URLs"):
        ll.RecordFileDataset(str(tmp_path / "x.llrec"), storage_options={})
    with pytest.raises(ValueError, match="not both"):
        ll.WebDataset(["http://127.0.0.1:1/a.tar", str(tmp_path / "b.tar")])


def test_the_object_stores_page_runs(moto, tmp_path):
    """docs/object-stores.md's example, run as written against the test's S3 server."""
    import re
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "object-stores.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.DOTALL)
    code = blocks[-1]
    env = {**os.environ, "LL_EXAMPLE_ENDPOINT": moto.endpoint_url, "PYTHONPATH": root}
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300,
                         env=env, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("(32, 3, 96, 96) uint8") and lines[1] == "True"
    assert "byte ranges from the store" in out.stdout


def _faulty_list(ds_root, proxy):
    local = ll.ImageFolderDataset(os.path.join(ds_root, "folder"))
    rel = [os.path.relpath(p, ds_root) for p in local.paths]
    bad = next(i for i, r in enumerate(rel) if r.endswith("img007.jpg"))
    ds = ll.ImageListDataset(rel, local.labels, root=f"{proxy.url}/ds", storage_options=FAST)
    proxy.add("status", status=404, match="img007.jpg", times=1000)
    return ds, bad


@pytest.mark.parametrize("engine", ["native", "threads"])
def test_failed_sample_raises_its_own_error(ds_root, proxy, engine):
    ds, bad = _faulty_list(ds_root, proxy)
    loader = _loader(ds, engine)
    with pytest.raises(RemoteReadError, match=rf"sample {bad}: cannot read .*img007\.jpg \(HTTP 404\)"):
        list(loader)


@pytest.mark.parametrize("engine", ["native", "threads"])
def test_failed_sample_is_skipped_alone(ds_root, proxy, engine):
    ds, bad = _faulty_list(ds_root, proxy)
    with pytest.warns(ll.SkipWarning):
        got = _batches(_loader(ds, engine, on_error="skip"))
    assert sum(len(b[1]) for b in got) == N - 1
    loader = _loader(ds, engine, on_error="skip")
    with pytest.warns(ll.SkipWarning):
        list(loader)
    assert [f.index for f in loader.errors] == [bad]


@pytest.mark.parametrize("cache", [False, True])
def test_pipeline_from_records_url(ds_root, nginx, tmp_path, cache):
    url = f"{nginx.url}/ds/rec/part-{{00000..00002}}.llrec"
    kw = {"cache_dir": str(tmp_path)} if cache else {}
    remote = ll.Pipeline.from_records(url, storage_options=FAST, **kw).map(T.Compose(CHAIN)).batch(5).with_options(seed=3)
    local = ll.Pipeline.from_records(os.path.join(ds_root, "rec", "part-*.llrec")).map(T.Compose(CHAIN)).batch(5)
    local = local.with_options(seed=3)
    _same([tuple(np.array(a) for a in b) for b in local], [tuple(np.array(a) for a in b) for b in remote])


def test_cached_records_read_before_the_last_shard_arrives(ds_root, proxy, tmp_path):
    # The download of shard 2 hangs; the dataset opens (indexes, headers by range) and reads
    # shard 0's records from its local copy meanwhile.
    proxy.add("stall", match="part-00002.llrec", method="GET", ranged=False)
    ds = ll.RecordFileDataset(f"{proxy.url}/ds/rec/part-{{00000..00002}}.llrec", cache_dir=str(tmp_path),
                              storage_options={**FAST, "timeout": 3.0})
    local = ll.RecordFileDataset(os.path.join(ds_root, "rec", "part-*.llrec"))
    assert ds.native_source().kind.name == "BUFFERS" and ds.shard_of[0] == 0
    assert ds.read(0) == local.read(0)
    assert not os.path.exists(ds.paths[2])
    proxy.released.set()
    last = len(local) - 1
    assert ds.shard_of[last] == 2 and ds.read(last) == local.read(last)
    ds.close()
