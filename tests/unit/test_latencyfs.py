"""benchmarks/_latencyfs.py: the latency-injecting FUSE filesystem the storage benchmark reads
through builds, mounts, serves every byte unchanged, charges its latency and unmounts, also
when the block it serves fails. No skip: a machine where it cannot start fails here, with the
daemon's reason."""

from __future__ import annotations

import concurrent.futures
import errno
import os
import re

import numpy as np
import pytest

import loaderlib as ll
from benchmarks._latencyfs import mount
from tests._synth import encode_jpeg, photo_like


def _tree(root) -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    files = {}
    for k, size in enumerate((0, 1, 4095, 4096, 131072, 131073, 300_001)):   # around page and request sizes
        files[f"a/blob{k}.bin"] = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    for k in range(6):
        files[f"imgs/{'cd'[k % 2]}/img{k}.jpg"] = encode_jpeg(photo_like(160 + 16 * k, 120, seed=k))
    for name, data in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return files


def _served(report: str) -> dict[str, float]:
    m = re.search(r"served (\d+) opens, (\d+) reads, (\d+) bytes; slept ([0-9.]+) s", report)
    assert m, report
    return dict(zip(("opens", "reads", "bytes", "slept"), map(float, m.groups())))


def test_files_read_back_bitwise_equal_and_the_latency_is_charged(tmp_path):
    src = tmp_path / "src"
    files = _tree(src)
    with mount(src, latency_ms=1, jitter=0.5) as m:
        assert os.path.ismount(m.path)
        assert sorted(os.listdir(m.path)) == ["a", "imgs"]
        for name, data in files.items():
            with open(os.path.join(m, name), "rb") as f:
                assert f.read() == data, name
        # Unaligned positional reads and many files at once (each on its own daemon thread).
        big = os.path.join(m, "a/blob6.bin")
        fd = os.open(big, os.O_RDONLY)
        try:
            assert os.pread(fd, 70_000, 100_003) == files["a/blob6.bin"][100_003:170_003]
        finally:
            os.close(fd)

        def read(name: str) -> bytes:
            with open(os.path.join(m, name), "rb") as f:
                return f.read()

        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            names = list(files) * 4
            assert list(pool.map(read, names)) == [files[n] for n in names]
        with pytest.raises(OSError, match="Read-only file system") as e:
            os.open(os.path.join(m, "a/new.bin"), os.O_WRONLY | os.O_CREAT)
        assert e.value.errno == errno.EROFS
        assert os.stat(os.path.join(m, "a/blob6.bin")).st_size == 300_001
    assert not os.path.ismount(m.path) and not os.path.exists(m.path)
    served = _served(m.report)
    opened = len(files) + 1 + 4 * len(files)
    assert served["opens"] == opened
    assert served["bytes"] >= 5 * sum(map(len, files.values())) + 70_000
    # Half a latency at open, half at the first read: at least 0.5 x 0.5 ms per open.
    assert served["slept"] >= opened * 0.25e-3


def test_the_loader_reads_the_same_samples_through_it(tmp_path):
    src = tmp_path / "src"
    _tree(src)

    def epoch(root) -> list[np.ndarray]:
        ds = ll.ImageFolderDataset(os.path.join(root, "imgs")).transform_first(
            ll.transforms.Compose([ll.transforms.RandomResizedCrop(64), ll.transforms.RandomHorizontalFlip()]))
        loader = ll.DataLoader(ds, batch_size=2, shuffle=True, num_threads=2, seed=3)
        return [x.copy() for x, _ in loader]

    local = epoch(src)
    with mount(src, latency_ms=0.5) as m:
        remote = epoch(m.path)
    assert len(local) == len(remote) == 3
    for a, b in zip(local, remote):
        np.testing.assert_array_equal(a, b)


def test_it_unmounts_when_the_block_fails(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "x").write_bytes(b"x")
    with pytest.raises(KeyError, match="stop"), mount(tmp_path / "src", latency_ms=0) as m:
        with open(os.path.join(m, "x"), "rb") as f:
            assert f.read() == b"x"
        raise KeyError("stop")
    assert not os.path.ismount(m.path)
    assert _served(m.report)["opens"] == 1


@pytest.mark.parametrize("where", ["split", "open", "first-read", "every-read"])
def test_each_mode_charges_where_it_says(tmp_path, where):
    """The daemon's own sum of the latencies it charged (not a clock reading) lies within the
    jitter's bounds for the requests of each kind it served."""
    src = tmp_path / "src"
    src.mkdir()
    for k in range(8):
        (src / f"f{k}").write_bytes(bytes([k]) * (50_000 + 100_000 * k))   # 1 to 7 read requests each
    latency = 2.0
    with mount(src, latency_ms=latency, jitter=0.5, where=where) as m:
        for k in range(8):
            with open(os.path.join(m, f"f{k}"), "rb") as f:
                assert f.read() == bytes([k]) * (50_000 + 100_000 * k)
    s = _served(m.report)
    assert s["opens"] == 8 and s["reads"] > 8
    charges = {"split": 8 * 0.5 + 8 * 0.5, "open": 8, "first-read": 8, "every-read": s["reads"]}[where]
    lo, hi = 0.5 * charges * latency * 1e-3, 1.5 * charges * latency * 1e-3
    assert lo <= s["slept"] <= hi
