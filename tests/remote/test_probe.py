"""``ll.probe_storage`` over HTTP (nginx) and S3 (moto's server) through the remote store layer:
whole objects for images, byte ranges for shards, the bytes per read those of the objects."""

from __future__ import annotations

import os

import pytest

import loaderlib as ll
from tests._synth import encode_jpeg, photo_like
from tests.remote.conftest import BUCKET, FAST


def _photos(folder: str, n: int) -> list[int]:
    os.makedirs(folder, exist_ok=True)
    sizes = []
    for i in range(n):
        data = encode_jpeg(photo_like(96 + 8 * (i % 5), 80, seed=i))
        with open(os.path.join(folder, f"img{i:03d}.jpg"), "wb") as f:
            f.write(data)
        sizes.append(len(data))
    return sizes


def test_http_objects_by_brace_range(served, nginx):
    sizes = _photos(os.path.join(served, "probe-http"), 10)
    r = ll.probe_storage(f"{nginx.url}/probe-http/img{{000..009}}.jpg", seconds=4, concurrency=(1, 8),
                         storage_options=FAST, batch_size=4, num_threads=2)
    assert r.listed == 10 and r.kind == "files" and not r.stalled
    for lv in r.levels:
        assert lv.reads > 0 and min(sizes) <= lv.bytes / lv.reads <= max(sizes)
    p = r.prediction
    assert r.cpu_rate and p["cpu_ceiling"] <= r.cpu_rate
    assert p["ceiling"] == pytest.approx(min(p["cpu_ceiling"], p["io_ceiling"]))


def test_s3_prefix_listing_and_shard_ranges(served, moto, ds_root):
    so = {**moto.storage_options, **FAST}
    r = ll.probe_storage(f"s3://{BUCKET}/ds/rec/", seconds=3, concurrency=(1, 4), storage_options=so,
                         range_bytes=500, cpu_rate=1000.0)
    assert r.kind == "shards" and r.listed == len([n for n in os.listdir(os.path.join(ds_root, "rec"))
                                                   if n.endswith(".llrec")])
    for lv in r.levels:
        assert lv.reads > 0 and lv.bytes == 500 * lv.reads
