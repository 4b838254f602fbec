"""Peak memory of decompression bombs being refused, and of a large PNG being decoded.

What it measures: for each file, a fresh Python process imports loaderlib, reads its own
VmHWM (peak resident set, /proc/self/status, per address space), calls ``ll.decode`` once
(default ``max_pixels``), and reads VmHWM again; the difference is the peak memory the
decode added. ru_maxrss is not used: across fork/exec it carries the parent's high-water
mark. Every bomb should be refused from its header, before 50 MB.

The files (built here, nothing downloaded):

* BMP RLE8, 1,080 bytes, declaring 20000 x 20000 (OpenCV took 2.3 GB before the guard);
* TIFF, 46 KB, 20000 x 20000 (1.5 GB before the guard);
* GIF, WebP (VP8X) and PNG headers declaring 20000 x 20000;
* a baseline JPEG declaring 20000 x 20000 (over max_pixels);
* a 2 KB progressive JPEG declaring 13000 x 13000: under max_pixels, but libjpeg would keep
  508 MB of coefficients (NOTE [ Coefficient memory budget ] in pyx/include/ll_jpeg.h);
* a real 6000 x 4000 PNG, decoded: the peak should be about one RGB image (72 MB), not two
  (NOTE [ No full-size colour copy ] in loaderlib/decoding.py).

Run: ``python benchmarks/bombs.py`` (a few seconds; ``--smoke`` decodes a 600x400 PNG instead).
"""

from __future__ import annotations

import io
import os
import platform
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np

_CHILD = r"""
import sys, cv2, loaderlib as ll   # cv2 imported first: its own ~16 MB is not the decode's
def hwm():
    return int([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1])
data = open(sys.argv[1], 'rb').read()
before = hwm()
try:
    img = ll.decode(data, source=sys.argv[1])
    outcome = f"decoded {img.shape[1]}x{img.shape[0]}"
except ll.DecodeError as e:
    outcome = "refused: " + e.reason
print(hwm() - before)
print(outcome)
"""


def _sof(data: bytes) -> int:
    i = 2
    while True:
        marker = data[i + 1]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return i
        i += 2 + int.from_bytes(data[i + 2:i + 4], "big")


def _jpeg_with_dims(progressive: bool, w: int, h: int) -> bytes:
    from _synth import photo_like
    from PIL import Image

    bio = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(photo_like(64, 64, 0)[:, :, ::-1])).save(
        bio, "JPEG", quality=85, progressive=progressive, subsampling=2)
    b = bytearray(bio.getvalue())
    s = _sof(bytes(b))
    b[s + 5:s + 7] = h.to_bytes(2, "big")
    b[s + 7:s + 9] = w.to_bytes(2, "big")
    return bytes(b)


def bombs() -> dict[str, bytes]:
    W = H = 20000
    bmp = (b"BM" + struct.pack("<IHHI", 1080, 0, 0, 54)
           + struct.pack("<IiiHHIIiiII", 40, W, H, 1, 8, 1, 1026, 0, 0, 0, 0) + bytes(1026))
    tiff = (b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 3)
            + struct.pack("<HHII", 256, 4, 1, W) + struct.pack("<HHII", 257, 4, 1, H)
            + struct.pack("<HHII", 258, 3, 1, 8) + struct.pack("<I", 0) + bytes(46000))
    gif = (b"GIF89a" + struct.pack("<HH", W, H) + b"\x00\x00\x00"
           + b",\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;")
    webp = (b"RIFF" + struct.pack("<I", 30) + b"WEBPVP8X" + struct.pack("<I", 10) + b"\x00\x00\x00\x00"
            + (W - 1).to_bytes(3, "little") + (H - 1).to_bytes(3, "little"))
    ihdr = struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0)
    png = (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr
           + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr)) + bytes(100))
    return {
        "BMP RLE 20000x20000": bmp,
        "TIFF 20000x20000": tiff,
        "GIF 20000x20000": gif,
        "WebP 20000x20000": webp,
        "PNG 20000x20000": png,
        "JPEG baseline 20000x20000": _jpeg_with_dims(False, W, H),
        "JPEG progressive 13000x13000": _jpeg_with_dims(True, 13000, 13000),
    }


def large_png(width: int = 6000, height: int = 4000) -> bytes:
    import cv2
    from _synth import photo_like

    return cv2.imencode(".png", photo_like(width, height, 1), [cv2.IMWRITE_PNG_COMPRESSION, 1])[1].tobytes()


def main() -> None:
    smoke = "--smoke" in sys.argv[1:]   # benchmarks/smoke.py: a 600x400 PNG instead of 6000x4000
    files = {**bombs(), **({"PNG 600x400 (real, decoded)": large_png(600, 400)} if smoke else
                           {"PNG 6000x4000 (real, decoded)": large_png()})}
    print(f"loaderlib decode peak memory (VmHWM delta in a fresh process), Python {platform.python_version()}, "
          f"{platform.machine()} {os.cpu_count()} CPUs")
    print(f"{'file':32s} {'bytes':>10s} {'peak MB':>8s}  outcome")
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            path = os.path.join(tmp, name.split()[0].lower() + ".bin")
            with open(path, "wb") as f:
                f.write(data)
            r = subprocess.run([sys.executable, "-c", _CHILD, path], capture_output=True, text=True, check=True)
            kib, outcome = r.stdout.strip().split("\n", 1)
            print(f"{name:32s} {len(data):10d} {int(kib) / 1024:8.1f}  {outcome[:110]}")


if __name__ == "__main__":
    main()
