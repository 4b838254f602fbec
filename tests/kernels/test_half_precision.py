"""float16 and bfloat16 output of Normalize and Cast, fused into the native chain.

References: numpy's float32 arithmetic then ``astype(float16)`` for float16, and for
bfloat16 a plain model of round-to-nearest-even written with float64 distances (not the
bit trick the library uses), plus ml_dtypes where it is installed.
"""

from __future__ import annotations

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T
from loaderlib._chain import compile_chain
from tests.kernels._loader_images import encode, make_image_folder, photo

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def bf16_reference(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), from the definition: of
    the two bfloat16 neighbours of x, the nearer one; at equal distance the even one."""
    shape = np.shape(x)
    x = np.asarray(x, np.float32).ravel()
    out = np.empty(x.size, np.uint16)
    for k, v in enumerate(x.tolist()):
        bits = int(np.float32(v).view(np.uint32))
        if np.isnan(v):
            out[k] = (bits >> 16) | 0x40
            continue
        lo = bits >> 16                     # truncation: the neighbour nearer to zero
        hi = lo + 1                         # the next one away from zero (may be inf)
        lo_v = float(np.uint32(lo << 16).view(np.float32))
        hi_v = float(np.uint32(hi << 16).view(np.float32))
        if np.isinf(hi_v):
            hi_v = np.copysign(2.0 ** 128, v)   # IEEE: overflow is rounded as if to 2**128
        d_lo, d_hi = abs(v - lo_v), abs(hi_v - v)
        if np.isinf(v) or d_lo < d_hi or (d_lo == d_hi and lo % 2 == 0):
            out[k] = lo
        else:
            out[k] = hi
    return out.reshape(shape)


def _special_floats() -> np.ndarray:
    rng = np.random.default_rng(0)
    ties = (rng.integers(0, 1 << 15, 200, dtype=np.uint32) << 16) | 0x8000        # exactly half-way
    near = (rng.integers(0, 1 << 15, 200, dtype=np.uint32) << 16) | 0x7FFF
    rand = rng.integers(0, 1 << 32, 2000, dtype=np.uint64).astype(np.uint32)
    vals = np.concatenate([ties, ties | 0x80000000, near, rand]).view(np.float32)
    extra = np.array([0.0, -0.0, 1.0, -1.5, 3.4028235e38, -3.4028235e38, 1e-45, -1e-40, np.inf, -np.inf,
                      0.2966864, 255.0, 1 / 3], np.float32)
    return np.concatenate([vals[np.isfinite(vals)], extra])


def test_bfloat16_rounding_matches_the_definition():
    x = _special_floats()
    np.testing.assert_array_equal(T._bfloat16_bits(x), bf16_reference(x))
    # NaN stays NaN (quiet), with its sign
    nan = T._bfloat16_bits(np.array([np.nan, -np.nan], np.float32))
    assert (nan & 0x7F80 == 0x7F80).all() and (nan & 0x7F != 0).all() and nan[1] >> 15 == 1


def test_bfloat16_rounding_matches_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = _special_floats()
    np.testing.assert_array_equal(T._bfloat16_bits(x), x.astype(ml_dtypes.bfloat16).view(np.uint16))
    np.testing.assert_array_equal(T.as_bfloat16(T._bfloat16_bits(x)).astype(np.float32),
                                  x.astype(ml_dtypes.bfloat16).astype(np.float32))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_normalize_half_is_float32_then_one_rounding(dtype):
    img = np.ascontiguousarray(photo()[:48, :64, ::-1])
    f32 = T.Normalize(MEAN, STD)(img)
    out = T.Normalize(MEAN, STD, dtype=dtype)(img)
    if dtype == "float16":
        assert out.dtype == np.float16
        np.testing.assert_array_equal(out, f32.astype(np.float16))
    else:
        assert out.dtype == np.uint16
        np.testing.assert_array_equal(out, bf16_reference(f32))


def test_cast_half_from_uint8_and_float():
    img = np.ascontiguousarray(photo()[:8, :16, ::-1])
    np.testing.assert_array_equal(T.Cast("float16")(img), img.astype(np.float16))
    # every uint8 value is exact in bfloat16 (8 significant bits)
    ramp = np.arange(256, dtype=np.uint8).reshape(16, 16, 1)
    np.testing.assert_array_equal(T.as_bfloat16(T.Cast("bfloat16")(ramp)).astype(np.float32)
                                  if _has_ml_dtypes() else
                                  (T.Cast("bfloat16")(ramp).astype(np.uint32) << 16).view(np.float32),
                                  ramp.astype(np.float32))
    x = np.random.default_rng(1).normal(size=(4, 5, 3)).astype(np.float32)
    np.testing.assert_array_equal(T.Cast("bfloat16")(x), bf16_reference(x))
    assert T.Cast(np.float16).dtype == "float16"


def _has_ml_dtypes() -> bool:
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return False
    return True


def _run(chain, bufs, threads):
    plan = compile_chain(chain)
    assert plan is not None, "the chain must fuse"
    out = np.empty((len(bufs), *plan.sample_shape), plan.dtype)
    st = plan.run_buffers_into(bufs, out, np.arange(len(bufs)), seed=3, epoch=1, num_threads=threads)
    assert st.ok.all()
    return plan, out


@pytest.mark.parametrize("chw", [False, True], ids=["HWC", "CHW"])
def test_fused_half_equals_fused_float32_then_cast_at_1_and_n_threads(chw):
    img = photo()
    bufs = [encode(img[y:y + 300, x:x + 280]) for y, x in ((0, 0), (100, 200), (212, 320), (50, 90))]
    geo = [T.RandomResizedCrop(40), T.RandomHorizontalFlip()]
    tail = [T.ToCHW()] if chw else []
    _, f32 = _run(T.Compose([*geo, T.Normalize(MEAN, STD), *tail]), bufs, 1)
    for dtype in ("float16", "bfloat16"):
        chain = T.Compose([*geo, T.Normalize(MEAN, STD, dtype=dtype), *tail])
        plan, one = _run(chain, bufs, 1)
        _, two = _run(chain, bufs, 2)
        np.testing.assert_array_equal(one, two)
        if dtype == "float16":
            assert plan.dtype == np.float16
            np.testing.assert_array_equal(one, f32.astype(np.float16))
        else:
            assert plan.dtype == np.uint16
            np.testing.assert_array_equal(one, bf16_reference(f32))
        assert any("lookup table" in line for line in plan.describe())


def test_fused_cast_to_half_after_uint8_geometry():
    bufs = [encode(photo()[:200, :240])] * 3
    _, u8 = _run(T.Compose([T.Resize((24, 30))]), bufs, 2)
    _, f16 = _run(T.Compose([T.Resize((24, 30)), T.Cast("float16"), T.ToCHW()]), bufs, 2)
    np.testing.assert_array_equal(f16, u8.astype(np.float16).transpose(0, 3, 1, 2))
    _, b16 = _run(T.Compose([T.Resize((24, 30)), T.Cast("bfloat16")]), bufs, 2)
    np.testing.assert_array_equal(b16, bf16_reference(u8.astype(np.float32)))


def test_loader_delivers_half_batches_identically_for_1_and_2_threads(tmp_path):
    root = make_image_folder(tmp_path, num_classes=2, per_class=4)
    def batches(dtype, threads):
        ds = ll.ImageFolderDataset(root).transform_first(T.Compose([
            T.RandomResizedCrop(32), T.Normalize(MEAN, STD, dtype=dtype), T.ToCHW()]))
        loader = ll.DataLoader(ds, batch_size=3, shuffle=True, seed=5, num_threads=threads)
        assert loader.engine == "native"
        return [x.copy() for x, _ in loader]
    f32 = batches("float32", 2)
    for dtype, np_dtype in (("float16", np.float16), ("bfloat16", np.uint16)):
        one, two = batches(dtype, 1), batches(dtype, 2)
        assert all(b.dtype == np_dtype and b.shape[1:] == (3, 32, 32) for b in one)
        for a, b, ref in zip(one, two, f32):
            np.testing.assert_array_equal(a, b)
            want = ref.astype(np.float16) if dtype == "float16" else bf16_reference(ref)
            np.testing.assert_array_equal(a, want)


def test_bad_half_precision_arguments():
    with pytest.raises(ValueError, match="Normalize dtype supports"):
        T.Normalize(MEAN, STD, dtype="int8")
    with pytest.raises(ValueError, match="Normalize dtype supports"):
        T.Normalize(MEAN, STD, dtype="no-such-type")
    with pytest.raises(ValueError, match="Cast supports"):
        T.Cast("float64")
    # bfloat16 bits end the point-wise steps: planning and running both say so
    with pytest.raises(ValueError, match="after a bfloat16 step"):
        T.Compose([T.Cast("bfloat16"), T.Normalize(MEAN, STD)]).plan(T.ImageSpec(8, 8, 3))
    with pytest.raises(ValueError, match="after a bfloat16 step"):
        T.Compose([T.Normalize(MEAN, STD, dtype="bfloat16"), T.Cast("float32")]).plan(T.ImageSpec(8, 8, 3))
    bits = T.Cast("bfloat16")(np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(ValueError, match="hold bfloat16 bits"):
        T.Normalize(MEAN, STD)(bits)
    with pytest.raises(ValueError, match="hold bfloat16 bits"):
        T.Cast("float32")(bits)
    assert compile_chain(T.Compose([T.Resize((8, 8)), T.Cast("bfloat16"), T.Cast("float32")])) is None
    if _has_ml_dtypes():
        with pytest.raises(TypeError, match="uint16 array of bfloat16 bits"):
            T.as_bfloat16(np.zeros(3, np.float32))
