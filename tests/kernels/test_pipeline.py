"""The fused native executor (loaderlib._chain) against the same chains done step by step
with OpenCV and numpy, plus determinism, sources (buffers, files, records), errors and
misuse."""

from __future__ import annotations

from dataclasses import replace

import cv2
import numpy as np
import pytest

import loaderlib as ll
from benchmarks._synth import encode_jpeg
from loaderlib import transforms as T
from loaderlib._chain import BatchStatus, NativePlan, compile_chain
from loaderlib._ext import _jpeg
from loaderlib.errors import DecodeError
from tests.conftest import cv2_reference, encode_cmyk_jpeg, make_photo
from tests.kernels import _resample_ref as resample_ref
from tests.kernels._loader_images import damaged

Status = _jpeg.Status

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
REDUCED = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}


@pytest.fixture(scope="module")
def jpegs() -> list[bytes]:
    """Photos of several sizes and subsamplings, baseline and progressive, one grayscale."""
    sizes = [(500, 375), (375, 500), (333, 251), (1031, 777), (64, 48), (640, 480), (17, 13), (2000, 1500)]
    out = []
    for k, (w, h) in enumerate(sizes):
        out.append(encode_jpeg(make_photo(w, h, seed=k), (90, 75, 95)[k % 3], ("420", "422", "444")[k % 3],
                               progressive=(k % 4 == 3)))
    out.append(encode_jpeg(cv2.cvtColor(make_photo(300, 200, seed=99), cv2.COLOR_BGR2GRAY), 85))
    return out


def _run(plan: NativePlan, bufs, seed=0, epoch=0, threads=2, indices=None, timings=None):
    n = len(bufs)
    out = np.full((n, *plan.sample_shape), 7, plan.dtype)
    st = plan.run_buffers_into(bufs, out, np.arange(n) if indices is None else indices, seed=seed, epoch=epoch,
                               num_threads=threads, timings=timings)
    return out, st


def _resize_ref(img: np.ndarray, oh: int, ow: int, t) -> np.ndarray:
    """OpenCV's resize, or the numpy model of the antialiased bilinear filter where it applies."""
    if t.interpolation == "bilinear" and t.antialias:
        return resample_ref.resize(img, oh, ow)
    flag = {"bilinear": cv2.INTER_LINEAR, "area": cv2.INTER_AREA}[t.interpolation]
    return cv2.resize(img, (ow, oh), interpolation=flag).reshape(oh, ow, img.shape[2])


def _step_by_step_cv2(data: bytes, chain: list, seed: int, epoch: int, index: int) -> np.ndarray:
    """The reference: OpenCV decode, then each step with OpenCV/numpy, drawing the same
    boxes and flips from loaderlib's generator (transform positions as in Compose)."""
    img = cv2_reference(data, "RGB")
    for pos, t in enumerate(chain):
        rng = T._Rng(seed, epoch, index, pos)
        if isinstance(t, T.RandomResizedCrop):
            i, j, h, w = t.get_params(img.shape[1], img.shape[0], rng)
            oh, ow = t.hw
            img = _resize_ref(img[i:i + h, j:j + w], oh, ow, t)
        elif isinstance(t, T.Resize):
            oh, ow = t.output_size(*img.shape[:2])
            img = _resize_ref(img, oh, ow, t)
        elif isinstance(t, T.CenterCrop):
            ch, cw = t.size if isinstance(t.size, tuple) else (t.size, t.size)
            top, left = round((img.shape[0] - ch) / 2.0), round((img.shape[1] - cw) / 2.0)
            img = img[top:top + ch, left:left + cw]
        elif isinstance(t, T.RandomHorizontalFlip):
            if rng.uniform(0) < t.p:
                img = img[:, ::-1]
        elif isinstance(t, T.Normalize):
            img = (img.astype(np.float32) / np.float32(255) - np.float32(t.mean)) / np.float32(t.std)
        elif isinstance(t, T.ToCHW):
            img = np.moveaxis(img, 2, 0)
        elif isinstance(t, T.Cast):
            img = img.astype(t.dtype)
    return np.ascontiguousarray(img)


CHAINS = {
    "rrc-flip-normalize-chw": [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.Normalize(MEAN, STD), T.ToCHW()],
    "rrc-uint8": [T.RandomResizedCrop((96, 128), scale=(0.3, 1.0)), T.RandomHorizontalFlip(p=0.7)],
    "resize-centercrop": [T.Resize(256), T.CenterCrop(224)],
    "resize-area-exact": [T.Resize((100, 150), interpolation="area")],
    "centercrop-flip-cast": [T.CenterCrop(12), T.RandomHorizontalFlip(), T.Cast("float32")],
    "flip-then-rrc": [T.RandomHorizontalFlip(), T.RandomResizedCrop(64), T.ToCHW()],
    # two resizes: two stages, the second resampling the first one's image
    "resize-then-rrc": [T.Resize(300), T.RandomResizedCrop(128), T.RandomHorizontalFlip()],
    "rrc-then-resize-area": [T.RandomResizedCrop(200), T.Resize((100, 90), interpolation="area"), T.ToCHW()],
}


@pytest.mark.parametrize("name", list(CHAINS))
def test_fused_chain_equals_step_by_step_opencv_numpy(jpegs, name):
    """With DCT scaling off the fused chain computes exactly what decode -> crop ->
    resize -> flip -> normalize -> layout computes step by step: within +-1 level of
    cv2.resize for uint8 output, and within the float image of +-1 level (1/255/std,
    plus 1e-6) for normalized output. Chains that resize twice get +-2: the first
    resize's +-1 carries into the second."""
    steps = CHAINS[name]
    plan = compile_chain(T.Compose([T.Decode(dct_scaling=False), *steps]))
    assert plan is not None
    out, st = _run(plan, jpegs, seed=11, epoch=2)
    assert st.ok.all(), st.errors
    tol = 1.0 + (sum(isinstance(t, (T.Resize, T.RandomResizedCrop)) for t in steps) > 1)
    if any(isinstance(t, T.Normalize) for t in steps):
        tol = 1.0 / 255 / min(STD) + 1e-6
    for i, data in enumerate(jpegs):
        ref = _step_by_step_cv2(data, steps, 11, 2, i)
        assert ref.shape == out[i].shape and ref.dtype == out[i].dtype
        diff = np.abs(out[i].astype(np.float64) - ref)
        assert diff.max() <= tol, f"{name} item {i}: max diff {diff.max()}"
        assert diff.mean() <= 0.2 * tol, f"{name} item {i}: mean diff {diff.mean()}"


@pytest.mark.parametrize("name", list(CHAINS))
def test_fused_chain_equals_the_python_compose(jpegs, name):
    """Compose.__call__ on a decoded image (what a non-JPEG item gets) draws the same
    boxes and flips as the fused chain and resamples with the same kernels."""
    steps = CHAINS[name]
    chain = T.Compose([T.Decode(dct_scaling=False), *steps])
    out, _ = _run(compile_chain(chain), jpegs, seed=3, epoch=1, indices=np.arange(100, 100 + len(jpegs)))
    for i, data in enumerate(jpegs):
        ref = chain(data, seed=3, epoch=1, index=100 + i)
        assert np.array_equal(out[i], ref), f"{name} item {i}: max diff {np.abs(out[i] - ref).max()}"


def test_dct_scaled_crop_has_exact_geometry(jpegs):
    """With DCT scaling on, the fused chain equals OpenCV's reduced decode (an independent
    libjpeg-turbo at the same 1/d scale) resampled with the box's exact sub-pixel map:
    within +-1 level. So the only difference from a full-resolution decode is the DCT
    scaling itself, measured in the next test."""
    plan = compile_chain(T.Compose([T.RandomResizedCrop(224)]))
    seen = set()
    many = [encode_jpeg(make_photo(1600, 1200, seed=s), 90) for s in range(6)]
    for images in (jpegs, many):
        out, st = _run(plan, images, seed=5)
        assert st.ok.all()
        for i, data in enumerate(images):
            info = ll.jpeg_info(data)
            top, left, h, w = T.RandomResizedCrop(224).get_params(info.width, info.height, T._Rng(5, 0, i, 0))
            # antialiased: the residual reduction stays >= 2 (NOTE [ DCT scale choice ])
            d = max([k for k in (1, 2, 4, 8) if -(-w // k) >= 448 and -(-h // k) >= 448], default=1)
            if d == 1:
                continue
            seen.add(d)
            red = cv2.imdecode(np.frombuffer(data, np.uint8), REDUCED[d] | cv2.IMREAD_IGNORE_ORIENTATION)[:, :, ::-1]
            dom = ((top // d, -(-(top + h) // d)), (left // d, -(-(left + w) // d)))
            ref = resample_ref.resample(red, (224, 224), (h / 224 / d, w / 224 / d), (top / d, left / d), dom)
            diff = np.abs(out[i] - ref)
            assert diff.max() <= 1.0, f"{info.width}x{info.height} item {i} at 1/{d}: max diff {diff.max()}"
    assert seen & {2, 4}, "no draw exercised DCT scaling"


def test_fused_and_unfused_agree_for_small_crops_of_large_images():
    """The fused chain (decoded DCT-scaled, NOTE [ DCT scale choice ]) against the same
    transforms called on a full decode (``T.Compose(...)(img)``, what a preview or a non-JPEG
    item gets), both antialiased by default: within 1 level mean absolute difference per
    image, for small crops of 1600x1200 to 4000x3000 photos. Measured here: 0.1-0.76 per
    image. Without antialiasing the step-by-step chain aliases: up to 7 levels."""
    sizes = [(2000, 1500), (4000, 3000), (1600, 1200)]
    bufs = [encode_jpeg(make_photo(w, h, seed=k), 90, ("420", "444")[k % 2]) for k, (w, h) in enumerate(sizes * 2)]
    full = [cv2_reference(d) for d in bufs]
    worst_plain = 0.0
    for steps in ([T.RandomResizedCrop(32)], [T.RandomResizedCrop(64)], [T.RandomResizedCrop(224)],
                  [T.Resize(72), T.CenterCrop(64)]):
        out, st = _run(compile_chain(T.Compose(steps)), bufs, seed=3, threads=2)
        assert st.ok.all()
        plain = [replace(t, antialias=False) if hasattr(t, "antialias") else t for t in steps]
        for i, img in enumerate(full):
            ref = T.Compose(steps)(img, seed=3, index=i)
            diff = np.abs(out[i].astype(int) - ref)
            assert diff.mean() <= 1.0, f"{steps} item {i}: mean diff {diff.mean():.2f}"
            worst_plain = max(worst_plain, np.abs(out[i].astype(int) - T.Compose(plain)(img, seed=3, index=i)).mean())
    assert worst_plain > 3.0   # the aliasing antialiasing removes


def test_resize_centercrop_decodes_only_the_centre_box():
    """Resize(256) + CenterCrop(224) equals resize-then-crop done by OpenCV, with DCT scaling
    off (exact) and on (within the DCT tolerance)."""
    data = encode_jpeg(make_photo(1031, 777, seed=3), 92, "420")
    img = cv2_reference(data)
    full = cv2.resize(img, (int(256 * 1031 / 777), 256), interpolation=cv2.INTER_LINEAR)
    t, lft = round((256 - 224) / 2), round((full.shape[1] - 224) / 2)
    ref = full[t:t + 224, lft:lft + 224]
    exact = compile_chain(T.Compose([T.Decode(dct_scaling=False), T.Resize(256, antialias=False), T.CenterCrop(224)]))
    out, _ = _run(exact, [data])
    assert np.abs(out[0].astype(int) - ref).max() <= 1
    # antialiased (the default): the numpy model of the triangle filter
    aa_ref = resample_ref.resize(img, 256, int(256 * 1031 / 777))[t:t + 224, lft:lft + 224]
    exact = compile_chain(T.Compose([T.Decode(dct_scaling=False), T.Resize(256), T.CenterCrop(224)]))
    out, _ = _run(exact, [data])
    assert np.abs(out[0].astype(int) - aa_ref).max() <= 1
    scaled = compile_chain(T.Compose([T.Resize(256), T.CenterCrop(224)]))
    out, _ = _run(scaled, [data])
    assert np.abs(out[0].astype(int) - aa_ref).mean() < 1.0


def test_center_crop_with_padding_in_the_fused_chain():
    data = encode_jpeg(make_photo(40, 30, seed=1), 95, "444")
    plan = compile_chain(T.Compose([T.CenterCrop((50, 44)), T.Normalize(0.5, 0.5)]))
    out, st = _run(plan, [data])
    assert st.ok.all()
    ref = T.Normalize(0.5, 0.5)(T.CenterCrop((50, 44))(cv2_reference(data)))
    assert np.array_equal(out[0], ref)
    assert out[0][0, 0, 0] == np.float32(-1.0)  # a padded pixel: (0/255 - 0.5) / 0.5


def test_same_output_for_1_and_2_threads_and_any_order(jpegs):
    plan = compile_chain(T.Compose(CHAINS["rrc-flip-normalize-chw"]))
    a, _ = _run(plan, jpegs, seed=9, threads=1)
    b, _ = _run(plan, jpegs, seed=9, threads=2)
    assert np.array_equal(a, b)
    perm = np.random.default_rng(0).permutation(len(jpegs))
    c, _ = _run(plan, [jpegs[k] for k in perm], seed=9, threads=2, indices=perm)
    assert np.array_equal(c, a[perm])
    # a resumed epoch: the second half alone gives the same samples
    half = len(jpegs) // 2
    d, _ = _run(plan, jpegs[half:], seed=9, threads=2, indices=np.arange(half, len(jpegs)))
    assert np.array_equal(d, a[half:])


def test_seed_and_epoch_change_the_augmentation(jpegs):
    plan = compile_chain(T.Compose(CHAINS["rrc-uint8"]))
    a, _ = _run(plan, jpegs, seed=1)
    b, _ = _run(plan, jpegs, seed=2)
    c, _ = _run(plan, jpegs, seed=1, epoch=1)
    assert sum(not np.array_equal(x, y) for x, y in zip(a, b)) >= len(jpegs) - 1
    assert sum(not np.array_equal(x, y) for x, y in zip(a, c)) >= len(jpegs) - 1


def test_deterministic_chain_needs_no_seed(jpegs):
    plan = compile_chain(T.Compose([T.Resize((32, 48)), T.ToCHW()]))
    a, _ = _run(plan, jpegs, seed=1)
    b, _ = _run(plan, jpegs, seed=2)
    assert np.array_equal(a, b) and a.shape == (len(jpegs), 3, 32, 48)


def test_timings_are_filled_only_when_asked(jpegs):
    plan = compile_chain(T.Compose([T.RandomResizedCrop(64)]))
    tm = np.full((len(jpegs), 3), -1, np.int64)
    _, st = _run(plan, jpegs, timings=tm)
    assert st.ok.all()
    assert (tm[:, 0] >= 0).all() and (tm[:, 1] > 0).all() and (tm[:, 2] > 0).all()
    # the 2000x1500 photo costs more to decode than the 17x13 one
    assert tm[7, 1] > tm[6, 1]
    with pytest.raises(ValueError, match=r"timings must be a C-contiguous \(\d+, 3\) int64 array"):
        _run(plan, jpegs, timings=np.zeros((len(jpegs), 2), np.int64))


def test_files_and_records_give_the_same_output(jpegs, tmp_path):
    """The same output from buffers, files and records, a PNG (the OpenCV fallback, which
    reads the item again in Python) included."""
    plan = compile_chain(T.Compose(CHAINS["rrc-flip-normalize-chw"]))
    jpegs = [*jpegs, cv2.imencode(".png", make_photo(90, 70, seed=2))[1].tobytes()]
    ref, st = _run(plan, jpegs, seed=4)
    assert st.ok.all()
    paths = []
    for i, data in enumerate(jpegs):
        p = tmp_path / f"img{i}.jpg"
        p.write_bytes(data)
        paths.append(p)
    out = np.empty_like(ref)
    tm = np.zeros((len(jpegs), 3), np.int64)
    st = plan.run_files_into(paths, out, np.arange(len(jpegs)), seed=4, epoch=0, num_threads=2, timings=tm)
    assert st.ok.all() and np.array_equal(out, ref)
    assert (tm[:, 0] > 0).all()  # reading is timed too
    rec = tmp_path / "pack.bin"
    offsets, sizes, pos = [], [], 0
    with open(rec, "wb") as f:
        for data in jpegs:
            f.write(b"\x00" * 3)
            pos += 3
            offsets.append(pos)
            sizes.append(len(data))
            f.write(data)
            pos += len(data)
    out2 = np.empty_like(ref)
    with open(rec, "rb") as f:
        st = plan.run_records_into(f, offsets, sizes, out2, np.arange(len(jpegs)), seed=4, epoch=0, num_threads=2)
    assert st.ok.all() and np.array_equal(out2, ref)


def test_read_errors_name_the_path_and_the_reason(jpegs, tmp_path):
    plan = compile_chain(T.Compose([T.CenterCrop(8)]))
    good = tmp_path / "good.jpg"
    good.write_bytes(jpegs[0])
    missing = tmp_path / "missing.jpg"
    out = np.zeros((3, 8, 8, 3), np.uint8)
    st = plan.run_files_into([good, missing, tmp_path], out, np.array([10, 11, 12]), seed=0, epoch=0,
                             num_threads=2)
    assert isinstance(st, BatchStatus)
    assert st.ok.tolist() == [True, False, False]
    assert st.status[1] == Status.ERR_READ and st.status[2] == Status.ERR_READ
    err = st.errors[1]
    assert isinstance(err, DecodeError) and err.index == 11 and err.source == str(missing)
    assert "No such file or directory" in str(err) and str(missing) in str(err)
    assert "not a regular file" in st.errors[2].reason
    # a record past the end of the file
    with open(good, "rb") as f:
        st = plan.run_records_into(f.fileno(), [0, 10_000_000], [len(jpegs[0]), 100], out[:2], [0, 1], seed=0,
                                   epoch=0, num_threads=1, sources=["rec0", "rec1"])
    assert st.ok.tolist() == [True, False]
    assert st.errors[1].source == "rec1" and "end of file" in st.errors[1].reason


def test_corrupt_and_foreign_items(jpegs):
    plan = compile_chain(T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip()]))
    trunc = jpegs[0][: len(jpegs[0]) // 2]
    png = cv2.imencode(".png", make_photo(90, 70, seed=2))[1].tobytes()
    bad_header = b"\xff\xd8\xff" + b"\x00" * 50
    items = [jpegs[0], trunc, b"not an image at all", png, b"", bad_header]
    out, st = _run(plan, items, seed=3, indices=np.arange(20, 26))
    assert st.status[0] == 0
    assert st.status[1] < 0 and "truncated" in st.errors[1].reason   # NOTE [ Truncated JPEG is an error ]
    assert st.status[2] < 0 and "not a recognised image format" in st.errors[2].reason
    assert st.errors[2].index == 22
    assert st.status[3] == 0  # PNG: OpenCV decode, then the same steps with the same key
    png_ref = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip()])(
        ll.decode(png), seed=3, epoch=0, index=23)
    assert np.array_equal(out[3], png_ref)
    assert st.status[4] < 0 and st.status[5] < 0
    assert set(st.errors) == {1, 2, 4, 5}
    strict = compile_chain(T.Compose([T.Decode(strict=True), T.RandomResizedCrop(32)]))
    _, st = _run(strict, [damaged(jpegs[0])])   # recoverable: strict refuses it
    assert st.status[0] == Status.ERR_STRICT and "strict=True" in st.errors[0].reason


def test_tiny_huge_and_extreme_images_are_safe():
    items = [encode_jpeg(make_photo(w, h, seed=k), 80) for k, (w, h) in
             enumerate([(1, 1), (2, 3), (3000, 8), (8, 3000), (4000, 3000)])]
    for chain in ([T.RandomResizedCrop(224)], [T.Resize(300), T.CenterCrop(224)],
                  [T.Resize((5, 7), interpolation="area"), T.Normalize(0.5, 0.2)],
                  [T.CenterCrop(100), T.Resize((60, 50), interpolation="nearest")],
                  [T.RandomResizedCrop(16, antialias=True)]):
        plan = compile_chain(T.Compose(chain))
        for threads in (1, 2):
            out, st = _run(plan, items, seed=2, threads=threads)
            assert st.ok.all(), (chain, st.errors)
            if plan.dtype == np.uint8:
                ref = [T.Compose([T.Decode(dct_scaling=False), *chain])(d, seed=2, index=k)
                       for k, d in enumerate(items[:4])]
                for k in range(4):  # small enough that DCT scaling never applies
                    assert np.abs(out[k].astype(int) - ref[k]).max() <= 1, (chain, k)
    guard = compile_chain(T.Compose([T.Decode(max_pixels=1000), T.RandomResizedCrop(8)]))
    _, st = _run(guard, items[4:])
    assert st.status[0] < 0 and "max_pixels" in st.errors[0].reason


def test_cmyk_jpeg_goes_through_the_fused_chain():
    data = encode_cmyk_jpeg(make_photo(150, 110, seed=4))
    chain = T.Compose([T.Decode(dct_scaling=False), T.RandomResizedCrop(48), T.RandomHorizontalFlip()])
    out, st = _run(compile_chain(chain), [data], seed=6)
    assert st.ok.all()
    assert np.array_equal(out[0], chain(data, seed=6, index=0))


def test_grayscale_decode_mode():
    data = encode_jpeg(make_photo(120, 90, seed=1), 90)
    plan = compile_chain(T.Compose([T.Decode(mode="GRAY", dct_scaling=False), T.Resize((30, 40)),
                                    T.Normalize(0.5, 0.5), T.ToCHW()]))
    assert plan.sample_shape == (1, 30, 40) and plan.dtype == np.float32
    out, _ = _run(plan, [data])
    gray = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_GRAYSCALE)
    ref = (resample_ref.resize(gray[:, :, None], 30, 40)[:, :, 0].astype(np.float32) / 255 - 0.5) / 0.5
    assert np.abs(out[0, 0] - ref).max() <= 1 / 255 / 0.5 + 1e-6


def test_compile_chain_plans_and_refuses():
    plan = compile_chain(T.Compose(CHAINS["rrc-flip-normalize-chw"]))
    assert plan.sample_shape == (3, 224, 224) and plan.dtype == np.float32
    lines = plan.describe()
    assert isinstance(lines, list) and all(isinstance(s, str) for s in lines) and len(lines) >= 4
    assert "DCT" in lines[0] and any("random resized crop" in s for s in lines)
    assert compile_chain(T.Compose([T.RandomResizedCrop(64), T.Cast("uint8")])).dtype == np.uint8
    assert compile_chain(None).sample_shape is None  # Decode alone: size varies
    assert compile_chain(T.Resize(256)).sample_shape is None
    assert compile_chain(T.Compose([T.Resize(256), T.CenterCrop(224)])).sample_shape == (224, 224, 3)
    # not fusable -> None (the engine runs Python)
    assert compile_chain(T.Compose([T.RandomResizedCrop(64), lambda x: x])) is None
    assert compile_chain(T.Compose([T.Normalize(MEAN, STD), T.RandomResizedCrop(64)])) is None
    assert compile_chain(T.Compose([T.ToCHW(), T.CenterCrop(8)])) is None
    assert compile_chain(T.Compose([T.RandomResizedCrop(64), T.Decode()])) is None
    assert compile_chain(lambda x: x) is None


def test_misuse_raises(jpegs):
    plan = compile_chain(T.Compose([T.RandomResizedCrop(16)]))
    with pytest.raises(ValueError, match=r"out must be \(2, 16, 16, 3\) uint8, got \(2, 16, 16, 3\) float32"):
        plan.run_buffers_into(jpegs[:2], np.zeros((2, 16, 16, 3), np.float32), [0, 1], seed=0, epoch=0,
                              num_threads=1)
    with pytest.raises(ValueError, match=r"out must be \(2, 16, 16, 3\) uint8, got \(3, 16, 16, 3\)"):
        plan.run_buffers_into(jpegs[:2], np.zeros((3, 16, 16, 3), np.uint8), [0, 1, 2], seed=0, epoch=0,
                              num_threads=1)
    with pytest.raises(ValueError, match=r"indices must have shape \(2,\), got \(1,\)"):
        plan.run_buffers_into(jpegs[:2], np.zeros((2, 16, 16, 3), np.uint8), [0], seed=0, epoch=0, num_threads=1)
    with pytest.raises(ValueError, match="out must be C-contiguous and writeable"):
        plan.run_buffers_into(jpegs[:2], np.zeros((2, 16, 16, 3), np.uint8)[:, ::-1], [0, 1], seed=0, epoch=0,
                              num_threads=1)
    with pytest.raises(TypeError, match="item 1: expected a contiguous bytes-like object .* got int"):
        plan.run_buffers_into([jpegs[0], 5], np.zeros((2, 16, 16, 3), np.uint8), [0, 1], seed=0, epoch=0,
                              num_threads=1)
    varying = compile_chain(None)
    with pytest.raises(ValueError, match="depends on the image"):
        varying.run_buffers_into(jpegs[:1], np.zeros((1, 8, 8, 3), np.uint8), [0], seed=0, epoch=0, num_threads=1)
    # empty batches are fine
    st = plan.run_buffers_into([], np.zeros((0, 16, 16, 3), np.uint8), [], seed=0, epoch=0, num_threads=2)
    assert st.status.shape == (0,)


def test_plan_reuses_scratch_across_batches(jpegs):
    """Steady state: the same plan over many batches gives the same results as fresh plans."""
    chain = T.Compose(CHAINS["rrc-uint8"])
    plan = compile_chain(chain)
    for seed in range(3):
        a, _ = _run(plan, jpegs, seed=seed)
        b, _ = _run(compile_chain(chain), jpegs, seed=seed)
        assert np.array_equal(a, b)


def test_mutated_jpegs_never_crash(jpegs):
    """300 truncated or byte-flipped JPEGs through multi-stage fused chains on 2 threads:
    every item either comes back written (status 0/1) or with an error, never a crash.
    (The C side was also run under AddressSanitizer/UBSan with random chains.)"""
    rng = np.random.default_rng(5)
    items = []
    for k in range(300):
        b = bytearray(jpegs[k % 4])
        if k % 2:
            b = b[: int(rng.integers(0, len(b)))]
        else:
            for p in rng.integers(2, len(b), 8):
                b[p] = int(rng.integers(0, 256))
        items.append(bytes(b))
    for chain in ([T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.Normalize(MEAN, STD)],
                  [T.Resize(50), T.CenterCrop(30), T.Resize((20, 24), interpolation="area")]):
        out, st = _run(compile_chain(T.Compose(chain)), items, seed=1)
        assert set(np.unique(st.status)) <= {0, 1, -1, -2, -3}
        assert set(st.errors) == set(np.flatnonzero(st.status < 0))
        assert st.ok.sum() > 100
        if out.dtype == np.float32:
            assert np.isfinite(out[st.ok]).all()
