"""Shared fixtures: photo-like test images generated at session start (nothing committed
except a few tiny special files in tests/data)."""

from __future__ import annotations

import io
import os

import cv2
import numpy as np
import pytest

from benchmarks._synth import encode_jpeg, photo_like

DATA = os.path.join(os.path.dirname(__file__), "data")


def make_photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A photo-like BGR image (see benchmarks._synth.photo_like)."""
    return photo_like(width, height, seed)


def encode_cmyk_jpeg(img_bgr: np.ndarray, quality: int = 90) -> bytes:
    from PIL import Image  # Pillow comes with matplotlib

    pil = Image.fromarray(np.ascontiguousarray(img_bgr[:, :, ::-1])).convert("CMYK")
    bio = io.BytesIO()
    pil.save(bio, "JPEG", quality=quality)
    return bio.getvalue()


# NOTE [ OpenCV references under memcheck ]
# `make memcheck` runs the decode tests under valgrind, which must report any byte of
# loaderlib's outputs that libjpeg never wrote. The tests compare those outputs with OpenCV's
# decode, and valgrind marks some of OpenCV's own output bytes undefined (its reduced-scale
# decodes: the last pixels of a row, from a block allocated inside cv2), as it did loaderlib's
# before NOTE [ Sample rows are cleared ] (pyx/include/ll_jpeg.h). They are not: OpenCV's
# decodes of the fast-decode test images and the fuzzing seeds, at full and reduced scales,
# gave the same bytes with glibc's MALLOC_PERTURB_ filling fresh blocks with 85, 170 and 3
# (JSIMD_FORCENONE=1 changes nothing in OpenCV's own libjpeg under valgrind). OpenCV is the
# reference here, not the code under test, and
# a comparison with it would fail memcheck on OpenCV's bytes (or a suppression broad enough to
# hide that would hide loaderlib's too). So under memcheck (LOADERLIB_MEMCHECK=1, set by the
# Makefile target) the reference is decoded in a child process, which valgrind does not trace
# (no --trace-children): its bytes arrive through a pipe, defined, and every byte loaderlib
# writes is still checked where the test compares it.
def _cv2_decode(arr: np.ndarray, flags: int) -> np.ndarray | None:
    if os.environ.get("LOADERLIB_MEMCHECK") != "1":
        return cv2.imdecode(arr, flags)
    import pickle
    import subprocess
    import sys

    code = ("import sys, pickle, cv2, numpy as np; a = np.frombuffer(sys.stdin.buffer.read(), np.uint8); "
            f"sys.stdout.buffer.write(pickle.dumps(cv2.imdecode(a, {int(flags)})))")
    res = subprocess.run([sys.executable, "-c", code], input=arr.tobytes(), capture_output=True, check=True)
    return pickle.loads(res.stdout)


def cv2_reference(data: bytes, mode: str = "RGB", flag: int | None = None) -> np.ndarray:
    """Independent reference: OpenCV's decoder, converted to our HWC convention (NOTE [ OpenCV
    references under memcheck ])."""
    arr = np.frombuffer(data, np.uint8)
    if mode == "GRAY":
        out = _cv2_decode(arr, (flag or cv2.IMREAD_GRAYSCALE) | cv2.IMREAD_IGNORE_ORIENTATION)
        return out[:, :, None]
    out = _cv2_decode(arr, (flag or cv2.IMREAD_COLOR) | cv2.IMREAD_IGNORE_ORIENTATION)
    return np.ascontiguousarray(out[:, :, ::-1]) if mode == "RGB" else out


# A matrix of JPEG variants: (id, bytes). Sizes include odd ones that are not multiples of
# an MCU, tiny ones and an upscaled one larger than the source photo.
_SIZES = [(17, 13), (64, 48), (333, 251), (500, 375), (512, 600), (1031, 777)]


@pytest.fixture(scope="session")
def jpeg_matrix() -> list[tuple[str, bytes]]:
    out = []
    k = 0
    for w, h in _SIZES:
        for sampling in ("420", "422", "444"):
            for progressive in (False, True):
                quality = (55, 75, 92, 100)[k % 4]
                img = make_photo(w, h, seed=k)
                out.append((f"{w}x{h}-{sampling}-q{quality}-{'prog' if progressive else 'base'}",
                            encode_jpeg(img, quality, sampling, progressive)))
                k += 1
        gray = cv2.cvtColor(make_photo(w, h, seed=k), cv2.COLOR_BGR2GRAY)
        out.append((f"{w}x{h}-gray", encode_jpeg(gray, 85)))
        out.append((f"{w}x{h}-gray-prog", encode_jpeg(gray, 70, progressive=True)))
        k += 1
    return out


@pytest.fixture(scope="session")
def photo_jpeg() -> bytes:
    return encode_jpeg(make_photo(500, 375, seed=123), 90, "420")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """How many timing checks ran without a verdict (tests/_timing.py): they are skips, counted here."""
    from tests._timing import NO_VERDICT

    def timing(rep):
        return "timing" in getattr(rep, "keywords", {})

    reports = [r for key in ("passed", "failed", "skipped") for r in terminalreporter.stats.get(key, [])
               if timing(r) and (r.skipped or getattr(r, "when", "call") == "call")]
    if not reports:
        return
    none = [r for r in reports if r.skipped and NO_VERDICT in str(r.longrepr)]
    terminalreporter.write_line(f"timing verdict checks: {len(reports) - len(none)} of {len(reports)} decided, "
                                f"{len(none)} without a verdict (not enough evidence; listed as skipped)")
