"""JPEG decode kernels against OpenCV's decoder (an independent libjpeg-turbo build)."""

from __future__ import annotations

import mmap
import os

import cv2
import numpy as np
import pytest

import loaderlib as ll
from loaderlib.decoding import decode_batch, jpeg_info, scale_denominator
from tests.conftest import DATA, cv2_reference, encode_cmyk_jpeg, encode_jpeg, make_photo

REDUCED = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}
REDUCED_GRAY = {2: cv2.IMREAD_REDUCED_GRAYSCALE_2, 4: cv2.IMREAD_REDUCED_GRAYSCALE_4,
                8: cv2.IMREAD_REDUCED_GRAYSCALE_8}


def test_build_info_reports_openmp_and_libjpeg_turbo():
    info = ll.build_info()
    assert info["openmp"] is True, "extensions were built without OpenMP"
    assert info["max_threads"] >= 1
    assert info["libjpeg_turbo_version"] and info["libjpeg_turbo_version"][0] in "23456789"
    assert isinstance(info["simd"], bool)


def test_full_decode_bitwise_equal_to_opencv(jpeg_matrix):
    for name, data in jpeg_matrix:
        for mode in ("RGB", "BGR", "GRAY"):
            got = ll.decode(data, mode=mode)
            ref = cv2_reference(data, mode)
            assert got.dtype == np.uint8 and got.flags.c_contiguous
            assert got.shape == ref.shape, (name, mode)
            assert np.array_equal(got, ref), f"{name} {mode}: max diff {np.abs(got.astype(int) - ref).max()}"


def test_grayscale_jpeg_as_one_channel_and_as_rgb(jpeg_matrix):
    grays = [(n, d) for n, d in jpeg_matrix if "gray" in n]
    assert grays
    for name, data in grays:
        assert jpeg_info(data).channels == 1
        g = ll.decode(data, mode="GRAY")
        rgb = ll.decode(data, mode="RGB")
        assert g.shape[2] == 1 and rgb.shape[2] == 3
        assert np.array_equal(rgb, np.repeat(g, 3, axis=2)), name
        assert np.array_equal(rgb, cv2_reference(data, "RGB")), name


def test_jpeg_info_reads_header_facts():
    img = make_photo(123, 77, seed=5)
    for sampling, label in (("420", "4:2:0"), ("422", "4:2:2"), ("444", "4:4:4")):
        for prog in (False, True):
            info = jpeg_info(encode_jpeg(img, 80, sampling, prog))
            assert (info.width, info.height, info.channels) == (123, 77, 3)
            assert info.subsampling == label
            assert info.progressive is prog
            assert info.color_space == "YCbCr"
            assert info.arithmetic is False and info.precision == 8
    g = jpeg_info(encode_jpeg(cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)))
    assert (g.channels, g.color_space, g.subsampling) == (1, "GRAY", "gray")


@pytest.mark.parametrize("denom", [2, 4, 8])
def test_dct_scaling_equals_opencv_reduced(jpeg_matrix, denom):
    for name, data in jpeg_matrix:
        got = ll.decode(data, scale=1 / denom)
        ref = cv2_reference(data, "RGB", REDUCED[denom])
        assert got.shape == ref.shape, (name, denom)
        assert np.array_equal(got, ref), name
        gg = ll.decode(data, mode="GRAY", scale=1 / denom)
        gref = cv2_reference(data, "GRAY", REDUCED_GRAY[denom])
        assert np.array_equal(gg, gref), name


def test_scale_argument_forms():
    from fractions import Fraction

    assert scale_denominator(1) == 1
    assert scale_denominator(0.5) == 2
    assert scale_denominator(Fraction(1, 8)) == 8
    for bad in (0.3, 2, "x", 1 / 3, 0):
        with pytest.raises(ValueError, match=r"scale must be 1, 1/2, 1/4 or 1/8, got "):
            scale_denominator(bad)


def test_crop_equals_full_decode_then_slice(jpeg_matrix):
    """Bitwise: the kernel decodes a little past the box (NOTE [ Exact crop decode ])."""
    rng = np.random.default_rng(0)
    for name, data in jpeg_matrix:
        info = jpeg_info(data)
        W, H = info.width, info.height
        for denom in (1, 2, 4, 8):
            full = ll.decode(data, scale=1 / denom)
            for _ in range(6):
                w = int(rng.integers(1, W + 1))
                h = int(rng.integers(1, H + 1))
                x = int(rng.integers(0, W - w + 1))
                y = int(rng.integers(0, H - h + 1))
                got = ll.decode(data, scale=1 / denom, crop=(x, y, w, h))
                ref = full[y // denom : -(-(y + h) // denom), x // denom : -(-(x + w) // denom)]
                assert got.shape == ref.shape, (name, denom, (x, y, w, h))
                assert np.array_equal(got, ref), (name, denom, (x, y, w, h))


def test_crop_out_of_bounds_is_a_value_error(photo_jpeg):
    with pytest.raises(ValueError, match="outside"):
        ll.decode(photo_jpeg, crop=(400, 0, 200, 10))
    with pytest.raises(ValueError, match=r"^crop must have x, y >= 0 and w, h > 0, got \(0, 0, 0, 10\)"):
        ll.decode(photo_jpeg, crop=(0, 0, 0, 10))
    with pytest.raises(ValueError, match=r"^crop must have x, y >= 0 and w, h > 0, got \(-1, 0, 5, 5\)"):
        ll.decode(photo_jpeg, crop=(-1, 0, 5, 5))


def test_batch_identical_for_one_and_two_threads(jpeg_matrix):
    datas = [d for _, d in jpeg_matrix]
    r1 = decode_batch(datas, num_threads=1)
    r2 = decode_batch(datas, num_threads=2)
    assert (r1.status == 0).all() and (r2.status == 0).all()
    for a, b, (name, data) in zip(r1.images, r2.images, jpeg_matrix):
        assert np.array_equal(a, b), name
        assert np.array_equal(a, cv2_reference(data)), name
    crops = [(1, 2, 10, 9)] * len(datas)
    c1 = decode_batch(datas, scale=0.5, crop=crops, num_threads=1)
    c2 = decode_batch(datas, scale=0.5, crop=crops, num_threads=2)
    assert all(np.array_equal(a, b) for a, b in zip(c1.images, c2.images))


def test_batch_into_caller_owned_outputs(photo_jpeg):
    datas = [photo_jpeg] * 5
    out = np.zeros((5, 375, 500, 3), np.uint8)
    res = decode_batch(datas, out=out, num_threads=2)
    assert (res.status == 0).all()
    ref = cv2_reference(photo_jpeg)
    for i in range(5):
        assert np.array_equal(out[i], ref)
        assert np.shares_memory(res.images[i], out)
    # A crop into a list of per-item outputs.
    outs = [np.zeros((100, 60, 1), np.uint8) for _ in range(3)]
    res = decode_batch([photo_jpeg] * 3, mode="GRAY", crop=(10, 20, 60, 100), out=outs)
    assert all(np.array_equal(o, cv2_reference(photo_jpeg, "GRAY")[20:120, 10:70]) for o in outs)


def test_batch_wrong_output_shape_is_reported_per_item(photo_jpeg):
    out = [np.zeros((375, 500, 3), np.uint8), np.zeros((10, 10, 3), np.uint8)]
    res = decode_batch([photo_jpeg, photo_jpeg], out=out, on_error="return")
    assert list(res.status) == [0, -5]
    assert "output buffer is 10x10x3" in str(res.errors[1])
    with pytest.raises(ValueError, match=r"outs\[0\] must be a writeable C-contiguous uint8 HxWxC array"):
        decode_batch([photo_jpeg], out=[np.zeros((375, 500, 3), np.float32)])


def test_inputs_of_every_buffer_kind_without_copy(photo_jpeg, tmp_path):
    ref = cv2_reference(photo_jpeg)
    p = tmp_path / "a.bin"
    p.write_bytes(b"garbage-prefix" + photo_jpeg + b"suffix")
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        mv = memoryview(mm)[14 : 14 + len(photo_jpeg)]
        kinds = [photo_jpeg, bytearray(photo_jpeg), memoryview(photo_jpeg),
                 np.frombuffer(photo_jpeg, np.uint8), mv]
        res = decode_batch(kinds, num_threads=2)
        for img in res.images:
            assert np.array_equal(img, ref)
        assert np.array_equal(ll.decode(mv), ref)
        del mv, res, kinds
    with pytest.raises(TypeError, match="^expected bytes, bytearray, memoryview, mmap or a uint8 numpy array, got int"):
        ll.decode(12345)
    with pytest.raises(TypeError, match="^numpy input must be C-contiguous"):
        ll.decode(np.frombuffer(photo_jpeg, np.uint8)[::2])


@pytest.mark.parametrize("ext", [".png", ".bmp", ".webp"])
def test_non_jpeg_formats_through_opencv(ext):
    img = make_photo(97, 61, seed=3)
    ok, buf = cv2.imencode(ext, img)
    assert ok
    data = buf.tobytes()
    assert np.array_equal(ll.decode(data), img[:, :, ::-1])
    assert np.array_equal(ll.decode(data, mode="BGR"), img)
    assert np.array_equal(ll.decode(data, mode="GRAY"), cv2_reference(data, "GRAY"))
    assert np.array_equal(ll.decode(data, crop=(5, 7, 20, 30)), img[7:37, 5:25, ::-1])
    half = ll.decode(data, scale=0.5)
    assert half.shape == (31, 49, 3)
    assert np.array_equal(half, cv2.resize(img, (49, 31), interpolation=cv2.INTER_AREA)[:, :, ::-1])
    # Mixed batch: JPEG and non-JPEG together.
    res = decode_batch([data, encode_jpeg(img)], num_threads=2)
    assert (res.status == 0).all()
    assert np.array_equal(res.images[0], img[:, :, ::-1])


def test_cmyk_jpeg_decodes_like_opencv():
    img = make_photo(71, 45, seed=9)
    data = encode_cmyk_jpeg(img)
    info = jpeg_info(data)
    assert info.channels == 4 and info.color_space in ("CMYK", "YCCK")
    for mode in ("RGB", "BGR", "GRAY"):
        assert np.array_equal(ll.decode(data, mode=mode), cv2_reference(data, mode)), mode
    full = ll.decode(data)
    assert np.array_equal(ll.decode(data, crop=(3, 4, 30, 20)), full[4:24, 3:33])


def test_arithmetic_coded_jpeg():
    with open(os.path.join(DATA, "arithmetic_40x30.jpg"), "rb") as f:
        data = f.read()
    info = jpeg_info(data)
    assert info.arithmetic is True
    assert np.array_equal(ll.decode(data), cv2_reference(data))


_SWEEP_SAMPLING = {"420": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420, "422": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422,
                   "444": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444, "440": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440,
                   "411": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411}


@pytest.mark.parametrize("progressive", [False, True], ids=["baseline", "progressive"])
@pytest.mark.parametrize("sampling", [*_SWEEP_SAMPLING, "gray"])
def test_crop_edges_at_every_offset_equal_the_full_decode(sampling, progressive):
    """NOTE [ Exact crop decode ]: the decoded area reaches only LL_CROP_CONTEXT pixels past the
    box, so every phase of the box's edges against the iMCU grid must still give the full
    decode's pixels. The left, right and top edges each sweep two iMCUs (32 output pixels) of
    offsets, at every DCT scale, exact and fast (merged upsampling), RGB and GRAY."""
    img = make_photo(150, 118, seed=41)
    params = [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive)]
    if sampling == "gray":
        img = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
    else:
        params += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, _SWEEP_SAMPLING[sampling]]
    ok, buf = cv2.imencode(".jpg", img, params)
    assert ok
    data = buf.tobytes()
    W, H = 150, 118
    checked = 0
    for denom in (1, 2, 4, 8):
        for fast in (False, True):
            for mode in ("RGB", "GRAY"):
                full = ll.decode(data, scale=1 / denom, fast=fast, mode=mode)
                boxes = []
                for x in range(0, min(34 * denom, W - 1), denom):   # the left edge
                    boxes.append((x, 9, max(1, (W - x) // 2), 40))
                for e in range(max(2, W - 34 * denom), W + 1, denom):   # the right edge
                    boxes.append((1, 17, e - 1, 33))
                for y in range(0, min(34 * denom, H - 1), denom):   # the top edge
                    boxes.append((7, y, 61, max(1, (H - y) // 2)))
                for x, y, w, h in boxes:
                    got = ll.decode(data, scale=1 / denom, crop=(x, y, w, h), fast=fast, mode=mode)
                    ref = full[y // denom : -(-(y + h) // denom), x // denom : -(-(x + w) // denom)]
                    assert got.shape == ref.shape, (denom, fast, mode, (x, y, w, h))
                    assert np.array_equal(got, ref), (denom, fast, mode, (x, y, w, h))
                    checked += 1
    assert checked > 500
