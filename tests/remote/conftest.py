"""Servers for the remote-storage tests, started by the tests on 127.0.0.1: nginx serving a
folder, moto's S3 server with a bucket holding the same files, and a fault-injecting proxy
in front of nginx. A server that cannot start fails the test with the reason."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from benchmarks._servers import FaultProxy, MotoServer, NginxServer

BUCKET = "lldata"


def _payload(n: int, seed: int) -> bytes:
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


@pytest.fixture(scope="session")
def served(tmp_path_factory) -> str:
    """The folder both servers serve: ``blobs/b{0..5}.bin`` (300 KB each, distinct bytes)
    and ``blobs/sub/c.bin``. Tests that need their own files put them in a sub-folder."""
    root = str(tmp_path_factory.mktemp("served"))
    os.makedirs(os.path.join(root, "blobs", "sub"))
    for i in range(6):
        with open(os.path.join(root, "blobs", f"b{i}.bin"), "wb") as f:
            f.write(_payload(300_000, i))
    with open(os.path.join(root, "blobs", "sub", "c.bin"), "wb") as f:
        f.write(_payload(1000, 99))
    return root


@pytest.fixture(scope="session")
def nginx(served):
    server = NginxServer(served)
    yield server
    server.close()


@pytest.fixture(scope="session")
def moto(served):
    server = MotoServer()
    server.upload_folder(BUCKET, served)
    yield server
    server.close()


@pytest.fixture
def proxy(nginx):
    p = FaultProxy(nginx.url)
    yield p
    p.close()


# Fast, bounded retries for the fault tests (the defaults wait up to 15 s between tries).
FAST = {"max_retries": 3, "backoff": 0.01, "max_backoff": 0.05, "timeout": 5.0}


N = 24   # the JPEGs of ds_root


@pytest.fixture(scope="session")
def ds_root(served, moto):
    """Under served/ds: record shards, WebDataset tars and a class-folder tree of the same
    JPEGs; uploaded to the bucket too (nginx serves the folder as it is)."""
    import cv2
    import numpy as np

    import loaderlib as ll
    from tests.unit.test_recordio import _write

    root = os.path.join(served, "ds")
    rng = np.random.default_rng(7)
    jpegs = []
    for i in range(N):
        img = rng.integers(0, 256, (40 + 3 * (i % 7), 52 + 5 * (i % 4), 3), dtype=np.uint8)
        img = cv2.GaussianBlur(img, (5, 5), 0)
        jpegs.append(cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 85])[1].tobytes())
    labels = [i % 3 for i in range(N)]
    os.makedirs(os.path.join(root, "rec"))
    ll.write_records(os.path.join(root, "rec", "part"), jpegs, labels, shard_size=len(b"".join(jpegs)) // 3)
    os.makedirs(os.path.join(root, "wds"))
    for s in range(3):
        with tarfile.open(os.path.join(root, "wds", f"train-{s:04d}.tar"), "w") as tf:
            for i in range(s * 8, s * 8 + 8):
                for ext, data in (("jpg", jpegs[i]), ("cls", str(labels[i]).encode())):
                    info = tarfile.TarInfo(f"s{i:04d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    for i, data in enumerate(jpegs):
        d = os.path.join(root, "folder", f"class{labels[i]}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"img{i:03d}.jpg"), "wb") as f:
            f.write(data)
    os.makedirs(os.path.join(root, "mx"))
    _write(Path(root) / "mx", "train", labels, jpegs)
    _write(Path(root) / "mx", "multi", [[float(i), i / 2] for i in range(N)], jpegs)     # several float labels
    _write(Path(root) / "mx", "noidx", labels, jpegs, with_idx=False)
    moto.upload_folder(BUCKET, root, prefix="ds/")
    return root
