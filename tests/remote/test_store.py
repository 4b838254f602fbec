"""The store layer against real servers: nginx (HTTP with ranges) and moto (S3)."""

from __future__ import annotations

import os

import pytest

from loaderlib._extract.remote.store import RemoteStore, expand_urls, open_store, read_ranges
from loaderlib.errors import LoaderError, RemoteReadError
from tests.remote.conftest import BUCKET


def _file(served, rel):
    with open(os.path.join(served, rel), "rb") as f:
        return f.read()


@pytest.fixture(params=["http", "s3"])
def base(request, nginx, moto):
    """(URL prefix of the served folder, storage_options) for each server."""
    if request.param == "http":
        return nginx.url, {}
    return f"s3://{BUCKET}", moto.storage_options


def test_head_get_ranges(base, served):
    prefix, so = base
    url = f"{prefix}/blobs/b1.bin"
    data = _file(served, "blobs/b1.bin")
    store = open_store(url, so)
    assert open_store(url, so) is store                 # one store (connection pool) per process
    info = store.head(url)
    assert info.size == len(data) and info.etag
    assert bytes(store.get(url)) == data
    assert bytes(store.get(url, size=len(data))) == data
    starts, ends = [0, 5, 299_000, 1000], [10, 4000, 300_000, 1001]
    got = store.get_ranges(url, starts, ends)
    assert [bytes(g) for g in got] == [data[s:e] for s, e in zip(starts, ends)]


def test_read_ranges_over_objects_in_request_order(base, served):
    prefix, so = base
    reqs = [(f"{prefix}/blobs/b{i % 3}.bin", 100 * i, 100 * i + 50 + i) for i in range(12)]
    got = read_ranges(reqs, so, indices=list(range(12)))
    want = [_file(served, f"blobs/b{i % 3}.bin")[s:e] for i, (_, s, e) in enumerate(reqs)]
    assert [bytes(g) for g in got] == want


def test_missing_object_is_one_loader_error(base):
    prefix, so = base
    url = f"{prefix}/blobs/missing.bin"
    with pytest.raises(RemoteReadError, match=r"sample 7: cannot read .*blobs/missing\.bin \(HTTP 404\)") as e:
        open_store(url, so).get_ranges(url, [0], [10], indices=[7])
    assert isinstance(e.value, LoaderError) and e.value.status == 404 and e.value.index == 7
    with pytest.raises(RemoteReadError, match="HTTP 404"):
        open_store(url, so).head(url)


def test_s3_listing_globs_prefixes_braces(moto):
    so = moto.storage_options
    b = f"s3://{BUCKET}/blobs"
    assert expand_urls(f"{b}/b{{1..3}}.bin", so) == [f"{b}/b1.bin", f"{b}/b2.bin", f"{b}/b3.bin"]
    assert expand_urls(f"{b}/*.bin", so) == [f"{b}/b{i}.bin" for i in range(6)]    # not sub/c.bin
    assert expand_urls(f"{b}/**/*.bin", so)[-1] == f"{b}/sub/c.bin"
    assert expand_urls(f"{b}/", so) == [f"{b}/b{i}.bin" for i in range(6)] + [f"{b}/sub/c.bin"]
    assert expand_urls(f"{b}/", so, suffixes=("c.bin",)) == [f"{b}/sub/c.bin"]
    with pytest.raises(FileNotFoundError, match="no object matches"):
        expand_urls(f"{b}/*.tar", so)


def test_http_has_no_listing(nginx):
    with pytest.raises(ValueError, match="brace range"):
        expand_urls(f"{nginx.url}/blobs/*.bin")
    assert expand_urls(f"{nginx.url}/blobs/b{{0..1}}.bin") == [f"{nginx.url}/blobs/b0.bin",
                                                              f"{nginx.url}/blobs/b1.bin"]


def test_aws_environment_variables(moto, served, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto.secret)
    monkeypatch.setenv("AWS_DEFAULT_REGION", moto.region)
    url = f"s3://{BUCKET}/blobs/b2.bin"
    assert bytes(open_store(url, {"max_retries": 1}).get(url)) == _file(served, "blobs/b2.bin")


def test_unknown_store_option_is_a_value_error():
    with pytest.raises(ValueError, match="cannot open s3://x"):
        RemoteStore("s3://x", __import__("loaderlib._extract.remote.options", fromlist=["StoreOptions"])
                    .StoreOptions.resolve({"no_such_option": 1}, environ={}))


def test_ranges_share_a_request_only_with_close_neighbours():
    """NOTE [ Ranges that share a request ]: groups by object, then by gaps of at most
    max(COALESCE_MIN, the median range); each group sorted by start."""
    from loaderlib._extract.remote.store import COALESCE_MIN, _range_groups

    kb = 1 << 10
    reqs = [("a", 700 * kb, 747 * kb),       # 0
            ("b", 0, 10),                    # 1
            ("a", 0, 47 * kb),               # 2
            ("a", 60 * kb, 107 * kb),        # 3: 13 KB after 2
            ("a", 107 * kb + COALESCE_MIN, 200 * kb),   # 4: exactly the gap after 3
            ("a", 300 * kb, 347 * kb)]       # 5: 100 KB after 4
    assert _range_groups(reqs) == [("a", [2, 3, 4]), ("a", [5]), ("a", [0]), ("b", [1])]
    # large ranges widen the gap allowed: reading 100 KB between two 1 MB ranges is cheaper
    # than another request
    big = [("s", 0, 1 << 20), ("s", (1 << 20) + 100 * kb, (2 << 20) + 100 * kb)]
    assert _range_groups(big) == [("s", [0, 1])]


def test_ranges_far_apart_and_close_together_come_back_exact(base, served):
    """Ranges split into several requests and ranges sharing one, over two objects, come
    back exact and in the order asked."""
    prefix, so = base
    starts = [290_000, 3, 150_000, 1_200, 80_000, 150_900, 10]
    reqs = [(f"{prefix}/blobs/b{4 + k % 2}.bin", s, s + 500 + k) for k, s in enumerate(starts)]
    got = read_ranges(reqs, so, indices=list(range(len(reqs))))
    assert [bytes(g) for g in got] == [_file(served, f"blobs/b{4 + k % 2}.bin")[s:e]
                                       for k, (_u, s, e) in enumerate(reqs)]
