"""Every read counts (NOTE [ Every read counts ] in pyx/include/ll_readahead.h): the Extract
figures of a profiled loader cover the reads the decode threads did themselves, not only the
read-ahead's, on the native engine and the threads engine; ``explain()`` shows the same line
as the report. The reference is the files on disk: their sizes, summed over the samples
delivered."""

from __future__ import annotations

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T
from tests._synth import encode_jpeg, photo_like

N = 48


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> tuple[list[str], list[int]]:
    root = tmp_path_factory.mktemp("reads")
    paths, sizes = [], []
    for i in range(N):
        data = encode_jpeg(photo_like(64 + 8 * (i % 7), 56 + 4 * (i % 5), seed=i))
        p = root / f"c{i % 2}" / f"img{i:03d}.jpg"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(data)
        paths.append(str(p))
        sizes.append(len(data))
    return paths, sizes


def _epoch(loader) -> int:
    n = 0
    for x, _y in loader:
        n += len(x)
    return n


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("io_depth", [None, 0])
def test_native_loader_counts_every_byte_of_the_files_it_delivered(photos, threads, io_depth):
    paths, sizes = photos
    ds = ll.ImageListDataset(paths, [0] * N).transform_first(T.Compose([T.RandomResizedCrop(32)]))
    loader = ll.DataLoader(ds, batch_size=8, shuffle=True, seed=1, num_threads=threads, profile=True,
                           io_depth=io_depth)
    try:
        assert loader.engine == "native"
        assert _epoch(loader) == N
        ex = loader.stats.extract
        assert ex is not None
        assert (ex.reads, ex.bytes) == (N, sum(sizes))
        assert ex.bytes_per_s == pytest.approx(sum(sizes) / loader.stats.elapsed_s, rel=1e-6)
        assert ex.latency_p50_ms > 0 and ex.latency_p95_ms >= ex.latency_p50_ms
        if io_depth == 0:
            assert ex.inline_reads == N and ex.inline_bytes == sum(sizes)
    finally:
        loader.close()


def test_threads_engine_counts_its_reads(photos):
    paths, sizes = photos
    ds = ll.ImageListDataset(paths, [0] * N).transform_first(lambda im: np.ascontiguousarray(im[:16, :16]))
    loader = ll.DataLoader(ds, batch_size=8, num_threads=2, profile=True)
    try:
        assert loader.engine == "threads"
        assert _epoch(loader) == N
        ex = loader.stats.extract
        assert ex is not None and (ex.reads, ex.bytes) == (N, sum(sizes))
        assert ex.bytes_per_s > 0 and ex.latency_p50_ms > 0
    finally:
        loader.close()


def test_explain_on_a_running_loader_shows_the_reports_extract_line(photos):
    paths, _sizes = photos
    loader = ll.DataLoader(ll.ImageListDataset(paths, [0] * N).transform_first(T.RandomResizedCrop(32)),
                           batch_size=8, profile=True)
    try:
        compared = 0
        for k, _batch in enumerate(loader):
            if k < 2:
                continue
            before = loader.stats.extract
            text = loader.explain()
            after = loader.stats
            if before == after.extract:   # nothing read while explain() ran: the same figures
                assert after.extract.line() in text   # the report's Extract line (profiling.report)
                compared += 1
        assert compared, "the figures never held still long enough to compare"
        assert "reads this epoch" in text and "MB/s" in text
    finally:
        loader.close()


def test_read_tally_matches_the_native_histogram_bins():
    from loaderlib._extract.readahead import ReadTally, _lat_bin

    # ll_lat_bin: 4 bins per octave of microseconds; bin b holds [2^(b/4), 2^((b+1)/4)) us.
    for us in (0.5, 1.0, 1.19, 1.2, 10.0, 16_000.0, 1e9):
        b = _lat_bin(int(us * 1000))
        lo = 0.0 if b == 0 else 2 ** (b / 4)
        assert lo <= us and (b == 95 or us < 2 ** ((b + 1) / 4)), (us, b)
    t = ReadTally()
    t.add(100, 2_000)
    t.add_batch((3, 300, 9_000, [0] * 12 + [3] + [0] * 83))
    c = t.merged(None)
    assert (c["reads"], c["bytes"], c["lat_ns"], c["inline_reads"], c["depth"]) == (4, 400, 11_000, 4, 0)
    assert sum(c["hist"]) == 4 and c["hist"][12] == 3 and c["hist"][_lat_bin(2_000)] == 1 and _lat_bin(2_000) == 4
    base = {"reads": 10, "failures": 0, "bytes": 1000, "lat_ns": 10, "cpu_ns": 0, "queue_ns": 0, "wait_ns": 0,
            "reading": 1, "depth": 16, "hist": [10] + [0] * 95}
    m = t.merged(base)
    assert (m["reads"], m["bytes"], m["depth"], m["hist"][0], m["hist"][4]) == (14, 1400, 16, 10, 1)
