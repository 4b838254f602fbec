"""``ll.probe_storage`` and ``python -m loaderlib doctor --storage`` (NOTE [ Storage probe ]):
the statistics against numpy and a hand-worked Little's law, a real run on a temp folder and
on a shard, a FIFO that never gets a writer (the probe returns and names it), the CLI."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import threading

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import __main__ as cli
from loaderlib._extract.readahead import HEADROOM, MAX_DEPTH
from loaderlib._observe import doctor as _doctor
from loaderlib._observe.probe import (
    MIN_CPU_READS,
    CpuSample,
    LevelStats,
    StorageReport,
    cpu_sample,
    level_stats,
    loader_read_cpu_s,
    predict,
    read_cpu_s,
)
from loaderlib._observe.probe_text import format_storage_report, summary_line
from tests._synth import encode_jpeg, photo_like


def _level(c: int, files_per_s: float, mean_ms: float, own_s: float | None = None,
           busy_s: float | None = None, reads: int = 100) -> LevelStats:
    return LevelStats(concurrency=c, reads=reads, bytes=reads * 50_000, seconds=reads / files_per_s,
                      files_per_s=files_per_s, bytes_per_s=files_per_s * 50_000, latency_mean_ms=mean_ms,
                      latency_p50_ms=mean_ms, latency_p95_ms=mean_ms, latency_p99_ms=mean_ms, unanswered=0,
                      oldest_unanswered_ms=0.0, cpu_own_s=own_s, cpu_busy_s=busy_s)


def _costly(c: int, files_per_s: float, mean_ms: float, own_ms: float, others_ms: float, reads: int = 1000):
    """A level whose reads cost ``own_ms`` of this process's CPU and ``others_ms`` of other
    processes' CPU each (no background load)."""
    own = reads * own_ms / 1e3
    return _level(c, files_per_s, mean_ms, own_s=own, busy_s=own + reads * others_ms / 1e3, reads=reads)


def test_level_stats_match_numpy_nearest_rank_percentiles():
    rng = np.random.default_rng(3)
    lat = rng.lognormal(np.log(0.016), 0.5, 997).tolist()      # seconds
    s = level_stats(64, lat, 997 * 1000, seconds=2.5, waiting_s=[0.1, 3.0])
    ms = np.asarray(lat) * 1e3
    for q, got in ((50, s.latency_p50_ms), (95, s.latency_p95_ms), (99, s.latency_p99_ms)):
        assert got == pytest.approx(np.percentile(ms, q, method="inverted_cdf"))
    assert s.latency_mean_ms == pytest.approx(ms.mean())
    assert (s.reads, s.files_per_s, s.bytes_per_s) == (997, pytest.approx(997 / 2.5), pytest.approx(997_000 / 2.5))
    assert (s.unanswered, s.oldest_unanswered_ms) == (2, pytest.approx(3000.0))
    empty = level_stats(1, [], 0, 1.0, [7.0])
    assert empty.reads == 0 and empty.latency_p50_ms is None and empty.oldest_unanswered_ms == pytest.approx(7000)


def test_prediction_is_littles_law_with_the_cores_or_the_storage_as_the_limit():
    # 16 ms reads that scale: 8 in flight give 500 files/s, 64 give 4,000; cores 2,000/s.
    levels = [_level(1, 62.5, 16.0), _level(8, 500, 16.0), _level(64, 4000, 16.5), _level(256, 9000, 28.0)]
    p = predict(levels, cpu_rate=2000.0, threads=2)
    assert p["limit"] == "cores" and p["ceiling"] == 2000.0 and p["io_ceiling"] == 9000
    assert p["latency_ms"] == 16.5                       # the first level that keeps up: 64
    assert p["in_flight"] == pytest.approx(2000 * 0.0165)
    assert p["io_depth"] == math.ceil(HEADROOM * 2000 * 0.0165) + 2
    # The storage saturates at 1,200 files/s: it is the limit, at the best level's latency.
    slow = [_level(1, 60, 16.0), _level(8, 450, 17.0), _level(64, 1200, 50.0), _level(256, 1100, 230.0)]
    p = predict(slow, cpu_rate=2000.0, threads=2)
    assert (p["limit"], p["ceiling"], p["latency_ms"]) == ("storage", 1200, 50.0)
    assert p["io_depth"] == min(MAX_DEPTH, math.ceil(HEADROOM * 1200 * 0.05) + 2)
    assert predict(slow, None, 2)["ceiling"] is None
    assert predict([], 2000.0, 2)["limit"] is None


def test_level_stats_take_the_cpu_used_between_two_samples():
    s = level_stats(8, [0.01] * 10, 1000, 1.0, cpu=(CpuSample(busy=5.0, own=1.0), CpuSample(busy=5.9, own=1.25)))
    assert (s.cpu_own_s, s.cpu_busy_s) == (pytest.approx(0.25), pytest.approx(0.9))
    s = level_stats(8, [0.01] * 10, 1000, 1.0, cpu=(CpuSample(None, 1.0), CpuSample(None, 1.5)))
    assert (s.cpu_own_s, s.cpu_busy_s) == (pytest.approx(0.5), None)
    assert level_stats(8, [0.01], 1, 1.0).cpu_own_s is None
    real = cpu_sample()
    assert real.own >= 0 and (real.busy is None or real.busy >= 0)


def test_cpu_per_read_is_own_beyond_a_warm_read_plus_the_others_beyond_their_background():
    # 1,000 reads in 2 s; this process used 0.4 s, the CPUs were busy 0.9 s; a warm read costs
    # the reading threads 0.1 ms; other work ran at 0.1 CPU with nothing read.
    lv = _level(64, 500, 16.0, own_s=0.4, busy_s=0.9, reads=1000)
    assert lv.seconds == pytest.approx(2.0)
    own_ms = 0.4 / 1000 * 1e3 - 0.1                       # 0.3 ms beyond the warm read
    others_ms = (0.9 - 0.4 - 0.1 * 2.0) / 1000 * 1e3      # 0.3 ms by the storage's processes
    assert read_cpu_s(lv, warm_read_s=1e-4, background_cores=0.1) == pytest.approx((own_ms + others_ms) / 1e3)
    # Neither share goes below zero (a background busier than the level, a dearer warm read).
    assert read_cpu_s(lv, warm_read_s=1e-3, background_cores=5.0) == 0.0
    # No /proc/stat: only this process's share.
    assert read_cpu_s(_level(64, 500, 16.0, own_s=0.4, reads=1000), 1e-4, 0.0) == pytest.approx(own_ms / 1e3)
    # Too few reads to average over, or no CPU figures: not measured.
    assert read_cpu_s(_level(64, 500, 16.0, own_s=0.4, busy_s=0.9, reads=MIN_CPU_READS - 1), 0.0, 0.0) is None
    assert read_cpu_s(_level(64, 500, 16.0), 0.0, 0.0) is None


def test_cpu_per_read_lowers_the_cores_ceiling_by_the_decode_share():
    # Cores: 2,000 samples/s at 1 ms of CPU each. Reads cost 0.25 ms (0.1 here, 0.15 in the
    # storage's processes): the same CPU time buys 2,000 x 1 / 1.25 = 1,600 samples/s.
    levels = [_costly(1, 62.5, 16.0, 0.5, 0.5, reads=90), _costly(8, 500, 16.0, 0.1, 0.15),
              _costly(64, 4000, 16.5, 0.1, 0.15), _costly(256, 9000, 28.0, 0.1, 0.15)]
    p = predict(levels, cpu_rate=2000.0, threads=2, cpu_s_per_sample=1e-3)
    assert p["read_cpu_ms"] == pytest.approx(0.25) and p["sample_cpu_ms"] == pytest.approx(1.0)
    assert p["cpu_ceiling"] == pytest.approx(1600.0) and p["ceiling"] == pytest.approx(1600.0)
    assert p["limit"] == "cores" and p["io_ceiling"] == 9000
    # Little's law at the lower rate: 64 in flight is the first level that keeps up.
    assert p["latency_ms"] == 16.5 and p["in_flight"] == pytest.approx(1600 * 0.0165)
    assert p["io_depth"] == math.ceil(HEADROOM * 1600 * 0.0165) + 2
    # The CPU per read is the first level holding the depth (28 here: 64 in flight).
    assert p["cpu_level"] == 64
    # Without the CPU per sample the reads are free: the old ceiling.
    free = predict(levels, cpu_rate=2000.0, threads=2)
    assert free["ceiling"] == free["cpu_ceiling"] == 2000.0 and free["read_cpu_ms"] is None


def test_the_reads_cpu_can_make_the_cores_the_limit_where_the_storage_was():
    # The storage gives 1,800 files/s; the cores 2,000 samples/s decoding alone, but each read
    # costs 0.5 ms beside the 1 ms of decoding: 1,333 samples/s, below the storage.
    levels = [_costly(8, 600, 13.0, 0.2, 0.3), _costly(64, 1800, 35.0, 0.2, 0.3)]
    assert predict(levels, cpu_rate=2000.0, threads=2)["limit"] == "storage"
    p = predict(levels, cpu_rate=2000.0, threads=2, cpu_s_per_sample=1e-3)
    assert p["limit"] == "cores" and p["ceiling"] == pytest.approx(2000 / 1.5)
    r = StorageReport("nfs:/x", "files", 100, 100, None, tuple(levels), 2000.0, "test", 2, {**p, "cpu_rate": 2000.0},
                      (), "", 1.0)
    text = format_storage_report(r)
    assert "read CPU   0.50 ms per read, measured by the probe's reads at 64 in flight" in text
    assert "min(cores with the reads' CPU, storage)" in text
    line = summary_line(levels, {**p, "cpu_rate": 2000.0}, (), 1.0)
    assert "cost 0.50 ms of CPU each" in line and "the cores, not the storage, limit the loader" in line
    assert "about 1,333 samples/s, 2,000 if reads cost no CPU" in line
    # Cheap reads: the storage stays the limit, and the line gives the cores with the reads.
    cheap = [_costly(8, 600, 13.0, 0.0, 0.05), _costly(64, 1800, 35.0, 0.0, 0.05)]
    q = predict(cheap, cpu_rate=2000.0, threads=2, cpu_s_per_sample=1e-3)
    assert q["limit"] == "storage" and q["ceiling"] == 1800
    line = summary_line(cheap, {**q, "cpu_rate": 2000.0}, (), 1.0)
    assert "the storage, not the cores, limits the loader" in line and "the cores could do 1,905" in line


def test_the_loaders_own_cpu_per_read_through_the_storage_comes_first():
    # Measured by running the loader where the files live: 0.5 ms per sample beyond decoding
    # a warm copy. It is used over the levels' figures (the probe's Python reading threads).
    levels = [_costly(8, 500, 16.0, 0.3, 0.2), _costly(64, 4000, 16.5, 0.3, 0.2)]
    p = predict(levels, cpu_rate=2000.0, threads=2, cpu_s_per_sample=1e-3, read_s=5e-4)
    assert (p["cpu_level"], p["read_cpu_ms"]) == ("loader", pytest.approx(0.5))
    assert p["cpu_ceiling"] == pytest.approx(2000 / 1.5) and p["limit"] == "cores"
    assert p["in_flight"] == pytest.approx(2000 / 1.5 * 0.0165)
    # Without it, the levels' figures (0.5 ms as well, at 64 in flight here).
    q = predict(levels, cpu_rate=2000.0, threads=2, cpu_s_per_sample=1e-3)
    assert q["cpu_level"] == 64 and q["read_cpu_ms"] == pytest.approx(0.5)
    # Reads through the storage without a CPU per sample cannot be weighed: the cores alone.
    assert predict(levels, cpu_rate=2000.0, threads=2, read_s=5e-4)["cpu_ceiling"] == 2000.0


def test_the_storage_processes_cpu_replaces_the_machines_busy_time():
    # The machine was busy 3 s (other work), this process used 0.4 s, the storage's processes
    # 0.25 s with a background of 0.05 CPU over the level's 2 s: 0.15 ms per read from them.
    lv = dataclasses.replace(_level(64, 500, 16.0, own_s=0.4, busy_s=3.0, reads=1000), cpu_storage_s=0.25)
    assert read_cpu_s(lv, 1e-4, 0.05) == pytest.approx((0.4 - 0.1) / 1000 + (0.25 - 0.1) / 1000)


def test_the_loaders_read_cpu_is_its_own_beyond_warm_copies_plus_the_storages():
    # 500 samples in 1 s through the storage: this process used 0.75 s (1.5 ms per sample,
    # 1.2 on warm copies), the storage's processes 0.2 s over a background of 0.05 CPU.
    a = CpuSample(busy=10.0, own=2.0, storage=1.0)
    b = CpuSample(busy=12.0, own=2.75, storage=1.2)
    assert loader_read_cpu_s(1.2e-3, 500, 1.0, a, b, 0.05) == pytest.approx(0.3e-3 + 0.15 / 500)
    # No storage process found: every other process's time (busy - own) instead.
    a, b = CpuSample(busy=10.0, own=2.0), CpuSample(busy=11.0, own=2.75)
    assert loader_read_cpu_s(1.2e-3, 500, 1.0, a, b, 0.05) == pytest.approx(0.3e-3 + 0.20 / 500)
    # Cheaper than warm copies and an idle storage: nothing, never below.
    a, b = CpuSample(busy=None, own=2.0, storage=1.0), CpuSample(busy=None, own=2.5, storage=1.0)
    assert loader_read_cpu_s(1.2e-3, 500, 1.0, a, b, 0.05) == 0.0


class _FakeCpu:
    """CPU counters that advance by a fixed amount per call: ``own`` by this process, ``busy``
    by every process (None: no /proc/stat)."""

    def __init__(self, own_step: float, busy_step: float | None):
        self.own_step, self.busy_step, self.calls = own_step, busy_step, 0

    def __call__(self) -> CpuSample:
        self.calls += 1
        busy = None if self.busy_step is None else self.calls * self.busy_step
        return CpuSample(busy=busy, own=self.calls * self.own_step)


def test_a_real_run_takes_its_cpu_figures_from_the_injected_counters(tmp_path):
    _photos(tmp_path, 12)
    # Counters that never move: reads and samples cost nothing measurable, so no CPU per
    # sample and the ceiling is the cores' rate as measured.
    r = ll.probe_storage(tmp_path, seconds=3, concurrency=(1, 8), batch_size=4, num_threads=2, cpu=_FakeCpu(0.0, 0.0))
    assert r.prediction["sample_cpu_ms"] is None and r.prediction["read_cpu_ms"] is None
    assert r.prediction["cpu_ceiling"] == pytest.approx(r.cpu_rate)
    # No /proc/stat: the report says the storage's processes are not counted.
    r = ll.probe_storage(tmp_path, seconds=3, concurrency=(1, 8), batch_size=4, num_threads=2, cpu=_FakeCpu(0.01, None))
    assert any("/proc/stat" in n for n in r.notes)
    assert all(lv.cpu_busy_s is None and lv.cpu_own_s == pytest.approx(0.01) for lv in r.levels)
    # Other work keeping the CPUs busy while nothing is read is reported.
    r = ll.probe_storage(tmp_path, seconds=3, concurrency=(1, 8), batch_size=4, num_threads=2, cpu=_FakeCpu(0.0, 50.0))
    assert any("other work kept" in n for n in r.notes)
    # ... and then the CPUs' busy time is not used: it cannot tell the storage from that work.
    assert all(lv.cpu_busy_s is None for lv in r.levels)


def _photos(folder, n: int) -> list[int]:
    os.makedirs(folder, exist_ok=True)
    sizes = []
    for i in range(n):
        data = encode_jpeg(photo_like(96 + 8 * (i % 5), 80 + 4 * (i % 3), seed=i))
        with open(os.path.join(folder, f"img{i:03d}.jpg"), "wb") as f:
            f.write(data)
        sizes.append(len(data))
    return sizes


def test_a_real_run_on_a_temp_folder(tmp_path):
    sizes = _photos(tmp_path / "a", 12)
    _photos(tmp_path / "b", 12)
    r = ll.probe_storage(tmp_path, seconds=4, concurrency=(1, 8), batch_size=8, num_threads=2)
    assert r.kind == "files" and r.listed == 24 and not r.stalled
    assert [lv.concurrency for lv in r.levels] == [1, 8]
    for lv in r.levels:
        assert lv.reads > 0
        # Whole-file reads: the bytes per read are those of the files.
        assert min(sizes) * 0.5 <= lv.bytes / lv.reads <= max(sizes) * 2
        assert lv.latency_p50_ms <= lv.latency_p95_ms <= lv.latency_p99_ms
    assert r.cpu_rate and r.cpu_rate > 0 and "DataLoader" in r.cpu_source
    p = r.prediction
    assert p["cpu_ceiling"] <= r.cpu_rate and p["ceiling"] == pytest.approx(min(p["cpu_ceiling"], p["io_ceiling"]))
    assert p["limit"] in ("cores", "storage") and p["io_depth"] >= 1
    text = str(r)
    assert "p50 ms" in text and r.summary in text and "samples/s" in r.summary
    assert json.loads(json.dumps(r.to_dict()))["levels"][0]["concurrency"] == 1


def test_shards_are_read_by_range(tmp_path):
    data = encode_jpeg(photo_like(120, 90, seed=1))
    ll.write_records(tmp_path / "part", [data] * 40, [0] * 40)
    r = ll.probe_storage(tmp_path / "part.llrec", seconds=2, concurrency=(1, 4), range_bytes=10_000, cpu_rate=1500.0)
    assert r.kind == "shards" and r.range_bytes == 10_000 and r.cpu_source == "given"
    for lv in r.levels:
        assert lv.reads > 0 and lv.bytes == 10_000 * lv.reads
    assert r.prediction["ceiling"] == pytest.approx(min(1500.0, r.prediction["io_ceiling"]))


def test_a_fifo_that_never_answers_is_named_and_the_probe_returns(tmp_path):
    folder = tmp_path / "hung"
    folder.mkdir()
    fifo = folder / "never.jpg"
    os.mkfifo(fifo)
    out: list = []
    th = threading.Thread(target=lambda: out.append(ll.probe_storage(folder, seconds=2)), daemon=True)
    try:
        th.start()
        th.join(120)   # a generous bound: the probe's own limit is 2 s; a hang fails here
        assert not th.is_alive(), "probe_storage did not return on a storage that never answers"
        r = out[0]
        assert r.stalled == (str(fifo),)
        assert len(r.levels) == 1 and r.levels[0].reads == 0 and r.levels[0].unanswered == 1
        assert r.cpu_rate is None and r.prediction["ceiling"] is None
        assert "did not answer" in r.summary and str(fifo) in r.summary
    finally:
        # Release the reader left blocked in open(): a writer that opens and closes at once.
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)


def test_a_fuse_mount_that_never_answers_is_named_and_its_daemon_found(tmp_path):
    # latencyfs charging an hour at every open: a hung mount. The probe returns, names the file
    # still waiting, and found the daemon serving the mount (NOTE [ Finding the storage's
    # processes ]).
    from benchmarks._latencyfs import mount

    _photos(tmp_path / "src", 8)
    out: list = []
    with mount(str(tmp_path / "src"), 3_600_000, 0.0, where="open") as m:
        try:
            th = threading.Thread(target=lambda: out.append(ll.probe_storage(m.path, seconds=2)), daemon=True)
            th.start()
            th.join(120)   # a generous bound: the probe's own limit is 2 s; a hang fails here
            assert not th.is_alive(), "probe_storage did not return on a FUSE mount that never answers"
            r = out[0]
            assert r.stalled and r.stalled[0].startswith(m.path) and r.levels[0].reads == 0
            assert "did not answer" in r.summary and r.stalled[0] in r.summary
            assert r.cpu_rate is None and r.prediction["ceiling"] is None
            assert r.storage_processes == (f"{m.pid} latencyfs",)
        finally:
            os.kill(m.pid, signal.SIGKILL)   # the blocked opens end with the daemon's connection


def test_bad_locations_and_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ll.probe_storage(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match="no images or shards"):
        ll.probe_storage(tmp_path)
    with pytest.raises(ValueError, match="seconds must be"):
        ll.probe_storage(tmp_path, seconds=0)
    with pytest.raises(ValueError, match="concurrency must be"):
        ll.probe_storage(tmp_path, concurrency=(0,))


def test_cli_doctor_storage_json_and_errors(tmp_path, capsys):
    _photos(tmp_path, 6)
    assert cli.main(["doctor", "--storage", str(tmp_path), "--seconds", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["location"] == str(tmp_path) and [lv["concurrency"] for lv in d["levels"]][:1] == [1]
    assert {"io_ceiling", "ceiling", "io_depth", "limit"} <= set(d["prediction"]) and d["summary"]
    assert cli.main(["doctor", "--storage", str(tmp_path / "nope"), "--seconds", "1"]) == 1
    assert "nope" in capsys.readouterr().err


def test_plain_doctor_lists_the_remote_extra():
    extras = _doctor._extras()
    e = extras["obstore"]
    assert "[remote]" in e["used_for"]
    report = {"loaderlib": {"version": "0", "location": "/", "python": "3", "platform": "p"},
              "build": {"openmp": True, "libraries": {}}, "threads": {"default": 2, "reason": "r", "affinity_cpus": 2,
                                                                     "cgroup_quota_cpus": None, "os_cpu_count": 2,
                                                                     "LOCAL_WORLD_SIZE": None,
                                                                     "LOADERLIB_NUM_THREADS": None,
                                                                     "OMP_NUM_THREADS": None},
              "fork": {"start_method": "fork", "start_method_is_default": True, "at_fork_guard": True, "summary": "s"},
              "extras": {"obstore": {**e, "found": False, "version": None, "install": "pip install loaderlib[remote]"}},
              "self_check": None, "problems": []}
    text = _doctor.format_report(report)
    line = next(x for x in text.splitlines() if x.strip().startswith("obstore"))
    assert "not installed (pip install loaderlib[remote])" in line
    found = dict(report, extras={"obstore": {**e, "found": True, "version": "0.12.0"}})
    assert "0.12.0" in next(x for x in _doctor.format_report(found).splitlines() if x.strip().startswith("obstore"))
