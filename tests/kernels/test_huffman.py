"""loaderlib's baseline Huffman decoder (NOTE [ Our Huffman decoder ] in pyx/include/ll_huff.h)
against libjpeg's own, on valid files of every kind it takes and on damaged ones.

Valid data must give the same pixels (and the same as OpenCV, the independent reference);
damaged data must give exactly libjpeg's outcome -- the same error, or the same pixels and the
same warning -- because our decoder hands every anomaly back to libjpeg. The decoder's counters
show which path ran, so no comparison here passes by never running our decoder."""

from __future__ import annotations

import os
import subprocess
import sys

import cv2
import numpy as np
import pytest

from benchmarks._synth import photo_like
from loaderlib._ext import _jpeg
from loaderlib.decoding import decode
from loaderlib.errors import DecodeError, DecodeWarning
from tests.kernels._huffman_checks import (
    assert_batch_equal_on_one_and_two_threads,
    assert_valid_file_decodes_as_libjpeg_and_opencv,
    both,
    noise,
    outcome,
)

SAMPLING = {
    "444": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444,
    "422": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422,
    "420": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420,
    "440": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440,
    "411": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411,
}


def _encode(img: np.ndarray, quality: int = 90, sampling: str = "420", rst: int = 0, optimize: bool = False) -> bytes:
    params = [cv2.IMWRITE_JPEG_QUALITY, quality, cv2.IMWRITE_JPEG_OPTIMIZE, int(optimize),
              cv2.IMWRITE_JPEG_RST_INTERVAL, rst]
    if img.ndim == 3:
        params += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, SAMPLING[sampling]]
    ok, buf = cv2.imencode(".jpg", img, params)
    assert ok
    return buf.tobytes()


def _corpus() -> list[tuple[str, bytes]]:
    out = []
    for k, (w, h) in enumerate([(1, 1), (8, 8), (17, 13), (97, 61), (333, 251), (640, 480)]):
        img = photo_like(w, h, seed=k)
        for sampling in SAMPLING:
            out.append((f"{w}x{h}-{sampling}", _encode(img, 90, sampling)))
        out.append((f"{w}x{h}-gray", _encode(cv2.cvtColor(img, cv2.COLOR_BGR2GRAY), 90)))
        out.append((f"{w}x{h}-rst", _encode(img, 85, "420", rst=2)))
        out.append((f"{w}x{h}-optimized", _encode(img, 95, "422", optimize=True)))
        out.append((f"{w}x{h}-q100-noise", _encode(noise(w, h, k), 100, "444")))
        out.append((f"{w}x{h}-q5", _encode(img, 5, "420", rst=1)))
    return out


CORPUS = _corpus()


@pytest.mark.parametrize("name,data", CORPUS, ids=[n for n, _ in CORPUS])
def test_valid_files_decode_as_libjpeg_and_opencv(name, data, decoders):
    assert_valid_file_decodes_as_libjpeg_and_opencv(name, data, decoders)


def test_batch_of_every_kind_equal_on_one_and_two_threads(decoders):
    assert_batch_equal_on_one_and_two_threads(CORPUS, decoders)


# --------------------------------------------------------------------------- damaged data


def _scan_start(data: bytes) -> int:
    """Index of the first entropy-coded byte (after the SOS segment)."""
    i = 2
    while True:
        assert data[i] == 0xFF
        marker = data[i + 1]
        length = int.from_bytes(data[i + 2:i + 4], "big")
        if marker == 0xDA:
            return i + 2 + length
        i += 2 + length


def _rst_positions(data: bytes, start: int) -> list[int]:
    return [i for i in range(start, len(data) - 1) if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7]


def _damaged() -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(7)
    img = photo_like(160, 120, seed=3)
    cases = []
    for kind, data in (("plain", _encode(img, 90, "420")), ("rst", _encode(img, 90, "420", rst=3)),
                       ("noise", _encode(noise(64, 48, 1), 100, "444", rst=1))):
        s = _scan_start(data)
        n = len(data) - s
        for frac in (0.0, 0.1, 0.5, 0.9, 0.999):
            cut = s + int(frac * n)
            cases.append((f"{kind}-cut{frac}", data[:cut]))
            cases.append((f"{kind}-cut{frac}-eoi", data[:cut] + b"\xff\xd9"))
        cases.append((f"{kind}-no-eoi", data[:-2]))
        cases.append((f"{kind}-garbage-tail", data[:-2] + b"\x12\x34\xff\xd9"))
        for j in range(12):
            b = bytearray(data)
            pos = s + int(rng.integers(0, n - 2))
            b[pos] = int(rng.integers(0, 256)) if j % 3 else 0xFF
            cases.append((f"{kind}-flip{j}", bytes(b)))
        b = bytearray(data)
        pos = s + n // 3
        b[pos:pos + 6] = b"\xff\x00" * 3   # 24 one bits: no valid code is that long
        cases.append((f"{kind}-invalid-code", bytes(b)))
        rst = _rst_positions(data, s)
        if rst:
            p = rst[len(rst) // 2]
            cases.append((f"{kind}-rst-missing", data[:p] + data[p + 2:]))
            b = bytearray(data)
            b[p + 1] = 0xD0 + (b[p + 1] - 0xD0 + 3) % 8
            cases.append((f"{kind}-rst-wrong-number", bytes(b)))
            cases.append((f"{kind}-rst-extraneous", data[:p] + b"\x55\xaa" + data[p:]))
            cases.append((f"{kind}-rst-fill", data[:p] + b"\xff" + data[p:]))
            cases.append((f"{kind}-rst-early", data[:p - 3] + data[p:]))
    return cases


DAMAGED = _damaged()


@pytest.mark.parametrize("name,data", DAMAGED, ids=[n for n, _ in DAMAGED])
def test_damaged_files_give_libjpegsoutcome(name, data, decoders):
    for kw in ({"strict": False}, {}, {"strict": True}, {"strict": False, "crop": (40, 50, 64, 48)},
               {"strict": False, "mode": "GRAY", "scale": 0.5}):
        if "crop" in kw and not name.startswith(("plain", "rst")):
            continue
        decoders(False)
        theirs = outcome(data, **kw)
        decoders(True)
        ours = outcome(data, **kw)
        assert ours == theirs, f"{name} {kw}: {ours[0]} {ours[-1]} vs libjpeg's {theirs[0]} {theirs[-1]}"


# Bytes in place of the EOI marker: none of them 0xFF, so they read as entropy data.
_TAIL = bytes([0x12, 0x34, 0x56, 0x78, 0x9A, 0xBC, 0xDE, 0x21])


def _eoi_cases() -> list[tuple[str, bytes, bytes]]:
    """Complete scans whose EOI marker is missing (cut after the last scan byte) or replaced by
    0-8 bytes of garbage: (name, damaged, intact)."""
    out = []
    for seed in range(36):
        img = photo_like(24 + 7 * seed, 16 + 5 * seed, seed=seed)
        for q in (75, 90):
            data = _encode(img, q, "420")
            assert data.endswith(b"\xff\xd9")
            for k in range(len(_TAIL) + 1):
                out.append((f"s{seed}-q{q}-tail{k}", data[:-2] + _TAIL[:k], data))
    return out


def test_a_missing_or_damaged_eoi_decodes_the_complete_image_with_either_decoder(decoders):
    """NOTE [ A missing EOI is not a truncation ] in ll_jpeg.h: the pixels are all there, so the
    outcome is the intact file's image, without a warning, whichever Huffman decoder runs. Our
    decoder finishes some of these files alone (its read-ahead stays inside the data), where
    libjpeg's read-ahead runs off the end: those used to fail with libjpeg's decoder only."""
    finished_alone = 0
    for name, data, intact in _eoi_cases():
        for kw in ({}, {"strict": True}, {"strict": False, "scale": 0.5}):
            ours, theirs, finished, _ = both(decoders, data, **kw)
            assert ours == theirs, f"{name} {kw}: {ours[0]} {ours[-1]} vs libjpeg's {theirs[0]} {theirs[-1]}"
            assert ours[0] == "ok" and ours[2] == [], f"{name} {kw}: {ours[-1]}"
            assert ours[1] == decode(intact, **kw).tobytes(), f"{name} {kw}"
            finished_alone += kw == {} and finished
    assert finished_alone >= 10, finished_alone


def test_data_that_ends_before_the_image_is_still_truncated(decoders):
    """The rule above keeps real truncations: bits were needed after the end."""
    data = _encode(photo_like(97, 61, seed=1), 90, "420")
    for cut in (len(data) - 40, len(data) // 2):
        for ours in (False, True):
            decoders(ours)
            with pytest.raises(DecodeError, match=r"truncated: the data ends before the image \(Premature end of JPEG"):
                decode(data[:cut])
            with pytest.warns(DecodeWarning, match="Premature end of JPEG file"):
                decode(data[:cut], strict=False)

def test_damage_is_handed_back_and_valid_data_is_not(decoders):
    """Every kind of damage above reaches the hand-back, and flips that keep the data valid are
    decoded by our decoder to the end (the comparisons above test both paths)."""
    decoders(True)
    handed_back, finished = set(), set()
    for name, data in DAMAGED:
        _, i0, b0 = _jpeg.huffman_decoder()
        outcome(data, strict=False)
        _, i1, b1 = _jpeg.huffman_decoder()
        if b1 > b0:
            handed_back.add(name.split("-", 1)[1])
        elif i1 > i0:
            finished.add(name)
    for kind in ("cut0.5", "cut0.5-eoi", "no-eoi", "invalid-code", "rst-missing", "rst-wrong-number",
                 "rst-extraneous", "rst-fill", "rst-early"):
        assert kind in handed_back, kind
    assert any("flip" in n for n in finished)


def test_environment_variable_selects_libjpegs_decoder():
    code = ("from loaderlib._ext import _jpeg; from loaderlib.decoding import decode; "
            "from benchmarks._synth import photo_like, encode_jpeg; decode(encode_jpeg(photo_like(32, 32))); "
            "print(_jpeg.huffman_decoder())")
    for env, expect in (("libjpeg", "(False, 0, 0)"), ("loaderlib", "(True, 1, 0)")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "LOADERLIB_HUFFMAN": env}).stdout.strip()
        assert out == expect
