"""Servers for the remote-storage tests, started by the tests on 127.0.0.1: nginx serving a
folder, moto's S3 server with a bucket holding the same files, and a fault-injecting proxy
in front of nginx. A server that cannot start fails the test with the reason."""

from __future__ import annotations

import os

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
