"""``python -m loaderlib doctor --storage``: what a data location can deliver, before a run.

NOTE [ Storage probe ]
A bounded probe (``seconds``, 10 by default, start to report) of where the data lives: a
local folder, file or glob, or ``s3://``, ``gs://`` and ``http(s)://`` URLs read through the
remote store layer (``_extract/remote``). It lists the location, reads a sample of its files
at 1, 8, 64 and 256 reads in flight (whole files; for shards, byte ranges of one sample's
size at random offsets, as the loader reads them), each level on files the earlier levels
did not read (a page cache would otherwise answer), and times every read. Then it decodes
the bytes it read with the loader itself (a DataLoader over copies in a temporary folder,
the ImageNet training crop unless a ``transform`` is given): the rate the cores reach when
reads cost nothing.

The prediction is Little's law, the read-ahead's own rule (NOTE [ Read-ahead depth ] in
``_extract/readahead.py``): to keep the cores fed at ``rate`` samples/s with reads of mean
latency ``L``, ``rate x L`` reads must be in flight. The latency is the one measured at the
smallest level that delivered the CPU rate (latency grows with concurrency on a storage
that saturates); the IO ceiling is the most files/s any level delivered (the loader's depth
reaches ``MAX_DEPTH``, above the probe's 256); the loader's ceiling is ``min(CPU, IO)``.

The CPU side counts the reads' own CPU (NOTE [ Read CPU in the ceiling ]): the decode run
measures the cores on bytes already in memory, but every read through a FUSE daemon, a local
server or a TCP stack costs CPU on the same machine, and the loader pays it beside decoding.

Every read runs on a daemon thread and the probe never waits for one past its deadline: on
a storage that never answers (a hung mount, a FIFO without a writer, a server that accepts
and stalls) the probe stops escalating after the first level with no answer, reports the
paths still unanswered with how long they have waited, and returns on time. Those threads
are left blocked in their read; they end when it returns, and a daemon thread does not keep
the interpreter from exiting. The listing runs the same way.

NOTE [ Read CPU in the ceiling ]
The cores' rate on warm copies (``cpu_rate``, samples/s) leaves out what a read costs the
machine. On the 2-core machine with the storage's work on the same cores the default loader
reached 0.85 / 0.81 / 0.74 / 0.68 of that rate through latencyfs at 1 / 4 / 16 / 64 ms and 0.57
over HTTP behind a proxy (idle machine), and a read cost 0.27-0.47 CPU-ms through latencyfs and
about 0.9 over HTTP (the loader process beyond decoding, plus the daemon, or nginx and the
proxy), beside 1.0-1.2 ms of decoding per sample (the slow-storage guide's probe tables).

So after the decode run on warm copies the probe runs the same DataLoader for a moment over
the files where they live, at the io_depth Little's law gives (no ramp to wait through; only
when its warm-up batches fit in the time left: a batch cannot be cut), and takes per sample
this process's CPU beyond the warm run's, plus the CPU of the storage's local processes
(NOTE [ Finding the storage's processes ] in ``probe_cpu.py``; where none was found and
little other work ran, every other process's share of the busy time of this process's CPUs,
``/proc/stat``, so storage pinned to other CPUs is not counted), less what those processes used
in a quiet window before the first level. The cores' ceiling becomes ``cpu_rate x decode / (decode + read)``: the same
CPU time the decode run had, spent on both.

Where the loader run does not fit, the levels' figures stand in: per read, this process's CPU
beyond a warm read by the same reading threads (a short calibration level over the copies),
plus the storage's processes' (or the others') CPU beyond the quiet window, at the first level
holding the loader's io_depth (``MIN_CPU_READS`` reads at least), or the deepest. They
overstate this process's share: Python reading threads pay GIL wake-ups the native read-ahead
does not (0.25-0.39 ms of system time per read through latencyfs at 16 ms, 0.016-0.03 on warm
copies).

What the model leaves out: the share of the cores the loader gets where other work keeps them
busy. A loader whose IO threads sleep and wake on every read gets more of contended cores than
the decode run's two busy threads (with a load average of 10-24 on the 2 cores the default ran
at 1.5-2.4x the prediction at 16-64 ms). The report notes such load, and its ``check`` line
gives the rate the loader run through the storage reached.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .probe_cpu import CpuSample, comm, cpu_sample, storage_pids
from .probe_text import format_storage_report, summary_line

__all__ = ["CpuSample", "LevelStats", "StorageReport", "cpu_sample", "level_stats", "loader_read_cpu_s", "predict",
           "probe_storage", "read_cpu_s"]

#: Reads in flight the probe measures at.
LEVELS = (1, 8, 64, 256)
#: Shard formats: read by byte range, one sample's size at random offsets.
SHARD_SUFFIXES = (".llrec", ".tar", ".rec", ".bin")
#: Image files (``loaderlib.datasets.IMAGE_EXTENSIONS``, repeated to keep this import-light).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
#: Names the listing collects at most before sampling (a huge folder is not walked whole).
MAX_LISTED = 100_000
#: Bytes and files of read files kept for the CPU run.
CPU_BYTES, CPU_FILES = 64 << 20, 512
#: The CPU run: samples in its one epoch (the copies repeated), and batches of warm-up.
EPOCH_SAMPLES, WARMUP_BATCHES = 65536, 2
#: Shares of the budget: listing, IO levels, the CPU run on warm copies, the CPU run through
#: the storage (the rest is slack).
LIST_SHARE, IO_SHARE, CPU_SHARE, READ_SHARE = 0.2, 0.45, 0.2, 0.15
#: Reads a level needs for its CPU per read to count (NOTE [ Read CPU in the ceiling ]).
MIN_CPU_READS = 50
#: The warm calibration level: reading threads, and its share of the budget; the quiet window's share.
WARM_CONCURRENCY, WARM_SHARE, QUIET_SHARE = 8, 0.03, 0.02
#: The budget's share for finding the storage's processes (NOTE [ Finding the storage's processes ]).
FIND_SHARE = 0.02


@dataclasses.dataclass(frozen=True)
class LevelStats:
    """The reads of one concurrency level.

    Attributes
    ----------
    concurrency : int
        Reads in flight (threads reading).
    reads, bytes : int
        Reads completed in the level's time, and their bytes.
    seconds : float
        The level's wall time.
    files_per_s, bytes_per_s : float
        Completed reads and bytes over ``seconds``.
    latency_mean_ms, latency_p50_ms, latency_p95_ms, latency_p99_ms : float or None
        Time per completed read (None when none completed).
    unanswered : int
        Reads still waiting at the level's end.
    oldest_unanswered_ms : float
        How long the oldest of those had waited.
    cpu_own_s : float or None
        This process's CPU time during the level (NOTE [ Read CPU in the ceiling ]).
    cpu_busy_s : float or None
        The busy time of this process's CPUs during the level, every process's; None where
        ``/proc/stat`` cannot be read.
    cpu_storage_s : float or None
        The CPU time of the storage's local processes during the level (NOTE [ Finding the
        storage's processes ] in ``probe_cpu.py``); None when none was found.
    """

    concurrency: int
    reads: int
    bytes: int
    seconds: float
    files_per_s: float
    bytes_per_s: float
    latency_mean_ms: float | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    unanswered: int
    oldest_unanswered_ms: float
    cpu_own_s: float | None = None
    cpu_busy_s: float | None = None
    cpu_storage_s: float | None = None


def _percentile(sorted_ms: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted values (``q`` in 0..100)."""
    k = max(1, math.ceil(q / 100 * len(sorted_ms)))
    return float(sorted_ms[k - 1])


def level_stats(concurrency: int, latencies_s: Sequence[float], nbytes: int, seconds: float,
                waiting_s: Sequence[float] = (), cpu: tuple[CpuSample, CpuSample] | None = None) -> LevelStats:
    """One level's figures from its completed reads' latencies (seconds), their bytes, the
    level's wall time, the ages of the reads still waiting at its end, and the CPU samples
    taken at its start and end."""
    own = busy = storage = None
    if cpu is not None:
        a, b = cpu
        own = b.own - a.own
        busy = b.busy - a.busy if a.busy is not None and b.busy is not None else None
        storage = b.storage - a.storage if a.storage is not None and b.storage is not None else None
    ms = sorted(1e3 * x for x in latencies_s)
    n = len(ms)
    return LevelStats(concurrency=int(concurrency), reads=n, bytes=int(nbytes), seconds=float(seconds),
                      files_per_s=n / seconds if seconds > 0 else 0.0,
                      bytes_per_s=nbytes / seconds if seconds > 0 else 0.0,
                      latency_mean_ms=sum(ms) / n if n else None,
                      latency_p50_ms=_percentile(ms, 50) if n else None,
                      latency_p95_ms=_percentile(ms, 95) if n else None,
                      latency_p99_ms=_percentile(ms, 99) if n else None,
                      unanswered=len(waiting_s), oldest_unanswered_ms=1e3 * max(waiting_s, default=0.0),
                      cpu_own_s=own, cpu_busy_s=busy, cpu_storage_s=storage)


def read_cpu_s(lv: LevelStats, warm_read_s: float, background_cores: float) -> float | None:
    """CPU seconds one read of level ``lv`` costs the machine beyond a warm local read
    (NOTE [ Read CPU in the ceiling ]): this process's CPU per read less ``warm_read_s``, plus
    the storage's processes' CPU per read when they were found, else the other processes' CPU
    (busy - own - ``background_cores`` x the level's seconds) per read; None when the level
    has too few reads or no CPU figures. ``background_cores`` is the same processes' load (the
    storage's, or every other) with nothing read."""
    if lv.reads < MIN_CPU_READS or lv.cpu_own_s is None:
        return None
    own = max(0.0, lv.cpu_own_s / lv.reads - warm_read_s)
    others = 0.0
    if lv.cpu_storage_s is not None:
        others = max(0.0, (lv.cpu_storage_s - background_cores * lv.seconds) / lv.reads)
    elif lv.cpu_busy_s is not None:
        others = max(0.0, (lv.cpu_busy_s - lv.cpu_own_s - background_cores * lv.seconds) / lv.reads)
    return own + others


def predict(levels: Sequence[LevelStats], cpu_rate: float | None, threads: int,
            cpu_s_per_sample: float | None = None, warm_read_s: float = 0.0,
            background_cores: float = 0.0, read_s: float | None = None) -> dict[str, Any]:
    """The io_depth and the loader's ceiling from the levels and the CPU rate
    (NOTE [ Storage probe ], NOTE [ Read CPU in the ceiling ]).

    ``cpu_rate`` is the cores' samples/s on warm copies, ``cpu_s_per_sample`` the CPU seconds
    each of those samples took (None: reads are taken to cost no CPU), ``warm_read_s`` the
    probe's own CPU per read of a warm copy and ``background_cores`` the other processes' load
    while nothing was read (see :func:`read_cpu_s`). ``read_s``, the CPU per sample that reading
    through the storage cost the loader and the storage's processes (measured by running the
    loader there), is used when given; else the levels' CPU per read.

    Returns a dict: ``io_ceiling`` (files/s), ``cpu_ceiling`` (samples/s the cores reach
    when each sample's read costs its CPU too), ``ceiling`` (samples/s, the smaller),
    ``limit`` ("cores", "storage" or None when nothing was measured), ``latency_ms`` (the
    latency the law used), ``in_flight`` (Little's law: rate x latency), ``io_depth`` (what the
    adaptive depth settles at: the law with the read-ahead's headroom, plus one read per
    thread), ``read_cpu_ms`` (CPU per read, None when not measured), ``sample_cpu_ms`` (CPU per
    sample decoding alone) and ``cpu_level`` (the concurrency whose CPU per read was used, or
    ``"loader"`` when ``read_s`` was).
    """
    from .._extract.readahead import HEADROOM, MAX_DEPTH

    out: dict[str, Any] = {"io_ceiling": None, "cpu_ceiling": None, "ceiling": None, "limit": None,
                           "latency_ms": None, "in_flight": None, "io_depth": None, "read_cpu_ms": None,
                           "sample_cpu_ms": None if cpu_s_per_sample is None else 1e3 * cpu_s_per_sample,
                           "cpu_level": None}
    answered = [lv for lv in levels if lv.reads > 0]
    if not answered:
        return out
    best = max(answered, key=lambda lv: lv.files_per_s)
    io = best.files_per_s
    out.update(io_ceiling=io, latency_ms=best.latency_mean_ms)
    if cpu_rate is None or cpu_rate <= 0:
        return out

    def law(cores: float) -> tuple[LevelStats, float, float]:
        enough = [lv for lv in answered if lv.files_per_s >= cores]
        at = min(enough, key=lambda lv: lv.concurrency) if enough else best
        rate = min(cores, io)
        return at, rate, rate * (at.latency_mean_ms or 0.0) / 1e3

    cores = cpu_rate
    at, rate, in_flight = law(cores)
    if cpu_s_per_sample is not None and cpu_s_per_sample > 0 and read_s is not None:
        cores = cpu_rate * cpu_s_per_sample / (cpu_s_per_sample + read_s)
        at, rate, in_flight = law(cores)
        out.update(read_cpu_ms=1e3 * read_s, cpu_level="loader")
    elif cpu_s_per_sample is not None and cpu_s_per_sample > 0:
        costs = [(lv, c) for lv in answered if (c := read_cpu_s(lv, warm_read_s, background_cores)) is not None]
        if costs:
            # The first level with as many reads in flight as the loader's depth will hold, or
            # the deepest (per-read CPU grows with the threads waiting).
            want = math.ceil(HEADROOM * in_flight) + max(1, int(threads))
            lv, read_s = next(((lv, c) for lv, c in sorted(costs, key=lambda lc: lc[0].concurrency)
                               if lv.concurrency >= want), max(costs, key=lambda lc: lc[0].concurrency))
            cores = cpu_rate * cpu_s_per_sample / (cpu_s_per_sample + read_s)
            at, rate, in_flight = law(cores)
            out.update(read_cpu_ms=1e3 * read_s, cpu_level=lv.concurrency)
    depth = min(MAX_DEPTH, math.ceil(HEADROOM * in_flight) + max(1, int(threads)))
    out.update(cpu_ceiling=cores, ceiling=rate, limit="cores" if cores <= io else "storage",
               latency_ms=at.latency_mean_ms, in_flight=in_flight, io_depth=depth)
    return out


@dataclasses.dataclass(frozen=True)
class StorageReport:
    """What :func:`probe_storage` measured and predicts.

    Attributes
    ----------
    location : str
        What was probed.
    kind : str
        ``"files"`` (whole-file reads) or ``"shards"`` (byte ranges of ``range_bytes``).
    listed, sampled : int
        Files or shards found, and those read.
    levels : tuple of LevelStats
        One per concurrency measured.
    cpu_rate : float or None
        Samples/s the loader's cores reached on the read bytes (no reads), or as given.
    cpu_source : str
        How ``cpu_rate`` was obtained.
    threads : int
        The loader's thread count it was measured with.
    prediction : dict
        :func:`predict`'s result: ``io_ceiling``, ``ceiling``, ``limit``, ``latency_ms``,
        ``in_flight``, ``io_depth``.
    stalled : tuple of str
        Paths whose reads never answered within the probe (empty when all did).
    summary : str
        One line: what to expect.
    seconds : float
        The probe's wall time.
    notes : tuple of str
        Caveats (files read twice, a cut-short listing, ...).
    storage_processes : tuple of str
        ``"PID name"`` of the local processes found serving the reads, whose CPU counts per
        read (NOTE [ Finding the storage's processes ]).
    """

    location: str
    kind: str
    listed: int
    sampled: int
    range_bytes: int | None
    levels: tuple[LevelStats, ...]
    cpu_rate: float | None
    cpu_source: str
    threads: int
    prediction: dict
    stalled: tuple[str, ...]
    summary: str
    seconds: float
    notes: tuple[str, ...] = ()
    storage_processes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-serialisable data (``doctor --storage --json``)."""
        d = dataclasses.asdict(self)
        d["levels"] = [dataclasses.asdict(lv) for lv in self.levels]
        d["stalled"] = list(self.stalled)
        d["notes"] = list(self.notes)
        d["storage_processes"] = list(self.storage_processes)
        return d

    def __str__(self) -> str:
        return format_storage_report(self)


# --------------------------------------------------------------------------- listing and reading


@dataclasses.dataclass(frozen=True)
class _Target:
    """One file or shard to read: its path or URL and size (None: unknown, read whole)."""

    path: str
    size: int | None


def _kind_of(path: str) -> str:
    return "shards" if path.lower().endswith(SHARD_SUFFIXES) else "files"


def _wanted(name: str) -> bool:
    return name.lower().endswith(IMAGE_SUFFIXES + SHARD_SUFFIXES)


def _list_local(location: str) -> list[_Target]:
    import glob

    if os.path.isdir(location):
        out: list[_Target] = []
        stack = [location]
        while stack and len(out) < MAX_LISTED:
            top = stack.pop()
            with os.scandir(top) as it:
                for e in sorted(it, key=lambda e: e.name):
                    if e.is_dir(follow_symlinks=True):
                        stack.append(e.path)
                    elif _wanted(e.name):
                        out.append(_Target(e.path, None))   # sizes come with the reads
        return out
    if any(c in location for c in "*?["):
        return [_Target(p, None) for p in sorted(glob.glob(location, recursive=True))[:MAX_LISTED]
                if not os.path.isdir(p)]
    if os.path.exists(location):
        return [_Target(location, None)]
    raise FileNotFoundError(f"{location!r} does not exist")


def _list_remote(location: str, storage_options: Any) -> list[_Target]:
    from .._extract.remote.store import expand_urls
    from .._extract.remote.urls import has_glob, parse_url

    u = parse_url(location)
    listed = has_glob(u.path) or location.endswith("/") or u.path == ""
    # A listing keeps the names the probe reads; named objects are read as named.
    urls = expand_urls(location, storage_options, IMAGE_SUFFIXES + SHARD_SUFFIXES if listed else None)
    return [_Target(url, None) for url in urls[:MAX_LISTED]]   # sizes: HEAD, for shards only


class _Reader:
    """Reads one target (a whole file, or ``range_bytes`` at a random offset of a shard) and
    returns its bytes; thread-safe."""

    def __init__(self, remote: bool, kind: str, range_bytes: int, storage_options: Any) -> None:
        self.remote = remote
        self.kind = kind
        self.range_bytes = range_bytes
        self.storage_options = storage_options
        self._sizes: dict[str, int] = {}
        self._lock = threading.Lock()

    def _size(self, t: _Target) -> int:
        if t.size is not None:
            return t.size
        with self._lock:
            known = self._sizes.get(t.path)
        if known is None:
            if self.remote:
                from .._extract.remote.store import open_store

                known = open_store(t.path, self.storage_options).head(t.path).size
            else:
                known = os.stat(t.path).st_size
            with self._lock:
                self._sizes[t.path] = known
        return known

    def read(self, t: _Target, rng: random.Random) -> bytes:
        if self.kind == "shards":
            size = self._size(t)
            n = min(self.range_bytes, size)
            start = rng.randrange(0, size - n + 1)
            if self.remote:
                from .._extract.remote.store import open_store

                return bytes(open_store(t.path, self.storage_options).get_ranges(t.path, [start], [start + n])[0])
            fd = os.open(t.path, os.O_RDONLY)
            try:
                return os.pread(fd, n, start)
            finally:
                os.close(fd)
        if self.remote:
            from .._extract.remote.store import open_store

            return bytes(open_store(t.path, self.storage_options).get(t.path))
        with open(t.path, "rb") as f:
            return f.read()


def _in_thread(fn: Callable[[], Any], timeout: float) -> tuple[bool, Any]:
    """``fn()`` on a daemon thread, waited for at most ``timeout`` seconds: ``(True, result)``,
    ``(True, exception)`` when it raised, ``(False, None)`` when it did not return in time."""
    box: list = []

    def go() -> None:
        try:
            box.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box.append((True, e))

    th = threading.Thread(target=go, name="loaderlib-probe-list", daemon=True)
    th.start()
    th.join(max(0.0, timeout))
    return box[0] if box else (False, None)


class _Level:
    """``concurrency`` daemon threads reading targets from a shared cursor until ``stop``."""

    def __init__(self, reader: _Reader, targets: list[_Target], cursor: list[int], concurrency: int,
                 clock: Callable[[], float], keep: list[tuple[str, bytes]], keep_bytes: list[int]) -> None:
        self.reader = reader
        self.targets = targets
        self.cursor = cursor
        self.clock = clock
        self.keep, self.keep_bytes = keep, keep_bytes
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.nbytes = 0
        self.errors: list[str] = []
        self.end = math.inf
        self.busy: dict[int, tuple[float, str]] = {}   # thread number -> (start, path) of its read
        self.threads = [threading.Thread(target=self._run, args=(k,), name=f"loaderlib-probe-{concurrency}-{k}",
                                         daemon=True) for k in range(concurrency)]

    def _next(self) -> _Target:
        with self.lock:
            t = self.targets[self.cursor[0] % len(self.targets)]
            self.cursor[0] += 1
        return t

    def _run(self, k: int) -> None:
        rng = random.Random(k)
        # Each thread watches the deadline itself: with hundreds of threads on a few cores the
        # coordinating thread may wait long for the GIL, and no read may start after the end.
        while not self.stop.is_set() and self.clock() < self.end:
            t = self._next()
            t0 = self.clock()
            with self.lock:
                self.busy[k] = (t0, t.path)
            try:
                data = self.reader.read(t, rng)
            except Exception as e:  # noqa: BLE001 - counted and reported, the probe goes on
                with self.lock:
                    self.busy.pop(k, None)
                    self.errors.append(f"{t.path}: {type(e).__name__}: {e}")
                continue
            t1 = self.clock()
            with self.lock:
                self.busy.pop(k, None)
                if self.stop.is_set() or t1 > self.end:
                    return      # finished after the level's end: not in its time
                self.latencies.append(t1 - t0)
                self.nbytes += len(data)
                if (self.reader.kind == "files" and self.keep_bytes[0] < CPU_BYTES and len(self.keep) < CPU_FILES
                        and self.cursor[0] <= len(self.targets)):   # each file once
                    self.keep.append((t.path, data))
                    self.keep_bytes[0] += len(data)

    def run(self, seconds: float, sleep: Callable[[float], None], cpu: Callable[[], CpuSample] = cpu_sample,
            during: Callable[[], None] | None = None) -> tuple[LevelStats, list[str]]:
        """Read for ``seconds``; ``during`` is called once halfway, while reads are in flight."""
        c0 = cpu()
        start = self.clock()
        end = self.end = start + seconds
        for th in self.threads:
            th.start()
        while self.clock() < end:
            if during is not None and self.clock() >= start + seconds / 2:
                during()
                during = None
            sleep(min(0.02, max(0.0, end - self.clock())))
        with self.lock:
            self.stop.set()
            now = self.clock()
            waiting = [(now - t0, p) for t0, p in self.busy.values()]
            lats = list(self.latencies)
            nbytes = self.nbytes
        c1 = cpu()
        # Threads still inside a read are left to finish it (NOTE [ Storage probe ]).
        stats = level_stats(len(self.threads), lats, nbytes, now - start, [w for w, _ in waiting], (c0, c1))
        return stats, [p for _, p in sorted(waiting, reverse=True)]


# --------------------------------------------------------------------------- the CPU rate


def _default_chain() -> Any:
    from .. import transforms as T

    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])


@dataclasses.dataclass(frozen=True)
class _CpuRun:
    """What the decode runs measured (NOTE [ Read CPU in the ceiling ])."""

    rate: float | None
    source: str
    threads: int
    cpu_s_per_sample: float | None = None     # this process's CPU per sample decoded from warm copies
    warm_read_s: float = 0.0                  # the probe's reading threads' CPU per read of a warm copy
    read_s: float | None = None               # CPU per sample read through the storage, beyond a warm copy's
    read_rate: float | None = None            # samples/s of the loader run through the storage
    read_seconds: float = 0.0                 # its wall time, warm-up batches excluded


def _loader_cpu(paths: list[str], storage_options: Any, seconds: float, chain: Any, batch_size: int, threads: int,
                clock: Callable[[], float], cpu: Callable[[], CpuSample], io_depth: int | None = None
                ) -> tuple[int, float, CpuSample | None, CpuSample | None]:
    """A DataLoader over ``paths`` repeated for about ``seconds`` (``io_depth`` as given): the
    samples after the warm-up batches, their wall time, and the CPU samples at their start and
    end."""
    from .._datasets.images import ImageListDataset
    from ..loader import DataLoader

    t_end = clock() + seconds
    bs = max(1, min(batch_size, len(paths)))
    # One long epoch of the files repeated (no epoch boundary to refill at), as a training
    # run's epoch is; its first batches start the threads and the read-ahead: warm-up.
    many = paths * max(1, -(-EPOCH_SAMPLES // len(paths)))
    ds = ImageListDataset(many, [0] * len(many), storage_options=storage_options).transform_first(chain)
    loader = DataLoader(ds, batch_size=bs, shuffle=True, seed=0, num_threads=threads, last_batch="discard",
                        io_depth=io_depth)
    t_first = None
    c_first = c_last = None
    n = batches = 0
    try:
        while clock() < t_end:
            for x, _y in loader:
                batches += 1
                if batches <= WARMUP_BATCHES:
                    t_first, c_first = clock(), cpu()
                    continue
                n += len(x)
                if clock() >= t_end:
                    break
        c_last = cpu()
        elapsed = clock() - t_first if t_first is not None else 0.0
    finally:
        loader.close()
    return n, elapsed, c_first, c_last


def _cpu_rate(kept: list[tuple[str, bytes]], seconds: float, transform: Any, batch_size: int,
              num_threads: int | None, clock: Callable[[], float], sleep: Callable[[float], None],
              cpu: Callable[[], CpuSample], warm_s: float, read_until: float | None = None,
              read_min: float = 0.0, storage_options: Any = None, background: float = 0.0,
              levels: Sequence[LevelStats] = ()) -> _CpuRun:
    """Samples/s of a DataLoader over copies of ``kept`` in a temporary folder (the cores'
    rate when reads cost nothing), for about ``seconds``; the first batches are warm-up.
    Before it, ``warm_s`` seconds of the probe's reading threads over the copies (what a warm
    read costs them); after it, until ``read_until`` (at least ``read_min`` seconds), the same
    DataLoader over the files where they live: the CPU a read through the storage costs the
    loader and the storage's processes (NOTE [ Read CPU in the ceiling ])."""
    import tempfile

    t_end = clock() + seconds     # writing the copies, the loader's start and its warm-up count too
    from .._threads import default_num_threads

    threads = num_threads or default_num_threads()
    images = [(p, d) for p, d in kept if p.lower().endswith((".jpg", ".jpeg"))]
    if not images:
        return _CpuRun(None, "no JPEG among the files read: pass cpu_rate=", threads)
    chain = _default_chain() if transform is None else transform
    what = "RandomResizedCrop(224) + flip" if transform is None else "the given transform"
    with tempfile.TemporaryDirectory(prefix="loaderlib-probe-") as tmp:
        paths = []
        for k, (p, d) in enumerate(images):
            q = os.path.join(tmp, f"{k:06d}{os.path.splitext(p)[1].lower()}")
            with open(q, "wb") as f:
                f.write(d)
            paths.append(q)
        warm = _Level(_Reader(False, "files", 1, None), [_Target(q, None) for q in paths], [0], WARM_CONCURRENCY,
                      clock, [], [CPU_BYTES])
        wl, _ = warm.run(warm_s, sleep, cpu)
        warm_read_s = wl.cpu_own_s / wl.reads if wl.reads and wl.cpu_own_s is not None else 0.0
        n, elapsed, c_first, c_last = _loader_cpu(paths, None, t_end - clock(), chain, batch_size, threads, clock, cpu)
    if n == 0 or elapsed <= 0 or c_first is None or c_last is None:
        return _CpuRun(None, f"the decode run of {len(paths)} image(s) did not finish a batch in time", threads)
    own = c_last.own - c_first.own
    per_sample = own / n if own > 0 else None
    source = f"a DataLoader with {what} over {len(paths)} of the files read, from a temporary copy: no read cost"
    read_s = read_rate = None
    read_seconds = 0.0
    rate = n / elapsed
    law = predict(levels, rate, threads)
    # The read-ahead at the depth Little's law gives (no ramp to wait through), and only when
    # its warm-up batches fit in the time left: the run cannot be cut inside a batch.
    bs = max(1, min(batch_size, len(images)))
    lat_s = (law["latency_ms"] or 0.0) / 1e3
    needed = lat_s + (WARMUP_BATCHES + 2) * bs * max(lat_s / max(1, law["io_depth"] or 1), 1 / rate)
    if read_until is not None and per_sample is not None and clock() + needed <= read_until:
        m, el, r0, r1 = _loader_cpu([p for p, _d in images], storage_options, max(read_min, read_until - clock()),
                                    chain, batch_size, threads, clock, cpu, law["io_depth"])
        if m > 0 and el > 0 and r0 is not None and r1 is not None:
            read_s = loader_read_cpu_s(per_sample, m, el, r0, r1, background)
            read_rate, read_seconds = m / el, el
    return _CpuRun(rate, source, threads, per_sample, warm_read_s, read_s, read_rate, read_seconds)


def loader_read_cpu_s(per_sample: float, samples: int, seconds: float, first: CpuSample, last: CpuSample,
                      background_cores: float) -> float:
    """CPU seconds per sample that reading through the storage cost, from a loader run there
    of ``samples`` in ``seconds`` between the CPU samples ``first`` and ``last`` (NOTE [ Read
    CPU in the ceiling ]): this process's CPU per sample beyond ``per_sample`` (the same loader
    on warm copies), plus the storage's processes' CPU (or, where none was found, every other
    process's: busy - own) beyond ``background_cores``, per sample."""
    mine = last.own - first.own
    theirs = 0.0
    if first.storage is not None and last.storage is not None:
        theirs = last.storage - first.storage
    elif first.busy is not None and last.busy is not None:
        theirs = last.busy - first.busy - mine
    return max(0.0, mine / samples - per_sample) + max(0.0, (theirs - background_cores * seconds) / samples)


# --------------------------------------------------------------------------- the probe


def probe_storage(location: str | os.PathLike | Sequence[str | os.PathLike], *, seconds: float = 10.0, storage_options: dict | None = None,
                  transform: Any = None, batch_size: int = 64, num_threads: int | None = None,
                  cpu_rate: float | None = None, range_bytes: int = 128 << 10,
                  concurrency: Sequence[int] = LEVELS, seed: int = 0,
                  clock: Callable[[], float] = time.perf_counter,
                  sleep: Callable[[float], None] = time.sleep,
                  cpu: Callable[[], CpuSample] | None = None) -> StorageReport:
    """Measure where the data lives, and predict the loader's io_depth and ceiling there.

    Reads a sample of the files (or shards) at 1, 8, 64 and 256 reads in flight, times every
    read, measures the loader's rate on the cores with the bytes read, and applies Little's
    law (NOTE [ Storage probe ]). Bounded: it returns within about ``seconds`` also when the
    storage never answers, naming the paths still waiting (their reads are left on daemon
    threads). ``python -m loaderlib doctor --storage LOCATION`` prints the same report.

    Parameters
    ----------
    location : str, os.PathLike or sequence of them
        A folder (walked for images and shards), a file, a glob, or a URL: ``s3://``,
        ``gs://`` (a key, a prefix ending in ``/`` or a glob) or ``http(s)://`` (a file or a
        brace range such as ``part-{0000..0099}.tar``); or a list of files or URLs (an
        ``ImageListDataset``'s paths).
    seconds : float
        The probe's time budget, listing and the CPU run included (default 10).
    storage_options : dict, optional
        For URLs: boto3's names (``endpoint_url``, ...), as the datasets take them.
    transform : optional
        The chain the loader will run, to measure its CPU rate (default:
        ``RandomResizedCrop(224)`` + ``RandomHorizontalFlip()``, uint8).
    batch_size : int
        The loader's batch size for the CPU run.
    num_threads : int, optional
        The loader's threads (default: ``loaderlib.default_num_threads()``).
    cpu_rate : float, optional
        Samples/s the loader reaches on warm data, when known: skips the CPU run (needed for
        shards, whose samples the probe does not decode).
    range_bytes : int
        Shards: the bytes of one read (one sample's size).
    concurrency : sequence of int
        Reads in flight to measure at.
    seed : int
        Which files are sampled.
    clock, sleep : callable
        Seconds and waiting (tests inject their own).
    cpu : callable, optional
        Returns a :class:`CpuSample`, the CPU time used so far (default: this process's, its
        CPUs' and the storage's local processes' found by ``storage_pids``; tests inject their
        own; NOTE [ Read CPU in the ceiling ]).

    Returns
    -------
    StorageReport
        ``levels`` (latency p50/p95/p99, bytes/s and files/s per concurrency),
        ``cpu_rate``, ``prediction`` (``io_depth``, ``ceiling``, ``limit``), ``stalled``,
        ``summary``; ``str(report)`` is the text ``doctor --storage`` prints and
        ``report.to_dict()`` its JSON.

    Raises
    ------
    FileNotFoundError
        Nothing to read at ``location``.
    ValueError
        A bad argument.

    Examples
    --------
    >>> report = ll.probe_storage("photos/", seconds=5)      # doctest: +SKIP
    >>> print(report.summary)                                 # doctest: +SKIP
    reads are 16 ms; with 34 in flight the cores, not the storage, limit the loader ...
    """
    from .._extract.remote.urls import is_url

    if not (isinstance(seconds, (int, float)) and 0 < seconds <= 3600):
        raise ValueError(f"seconds must be in (0, 3600], got {seconds!r}")
    levels_wanted = [int(c) for c in concurrency]
    if not levels_wanted or any(c < 1 or c > 4096 for c in levels_wanted):
        raise ValueError(f"concurrency must be reads in flight between 1 and 4096, got {list(concurrency)!r}")
    if range_bytes < 1:
        raise ValueError(f"range_bytes must be positive, got {range_bytes!r}")
    given = None if isinstance(location, (str, os.PathLike)) else [os.fspath(p) for p in location]
    if given is not None and not given:
        raise ValueError("an empty list of files to probe")
    where = os.fspath(location) if given is None else f"{given[0]} and {len(given) - 1} more file(s)"
    remote = is_url(where if given is None else given[0])
    t_start = clock()
    deadline = t_start + seconds
    notes: list[str] = []
    if given is not None:
        done, listed = True, [_Target(p, None) for p in given]
    else:
        done, listed = _in_thread((lambda: _list_remote(where, storage_options)) if remote else
                                  (lambda: _list_local(where)), LIST_SHARE * seconds)
    if not done:
        report = StorageReport(where, "files", 0, 0, None, (), None, "not measured", num_threads or 0,
                               predict((), None, 1), (where,),
                               f"the storage did not answer: listing {where} took more than "
                               f"{LIST_SHARE * seconds:.1f} s (a hung mount or a stalled server)",
                               clock() - t_start)
        return report
    if isinstance(listed, BaseException):
        raise listed
    if not listed:
        raise FileNotFoundError(f"no images or shards at {where!r} (looked for {', '.join(IMAGE_SUFFIXES + SHARD_SUFFIXES)})")
    if len(listed) >= MAX_LISTED:
        notes.append(f"the listing stopped at {MAX_LISTED:,} names; the sample is drawn from those")
    kinds = {_kind_of(t.path) for t in listed}
    kind = "shards" if kinds == {"shards"} else "files"
    targets = [t for t in listed if _kind_of(t.path) == kind]
    random.Random(seed).shuffle(targets)
    reader = _Reader(remote, kind, int(range_bytes), storage_options)
    cursor = [0]
    kept: list[tuple[str, bytes]] = []
    kept_bytes = [0]
    # NOTE [ Finding the storage's processes ]: once before reading, and once while reads are
    # in flight (a proxy connects to the server behind it only then); a process found late
    # counts from the next level on.
    pids: list[tuple[int, ...]] = [()]
    late: list[tuple[int, ...]] = []
    rediscover: Callable[[], None] | None = None
    if cpu is None:
        first = targets[0].path
        # Bounded: a URL's host name is resolved (a stalled resolver must not hold the probe).
        done, found = _in_thread(lambda: storage_pids(first), FIND_SHARE * seconds)
        pids[0] = found if done and isinstance(found, tuple) else ()
        rediscover = functools.partial(lambda out: out.append(storage_pids(first)), late)

        def sample() -> CpuSample:
            return cpu_sample(pids[0])

        cpu = sample
    # The storage's (or every other process's) load with nothing read (NOTE [ Read CPU in the
    # ceiling ]).
    q0, t0 = cpu(), clock()
    sleep(QUIET_SHARE * seconds)
    q1, t1 = cpu(), clock()
    dt = max(t1 - t0, 1e-9)
    others = None if q0.busy is None or q1.busy is None else max(0.0, (q1.busy - q0.busy - (q1.own - q0.own)) / dt)
    background = others or 0.0
    if q0.storage is not None and q1.storage is not None:
        background = max(0.0, (q1.storage - q0.storage) / dt)
        others = None if others is None else max(0.0, others - background)
    elif q0.busy is None:
        notes.append("the machine's CPU time could not be read (/proc/stat) and no local process serves the reads: "
                     "only this process's CPU per read is in the ceiling")
    if others is not None and others >= 0.5:
        notes.append(f"other work kept {others:.1f} CPU(s) busy while nothing was read: the CPU per read counts this "
                     "process and the storage's processes only (the CPUs' busy time cannot tell the storage's work "
                     "from the other work's), and the loader's share of the cores may differ from the probe's")
        # NOTE [ Finding the storage's processes ]: under load the busy time is not used.
        counted = cpu

        def unbusy() -> CpuSample:
            return dataclasses.replace(counted(), busy=None)

        cpu = unbusy
    io_left = max(0.0, min(IO_SHARE * seconds, deadline - clock() - (CPU_SHARE + READ_SHARE) * seconds))
    per_level = io_left / len(levels_wanted)
    levels: list[LevelStats] = []
    stalled: list[str] = []
    errors: list[str] = []
    for c in levels_wanted:
        lv = _Level(reader, targets, cursor, c, clock, kept, kept_bytes)
        stats, waiting = lv.run(per_level, sleep, cpu, rediscover if c >= 8 and not late else None)
        if late:
            pids[0] = tuple(sorted(set(pids[0]) | set(late[-1])))
        levels.append(stats)
        errors += lv.errors
        if stats.reads == 0:
            stalled = waiting
            break   # a storage that answers nothing gets no more threads (NOTE [ Storage probe ])
    if errors:
        notes.append(f"{len(errors)} read(s) failed, first: {errors[0]}")
    if kind == "files" and cursor[0] > len(targets):
        notes.append(f"{cursor[0]:,} reads of {len(targets):,} files: some were read twice, and a page cache may "
                     "have answered those")
    threads = num_threads or 0
    source = "given"
    rate = cpu_rate
    run = _CpuRun(rate, source, threads)
    if rate is None and not stalled:
        cpu_s = max(0.5 * CPU_SHARE * seconds, deadline - clock() - READ_SHARE * seconds)
        run = _cpu_rate(kept, cpu_s, transform, batch_size, num_threads, clock, sleep, cpu,
                        min(WARM_SHARE * seconds, 0.25 * cpu_s), read_until=deadline,
                        read_min=0.5 * READ_SHARE * seconds, storage_options=storage_options, background=background,
                        levels=levels)
        rate, source, threads = run.rate, run.source, run.threads
    elif stalled:
        source = "not measured: the storage did not answer"
    if not threads:
        from .._threads import default_num_threads

        threads = default_num_threads()
    pred = predict(levels, rate, threads, run.cpu_s_per_sample, run.warm_read_s, background, read_s=run.read_s)
    pred["cpu_rate"] = rate
    # What the loader ran at through the storage meanwhile: a check of the ceiling, not the
    # ceiling (short, on files the levels just read; NOTE [ Read CPU in the ceiling ]).
    pred["loader_rate"] = run.read_rate
    pred["loader_seconds"] = run.read_seconds
    summary = summary_line(levels, pred, stalled, clock() - t_start)
    return StorageReport(location=where, kind=kind, listed=len(listed), sampled=min(cursor[0], len(targets)),
                         range_bytes=int(range_bytes) if kind == "shards" else None, levels=tuple(levels),
                         cpu_rate=rate, cpu_source=source, threads=threads, prediction=pred,
                         stalled=tuple(stalled), summary=summary, seconds=clock() - t_start, notes=tuple(notes),
                         storage_processes=tuple(f"{p} {comm(p)}" for p in pids[0]))
