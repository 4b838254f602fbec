"""How should a read-ahead stage issue its reads: a pool of native threads doing blocking
``open/fstat/pread/close``, or io_uring? Measured with ``benchmarks/io_mechanism.c`` on the
loader benchmark's photos, on warm local files and through latencyfs (per-file latency with
+-50% jitter, page cache bypassed), for D = 1, 4, 16, 64, 256 files in flight.

Mechanisms (each in a fresh process; see io_mechanism.c):

* ``threads``: D pthreads, blocking calls;
* ``uring``: one thread, one ring, OPENAT -> fstat -> READ -> CLOSE, each completion submits the
  next step;
* ``uring+async``: the same with IOSQE_ASYNC (every request goes to io_uring's workers at once);
* ``uring+async+wq``: and the ring's worker limits raised to D (IORING_REGISTER_IOWQ_MAX_WORKERS);
* ``linked+async+wq``: one linked OPENAT(direct) -> READ(1 MiB) -> CLOSE per file, no fstat.

Reports files/s and CPU microseconds per file: of the reading process (all its threads,
io_uring's workers included) and, through latencyfs, of the FUSE daemon too.

Usage::

    python benchmarks/io_mechanism.py                       # 4 ms, 3 interleaved rounds
    python benchmarks/io_mechanism.py --latency 4 --depths 1,16,64 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

from _latencyfs import BIN_DIR, mount
from _photos import add_data_kind, photos_for
from _report import machine_summary, med
from loader import image_files

HERE = os.path.dirname(os.path.abspath(__file__))

SOURCE = os.path.join(HERE, "io_mechanism.c")
MECHANISMS = {   # name -> io_mechanism.c flags; "{d}" is the depth
    "threads": ["--mode=threads"],
    "uring": ["--mode=uring"],
    "uring+async": ["--mode=uring", "--force-async"],
    "uring+async+wq": ["--mode=uring", "--force-async", "--iowq-max={d}"],
    "linked+async+wq": ["--mode=uring-linked", "--force-async", "--iowq-max={d}"],
}


def _have_liburing() -> bool:
    return subprocess.run(["pkg-config", "--exists", "liburing"], check=False).returncode == 0


def build() -> str:
    """Compile io_mechanism.c (installing Debian's liburing-dev with apt-get when missing)."""
    exe = os.path.join(BIN_DIR, "io_mechanism")
    if os.path.exists(exe) and os.path.getmtime(exe) >= os.path.getmtime(SOURCE):
        return exe
    if not _have_liburing() and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        cmd = ["apt-get", "install", "-y", "-q", "liburing-dev", "pkg-config"]
        if subprocess.run(cmd, env=env, capture_output=True, check=False).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
            subprocess.run(cmd, env=env, capture_output=True, check=False)
    if not _have_liburing():
        sys.exit("liburing is missing: apt-get install liburing-dev")
    os.makedirs(BIN_DIR, exist_ok=True)
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "liburing"], capture_output=True, text=True,
                           check=True).stdout.split()
    tmp = f"{exe}.{os.getpid()}.tmp"
    subprocess.run(["cc", "-O2", "-Wall", "-Wextra", "-o", tmp, SOURCE, "-lpthread", *flags], check=True)
    os.replace(tmp, exe)
    return exe


def _cpu(pid: int) -> float:
    """CPU seconds of a process's live threads, in nanoseconds from the scheduler (the clock
    ticks of /proc/PID/stat are 10 ms: coarser than a short run's whole share). The daemon
    keeps its threads (latencyfs.c: idle threads = max threads), so none of its time leaves."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def run_one(exe: str, mech: str, depth: int, files: int, listing: str, daemon: int | None) -> dict:
    flags = [f.format(d=depth) for f in MECHANISMS[mech]]
    before = _cpu(daemon) if daemon else 0.0
    out = subprocess.run([exe, *flags, f"--depth={depth}", f"--files={files}", listing], capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"io_mechanism {mech} D={depth} failed: {out.stderr.strip()}")
    res = json.loads(out.stdout)
    res["daemon_us_per_file"] = (_cpu(daemon) - before) * 1e6 / files if daemon else 0.0
    return res


def files_for(depth: int, latency_ms: float, n: int) -> int:
    """Enough files that ramp-up is small against the run, few enough that D = 1 at 16 ms ends."""
    if latency_ms <= 0:
        return max(4 * n, 2048)
    return min(max(128, 32 * depth), 4 * n)


def measure(exe: str, paths: list[str], latency_ms: float, depths: list[int], repeat: int,
            daemon: int | None) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".list", delete=False) as f:
        f.write("\n".join(paths) + "\n")
        listing = f.name
    try:
        runs: dict = {}
        for _ in range(repeat):
            for d in depths:
                for mech in MECHANISMS:
                    r = run_one(exe, mech, d, files_for(d, latency_ms, len(paths)), listing, daemon)
                    runs.setdefault((mech, d), []).append(r)
        return runs
    finally:
        os.unlink(listing)


def print_table(title: str, runs: dict, depths: list[int], fuse: bool) -> None:
    print(f"\n== {title}")
    cols = list(MECHANISMS)
    head = f"{'D':>4} " + " ".join(f"{c:>17}" for c in cols)
    print(f"files/s (median)\n{head}")
    for d in depths:
        print(f"{d:>4} " + " ".join(f"{med([r['files_per_s'] for r in runs[c, d]]):17,.0f}" for c in cols))
    print("CPU us per file of the reader" + (" + the FUSE daemon" if fuse else "") + " (median)")
    print(head)
    for d in depths:
        cells = []
        for c in cols:
            own = med([r["cpu_us_per_file"] for r in runs[c, d]])
            cells.append(f"{own:.0f} + {med([r['daemon_us_per_file'] for r in runs[c, d]]):.0f}" if fuse
                         else f"{own:.1f}")
        print(f"{d:>4} " + " ".join(f"{x:>17}" for x in cells))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="an ImageFolder (default: the loader benchmark's generated photos)")
    p.add_argument("--images", type=int, default=1024, help="photos to generate when --data is not given")
    add_data_kind(p)
    p.add_argument("--latency", type=float, default=4.0, help="per-file latency through latencyfs, ms")
    p.add_argument("--depths", default="1,4,16,64,256")
    p.add_argument("--repeat", type=int, default=3, help="interleaved rounds; medians are reported")
    a = p.parse_args()
    depths = [int(x) for x in a.depths.split(",")]
    exe = build()
    root = photos_for(a, a.images, os.path.join(HERE, "out"))
    paths = image_files(root)[0]
    size = sum(os.path.getsize(x) for x in paths)
    for x in paths:   # warm the page cache for the local case
        with open(x, "rb") as f:
            f.read()
    print(machine_summary())
    print(f"{len(paths)} files of {size / len(paths) / 1024:.0f} KiB on average from {root}; each file read "
          f"whole (open + fstat + read + close); CPU from getrusage (reader) and the daemon's threads' schedstat; medians of "
          f"{a.repeat} interleaved rounds; the machine was shared with other work, so figures are noisy")
    local = measure(exe, paths, 0, depths, a.repeat, None)
    print_table("warm local files (page cache)", local, depths, fuse=False)
    with mount(root, a.latency) as m:
        remote = [os.path.join(m.path, os.path.relpath(x, root)) for x in paths]
        fuse = measure(exe, remote, a.latency, depths, a.repeat, m.pid)
    print_table(f"latencyfs: {m.describe()}", fuse, depths, fuse=True)
    print(m.report)


if __name__ == "__main__":
    main()
