"""WebDataset sidecar indexes over HTTP (NOTE [ WebDataset sidecar index ] in
loaderlib/_extract/wds_index.py): with a ``.idx`` beside each shard, an uncached remote
WebDataset opens without a whole-shard request and reads the same samples as the local
shards; a malformed or mismatched ``.idx`` is an error naming it. A request-recording proxy
in front of nginx counts the requests."""

from __future__ import annotations

import os
import re
import shutil

import numpy as np
import pytest

import loaderlib as ll
from loaderlib._extract.wds_index import SidecarError
from tests.remote.conftest import FAST
from tests.remote.test_datasets import _batches, _loader, _same
from tests.unit.test_webdataset import _jpeg


@pytest.fixture
def shards(served):
    """Three shards of 8 labelled JPEGs each, with their .idx, in a folder of their own."""
    root = os.path.join(served, f"wdsidx-{os.getpid()}")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    rng = np.random.default_rng(5)
    images = [_jpeg(rng, 64 + k % 5, 80 + 3 * (k % 4)) for k in range(24)]   # about 10 KB each
    labels = [k % 5 for k in range(24)]
    paths = ll.write_webdataset(os.path.join(root, "train"), images, labels, shard_size=8 * min(map(len, images)))
    yield root, paths, images, labels
    shutil.rmtree(root, ignore_errors=True)


def _shard_requests(proxy, root: str) -> list[tuple[str, str, str | None]]:
    return [r for r in proxy.requests if r[1].endswith(".tar") and os.path.basename(root) in r[1]]


def _range_bytes(rng: str | None) -> int:
    m = re.fullmatch(r"bytes=(\d+)-(\d+)", rng or "")
    assert m, rng
    return int(m.group(2)) - int(m.group(1)) + 1


def test_no_whole_shard_request_when_an_index_exists(shards, proxy):
    root, paths, images, labels = shards
    assert len(paths) >= 3 and all(os.path.exists(p[:-4] + ".idx") for p in paths)
    spec = f"{proxy.url}/{os.path.basename(root)}/train-{{00000..{len(paths) - 1:05d}}}.tar"
    ds = ll.WebDataset(spec, storage_options=dict(FAST))
    opened = _shard_requests(proxy, root)
    gets = [r for r in opened if r[0] == "GET"]
    assert gets and all(r[2] is not None for r in gets), "a shard was requested whole"
    shard_bytes = min(os.path.getsize(p) for p in paths)
    # Only tar headers and label members were read: a few hundred bytes per request.
    assert max(_range_bytes(r[2]) for r in gets) <= 512
    assert sum(_range_bytes(r[2]) for r in gets) < shard_bytes / 4
    local = ll.WebDataset(paths)
    assert ds.keys == local.keys and np.array_equal(ds.labels, local.labels) and np.array_equal(ds.labels, labels)
    assert np.array_equal(ds.offsets, local.offsets) and np.array_equal(ds.sizes, local.sizes)
    assert [ds.read(i) for i in range(len(ds))] == images
    _same(_batches(_loader(local, "native")), _batches(_loader(ds, "native")))
    assert all(r[2] is not None for r in _shard_requests(proxy, root) if r[0] == "GET")


def test_without_an_index_the_shard_is_read_whole(shards, proxy):
    """The control: the proxy does see the whole-shard request when there is no .idx."""
    root, paths, _images, _labels = shards
    os.unlink(paths[0][:-4] + ".idx")
    ds = ll.WebDataset(f"{proxy.url}/{os.path.basename(root)}/{os.path.basename(paths[0])}",
                       storage_options=dict(FAST))
    assert len(ds) == len(ll.WebDataset(paths[0]))
    assert any(r[0] == "GET" and r[2] is None for r in _shard_requests(proxy, root))


@pytest.mark.parametrize("damage, match", [
    (lambda text, other: "v9 3\n" + text.split("\n", 1)[1], r"not a WebDataset index \(first line 'v9 3'"),
    (lambda text, other: re.sub(r"^v1\.2 (\d+)", lambda m: f"v1.2 {int(m.group(1)) + 1}", text),
     r"the header says (\d+) samples but (?!\1)\d+ lines follow"),
    (lambda text, other: text.replace("\njpg ", "\njpg x", 1), r"line 2: offset 'x\d+' and size '\d+' must be integers"),
    (lambda text, other: other, r"the shard's member at \d+ is '\d+\.jpg' of \d+ bytes, the index says"),
], ids=["version", "count", "field", "another shard's index"])
def test_a_corrupt_or_mismatched_index_is_an_error_naming_it(shards, proxy, damage, match):
    root, paths, _images, _labels = shards
    idx, other = paths[0][:-4] + ".idx", paths[1][:-4] + ".idx"
    with open(idx) as f, open(other) as g:
        text, other_text = f.read(), g.read()
    with open(idx, "w") as f:
        f.write(damage(text, other_text))
    url = f"{proxy.url}/{os.path.basename(root)}/{os.path.basename(paths[0])}"
    with pytest.raises(SidecarError, match=re.escape(url[:-4] + ".idx") + ".*" + match):
        ll.WebDataset(url, storage_options=dict(FAST))
