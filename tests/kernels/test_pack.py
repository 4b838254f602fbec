"""``pack`` at a capped resolution (NOTE [ Packing at a capped resolution ] in
pyx/include/ll_pack.h) and the loader on packed records (NOTE [ Original coordinates ] in
ll_chain.h, NOTE [ Raw records need no decode ]).

References are independent of the kernels: OpenCV decodes sources and packed JPEGs, the numpy
model of the antialiased bilinear filter (_resample_ref.py) resizes, and the crop mapping is
the plain formula of NOTE [ Original coordinates ] written here in numpy."""

import json
import math
import os
import subprocess
import sys
import warnings

import cv2
import numpy as np
import pytest

import loaderlib as ll
from loaderlib import DataLoader
from loaderlib import transforms as T
from loaderlib.decoding import raw_record
from tests.kernels import _resample_ref as resample_ref
from tests.kernels._loader_images import encode, photo

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
MAX_SIDE, RAW_BELOW = 160, 12_000


def _cv2_rgb(data) -> np.ndarray:
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED | cv2.IMREAD_IGNORE_ORIENTATION)
    return img[:, :, None] if img.ndim == 2 else np.ascontiguousarray(img[:, :, ::-1])


def _stored(w: int, h: int, cap: int) -> tuple[int, int]:
    """The documented stored size: the longer side to the cap, the other rounded half up."""
    if max(w, h) <= cap:
        return w, h
    if w >= h:
        return cap, max(1, math.floor(h * cap / w + 0.5))
    return max(1, math.floor(w * cap / h + 0.5)), cap


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Two classes of photo crops: larger than the cap (4:2:0, 4:4:4, grayscale), within it,
    small enough to go raw after the cap, and a PNG."""
    root = tmp_path_factory.mktemp("src")
    img = photo()
    rng = np.random.default_rng(5)
    specs = [(300, 420, 90, None), (400, 230, 95, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444), (170, 500, 85, None),
             (120, 150, 90, None), (90, 110, 90, None), (512, 330, 92, None), (260, 260, 80, "gray"),
             (70, 600, 90, None), (200, 180, 88, "png")]
    for k, (h, w, q, kind) in enumerate(specs):
        d = root / f"c{k % 2}"
        d.mkdir(exist_ok=True)
        y, x = int(rng.integers(0, 512 - min(h, 512) + 1)), int(rng.integers(0, 600 - min(w, 600) + 1))
        crop = np.ascontiguousarray(img[y:y + h, x:x + w])
        if kind == "gray":
            data = encode(cv2.cvtColor(crop, cv2.COLOR_BGR2GRAY), quality=q)
        elif kind == "png":
            data = encode(crop, ext=".png")
        else:
            data = encode(crop, quality=q, sampling=kind)
        (d / f"img{k:02d}.{'png' if kind == 'png' else 'jpg'}").write_bytes(data)
    return str(root)


@pytest.fixture(scope="module")
def packed(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("packed") / "p"
    report = ll.pack(folder, out, max_side=MAX_SIDE, quality=95, raw_below=RAW_BELOW, progress=False)
    return report, ll.RecordFileDataset(out)


def test_pack_dimensions_and_metadata(folder, packed):
    report, ds = packed
    src = ll.ImageFolderDataset(folder)
    assert len(ds) == len(src) == report.images == 9
    assert ds.synsets == src.synsets and ds.labels.tolist() == src.labels.tolist()
    kinds = {"file": 0, "jpeg": 0, "raw": 0}
    for i, (path, _) in enumerate(src.items):
        data = open(path, "rb").read()
        orig = _cv2_rgb(data)
        oh, ow = orig.shape[:2]
        sw, sh = _stored(ow, oh, MAX_SIDE)
        assert ds.keys[i] == path
        assert tuple(ds.original_sizes[i]) == (ow, oh)
        assert tuple(ds.stored_sizes[i]) == (sw, sh)
        rec = ds.read(i)
        want_kind = "raw" if sw * sh < RAW_BELOW else ("jpeg" if (sw, sh) != (ow, oh) else "file")
        assert ds.kinds[i] == want_kind, path
        kinds[want_kind] += 1
        if want_kind == "file":
            assert rec == data   # within the cap: the file's own bytes
            continue
        if want_kind == "raw":
            px, size = raw_record(rec)
            assert size == (ow, oh)
        else:
            px = _cv2_rgb(rec)
        c = 1 if orig.shape[2] == 1 else 3
        assert px.shape == (sh, sw, c), path
        ref = resample_ref.resize(np.ascontiguousarray(orig[:, :, :c]), sh, sw)
        diff = np.abs(px.astype(np.int16) - ref.astype(np.int16))
        if want_kind == "raw":   # the kernels' fixed point against float64: no encoder in between
            assert diff.max() <= 1, (path, diff.max())
        else:   # JPEG at quality 95: as close to the reference as OpenCV's own encoder gets
            enc = cv2.imencode(".jpg", ref[:, :, ::-1] if c == 3 else ref, [cv2.IMWRITE_JPEG_QUALITY, 95])[1]
            cv2_trip = _cv2_rgb(enc.tobytes())
            own = np.abs(cv2_trip.astype(np.int16) - ref.astype(np.int16)).mean()
            assert diff.mean() <= own + 0.3, (path, diff.mean(), own)
            assert np.abs(px.astype(np.int16) - cv2_trip.astype(np.int16)).mean() < 0.6, path
        np.testing.assert_array_equal(ll.decode(rec, mode="GRAY" if c == 1 else "RGB"), px)
    assert report.kinds == kinds and kinds["raw"] >= 2 and kinds["jpeg"] >= 4 and kinds["file"] >= 1
    assert report.bytes_out == sum(int(s) for s in ds.sizes)
    assert report.bytes_in == sum(os.path.getsize(p) for p, _ in src.items)


def _reference_sample(ds, i, size, seed, epoch, flip_p=0.5):
    """RandomResizedCrop(size) + flip + Normalize + ToCHW on record i, from OpenCV's decode of
    the packed bytes and the crop box drawn in original coordinates, mapped by the stored /
    original scale (NOTE [ Original coordinates ])."""
    rec = ds.read(i)
    img = raw_record(rec)[0] if ds.kinds[i] == "raw" else _cv2_rgb(rec)
    if img.shape[2] == 1:
        img = np.repeat(img, 3, axis=2)
    ow, oh = (int(v) for v in ds.original_sizes[i])
    sh, sw = img.shape[:2]
    top, left, h, w = T.RandomResizedCrop(size).get_params(ow, oh, T._Rng(seed, epoch, i, 0))
    sx, sy = sw / ow, sh / oh
    dom = ((math.floor(sy * top + 1e-9), math.ceil(sy * (top + h) - 1e-9)),
           (math.floor(sx * left + 1e-9), math.ceil(sx * (left + w) - 1e-9)))
    out = resample_ref.resample(img, (size, size), (sy * h / size, sx * w / size), (sy * top, sx * left), dom)
    out = np.clip(np.floor(out + 0.5), 0, 255)
    if T._Rng(seed, epoch, i, 1).uniform(0) < flip_p:   # positions after the Decode
        out = out[:, ::-1]
    return ((out / 255.0 - np.asarray(MEAN)) / np.asarray(STD)).transpose(2, 0, 1).astype(np.float32)


def _train_chain(size):
    return T.Compose([T.Decode(dct_scaling=False), T.RandomResizedCrop(size), T.RandomHorizontalFlip(),
                      T.Normalize(MEAN, STD), T.ToCHW()])


@pytest.mark.parametrize("threads", [1, 2])
def test_loader_on_packed_records_equals_opencv_reference(packed, threads):
    _, ds = packed
    loader = DataLoader(ds.transform_first(_train_chain(48)), batch_size=4, num_threads=threads, seed=11)
    assert loader.engine == "native"
    level = 1.0 / 255 / min(STD)
    k = 0
    for epoch in range(2):
        loader.set_epoch(epoch)
        k = 0
        for images, labels in loader:
            for img, lab in zip(images, labels):
                assert lab == ds.labels[k]
                ref = _reference_sample(ds, k, 48, 11, epoch)
                diff = np.abs(img - ref)
                assert diff.max() <= 1.001 * level, (ds.keys[k], ds.kinds[k], diff.max() / level)
                k += 1
    assert k == len(ds)


def test_crops_on_packed_records_land_where_they_were(folder, packed):
    """The same seed crops the same part of the picture from the original files and from the
    packed records: the scale and place of a box do not change with the stored size."""
    _, ds = packed
    src = ll.ImageFolderDataset(folder)
    chain = T.Compose([T.RandomResizedCrop(32, scale=(0.3, 1.0)), T.Cast("float32")])
    a = np.concatenate([x for x, _ in DataLoader(src.transform_first(chain), batch_size=9, seed=3)])
    b = np.concatenate([x for x, _ in DataLoader(ds.transform_first(chain), batch_size=9, seed=3)])
    diffs = np.abs(a - b).reshape(len(ds), -1).mean(axis=1)
    assert diffs.max() < 12.0, diffs   # the same content at a lower resolution
    rolled = np.abs(a - np.roll(b, 1, axis=0)).reshape(len(ds), -1).mean(axis=1)
    assert np.median(rolled) > 3 * np.median(diffs)


def test_raw_records_decode_nothing(folder, tmp_path):
    ll.pack(folder, tmp_path / "raw", max_side=64, raw_below=1 << 30, progress=False)
    ll.pack(folder, tmp_path / "jpg", max_side=64, progress=False)
    raw, jpg = ll.RecordFileDataset(tmp_path / "raw"), ll.RecordFileDataset(tmp_path / "jpg")
    assert set(raw.kinds) == {"raw"} and set(jpg.kinds) == {"jpeg"}
    chain = T.Compose([T.RandomResizedCrop(32), T.Normalize(MEAN, STD)])
    spent = {}
    for name, ds in (("raw", raw), ("jpg", jpg)):
        loader = DataLoader(ds.transform_first(chain), batch_size=3, num_threads=2, profile=True, seed=0)
        n = sum(len(x) for x, _ in loader)
        assert n == len(ds)
        spent[name] = (loader.stats.stage_total_s["decode"], loader.stats.stage_total_s["transform"])
        loader.close()
    assert spent["raw"][0] == 0.0 and spent["raw"][1] > 0      # no decode time at all, transforms timed
    assert spent["jpg"][0] > 0


def test_resume_on_packed_shards(folder, tmp_path):
    report = ll.pack(folder, tmp_path / "s", max_side=96, raw_below=6000, shard_size=20_000, progress=False)
    assert len(report.shards) >= 3
    ds = ll.RecordFileDataset(str(tmp_path / "s-*.llrec"))
    assert set(ds.kinds) == {"jpeg", "raw"}

    def make():
        return DataLoader(ds.transform_first(_train_chain(24)), batch_size=2, shuffle=True, num_threads=2, seed=4)

    reference = [(x.copy(), y.copy()) for x, y in make()]
    first = make()
    it = iter(first)
    for _ in range(2):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    second = make()
    second.load_state_dict(state)
    rest = [(x.copy(), y.copy()) for x, y in second]
    assert len(rest) == len(reference) - 2
    for (x, y), (rx, ry) in zip(rest, reference[2:]):
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)
    second.close()


def test_pack_output_identical_for_one_and_two_threads(folder, tmp_path):
    a = ll.pack(folder, tmp_path / "a", max_side=100, quality=90, raw_below=8000, reencode=True, num_threads=1,
                progress=False)
    b = ll.pack(folder, tmp_path / "b", max_side=100, quality=90, raw_below=8000, reencode=True, num_threads=2,
                progress=False)
    assert a.kinds == b.kinds and a.bytes_out == b.bytes_out
    da, db = ll.RecordFileDataset(tmp_path / "a"), ll.RecordFileDataset(tmp_path / "b")
    for i in range(len(da)):
        assert da.read(i) == db.read(i)
    np.testing.assert_array_equal(da.original_sizes, db.original_sizes)


def test_reencode_keeps_size_and_write_records_options(folder, tmp_path):
    src = ll.ImageFolderDataset(folder)
    paths = [p for p, _ in src.items]
    ll.write_records(tmp_path / "k", paths, src.labels, max_side=1000)
    ll.write_records(tmp_path / "r", paths, src.labels, max_side=1000, quality=70, reencode=True)
    kept, redone = ll.RecordFileDataset(tmp_path / "k"), ll.RecordFileDataset(tmp_path / "r")
    assert set(kept.kinds) == {"file"} and set(redone.kinds) == {"jpeg"}
    for i, p in enumerate(paths):
        assert kept.read(i) == open(p, "rb").read()
        assert tuple(redone.stored_sizes[i]) == tuple(redone.original_sizes[i]) == tuple(kept.original_sizes[i])
        assert _cv2_rgb(redone.read(i)).shape[:2] == _cv2_rgb(kept.read(i)).shape[:2]
    # a packed record packed again keeps the first original size
    again = ll.write_records(tmp_path / "again", [redone.read(i) for i in range(len(redone))], max_side=50)
    twice = ll.RecordFileDataset(again[0])
    np.testing.assert_array_equal(twice.original_sizes, redone.original_sizes)
    assert (twice.stored_sizes.max(axis=1) == 50).all()


# --------------------------------------------------------------------------- bad input


@pytest.fixture()
def bad_folder(tmp_path):
    root = tmp_path / "bad"
    (root / "a").mkdir(parents=True)
    good = encode(photo()[:300, :400], 90)
    (root / "a" / "good1.jpg").write_bytes(good)
    (root / "a" / "good2.jpg").write_bytes(good)
    (root / "a" / "trunc.jpg").write_bytes(good[:len(good) // 2])
    (root / "a" / "garbage.jpg").write_bytes(b"\xff\xd8\xff" + bytes(range(256)) * 4)
    (root / "a" / "empty.jpg").write_bytes(b"")
    return str(root)


def test_undecodable_file_is_named_and_nothing_is_written(bad_folder, tmp_path):
    with pytest.raises(ll.DecodeError, match=r"empty\.jpg|garbage\.jpg|trunc\.jpg"):
        ll.pack(bad_folder, tmp_path / "o", max_side=128, progress=False)
    assert os.listdir(tmp_path) == ["bad"]   # no shard, no temporary file


def test_undecodable_files_skipped_with_warning(bad_folder, tmp_path):
    with pytest.warns(ll.SkipWarning, match=r"trunc\.jpg"):
        report = ll.pack(bad_folder, tmp_path / "o", max_side=128, on_error="skip", progress=False)
    assert sorted(os.path.basename(s) for s, _ in report.skipped) == ["empty.jpg", "garbage.jpg", "trunc.jpg"]
    ds = ll.RecordFileDataset(tmp_path / "o")
    assert [os.path.basename(k) for k in ds.keys] == ["good1.jpg", "good2.jpg"]
    assert report.images == 2 and list(ds.stored_sizes[0]) == [128, 96]


@pytest.mark.parametrize("kwargs, match", [({"max_side": 15}, r"max_side \(--max-side\)"),
                                           ({"max_side": 0}, r"max_side \(--max-side\)"),
                                           ({"quality": 0}, r"quality \(--quality\)"),
                                           ({"quality": 101}, r"quality \(--quality\)"),
                                           ({"raw_below": -1}, r"raw_below \(--raw-below\)")])
def test_bad_options_name_the_flag(folder, tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ll.pack(folder, tmp_path / "o", progress=False, **kwargs)
    with pytest.raises(ValueError, match=match):
        ll.write_records(tmp_path / "o", [b"x"], **kwargs)
    assert os.listdir(tmp_path) == []


def test_existing_output_needs_force(folder, tmp_path):
    ll.pack(folder, tmp_path / "o", max_side=64, progress=False)
    before = (tmp_path / "o.llrec").read_bytes()
    with pytest.raises(FileExistsError, match=r"--force"):
        ll.pack(folder, tmp_path / "o", max_side=32, progress=False)
    assert (tmp_path / "o.llrec").read_bytes() == before
    ll.pack(folder, tmp_path / "o", max_side=32, overwrite=True, progress=False)
    assert ll.RecordFileDataset(tmp_path / "o").stored_sizes.max() == 32


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, "-m", "loaderlib", "pack", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_cli_pack_prints_savings_and_refuses_bad_flags(folder, tmp_path):
    out = str(tmp_path / "o")
    r = _cli(folder, out, "--max-side", "128", "--quality", "90", "--raw-below", "9000", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "MB saved" in r.stdout and "images/s" in r.stdout and "raw" in r.stdout
    assert "packing" not in r.stderr   # --quiet: no progress bar
    for flag, value in (("--max-side", "8"), ("--quality", "0"), ("--quality", "101")):
        bad = _cli(folder, str(tmp_path / "x"), flag, value)
        assert bad.returncode == 2 and flag in bad.stderr, bad.stderr
    again = _cli(folder, out, "--max-side", "64", "--quiet")
    assert again.returncode == 1 and "--force" in again.stderr
    assert _cli(folder, out, "--max-side", "64", "--quiet", "--force").returncode == 0


@pytest.mark.parametrize("damage", ["short", "header", "dims", "channels"])
def test_damaged_raw_record_is_a_named_error(folder, tmp_path, damage):
    ll.pack(folder, tmp_path / "r", max_side=32, raw_below=1 << 30, progress=False)
    ds = ll.RecordFileDataset(tmp_path / "r")
    good = bytearray(ds.read(0))
    if damage == "short":
        bad = bytes(good[:-5])
    elif damage == "header":
        bad = bytes(good[:20])
    elif damage == "dims":
        bad = bytes(good[:8] + (10**6).to_bytes(4, "little") + good[12:])
    else:
        bad = bytes(good[:16] + (2).to_bytes(4, "little") + good[20:])
    ll.write_records(tmp_path / "bad", [bad, bytes(good)], [0, 1])
    loader = DataLoader(ll.RecordFileDataset(tmp_path / "bad").transform_first(T.RandomResizedCrop(16)),
                        batch_size=2, num_threads=2)
    with pytest.raises(ll.DecodeError, match=r"raw record") as e:
        list(loader)
    assert "record 0" in str(e.value)
    with pytest.raises(ll.DecodeError, match=r"raw record"):
        ll.decode(bad)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ll.SkipWarning)
        skipped = DataLoader(ll.RecordFileDataset(tmp_path / "bad").transform_first(T.RandomResizedCrop(16)),
                             batch_size=2, num_threads=2, on_error="skip")
        assert sum(len(x) for x, _ in skipped) == 1


@pytest.mark.parametrize("chain", ["rrc", "resize-rrc"])
def test_mutated_packed_records_never_crash(folder, tmp_path, chain):
    """Random bytes in the first 48 bytes of packed JPEG and raw records (the APP9 segment with
    the original size, the raw header) and cut records: each gives a sample or an error naming
    it, never a crash, on one and two stages (an absurd original size meets the intermediate
    image guard)."""
    ll.pack(folder, tmp_path / "p", max_side=48, raw_below=2000, progress=False)
    ds = ll.RecordFileDataset(tmp_path / "p")
    assert set(ds.kinds) == {"jpeg", "raw"}
    rng = np.random.default_rng(1)
    bad = []
    for k in range(160):
        rec = bytearray(ds.read(k % len(ds)))
        for _ in range(int(rng.integers(1, 4))):
            rec[int(rng.integers(0, min(len(rec), 48)))] = int(rng.integers(0, 256))
        if rng.random() < 0.25:
            rec = rec[:int(rng.integers(0, len(rec) + 1))]
        bad.append(bytes(rec))
    ll.write_records(tmp_path / "m", bad)
    steps = [T.Resize(40), T.RandomResizedCrop(16)] if chain == "resize-rrc" else [T.RandomResizedCrop(16)]
    mutated = ll.RecordFileDataset(tmp_path / "m").transform_first(T.Compose([*steps, T.Normalize(MEAN, STD)]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = DataLoader(mutated, batch_size=16, num_threads=2, on_error="skip")
        n = sum(len(x) for x, _ in loader)
    assert 0 < n < len(bad)
    assert all(e.index is not None and e.source == f"record {e.index}" for e in loader.errors)


def test_mutated_sources_never_crash_pack(folder, tmp_path):
    src = ll.ImageFolderDataset(folder)
    rng = np.random.default_rng(2)
    blobs = []
    for k in range(60):
        data = bytearray(open(src.items[k % len(src)][0], "rb").read())
        for _ in range(int(rng.integers(1, 6))):
            data[int(rng.integers(0, len(data)))] = int(rng.integers(0, 256))
        if rng.random() < 0.3:
            data = data[:int(rng.integers(0, len(data) + 1))]
        blobs.append(bytes(data))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        written = ll.write_records(tmp_path / "o", blobs, max_side=64, raw_below=1500, reencode=True,
                                   on_error="skip", num_threads=2)
    ds = ll.RecordFileDataset(written[0])
    assert 0 < len(ds) <= len(blobs)
    assert all(max(s) <= 64 for s in ds.stored_sizes.tolist())


def test_write_records_unreadable_path_raises_or_skips(folder, tmp_path):
    paths = [p for p, _ in ll.ImageFolderDataset(folder).items][:3]
    missing = str(tmp_path / "gone.jpg")
    with pytest.raises(ll.LoaderError, match=r"cannot read item 1 .*gone\.jpg"):
        ll.write_records(tmp_path / "o", [paths[0], missing, paths[1]], [0, 1, 2], max_side=64)
    assert not os.path.exists(tmp_path / "o.llrec")
    with pytest.warns(ll.SkipWarning, match=r"gone\.jpg"):
        ll.write_records(tmp_path / "o", [paths[0], missing, paths[1]], [0, 1, 2], on_error="skip")
    ds = ll.RecordFileDataset(tmp_path / "o")
    assert ds.keys == [paths[0], paths[1]] and ds.labels.tolist() == [0, 2] and ds.kinds == ["file", "file"]
    assert (ds.original_sizes == -1).all()   # written without pack's options: sizes unknown
