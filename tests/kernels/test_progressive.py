"""loaderlib's progressive Huffman decoder (NOTE [ Progressive scans ] in pyx/include/ll_phuff.h)
against libjpeg's own, on progressive files of many scan scripts and on damaged ones.

As for the baseline decoder (test_huffman.py): valid files give the same pixels as libjpeg's
decoder and as OpenCV, and our decoder must have finished them (its counters say so); damaged
files give exactly libjpeg's outcome. The files come from OpenCV's encoder (libjpeg's standard
script) and from tests/kernels/progressive_writer.c, which writes other scripts through
libjpeg's compressor: spectral selection alone, four bit planes of successive approximation,
one DC scan per component, restart intervals in every scan."""

from __future__ import annotations

import os
import subprocess
import sys

import cv2
import numpy as np
import pytest

from benchmarks._synth import photo_like
from loaderlib import jpeg_info
from loaderlib import transforms as T
from loaderlib._chain import compile_chain
from loaderlib._ext import _jpeg
from loaderlib.decoding import decode
from loaderlib.errors import DecodeError, DecodeWarning
from tests.conftest import cv2_reference
from tests.kernels._cprog import build_c, libjpeg_flags
from tests.kernels._huffman_checks import (
    assert_batch_equal_on_one_and_two_threads,
    assert_valid_file_decodes_as_libjpeg_and_opencv,
    both,
    noise,
    outcome,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = ("simple", "spectral", "deep", "dc-split")

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="builds a C program with cc")


@pytest.fixture(scope="module")
def writer(tmp_path_factory):
    """The built progressive_writer: a function (image, script, quality, restart, sampling) -> bytes."""
    tmp = tmp_path_factory.mktemp("progressive")
    exe = build_c(tmp, os.path.join(ROOT, "tests", "kernels", "progressive_writer.c"), libjpeg_flags())
    count = [0]

    def write(img: np.ndarray, script: str, quality: int = 90, restart: int = 0, sampling: str = "420") -> bytes:
        count[0] += 1
        pnm, out = str(tmp / f"in{count[0]}.pnm"), str(tmp / f"out{count[0]}.jpg")
        h, w = img.shape[:2]
        with open(pnm, "wb") as f:
            f.write(f"{'P5' if img.ndim == 2 else 'P6'} {w} {h} 255\n".encode())
            f.write(np.ascontiguousarray(img if img.ndim == 2 else img[:, :, ::-1]).tobytes())   # BGR -> RGB
        res = subprocess.run([exe, pnm, out, script, str(quality), str(restart), sampling], capture_output=True,
                             text=True, check=False)
        assert res.returncode == 0, res.stderr
        with open(out, "rb") as f:
            data = f.read()
        assert jpeg_info(data).progressive
        return data

    return write


def _opencv(img: np.ndarray, quality: int, rst: int = 0) -> bytes:
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, quality, cv2.IMWRITE_JPEG_PROGRESSIVE, 1,
                                         cv2.IMWRITE_JPEG_RST_INTERVAL, rst])
    assert ok
    return buf.tobytes()


def _corpus(write) -> list[tuple[str, bytes]]:
    out = []
    for k, (w, h) in enumerate([(1, 1), (8, 8), (17, 13), (97, 61), (333, 251)]):
        img = photo_like(w, h, seed=k)
        gray = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
        out.append((f"{w}x{h}-opencv", _opencv(img, 90)))
        out.append((f"{w}x{h}-opencv-noise-q100", _opencv(noise(w, h, k), 100)))
        for script in SCRIPTS:
            out.append((f"{w}x{h}-{script}-420", write(img, script, 90, 0, "420")))
            out.append((f"{w}x{h}-{script}-gray", write(gray, script, 85, 0)))
        out.append((f"{w}x{h}-deep-444-rst2", write(img, "deep", 95, 2, "444")))
        out.append((f"{w}x{h}-spectral-422-rst1", write(img, "spectral", 75, 1, "422")))
        out.append((f"{w}x{h}-dc-split-noise-rst3", write(noise(w, h, k), "dc-split", 100, 3, "420")))
        out.append((f"{w}x{h}-simple-q5", write(img, "simple", 5, 0, "420")))
    return out


@pytest.fixture(scope="module")
def corpus(writer):
    return _corpus(writer)


def test_valid_progressive_files_decode_as_libjpeg_and_opencv(corpus, decoders):
    assert len(corpus) == 70
    for name, data in corpus:
        assert_valid_file_decodes_as_libjpeg_and_opencv(name, data, decoders)


def test_batch_of_progressive_files_equal_on_one_and_two_threads(corpus, decoders):
    assert_batch_equal_on_one_and_two_threads(corpus, decoders)


# --------------------------------------------------------------------------- damaged data


def _segments(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each scan's entropy-coded data."""
    out, i = [], 2
    while i < len(data) - 1:
        assert data[i] == 0xFF, i
        marker = data[i + 1]
        if marker == 0xD9:
            break
        length = int.from_bytes(data[i + 2:i + 4], "big")
        i += 2 + length
        if marker == 0xDA:
            j = i
            while not (data[j] == 0xFF and data[j + 1] != 0 and not 0xD0 <= data[j + 1] <= 0xD7):
                j += 1
            out.append((i, j))
            i = j
    return out


def _damaged(write) -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(11)
    img = photo_like(160, 120, seed=5)
    cases = []
    for kind, data in (("simple", _opencv(img, 90)), ("rst", write(img, "deep", 90, 3, "420")),
                       ("noise", write(noise(64, 48, 2), "spectral", 100, 1, "444"))):
        segs = _segments(data)
        s, n = segs[0][0], len(data) - segs[0][0]
        for frac in (0.05, 0.3, 0.6, 0.9, 0.999):
            cut = s + int(frac * n)
            cases.append((f"{kind}-cut{frac}", data[:cut]))
            cases.append((f"{kind}-cut{frac}-eoi", data[:cut] + b"\xff\xd9"))
        cases.append((f"{kind}-no-eoi", data[:-2]))
        cases.append((f"{kind}-garbage-tail", data[:-2] + b"\x12\x34\xff\xd9"))
        for j in range(15):   # a byte changed in some scan's data
            b = bytearray(data)
            a, e = segs[int(rng.integers(0, len(segs)))]
            if e - a < 3:
                continue
            pos = a + int(rng.integers(0, e - a - 1))
            b[pos] = int(rng.integers(0, 256)) if j % 3 else 0xFF
            cases.append((f"{kind}-flip{j}", bytes(b)))
        a, e = max(segs, key=lambda x: x[1] - x[0])
        b = bytearray(data)
        b[a + (e - a) // 3:a + (e - a) // 3 + 6] = b"\xff\x00" * 3   # 24 one bits: no code is that long
        cases.append((f"{kind}-invalid-code", bytes(b)))
        # Bytes left over at the end of a scan, and a scan whose data stops short.
        a, e = segs[len(segs) // 2]
        cases.append((f"{kind}-scan-extraneous", data[:e] + b"\x55\xaa\x55" + data[e:]))
        cases.append((f"{kind}-scan-fill", data[:e] + b"\xff" + data[e:]))
        cases.append((f"{kind}-scan-short", data[:max(a, e - 4)] + data[e:]))
        rst = [i for i in range(a, e - 1) if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7]
        if rst:
            p = rst[len(rst) // 2]
            cases.append((f"{kind}-rst-missing", data[:p] + data[p + 2:]))
            b = bytearray(data)
            b[p + 1] = 0xD0 + (b[p + 1] - 0xD0 + 3) % 8
            cases.append((f"{kind}-rst-wrong-number", bytes(b)))
            cases.append((f"{kind}-rst-extraneous", data[:p] + b"\x55\xaa" + data[p:]))
            cases.append((f"{kind}-rst-early", data[:max(a, p - 3)] + data[p:]))
    return cases


@pytest.fixture(scope="module")
def damaged(writer):
    return _damaged(writer)


def test_damaged_progressive_files_give_libjpegsoutcome(damaged, decoders):
    for name, data in damaged:
        for kw in ({"strict": False}, {}, {"strict": True}, {"strict": False, "crop": (40, 50, 64, 48)},
                   {"strict": False, "mode": "GRAY", "scale": 0.5}):
            if "crop" in kw and name.startswith("noise"):
                continue
            ours, theirs, _, _ = both(decoders, data, **kw)
            assert ours == theirs, f"{name} {kw}: {ours[0]} {ours[-1]} vs libjpeg's {theirs[0]} {theirs[-1]}"


def test_progressive_damage_is_handed_back_and_valid_data_is_not(damaged, decoders):
    decoders(True)
    handed_back, finished = set(), set()
    for name, data in damaged:
        _, i0, b0 = _jpeg.huffman_decoder()
        outcome(data, strict=False)
        _, i1, b1 = _jpeg.huffman_decoder()
        kind = name.split("-", 1)[1]
        if b1 > b0:
            handed_back.add(kind)
        elif i1 > i0:
            finished.add(kind)
    for kind in ("cut0.3", "cut0.6-eoi", "invalid-code", "scan-extraneous", "scan-fill", "scan-short",
                 "rst-missing", "rst-wrong-number", "rst-extraneous", "rst-early"):
        assert kind in handed_back, (kind, sorted(handed_back))
    assert "no-eoi" in handed_back or "no-eoi" in finished
    assert any("flip" in n for n in finished), sorted(finished)


def test_truncated_progressive_file_is_an_error_with_either_decoder(decoders):
    data = _opencv(photo_like(97, 61, seed=1), 90)
    for ours in (False, True):
        decoders(ours)
        with pytest.raises(DecodeError, match=r"truncated: the data ends before the image"):
            decode(data[:len(data) // 2])
        with pytest.warns(DecodeWarning, match="Premature end of JPEG file"):
            decode(data[:len(data) // 2], strict=False)


def test_environment_variable_selects_libjpegs_decoder_for_progressive_files():
    code = ("import cv2; from loaderlib._ext import _jpeg; from loaderlib.decoding import decode; "
            "from benchmarks._synth import photo_like; "
            "ok, b = cv2.imencode('.jpg', photo_like(32, 32), [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]); "
            "decode(b.tobytes()); print(_jpeg.huffman_decoder())")
    for env, expect in (("libjpeg", "(False, 0, 0)"), ("loaderlib", "(True, 1, 0)")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                             env={**os.environ, "LOADERLIB_HUFFMAN": env}).stdout.strip()
        assert out == expect


def test_mutated_progressive_files_give_libjpegsoutcome(decoders):
    """Differential fuzzing, seeded: 1,200 progressive files with one to three random byte
    changes, insertions or deletions past their headers, decoded by both decoders (full, at
    half scale, cropped; strict and not). Every outcome must be libjpeg's. Both paths must run:
    some files our decoder finishes, others it hands back. (This found NOTE [ Tables end with
    their image ] in ll_jpeg.h: each file here is decoded right after another one.)"""
    rng = np.random.default_rng(2026)
    seeds = []
    for k, (w, h) in enumerate([(64, 48), (97, 61)]):
        img = photo_like(w, h, seed=k)
        for rst in (0, 2):
            seeds.append(_opencv(img, 90, rst))
        seeds.append(_opencv(noise(w, h, k), 100))
    finished = handed_back = 0
    for i in range(1200):
        d = bytearray(seeds[int(rng.integers(len(seeds)))])
        for _ in range(int(rng.integers(1, 4))):
            op, p = int(rng.integers(4)), int(rng.integers(150, len(d)))
            if op == 0:
                d[p] = int(rng.integers(256))
            elif op == 1:
                d[p] ^= 1 << int(rng.integers(8))
            elif op == 2:
                del d[p:p + int(rng.integers(1, 5))]
            else:
                d[p:p] = bytes(rng.integers(0, 256, int(rng.integers(1, 4)), dtype=np.uint8))
        data = bytes(d)
        kw = ({"strict": False}, {}, {"strict": False, "scale": 0.5}, {"strict": False, "crop": (5, 7, 30, 20)})[i % 4]
        ours, theirs, done, back = both(decoders, data, **kw)
        finished += done
        handed_back += back
        assert ours[0] == theirs[0] and ours[-1] == theirs[-1], f"mutation {i} {kw}: {ours[0]} vs {theirs[0]}"
        assert ours == theirs, f"mutation {i} {kw}: different pixels"
    assert finished > 100 and handed_back > 100, (finished, handed_back)


# NOTE [ Block smoothing needs two iMCUs on the left ] (pyx/include/ll_jpeg.h): files whose low
# AC coefficients are never refined are decoded with libjpeg's inter-block smoothing; the
# fuzzing finding is one (a 32x24 4:2:0 file from the native harness, chain 3).
FINDING = os.path.join(ROOT, "fuzz", "corpus", "native-chain3-fused-differs.jpg")
_REDUCED = {("RGB", 2): cv2.IMREAD_REDUCED_COLOR_2, ("RGB", 4): cv2.IMREAD_REDUCED_COLOR_4,
            ("RGB", 8): cv2.IMREAD_REDUCED_COLOR_8, ("GRAY", 2): cv2.IMREAD_REDUCED_GRAYSCALE_2,
            ("GRAY", 4): cv2.IMREAD_REDUCED_GRAYSCALE_4, ("GRAY", 8): cv2.IMREAD_REDUCED_GRAYSCALE_8}


def _smoothed(write) -> list[tuple[str, bytes]]:
    img = photo_like(150, 118, seed=41)
    files = [(f"unrefined-{s}", write(img, "unrefined", 90, 0, s)) for s in ("420", "422", "444")]
    files.append(("unrefined-gray", write(cv2.cvtColor(img, cv2.COLOR_BGR2GRAY), "unrefined", 90, 0)))
    return files


def test_crop_of_a_smoothed_progressive_file_is_the_slice_of_opencvs_decode(writer, decoders):
    """The crop box's left edge sweeps three iMCUs of offsets, at every DCT scale, RGB and GRAY,
    with either Huffman decoder: each crop must be the slice of OpenCV's decode of the whole file
    at that scale. With LL_CROP_CONTEXT alone as the left margin, the two block columns of every
    component at the crop's left edge were smoothed as if they were the image's edge: up to
    several levels off for offsets past the first iMCU."""
    checked = 0
    for name, data in _smoothed(writer):
        W, H = 150, 118
        for mode in ("RGB", "GRAY"):
            for denom in (1, 2, 4, 8):
                ref = cv2_reference(data, mode, _REDUCED.get((mode, denom)))
                for ours in (True, False):
                    decoders(ours)
                    assert np.array_equal(decode(data, mode=mode, scale=1 / denom), ref), (name, mode, denom)
                    boxes = [(x, 9, max(1, (W - x) // 2), 40) for x in range(0, min(50 * denom, W - 1), denom)]
                    boxes += [(13, y, 70, max(1, (H - y) // 2)) for y in range(0, min(34 * denom, H - 1), 3 * denom)]
                    for x, y, w, h in boxes:
                        got = decode(data, mode=mode, scale=1 / denom, crop=(x, y, w, h))
                        want = ref[y // denom:-(-(y + h) // denom), x // denom:-(-(x + w) // denom)]
                        assert np.array_equal(got, want), (name, mode, denom, ours, (x, y, w, h))
                        checked += 1
    assert checked > 1000


def test_crop_of_a_truncated_progressive_file_kept_with_strict_false_is_the_slice_of_its_decode():
    """A progressive file cut before its last scans (a partial download) is smoothed too: with
    strict=False every crop must still be the slice of the full decode of the same bytes (41 of
    60 left-edge offsets differed with the file cut at half, before NOTE [ Block smoothing needs
    two iMCUs on the left ])."""
    data = _opencv(photo_like(150, 118, seed=41), 90)
    for frac in (0.5, 0.7):
        cut = data[:int(len(data) * frac)]
        with pytest.warns(DecodeWarning, match="Premature end of JPEG file"):
            full = decode(cut, strict=False)
        for x in range(60):
            with pytest.warns(DecodeWarning, match="Premature end of JPEG file"):
                got = decode(cut, strict=False, crop=(x, 9, 60, 40))
            assert np.array_equal(got, full[9:49, x:x + 60]), (frac, x)


@pytest.mark.parametrize("num_threads", [1, 2])
def test_fused_chain_on_a_smoothed_progressive_file_equals_opencvs_pixels(writer, num_threads):
    """The fuzzing finding's path: a fused chain decodes only the region its taps read. A
    CenterCrop chain must give the slice of OpenCV's decode, for every phase of the crop's left
    edge against the iMCU grid; a RandomResizedCrop chain (no DCT scaling) must give what the
    same chain gives on OpenCV's decoded pixels of the smoothed files, and on the finding itself
    what it gives on loaderlib's full decode (the harness's check: OpenCV refuses the finding,
    whose libjpeg warns of an inconsistent progression that libjpeg-turbo 2.1.5 and 3.1.3 accept
    without a word). The batch holds each file several times, on one and two threads."""
    files = [d for name, d in _smoothed(writer) if name != "unrefined-gray"]
    with open(FINDING, "rb") as f:
        finding = f.read()
    assert jpeg_info(finding).progressive
    for off in range(0, 48, 3):
        plan = compile_chain(T.Compose([T.Decode(dct_scaling=False), T.CenterCrop((40, 150 - 2 * off))]))
        out = np.zeros((2 * len(files), *plan.sample_shape), np.uint8)
        st = plan.run_buffers_into(files * 2, out, np.arange(len(out)), seed=3, epoch=0, num_threads=num_threads)
        assert not st.errors
        for k, data in enumerate(files * 2):
            ref = cv2_reference(data)
            assert np.array_equal(out[k], ref[39:79, off:150 - off]), (k, off)
    chain = T.Compose([T.Decode(dct_scaling=False), T.RandomResizedCrop(24), T.ToCHW()])
    plan = compile_chain(chain)
    bufs = [finding] * 32 + files * 4   # 4 of the finding's 32 boxes start past its first iMCU
    idx = np.arange(100, 100 + len(bufs))
    fused = np.zeros((len(bufs), *plan.sample_shape), np.uint8)
    st = plan.run_buffers_into(bufs, fused, idx, seed=1, epoch=1, num_threads=num_threads)
    assert not st.errors
    ref = np.zeros_like(fused)
    pixels = [decode(b, strict=True) if b is finding else cv2_reference(b) for b in bufs]
    st = plan.run_pixels_into(pixels, ref, idx, seed=1, epoch=1, num_threads=num_threads)
    assert not st.errors
    for k in range(len(bufs)):
        assert np.array_equal(fused[k], ref[k]), f"item {k}"
