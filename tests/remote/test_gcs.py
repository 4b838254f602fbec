"""gs:// URLs, read through obstore's GCS client against a real server on 127.0.0.1: moto's,
whose S3 interface answers the requests GCS's XML API makes (GET and HEAD of
``{base_url}/{bucket}/{object}``, ranged GETs, ``list-type=2`` listings). The objects are
public-read and the requests unsigned (``anon``), the way a public bucket is read, since an
emulator has no Google credentials; ``base_url`` points the client at the server, as it
would at any GCS emulator. Same samples, same order, bitwise, as the local files."""

from __future__ import annotations

import numpy as np
import pytest

import loaderlib as ll
from loaderlib.errors import RemoteReadError
from tests.remote.conftest import FAST, N
from tests.remote.test_datasets import _batches, _loader, _make, _same

GCS_BUCKET = "llgcs"


@pytest.fixture(scope="module")
def gcs(ds_root, moto):
    """``(url_root, storage_options)`` of the ds_root tree in a public-read bucket."""
    moto.upload_folder(GCS_BUCKET, ds_root, prefix="ds/", acl="public-read")
    return f"gs://{GCS_BUCKET}/ds", {"base_url": moto.endpoint_url, "anon": True, **FAST}


@pytest.mark.parametrize("kind, cache", [("records", False), ("records", True), ("webdataset", False),
                                         ("list", False), ("folder", False), ("recordio", False)])
def test_gs_dataset_equals_local(ds_root, gcs, tmp_path, kind, cache):
    url_root, so = gcs
    local, remote = _make(kind, (ds_root, url_root), so, str(tmp_path / "cache") if cache else None)
    assert len(remote) == len(local) == N
    np.testing.assert_array_equal(np.asarray(remote.labels), np.asarray(local.labels))
    a, b = _loader(local, "native"), _loader(remote, "native")
    assert a.engine == b.engine == "native"
    _same(_batches(a), _batches(b))
    np.testing.assert_array_equal(remote[7][0], local[7][0])
    getattr(remote, "close", lambda: None)()


def test_gs_glob_lists_the_bucket(ds_root, gcs):
    url_root, so = gcs
    ds = ll.RecordFileDataset(f"{url_root}/rec/part-*.llrec", storage_options=so)
    local = ll.RecordFileDataset(f"{ds_root}/rec/part-*.llrec")
    assert len(ds) == len(local) == N
    assert [bytes(b) for b in ds.buffers([0, 11, N - 1])] == [local.read(i) for i in (0, 11, N - 1)]


def test_gs_missing_object_is_one_error_naming_the_url(gcs):
    url_root, so = gcs
    with pytest.raises(RemoteReadError, match=r"cannot read gs://llgcs/ds/rec/nope\.llrec"):
        ll.RecordFileDataset(f"{url_root}/rec/nope.llrec", storage_options=so)
