"""Bad input is the normal case over millions of files: every variant either decodes or
raises DecodeError naming the item; the process never crashes."""

from __future__ import annotations

import os
import sys
import warnings

import cv2
import numpy as np
import pytest

import loaderlib as ll
from loaderlib import DecodeError, DecodeWarning
from loaderlib.decoding import DEFAULT_MAX_PIXELS, decode_batch, jpeg_info
from tests.conftest import DATA, cv2_reference, encode_cmyk_jpeg, encode_jpeg, make_photo
from tests.kernels._loader_images import damaged


def _sof_offset(data: bytes) -> int:
    """Offset of the SOFn marker segment (FF C0..CF except C4, C8, CC)."""
    i = 2
    while i + 4 <= len(data):
        assert data[i] == 0xFF
        marker = data[i + 1]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return i
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    raise AssertionError("no SOF marker")


def _with_dims(data: bytes, width: int, height: int) -> bytes:
    b = bytearray(data)
    s = _sof_offset(data)
    b[s + 5 : s + 7] = height.to_bytes(2, "big")
    b[s + 7 : s + 9] = width.to_bytes(2, "big")
    return bytes(b)


def test_empty_input():
    with pytest.raises(DecodeError, match="empty"):
        ll.decode(b"")
    with pytest.raises(DecodeError, match="empty"):
        jpeg_info(b"")


def test_truncated_jpeg_raises(photo_jpeg):
    """NOTE [ Truncated JPEG is an error ]: a cut file is refused (as PIL does), not greyed out."""
    cut = photo_jpeg[: len(photo_jpeg) // 2]
    with pytest.raises(DecodeError, match="truncated: the data ends before the image"):
        ll.decode(cut)
    with pytest.raises(DecodeError, match=r"Premature end of JPEG file.*strict=True"):
        ll.decode(cut, strict=True)


def test_recoverable_damage_warns_or_raises_per_strict(photo_jpeg):
    bad = damaged(photo_jpeg)
    ref = cv2_reference(photo_jpeg)
    with pytest.warns(DecodeWarning, match="premature end of data segment"):
        img = ll.decode(bad)
    assert img.shape == ref.shape
    with pytest.raises(DecodeError, match="strict"):
        ll.decode(bad, strict=True)
    # Truncated inside the headers: nothing to decode.
    with pytest.raises(DecodeError, match="^cannot decode image: "):
        ll.decode(photo_jpeg[:150])


def test_corrupt_headers_and_random_bytes(photo_jpeg):
    rng = np.random.default_rng(1)
    with pytest.raises(DecodeError, match="not a recognised image format"):
        ll.decode(rng.integers(0, 256, 5000, dtype=np.uint8).tobytes())
    with pytest.raises(DecodeError, match="^cannot decode image: "):   # libjpeg's own reason
        ll.decode(b"\xff\xd8\xff" + rng.integers(0, 256, 5000, dtype=np.uint8).tobytes())
    with pytest.raises(DecodeError, match="not a recognised image format"):
        ll.decode(b"this is a text file, not an image\n" * 20)
    b = bytearray(photo_jpeg)
    s = _sof_offset(photo_jpeg)
    b[s + 4 : s + 20] = b"\x00" * 16  # zero precision, dimensions and components
    with pytest.raises(DecodeError, match=r"Empty JPEG image"):
        ll.decode(bytes(b))


def test_twelve_bit_jpeg_is_refused_with_libjpegs_message(photo_jpeg):
    b = bytearray(photo_jpeg)
    b[_sof_offset(photo_jpeg) + 4] = 12  # sample precision
    with pytest.raises(DecodeError, match="precision 12"):
        ll.decode(bytes(b))


def test_declared_dimensions_guard(photo_jpeg):
    bomb = _with_dims(photo_jpeg, 20000, 20000)  # 400 MP declared in a 40 KB file
    with pytest.raises(DecodeError, match="max_pixels"):
        ll.decode(bomb)
    assert 20000 * 20000 > DEFAULT_MAX_PIXELS
    with pytest.raises(DecodeError, match="max_pixels"):
        ll.decode(photo_jpeg, max_pixels=1000)
    # Beyond libjpeg's own limit even without the guard.
    with pytest.raises(DecodeError, match="65500"):
        ll.decode(_with_dims(photo_jpeg, 65535, 65535), max_pixels=None)
    # The header-only reader still reports what the file claims.
    assert jpeg_info(bomb).width == 20000


def test_truncated_and_corrupt_non_jpeg():
    img = make_photo(40, 30, seed=2)
    png = cv2.imencode(".png", img)[1].tobytes()
    with pytest.raises(DecodeError, match="PNG"):
        ll.decode(png[: len(png) // 2])
    bomb = bytearray(png)
    bomb[16:24] = (100000).to_bytes(4, "big") * 2
    with pytest.raises(DecodeError, match="max_pixels"):
        ll.decode(bytes(bomb))


def test_batch_errors_name_item_and_source(photo_jpeg):
    good = photo_jpeg
    bad = b"\xff\xd8\xff\xe0" + b"\x00" * 50
    res = decode_batch([good, bad, b"", good], sources=["a.jpg", "b.jpg", "c.jpg", "d.jpg"],
                       on_error="return", num_threads=2)
    assert list(res.ok) == [True, False, False, True]
    assert res.images[1] is None and res.images[2] is None
    e = res.errors[1]
    assert e.index == 1 and e.source == "b.jpg"
    assert "item 1" in str(e) and "b.jpg" in str(e)
    assert "empty" in str(res.errors[2])
    assert np.array_equal(res.images[3], cv2_reference(good))
    with pytest.raises(DecodeError, match="item 1 'b.jpg'"):
        decode_batch([good, bad], sources=["a.jpg", "b.jpg"])


def test_batch_warnings_and_strict(photo_jpeg):
    bad = damaged(photo_jpeg)
    with pytest.warns(DecodeWarning, match="item 1 'x.jpg'"):
        res = decode_batch([photo_jpeg, bad], sources=["w.jpg", "x.jpg"])
    assert list(res.status) == [0, 1]
    res = decode_batch([photo_jpeg, bad], strict=True, on_error="return")
    assert list(res.status) == [0, -7]
    cut = photo_jpeg[: len(photo_jpeg) * 2 // 3]
    res = decode_batch([photo_jpeg, cut], on_error="return")
    assert list(res.status) == [0, -1] and "truncated" in str(res.errors[1])


# --------------------------------------------------------------------------- mutations


def _seeds() -> list[bytes]:
    img = make_photo(72, 56, seed=11)
    gray = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
    with open(os.path.join(DATA, "arithmetic_40x30.jpg"), "rb") as f:
        arith = f.read()
    return [
        encode_jpeg(img, 90, "420"),
        encode_jpeg(img, 75, "444", progressive=True),
        encode_jpeg(img, 60, "422"),
        encode_jpeg(gray, 80, progressive=True),
        encode_cmyk_jpeg(img),
        arith,
        cv2.imencode(".png", img)[1].tobytes(),
    ]


def _mutate(data: bytes, rng: np.random.Generator) -> bytes:
    b = bytearray(data)
    kind = int(rng.integers(0, 6))
    if kind == 0:  # truncate anywhere
        return bytes(b[: int(rng.integers(0, len(b)))])
    if kind == 1:  # flip a few random bytes
        for _ in range(int(rng.integers(1, 12))):
            b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
        return bytes(b)
    if kind == 2:  # overwrite a run with random bytes (often hits the headers)
        start = int(rng.integers(0, min(len(b), 400)))
        n = int(rng.integers(1, 64))
        b[start : start + n] = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        return bytes(b)
    if kind == 3:  # insert random bytes
        at = int(rng.integers(0, len(b)))
        return bytes(b[:at]) + rng.integers(0, 256, int(rng.integers(1, 40)), dtype=np.uint8).tobytes() + bytes(b[at:])
    if kind == 4:  # delete a run
        at = int(rng.integers(0, len(b)))
        return bytes(b[:at] + b[at + int(rng.integers(1, 200)) :])
    # corrupt a 16-bit field right after a marker (lengths, dimensions, table sizes)
    markers = [i for i in range(len(b) - 3) if b[i] == 0xFF and b[i + 1] not in (0x00, 0xFF)]
    if markers:
        at = markers[int(rng.integers(0, len(markers)))] + 2 + int(rng.integers(0, 8))
        if at + 2 <= len(b):
            b[at : at + 2] = int(rng.integers(0, 65536)).to_bytes(2, "big")
    return bytes(b)


def test_mutation_sweep_never_crashes():
    """Thousands of corrupted/truncated variants through decode and decode_batch: each
    decodes (with the shape its header implies) or raises DecodeError; no other outcome."""
    rng = np.random.default_rng(2024)
    seeds = _seeds()
    variants = [_mutate(seeds[i % len(seeds)], rng) for i in range(3000)]
    outcomes = {"decoded": 0, "error": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DecodeWarning)
        for k, v in enumerate(variants):
            denom = (1, 2, 4, 8)[k % 4]
            try:
                img = ll.decode(v, mode=("RGB", "GRAY", "BGR")[k % 3], scale=1 / denom, strict=bool(k % 2),
                                max_pixels=4_000_000)
            except DecodeError:
                outcomes["error"] += 1
            else:
                outcomes["decoded"] += 1
                assert img.dtype == np.uint8 and img.ndim == 3 and img.size > 0
        for start in range(0, len(variants), 250):
            chunk = variants[start : start + 250]
            crops = [(0, 0, 8, 8) if j % 3 == 0 else None for j in range(len(chunk))]
            res = decode_batch(chunk, crop=crops, num_threads=2, on_error="return", max_pixels=4_000_000)
            assert set(res.errors) == {int(i) for i in np.flatnonzero(res.status < 0)}
            for j, img in enumerate(res.images):
                assert (img is None) == (res.status[j] < 0)
                if img is not None and crops[j] is not None:
                    assert img.shape[:2] == (8, 8)
    # The sweep must exercise both outcomes, or it tests nothing.
    assert outcomes["decoded"] > 200 and outcomes["error"] > 200, outcomes


def test_strict_false_keeps_partial_images(photo_jpeg):
    """PIL's LOAD_TRUNCATED_IMAGES: with strict=False a cut file decodes, padded, with a warning."""
    cut = photo_jpeg[: len(photo_jpeg) // 2]
    ref = cv2_reference(photo_jpeg)
    with pytest.warns(DecodeWarning, match="Premature end"):
        img = ll.decode(cut, strict=False)
    assert img.shape == ref.shape
    assert np.array_equal(img[:64], ref[:64])   # the rows before the cut are intact
    with pytest.raises(TypeError, match="strict must be True, False or None"):
        ll.decode(cut, strict="yes")
    with pytest.raises(TypeError, match="strict must be True, False or None"):
        ll.transforms.Decode(strict=1)


def _bombs() -> dict:
    """Tiny files whose headers declare 20000 x 20000 pixels (400 megapixels)."""
    import struct
    import zlib

    W = H = 20000
    bmp = (b"BM" + struct.pack("<IHHI", 1080, 0, 0, 54) + struct.pack("<IiiHHIIiiII", 40, W, H, 1, 8, 1, 1026, 0, 0,
                                                                        0, 0) + bytes(1026))
    tiff = (b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 3)
            + struct.pack("<HHII", 256, 4, 1, W) + struct.pack("<HHII", 257, 4, 1, H)
            + struct.pack("<HHII", 258, 3, 1, 8) + struct.pack("<I", 0) + bytes(46000))
    gif = b"GIF89a" + struct.pack("<HH", W, H) + b"\x00\x00\x00" + b",\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;"
    webp = b"RIFF" + struct.pack("<I", 30) + b"WEBPVP8X" + struct.pack("<I", 10) + b"\x00\x00\x00\x00" \
        + (W - 1).to_bytes(3, "little") + (H - 1).to_bytes(3, "little")
    ihdr = struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0)
    png = (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr
           + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr)) + bytes(100))
    return {"BMP": bmp, "TIFF": tiff, "GIF": gif, "WebP": webp, "PNG": png}


@pytest.mark.parametrize("kind", ["BMP", "TIFF", "GIF", "WebP", "PNG"])
def test_bombs_are_refused_from_the_header(kind):
    data = _bombs()[kind]
    with pytest.raises(DecodeError, match=rf"{kind} declares 20000x20000 = 400000000 pixels.*refused before"):
        ll.decode(data)
    res = decode_batch([data], on_error="return")
    assert res.status[0] < 0 and "max_pixels" in str(res.errors[0])


def test_bombs_cost_no_memory(tmp_path):
    """Peak memory (VmHWM, per process) of refusing every bomb (the progressive JPEG too): far
    below what decoding would take."""
    import subprocess
    import sys

    code = (
        "import loaderlib as ll, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from test_decode_bad_input import _bombs, progressive_bomb\n"
        "def hwm():\n"
        "    return int([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1])\n"
        "before = hwm()\n"
        "for data in [*_bombs().values(), progressive_bomb()]:\n"
        "    try:\n"
        "        ll.decode(data)\n"
        "    except ll.DecodeError:\n"
        "        pass\n"
        "print(hwm() - before)\n"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", code, here], capture_output=True, text=True, timeout=120, check=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    assert int(r.stdout.strip()) < 50 * 1024   # KiB: refused before 50 MB


def _progressive(w: int, h: int, seed: int = 0, progressive: bool = True) -> bytes:
    """A 4:2:0 JPEG written by Pillow (an independent encoder), progressive or baseline."""
    import io

    from PIL import Image

    bio = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(make_photo(w, h, seed)[:, :, ::-1])).save(
        bio, "JPEG", quality=85, progressive=progressive, subsampling=2)
    return bio.getvalue()


def progressive_bomb() -> bytes:
    """A 2 KB progressive JPEG whose header declares 13000 x 13000 (169 megapixels, under
    DEFAULT_MAX_PIXELS): libjpeg would allocate its whole coefficient buffer, 508 MB."""
    return _with_dims(_progressive(64, 64), 13000, 13000)


def _coef_bytes_420(w: int, h: int) -> int:
    """libjpeg's whole-image coefficient buffer for 4:2:0 (jdcoefct.c): per component, blocks
    rounded up to whole MCUs of its sampling factors, 64 coefficients of 2 bytes each."""
    def up(n, k):
        return -(-n // k)

    luma = up(up(w, 8), 2) * 2 * up(up(h, 8), 2) * 2
    chroma = up(w, 16) * up(h, 16)
    return (luma + 2 * chroma) * 128


def test_progressive_bomb_is_refused_before_allocation():
    """NOTE [ Coefficient memory budget ]: refused from the header at every scale and crop,
    with the file named and the way to raise the budget, in decode, decode_batch and the
    fused chain."""
    from loaderlib._chain import compile_chain

    bomb = progressive_bomb()
    assert len(bomb) < 4096 and 13000 * 13000 < DEFAULT_MAX_PIXELS
    need = _coef_bytes_420(13000, 13000)
    msg = (rf"progressive JPEG of 13000x13000 needs {need / 1e6:.1f} MB of coefficients at any scale or crop, "
           rf"over the budget of 268\.4 MB .*raise max_pixels to {(2 * need + 2) // 3} or pass None")
    for kwargs in ({}, {"scale": 1 / 8}, {"crop": (0, 0, 64, 64)}, {"scale": 1 / 8, "crop": (100, 100, 64, 64)}):
        with pytest.raises(DecodeError, match=msg):
            ll.decode(bomb, source="bomb.jpg", **kwargs)
    res = decode_batch([_progressive(64, 64), bomb], sources=["ok.jpg", "bomb.jpg"], on_error="return")
    assert res.status[0] == 0 and res.status[1] < 0
    assert "bomb.jpg" in str(res.errors[1]) and "coefficients" in str(res.errors[1])
    plan = compile_chain(ll.transforms.Compose([ll.transforms.RandomResizedCrop(32)]))
    out = np.zeros((1, *plan.sample_shape), plan.dtype)
    st = plan.run_buffers_into([bomb], out, np.arange(1), seed=0, epoch=0, num_threads=1)
    assert st.status[0] < 0 and "coefficients" in st.errors[0].reason


def test_progressive_budget_follows_max_pixels():
    """A real 600x400 progressive JPEG needs 729,600 bytes of coefficients (computed from
    libjpeg's layout): refused when 1.5 x max_pixels is below that, decoded (equal to OpenCV)
    at exactly the max_pixels the error names; the baseline file of the same image needs no
    coefficient buffer and decodes under the same low max_pixels."""
    prog, base = _progressive(600, 400, seed=3), _progressive(600, 400, seed=3, progressive=False)
    need = _coef_bytes_420(600, 400)
    assert need == 729_600 and jpeg_info(prog).progressive
    with pytest.raises(DecodeError, match=rf"needs 0\.7 MB of coefficients.*raise max_pixels to {(2 * need + 2) // 3} "):
        ll.decode(prog, max_pixels=400_000)
    img = ll.decode(prog, max_pixels=(2 * need + 2) // 3)
    assert np.array_equal(img, cv2_reference(prog))
    assert np.array_equal(ll.decode(base, max_pixels=400_000), cv2_reference(base))
    assert np.array_equal(ll.decode(prog, max_pixels=None), img)


_PEAK = r"""
import sys, cv2, numpy as np, loaderlib as ll
path, mode, rgb_flag = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if not rgb_flag:
    del cv2.IMREAD_COLOR_RGB   # an OpenCV older than 4.10: the in-place cvtColor path
data = open(path, "rb").read()
def hwm():
    return int([l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]) * 1024
before = hwm()
out = ll.decode(data, mode=mode)
ratio = (hwm() - before - out.nbytes) / (out.shape[0] * out.shape[1] * 3)   # beyond the output, in colour images
ref = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_GRAYSCALE if mode == "GRAY" else cv2.IMREAD_COLOR)
ref = ref[:, :, None] if ref.ndim == 2 else (ref[:, :, ::-1] if mode == "RGB" else ref)
print(ratio, np.array_equal(out, ref))
"""


@pytest.mark.parametrize(("ext", "mode", "rgb_flag"), [(".png", "RGB", 1), (".bmp", "BGR", 1), (".tiff", "RGB", 1),
                                                       (".png", "GRAY", 1), (".png", "RGB", 0)])
def test_opencv_formats_decode_without_a_full_size_copy(tmp_path, ext, mode, rgb_flag):
    """NOTE [ No full-size colour copy ]: decoding a 3000x2000 PNG/BMP/TIFF raises the process's
    peak memory (VmHWM, read in a fresh process) by the output image plus less than a third of
    a colour image, not by two images (which cv2.imdecode's returned copy costs, and a BGR->RGB
    copy on top); equal to OpenCV's own decode. Also for OpenCV builds without
    IMREAD_COLOR_RGB (channels swapped in place)."""
    import subprocess
    import sys

    path = tmp_path / f"big{ext}"
    params = [cv2.IMWRITE_WEBP_QUALITY, 101] if ext == ".webp" else []
    path.write_bytes(cv2.imencode(ext, make_photo(3000, 2000, seed=4), params)[1].tobytes())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    r = subprocess.run([sys.executable, "-c", _PEAK, str(path), mode, str(rgb_flag)], capture_output=True, text=True,
                       timeout=120, check=True, env=env)
    ratio, same = r.stdout.split()
    assert same == "True"
    limit = 0.5 if ext == ".tiff" else 0.3   # libtiff maps the file itself: an uncompressed TIFF is 1/3 of it
    assert float(ratio) < limit, f"{ext} {mode}: {float(ratio):.2f} colour images beyond the output"


def _without_segments(data: bytes, marker: int) -> bytes:
    """data with every segment of the given marker before the first scan removed."""
    out, i = bytearray(data[:2]), 2
    while i < len(data) - 1:
        m, length = data[i + 1], int.from_bytes(data[i + 2:i + 4], "big")
        if m == 0xDA:
            return bytes(out + data[i:])
        if m != marker:
            out += data[i:i + 2 + length]
        i += 2 + length
    raise AssertionError("no scan")


def _reason(err) -> str | None:
    """An item's error without the item's index."""
    return None if err is None else str(err).split(": ", 1)[-1]


@pytest.mark.parametrize("progressive", [False, True], ids=["baseline", "progressive"])
def test_a_file_without_its_tables_decodes_as_on_a_fresh_decoder(progressive):
    """NOTE [ Tables end with their image ] (ll_jpeg.h): libjpeg keeps a decompressor's tables
    from one image to the next, so a file that lacks one used to borrow the table of the file
    the same thread decoded before it. Now it decodes as on a fresh decoder, whatever came
    before: without its Huffman tables, with libjpeg's standard ones; without its quantization
    table, not at all."""
    good = encode_jpeg(make_photo(64, 48, seed=1), 90, "420", progressive)
    other = encode_jpeg(make_photo(64, 48, seed=2), 40, "444", True)
    no_dqt = _without_segments(good, 0xDB)
    no_dht = _without_segments(good, 0xC4)
    with pytest.raises(DecodeError, match=r"Quantization table 0x00 was not defined"):
        ll.decode(no_dqt)
    for bad in (no_dqt, no_dht):
        alone = decode_batch([bad], num_threads=1, strict=False, on_error="return")
        for before in (other, good):
            after = decode_batch([before] * 3 + [bad], num_threads=1, strict=False, on_error="return")
            assert after.status[3] == alone.status[0]
            assert _reason(after.errors.get(3)) == _reason(alone.errors.get(0))
            if alone.images[0] is not None:
                np.testing.assert_array_equal(after.images[3], alone.images[0])
    # More files than one decompressor lives for (it is renewed every 64 headers): the same.
    many = decode_batch([good, other] * 70 + [no_dht], num_threads=1, strict=False, on_error="return")
    alone = decode_batch([no_dht], num_threads=1, strict=False, on_error="return")
    assert many.status[-1] == alone.status[0]
    np.testing.assert_array_equal(many.images[0], decode_batch([good], num_threads=1).images[0])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the program's allocator uses mmap and mprotect")
def test_a_reused_decoder_never_touches_the_memory_of_the_image_before(tmp_path):
    """NOTE [ Merged upsampling leaves cconvert stale ] (ll_jpeg.h): one decompressor decodes
    each image with fancy upsampling, then fast (the merged upsampler on 4:2:0 and 4:2:2), with
    crops that start below the top (jpeg_skip_scanlines). tests/kernels/decoder_reuse.c runs
    the decodes through an allocator that makes freed memory inaccessible, so a read of the
    image before's freed state is a SIGSEGV on every run (it was: libjpeg read and wrote the
    previous image's colour converter)."""
    import subprocess

    from tests.kernels._cprog import ROOT, build_c, libjpeg_flags

    exe = build_c(tmp_path, os.path.join(ROOT, "tests", "kernels", "decoder_reuse.c"), [*libjpeg_flags(), "-lm"])
    img = make_photo(120, 168, seed=4)
    files = []
    for name, params in [
        ("444", [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444]),
        ("420", [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420]),
        ("422", [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422]),
        ("420p", [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420,
                  cv2.IMWRITE_JPEG_PROGRESSIVE, 1]),
    ]:
        ok, enc = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90, *params])
        assert ok
        path = tmp_path / f"{name}.jpg"
        path.write_bytes(enc.tobytes())
        files.append(str(path))
    gray = tmp_path / "gray.jpg"
    gray.write_bytes(cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_BGR2GRAY))[1].tobytes())
    files.insert(2, str(gray))
    res = subprocess.run([exe, *files], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, f"exit {res.returncode}: {res.stdout}{res.stderr}"
    assert res.stdout.split() == ["decodes", str(20 * len(files)), "bad", "items", "0"], res.stdout
