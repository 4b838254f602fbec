"""Fast JPEG decode (``fast=True``: libjpeg's fast integer IDCT and merged upsampling,
NOTE [ Fast decode ] in pyx/include/ll_jpeg.h) against the exact decode, which is itself
bitwise equal to OpenCV (the independent reference of tests/kernels/test_decode.py)."""

from __future__ import annotations

import warnings

import cv2
import numpy as np
import pytest

import loaderlib as ll
from benchmarks._synth import encode_jpeg, photo_like
from loaderlib import transforms as T
from loaderlib._chain import compile_chain
from loaderlib.decoding import decode_batch
from loaderlib.errors import DecodeError, DecodeWarning
from tests.conftest import cv2_reference

# The bounds stated in loaderlib.decoding.decode's docstring, in uint8 levels (measured on
# this set: 1.23 overall, per image 1.85 / 4.62, max 42 / 18).
MEAN_BOUND = 1.3             # mean absolute error over every pixel of the set
MEAN_BOUND_IMAGE = 2.0       # per image, 333x251 and larger
MEAN_BOUND_THUMBNAIL = 5.0   # per image, the 17x13 and 64x48 thumbnails (every pixel near an edge)
MAX_BOUND = 45               # with chroma subsampling (4:2:0, 4:2:2): merged upsampling at colour edges
MAX_BOUND_NO_SUBSAMPLING = 20  # 4:4:4 and grayscale: only the IDCT differs

SIZES = [(17, 13), (64, 48), (333, 251), (640, 480)]
KINDS = [("420", False), ("422", False), ("444", False), ("420", True), ("gray", False), ("gray", True)]


def _images() -> list[tuple[str, str, bytes]]:
    """(name, mode, jpeg) over sizes x subsamplings (baseline and progressive) x quality."""
    out = []
    for k, (w, h) in enumerate(SIZES):
        img = photo_like(w, h, seed=k)
        for sampling, prog in KINDS:
            for q in (90, 95):
                if sampling == "gray":
                    data = encode_jpeg(cv2.cvtColor(img, cv2.COLOR_BGR2GRAY), q, progressive=prog)
                else:
                    data = encode_jpeg(img, q, sampling, progressive=prog)
                name = f"{w}x{h}-{sampling}{'-prog' if prog else ''}-q{q}"
                out.append((name, "GRAY" if sampling == "gray" else "RGB", data))
    return out


@pytest.fixture(scope="module")
def images() -> list[tuple[str, str, bytes]]:
    return _images()


def test_fast_decode_error_stays_within_the_documented_bound(images):
    total, count = 0, 0
    for name, mode, data in images:
        exact = ll.decode(data, mode=mode)
        fast = ll.decode(data, mode=mode, fast=True)
        assert fast.shape == exact.shape and fast.dtype == np.uint8 and fast.flags.c_contiguous
        diff = np.abs(fast.astype(np.int16) - exact)
        bound = MAX_BOUND if ("420" in name or "422" in name) else MAX_BOUND_NO_SUBSAMPLING
        mean_bound = MEAN_BOUND_THUMBNAIL if exact.shape[1] < 100 else MEAN_BOUND_IMAGE
        assert diff.mean() <= mean_bound, f"{name}: mean abs error {diff.mean():.3f}"
        assert diff.max() <= bound, f"{name}: max abs error {diff.max()}"
        total += int(diff.sum())
        count += diff.size
    assert total / count <= MEAN_BOUND, f"mean abs error over the set {total / count:.3f}"
    # the option does something: a 4:2:0 photo decodes differently
    name, mode, data = images[-12]
    assert "640x480-420-q90" == name
    assert not np.array_equal(ll.decode(data, fast=True), ll.decode(data))


def test_default_decode_is_unchanged_and_bitwise_equal_to_opencv(images):
    for name, mode, data in images:
        ref = cv2_reference(data, mode)
        assert np.array_equal(ll.decode(data, mode=mode), ref), name
        assert np.array_equal(ll.decode(data, mode=mode, fast=False), ref), name


def test_fast_crop_and_scale_equal_slicing_a_full_fast_decode(images):
    """NOTE [ Exact crop decode ] holds for the fast decode too: a crop at any DCT scale
    is the slice of the full fast decode at that scale."""
    for name, mode, data in images:
        if not name.startswith("333x251") and not name.startswith("640x480"):
            continue
        for denom in (1, 2, 4, 8):
            full = ll.decode(data, mode=mode, scale=1 / denom, fast=True)
            for x, y, w, h in ((0, 0, 40, 30), (37, 21, 101, 77), (150, 100, 183, 151), (5, 200, 300, 51)):
                got = ll.decode(data, mode=mode, scale=1 / denom, crop=(x, y, w, h), fast=True)
                ref = full[y // denom:-(-(y + h) // denom), x // denom:-(-(x + w) // denom)]
                assert np.array_equal(got, ref), f"{name} 1/{denom} crop {(x, y, w, h)}"


def test_fast_decodes_depend_on_no_byte_libjpeg_left_unwritten(images):
    """NOTE [ Sample rows are cleared ] (pyx/include/ll_jpeg.h): libjpeg-turbo's SIMD kernels
    read past the samples its IDCT wrote, to the end of each padded row and past a crop's
    columns. `make memcheck` runs this file under valgrind, which reports any byte of an output
    that was never written; here, with any SIMD level, the same fast decode must give the same
    pixels whichever image its thread decoded before (noise or a flat one, whose freed blocks
    libjpeg's next allocations reuse) and in batches on one and two threads: whole images at
    every scale (rows whose last vector runs into the padding), crops whose edges fall inside a
    vector, and a truncated file kept with strict=False."""
    by_name = {name: (mode, data) for name, mode, data in images}
    cases = []   # (data, mode, denom, crop)
    for name in ("333x251-444-q90", "333x251-420-q90", "333x251-422-q90", "333x251-gray-q90", "640x480-420-prog-q90"):
        mode, data = by_name[name]
        for denom in (1, 2, 4, 8):
            for crop in (None, (37, 21, 101, 77), (150, 100, 183, 151)):
                cases.append((data, mode, denom, crop))
    mode, data = by_name["640x480-420-q90"]
    for denom in (1, 8):
        cases.append((data[:len(data) * 2 // 3], mode, denom, (5, 200, 300, 51)))
        cases.append((data[:len(data) * 2 // 3], mode, denom, None))
    rng = np.random.default_rng(5)
    noise = encode_jpeg(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8), 100, "444")
    flat = encode_jpeg(np.full((480, 640, 3), 200, np.uint8), 90, "420")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DecodeWarning)   # the truncated file, kept with strict=False
        first = []
        for data, mode, denom, crop in cases:
            outs = []
            for before in (noise, flat, noise):
                ll.decode(before, scale=1 / denom, fast=True)
                outs.append(ll.decode(data, mode=mode, scale=1 / denom, crop=crop, fast=True, strict=False))
            assert all(np.array_equal(outs[0], o) for o in outs[1:]), (mode, denom, crop)
            first.append(outs[0])
        for denom in (1, 2, 4, 8):
            for mode in ("RGB", "GRAY"):
                ks = [k for k, c in enumerate(cases) if c[1] == mode and c[2] == denom]
                bufs = [b for k in ks for b in (cases[k][0], noise)]
                crops = [c for k in ks for c in (cases[k][3], None)]
                for nt in (1, 2):
                    res = decode_batch(bufs, mode=mode, scale=1 / denom, crop=crops, num_threads=nt, fast=True,
                                       strict=False)
                    for j, k in enumerate(ks):
                        assert np.array_equal(res.images[2 * j], first[k]), (mode, denom, cases[k][3], nt)


def test_fast_batch_identical_for_one_and_two_threads(images):
    datas = [d for _, m, d in images if m == "RGB"]
    r1 = decode_batch(datas, num_threads=1, fast=True)
    r2 = decode_batch(datas, num_threads=2, fast=True)
    assert len(r1.images) == len(datas)
    for (a, b, d) in zip(r1.images, r2.images, datas):
        assert np.array_equal(a, b)
        assert np.array_equal(a, ll.decode(d, fast=True))


CHAINS = {
    "rrc-flip-normalize-chw": [T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.Normalize(0.5, 0.25),
                               T.ToCHW()],
    "resize-centercrop": [T.Resize(72), T.CenterCrop(64)],
}


@pytest.mark.parametrize("name", list(CHAINS))
def test_fused_fast_chain_equals_the_python_compose(images, name):
    """As tests/kernels/test_pipeline.py's test_fused_chain_equals_the_python_compose, with
    Decode(fast=True): the fused chain and Compose called on the bytes give the same array,
    for 1 and 2 threads."""
    datas = [d for _, m, d in images if m == "RGB"]
    chain = T.Compose([T.Decode(dct_scaling=False, fast=True), *CHAINS[name]])
    plan = compile_chain(chain)
    assert plan is not None
    assert "IFAST, merged upsampling (fast=True)" in plan.describe()[0]
    outs = []
    for threads in (1, 2):
        out = np.zeros((len(datas), *plan.sample_shape), plan.dtype)
        st = plan.run_buffers_into(datas, out, np.arange(len(datas)), seed=3, epoch=1, num_threads=threads)
        assert st.ok.all(), st.errors
        outs.append(out)
    assert np.array_equal(outs[0], outs[1])
    exact = compile_chain(T.Compose([T.Decode(dct_scaling=False), *CHAINS[name]]))
    out_exact = np.zeros_like(outs[0])
    exact.run_buffers_into(datas, out_exact, np.arange(len(datas)), seed=3, epoch=1, num_threads=2)
    assert not np.array_equal(outs[0], out_exact)  # the flag reaches the fused decoder
    for i, data in enumerate(datas):
        ref = chain(data, seed=3, epoch=1, index=i)
        assert np.array_equal(outs[0][i], ref), f"{name} item {i}: max diff {np.abs(outs[0][i] - ref).max()}"


def test_bad_fast_argument_raises():
    data = encode_jpeg(photo_like(32, 24), 90)
    with pytest.raises(TypeError, match="fast must be True or False, got 'yes'"):
        ll.decode(data, fast="yes")
    with pytest.raises(TypeError, match="fast must be True or False, got 1"):
        decode_batch([data], fast=1)
    with pytest.raises(TypeError, match="fast must be True or False, got None"):
        T.Decode(fast=None)
    assert T.Decode(fast=np.bool_(True)).fast is True


def test_fast_decode_of_bad_data_raises_or_decodes_never_crashes():
    """The fast path takes the same guards: truncated data raises, corrupted bytes decode or
    raise DecodeError (at every scale, with and without a crop), as the exact path does."""
    data = encode_jpeg(photo_like(200, 150, seed=7), 90, "420")
    with pytest.raises(DecodeError, match="truncated: the data ends before the image"):
        ll.decode(data[: len(data) // 2], fast=True)
    rng = np.random.default_rng(5)
    for k in range(40):
        bad = bytearray(data)
        for pos in rng.integers(2, len(bad), 8):
            bad[pos] = int(rng.integers(0, 256))
        for scale, crop in ((1, None), (1 / 2, (30, 20, 100, 90)), (1 / 8, None)):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DecodeWarning)
                    got = ll.decode(bytes(bad), scale=scale, crop=crop, fast=True, strict=False)
            except DecodeError:
                continue
            assert got.dtype == np.uint8 and got.ndim == 3, k
