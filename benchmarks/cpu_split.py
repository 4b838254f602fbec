"""Where the native pipeline's CPU goes, in CPU-ms per image: libjpeg / loaderlib's kernels / other.

Runs the ResNet-50 training chain (RandomResizedCrop(224), flip, Normalize, CHW float32, or the
uint8 variant) on the native engine under ``perf record`` (cycles, user and kernel), then
splits the samples by shared object: ``libjpeg*`` is the decoder (IDCT, upsampling, colour
conversion, and entropy decoding where libjpeg's own decoder runs), ``loaderlib/_ext/*.so`` is
ours (the chain kernels: resampling, normalise, layout, reading, collation; and the baseline
Huffman decoder that replaces libjpeg's, NOTE [ Our Huffman decoder ] in pyx/include/ll_huff.h,
reported on its own line as part of ours), and everything else (libc's memmove and friends, the
kernel, libgomp, Python) is "other". The total CPU-ms per image comes
from the process's own CPU time over the measured images (after two warm-up epochs), so the split
is that total times each share.

Usage::

    python benchmarks/cpu_split.py [--data DIR] [--images 2048] [--variant float|uint8]

Needs ``perf`` (linux-perf) with ``perf_event_paranoid`` <= 2 for user-space samples of the
process it starts.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from _photos import add_data_kind, photos_for

HERE = os.path.dirname(os.path.abspath(__file__))


def child(root: str, variant: str, images: int, threads: int) -> None:
    import resource
    import time

    from loader import rn50_chain

    import loaderlib as ll

    ds = ll.ImageFolderDataset(root).transform_first(rn50_chain(variant))
    loader = ll.DataLoader(ds, batch_size=64, shuffle=True, seed=0, num_threads=threads, last_batch="discard")
    # Two whole epochs first, iterated as the measurement below iterates (a batch still held
    # when the next epoch starts). An arena slot can still be touched for the first time inside
    # the measured window; its page faults (under ll_emit_row) are a fixed cost in "other". In
    # huge pages they were 5-15% of the profile (clear_page_erms); slots are in small pages
    # now (NOTE [ Slots in small pages ] in pyx/_arena.pyx) and no fault is among the top
    # symbols at --images 2048.
    it, n = iter(loader), 0
    while n < 2 * len(loader):
        for x, _ in it:
            n += 1
        else:
            it = iter(loader)
    next(it)
    # Warm: tell the parent, which attaches perf to this process, and wait for its go.
    print("ready", flush=True)
    sys.stdin.readline()

    def cpu() -> float:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    c0, t0, n = cpu(), time.perf_counter(), 0
    while n < images:
        for x, _ in it:
            n += len(x)
            if n >= images:
                break
        else:
            it = iter(loader)
    print(json.dumps({"cpu_ms": 1000 * (cpu() - c0) / n, "rate": n / (time.perf_counter() - t0), "images": n}))


def _our_modules() -> set:
    import loaderlib._ext as ext

    return {f for f in os.listdir(os.path.dirname(ext.__file__)) if f.endswith(".so")}


def _is_huffman(name: str) -> bool:
    """Our Huffman decoder's symbols (pyx/include/ll_huff.h)."""
    sym = name.split(":", 1)[-1]
    return sym.startswith(("ll_huff_", "ll_refill"))


def classify(dso: str, ours: set) -> str:
    name = os.path.basename(dso)
    if name.startswith(("libjpeg", "libturbojpeg")):
        return "libjpeg"
    if name in ours:
        return "ours"
    return "other"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="an ImageFolder (default: benchmarks/loader.py's generated photos)")
    p.add_argument("--make", type=int, default=1024)
    add_data_kind(p)
    p.add_argument("--images", type=int, default=4096,
                   help="images measured, after two whole warm-up epochs (first touch of the arena's slots)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--variant", default="float", choices=("float", "uint8"))
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        root, variant, images, threads = a.child
        child(root, variant, int(images), int(threads))
        return

    from _report import machine_summary

    print(machine_summary())
    root = photos_for(a, a.make, os.path.join(HERE, "out"))
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", root, a.variant,
                                 str(a.images), str(a.threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        # Only the steady state is profiled: perf attaches after the warm-up batch.
        perf = subprocess.Popen(["perf", "record", "-q", "-F", "999", "-o", data, "-p", str(proc.pid)],
                                stderr=subprocess.DEVNULL)
        time.sleep(1.0)   # let perf attach before the measured images start
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out = proc.stdout.read()
        proc.wait()
        perf.wait()
        res = json.loads(out.strip().splitlines()[-1])
        rep = subprocess.run(["perf", "report", "-i", data, "--stdio", "--sort", "dso,sym", "--percent-limit", "0"],
                             capture_output=True, text=True, check=True).stdout
    ours = _our_modules()
    shares: dict = collections.Counter()
    top: dict = collections.defaultdict(list)
    for line in rep.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[[^\]]+\]\s+(.*)", line)
        if not m:
            continue
        pct, dso, sym = float(m.group(1)), m.group(2), m.group(3).strip()
        kind = classify(dso, ours)
        shares[kind] += pct
        top[kind].append((pct, f"{os.path.basename(dso)}:{sym}"))
    total = sum(shares.values()) or 1.0
    print(f"variant {a.variant}; {res['images']} images after two warm-up epochs; {a.threads} threads; "
          f"{res['rate']:,.0f} img/s under perf; {res['cpu_ms']:.3f} CPU-ms per image in all")
    for kind in ("libjpeg", "ours", "other"):
        share = shares[kind] / total
        heads = ", ".join(f"{name} {pct:.1f}%" for pct, name in sorted(top[kind], reverse=True)[:4])
        print(f"  {kind:<8} {100 * share:5.1f}%  {share * res['cpu_ms']:.3f} CPU-ms/img   ({heads})")
        if kind == "ours":
            huff = sum(pct for pct, name in top[kind] if _is_huffman(name)) / total
            print(f"    of which Huffman decoding {100 * huff:5.1f}%  {huff * res['cpu_ms']:.3f} CPU-ms/img, "
                  f"chain kernels {(share - huff) * res['cpu_ms']:.3f} CPU-ms/img")


if __name__ == "__main__":
    main()
