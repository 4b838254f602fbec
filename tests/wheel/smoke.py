"""Smoke test of an installed loaderlib wheel (``make test-wheel``; cibuildwheel's test-command).

Run it with the wheel installed in a fresh virtualenv, from a folder outside the source tree,
with ``python -I`` (neither the current folder nor the script's folder on sys.path), so the
installed package is what gets imported. It checks: the import; the build (OpenMP on, SIMD,
libjpeg-turbo); the bundled sample photo decodes to its header's size (and to the pixels given
by ``--expect-sha256``, OpenCV's decode computed by the caller); a DataLoader epoch on the native
engine with equal batches for 1 and 2 threads; ``python -m loaderlib doctor``; on Linux, that
the extensions resolve libjpeg and the OpenMP runtime inside the wheel (``ldd``); without
OpenCV installed, that a PNG gets the error naming both OpenCV distributions; and that the
installed metadata requires neither OpenCV nor matplotlib.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.metadata
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib


def check(cond: bool, what: str) -> None:
    if not cond:
        raise SystemExit(f"wheel smoke test FAILED: {what}")
    print(f"ok  {what}")


def tiny_png() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + bytes([10, 20, 30]) * 4 for _ in range(3))  # 4x3 RGB, filter 0
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 3, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--expect-sha256", help="sha256 of the sample photo's RGB pixels by an independent decoder")
    ap.add_argument("--source-tree", help="the checkout the wheel was built from (must not be imported)")
    args = ap.parse_args()

    import numpy as np

    import loaderlib as ll
    from loaderlib import transforms as T

    where = os.path.dirname(ll.__file__)
    check(where.startswith(sys.prefix), f"loaderlib imported from the virtualenv ({where})")
    if args.source_tree:
        check(not os.path.abspath(where).startswith(os.path.abspath(args.source_tree)),
              "the source tree is not what got imported")

    info = ll.build_info()
    check(info["openmp"] is True, f"built with OpenMP (build_info: {info})")
    check(bool(info["libjpeg_turbo_version"]) and info["simd"], "libjpeg-turbo with SIMD")

    from loaderlib._sample import sample_jpeg

    data = sample_jpeg()
    img = ll.decode(data)
    meta = ll.jpeg_info(data)
    check(img.shape == (meta.height, meta.width, 3) == (600, 512, 3), f"sample photo decodes to {img.shape}")
    if args.expect_sha256:
        got = hashlib.sha256(np.ascontiguousarray(img).tobytes()).hexdigest()
        check(got == args.expect_sha256, "decoded pixels equal OpenCV's decode of the same file")

    with tempfile.TemporaryDirectory() as root:
        for c in range(2):
            os.makedirs(os.path.join(root, f"class_{c}"))
            for i in range(6):
                with open(os.path.join(root, f"class_{c}", f"{i}.jpg"), "wb") as f:
                    f.write(data)
        chain = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(),
                           T.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)), T.ToCHW()])
        epochs = {}
        for threads in (1, 2):
            ds = ll.ImageFolderDataset(root).transform_first(chain)
            loader = ll.DataLoader(ds, batch_size=4, shuffle=True, num_threads=threads, seed=7)
            batches = [(x.copy(), y.copy()) for x, y in loader]
            check(loader.engine == "native", f"{threads} thread(s): the native engine ran the epoch")
            epochs[threads] = batches
        xs = np.concatenate([x for x, _ in epochs[1]])
        ys = np.concatenate([y for _, y in epochs[1]])
        check(xs.shape == (12, 3, 64, 64) and xs.dtype == np.float32, f"an epoch of {xs.shape} float32")
        check(sorted(ys.tolist()) == [0] * 6 + [1] * 6, "every sample delivered once")
        check(all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
                  for a, b in zip(epochs[1], epochs[2], strict=True)), "1 and 2 threads give equal batches")

    res = subprocess.run([sys.executable, "-I", "-m", "loaderlib", "doctor", "--json", "--seconds", "0.5"],
                         capture_output=True, text=True, timeout=300, check=False)
    check(res.returncode == 0, f"python -m loaderlib doctor exits 0 ({res.stderr.strip()[-300:]})")
    report = json.loads(res.stdout)
    check(report["self_check"]["ok"] and report["build"]["openmp"], "doctor: build and self-check ok")
    libs_dir = os.path.join(os.path.dirname(where), "loaderlib.libs")
    if sys.platform == "linux":
        for key in ("libjpeg", "openmp"):
            path = report["build"]["libraries"][key]
            check(path is not None and path.startswith(libs_dir), f"doctor: {key} loaded from the wheel ({path})")
        seen = set()
        for so in sorted(glob.glob(os.path.join(where, "_ext", "*.so"))):
            out = subprocess.run(["ldd", so], capture_output=True, text=True, check=True).stdout
            lines = [ln.strip() for ln in out.splitlines() if "jpeg" in ln or "gomp" in ln]
            seen.update("jpeg" if "jpeg" in ln else "gomp" for ln in lines)
            resolved = [os.path.normpath(ln.split("=>", 1)[1].split(" (")[0].strip()) for ln in lines if "=>" in ln]
            check("not found" not in out and len(resolved) == len(lines)
                  and all(os.path.dirname(r) == libs_dir for r in resolved),
                  f"ldd {os.path.basename(so)}: " + ("; ".join(lines) or "needs neither libjpeg nor libgomp"))
        check(seen == {"jpeg", "gomp"}, "the extensions link libjpeg and libgomp (from the wheel)")

    try:
        import cv2  # noqa: F401
        have_cv2 = True
    except ImportError:
        have_cv2 = False
    if not have_cv2:
        try:
            ll.decode(tiny_png())
        except ImportError as e:
            msg = str(e)
            check("opencv-python-headless" in msg and "opencv-python " in msg and "loaderlib[opencv]" in msg,
                  "a PNG without OpenCV: the error names both distributions")
        else:
            check(False, "a PNG without OpenCV raised nothing")

    requires = importlib.metadata.requires("loaderlib") or []
    core = [r for r in requires if "extra ==" not in r]
    check(not any(r.startswith(("opencv", "matplotlib", "ipywidgets")) for r in core),
          f"core requirements: {', '.join(core)}")
    check(any(r.startswith("opencv-python-headless") and "extra == \"opencv\"" in r for r in requires),
          "OpenCV is the [opencv] extra")
    print("wheel smoke test passed")


if __name__ == "__main__":
    main()
