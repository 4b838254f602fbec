"""The native engine on real JPEG files and record files."""

import gc
import os
import subprocess
import sys
import textwrap
import threading
import warnings

import cv2
import numpy as np
import pytest

import loaderlib as ll
from loaderlib import DataLoader
from loaderlib import transforms as T
from loaderlib.arena import arena_counters
from tests.kernels import _resample_ref as resample_ref
from tests.kernels._loader_images import damaged, encode, make_image_folder, photo

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp("imgs"), num_classes=3, per_class=8)


def _train_chain():
    return T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.Normalize(MEAN, STD), T.ToCHW()])


def _ref_resize_crop(path, size):
    """Reference: OpenCV decode, RGB, shorter side to `size` (torchvision rule) with the numpy
    model of the antialiased bilinear filter (Resize's default), centre crop."""
    img = cv2.imread(path, cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)[:, :, ::-1]
    h, w = img.shape[:2]
    oh, ow = (int(size * h / w), size) if w <= h else (size, int(size * w / h))
    img = resample_ref.resize(np.ascontiguousarray(img), oh, ow)
    top, left = round((oh - size) / 2.0), round((ow - size) / 2.0)
    return img[top:top + size, left:left + size]


def test_native_engine_chosen_and_explained(folder):
    ds = ll.ImageFolderDataset(folder).transform_first(_train_chain())
    loader = DataLoader(ds, batch_size=8, seed=0)
    assert loader.engine == "native"
    text = loader.explain()
    assert "engine: native" in text and "random resized crop" in text
    # a Python step moves it to the threads engine, and explain says which stage
    py = ll.ImageFolderDataset(folder).transform_first(T.Compose([T.Resize((32, 32)), lambda im: im]))
    loader = DataLoader(py, batch_size=8)
    assert loader.engine == "threads"
    assert "python" in loader.explain()
    assert DataLoader(py, batch_size=8, num_workers=1).engine == "processes"


def test_resize_center_crop_matches_opencv(folder):
    ds = ll.ImageFolderDataset(folder)
    chain = T.Compose([T.Decode(dct_scaling=False), T.Resize(96), T.CenterCrop(96)])
    loader = DataLoader(ds.transform_first(chain), batch_size=5, num_threads=2)
    assert loader.engine == "native"
    k = 0
    for images, labels in loader:
        assert images.shape[1:] == (96, 96, 3) and images.dtype == np.uint8
        for img, lab in zip(images, labels):
            path, want_label = ds.items[k]
            assert lab == want_label
            ref = _ref_resize_crop(path, 96)
            diff = np.abs(img.astype(np.int16) - ref.astype(np.int16))
            assert diff.max() <= 2, (path, diff.max())
            k += 1
    assert k == len(ds)


def test_identical_for_one_and_two_threads(folder):
    ds = ll.ImageFolderDataset(folder).transform_first(_train_chain())
    runs = []
    for n in (1, 2):
        loader = DataLoader(ds, batch_size=7, shuffle=True, seed=42, num_threads=n)
        runs.append([(x.copy(), y.copy()) for x, y in loader])
    assert len(runs[0]) == len(runs[1]) == 4
    for (x1, y1), (x2, y2) in zip(*runs):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    assert runs[0][0][0].shape == (7, 3, 64, 64) and runs[0][0][0].dtype == np.float32


def test_shuffle_epochs_and_augmentation_vary(folder):
    ds = ll.ImageFolderDataset(folder)
    loader = DataLoader(ds.transform_first(_train_chain()), batch_size=6, shuffle=True, seed=1)
    e0 = [(x.copy(), y.copy()) for x, y in loader]
    e1 = [(x.copy(), y.copy()) for x, y in loader]
    lab0 = np.concatenate([y for _, y in e0])
    assert sorted(lab0.tolist()) == sorted(ds.labels.tolist())
    assert not all(np.array_equal(a[1], b[1]) for a, b in zip(e0, e1))


def test_records_match_files(folder, tmp_path):
    ds = ll.ImageFolderDataset(folder)
    ll.write_records(tmp_path / "r", [p for p, _ in ds.items], ds.labels, synsets=ds.synsets)
    rec = ll.RecordFileDataset(tmp_path / "r")
    chain = _train_chain()
    a = DataLoader(ds.transform_first(chain), batch_size=8, shuffle=True, seed=3)
    b = DataLoader(rec.transform_first(chain), batch_size=8, shuffle=True, seed=3)
    assert b.engine == "native" and "pread" in b.explain()
    for (x1, y1), (x2, y2) in zip(a, b):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)


def test_kept_batches_never_overwritten(folder):
    ds = ll.ImageFolderDataset(folder).transform_first(T.Compose([T.Resize((24, 24))]))
    loader = DataLoader(ds, batch_size=3, prefetch=1)
    kept = list(loader)
    copies = [(x.copy(), y.copy()) for x, y in DataLoader(ds, batch_size=3)]
    assert len(kept) == 8
    for (x1, y1), (x2, y2) in zip(kept, copies):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)


def test_steady_state_allocates_no_arena_memory(folder):
    psutil = pytest.importorskip("psutil")
    ds = ll.ImageFolderDataset(folder).transform_first(T.Compose([T.RandomResizedCrop(96), T.ToCHW()]))
    loader = DataLoader(ds, batch_size=4, shuffle=True, seed=0, prefetch=2, last_batch="discard")
    proc = psutil.Process()

    def epochs():
        while True:
            yield from loader

    stream = epochs()
    for _ in range(20):          # warm-up: arena planned, pools and scratch grown
        next(stream)
    before = arena_counters()
    rss0 = proc.memory_info().rss
    for _ in range(200):
        next(stream)
    after = arena_counters()
    rss1 = proc.memory_info().rss
    # 200 batches = 33 epochs of 6 batches: the loader's ring serves every epoch.
    assert after["allocations"] == before["allocations"]
    assert after["bytes_live"] == before["bytes_live"]
    assert rss1 - rss0 < 16 * 2**20


def test_one_iterator_steady_state_allocates_nothing(folder):
    ds = ll.ImageFolderDataset(folder).transform_first(T.Compose([T.Resize((16, 16))]))
    idx = np.tile(np.arange(len(ds)), 9)[:216]
    loader = DataLoader(ds, batch_sampler=[idx[i:i + 1] for i in range(216)], prefetch=2)
    it = iter(loader)
    for _ in range(16):
        next(it)
    before = arena_counters()["allocations"]
    n = sum(1 for _ in it)
    assert n == 200
    assert arena_counters()["allocations"] == before


def test_decode_error_names_path_and_skip_fills(folder, tmp_path):
    ds = ll.ImageFolderDataset(folder)
    paths = [p for p, _ in ds.items[:10]]
    bad = str(tmp_path / "broken.jpg")
    with open(bad, "wb") as f:
        f.write(b"\xff\xd8\xff\xe0 this is not really a jpeg")
    paths.insert(2, bad)
    labels = list(range(11))
    lst = ll.ImageListDataset(paths, labels).transform_first(T.Compose([T.Resize((20, 20))]))
    loader = DataLoader(lst, batch_size=4, timeout=30)
    assert loader.engine == "native"
    with pytest.raises(ll.DecodeError, match="broken.jpg") as info:
        list(loader)
    assert info.value.index == 2
    loader = DataLoader(lst, batch_size=4, on_error="skip")
    got = [y.tolist() for _, y in loader]
    assert got == [[0, 1, 3, 4], [5, 6, 7, 8], [9, 10]]
    assert len(loader.errors) == 1 and loader.errors[0].source == bad and loader.errors[0].index == 2
    assert loader.errors[0].reason


def test_missing_file_raises(folder, tmp_path):
    lst = ll.ImageListDataset([str(tmp_path / "nope.jpg")], [0]).transform_first(T.Resize((8, 8)))
    with pytest.raises(ll.DecodeError, match="nope.jpg"):
        next(iter(DataLoader(lst, batch_size=1)))


def test_abandoned_native_iterators_leave_no_threads(folder):
    before = set(threading.enumerate())
    ds = ll.ImageFolderDataset(folder).transform_first(T.Resize((16, 16)))
    loader = DataLoader(ds, batch_size=2, prefetch=3)
    for _ in range(4):
        for _b in loader:
            break
    del _b
    gc.collect()
    assert [t for t in threading.enumerate() if t not in before] == []


def test_two_native_loaders_in_lockstep(folder, tmp_path):
    ds = ll.ImageFolderDataset(folder)
    other = tmp_path / "other"
    img = photo()
    os.makedirs(other / "a")
    for i in range(10):
        with open(other / "a" / f"{i}.jpg", "wb") as f:
            f.write(encode(img[i * 10:i * 10 + 200, :300]))
    def make():
        return (DataLoader(ds.transform_first(T.Resize((16, 16))), batch_size=4),
                DataLoader(ll.ImageFolderDataset(other).transform_first(T.Resize((8, 8))), batch_size=4))

    # Each loader alone is the reference; in lockstep they must deliver the very same batches.
    alone1, alone2 = ([(x.copy(), y.copy()) for x, y in loader] for loader in make())
    l1, l2 = make()
    n = 0
    for (x1, y1), (x2, y2) in zip(l1, l2):
        assert x1.shape[1:] == (16, 16, 3) and x2.shape[1:] == (8, 8, 3)
        np.testing.assert_array_equal(x1, alone1[n][0])
        np.testing.assert_array_equal(y1, alone1[n][1])
        np.testing.assert_array_equal(x2, alone2[n][0])
        np.testing.assert_array_equal(y2, alone2[n][1])
        n += 1
    assert n == len(alone2) == 3


def test_torch_zero_copy(folder):
    torch = pytest.importorskip("torch")
    ds = ll.ImageFolderDataset(folder).transform_first(_train_chain())
    x, y = next(iter(DataLoader(ds, batch_size=4)))
    t = torch.from_numpy(x)
    assert t.data_ptr() == x.ctypes.data and t.shape == (4, 3, 64, 64)
    d = torch.from_dlpack(x)
    assert d.data_ptr() == x.ctypes.data
    assert torch.from_numpy(y).dtype == torch.int64


def test_fork_after_native_epoch_completes(folder):
    # NOTE [ OpenMP after fork ]: the child must not hang in its first parallel region.
    code = textwrap.dedent(f"""
        import os, sys, warnings
        import loaderlib as ll
        from loaderlib import transforms as T
        ds = ll.ImageFolderDataset({folder!r}).transform_first(T.Resize((32, 32)))
        n = sum(len(y) for _, y in ll.DataLoader(ds, batch_size=4, num_threads=2))
        pid = os.fork()
        if pid == 0:
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                m = sum(len(y) for _, y in ll.DataLoader(ds, batch_size=4, num_threads=2))
            ok = m == n and any("forked" in str(x.message) for x in w)
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    """)
    res = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_native_stats_fed(folder):
    ds = ll.ImageFolderDataset(folder).transform_first(_train_chain())
    loader = DataLoader(ds, batch_size=8, profile=True)
    list(loader)
    st = loader.stats
    assert st.samples == len(ds) and st.batches == 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert loader.recorder.enabled


def test_python_tail_after_native_prefix(folder):
    """Threads engine: the native prefix stays native, the Python tail runs per sample."""
    ds = ll.ImageFolderDataset(folder)
    chain = T.Compose([T.Decode(dct_scaling=False), T.RandomResizedCrop(40), T.RandomHorizontalFlip(),
                       lambda im: np.ascontiguousarray(im[::-1]), T.Normalize(MEAN, STD)])
    outs = []
    for n in (1, 2):
        loader = DataLoader(ds.transform_first(chain), batch_size=6, seed=9, num_threads=n)
        assert loader.engine == "threads"
        text = loader.explain()
        assert "native  random resized crop" in text and "lambda" in text
        outs.append([(x.copy(), y.copy()) for x, y in loader])
    for (x1, y1), (x2, y2) in zip(*outs):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    # equal to the chain applied step by step with the same keyed randomness
    x, y = outs[0][1]
    for j in range(6):
        i = 6 + j
        ref = chain(ds[i][0], seed=9, epoch=0, index=i)
        np.testing.assert_array_equal(x[j], ref)
        assert y[j] == ds.labels[i]


def test_python_batchify_on_native_samples(folder):
    ds = ll.ImageFolderDataset(folder).transform_first(T.Resize((16, 16)))
    loader = DataLoader(ds, batch_size=5, batchify_fn=lambda s: (len(s), s[0][0].shape, s[0][1]))
    assert loader.engine == "threads"
    batches = list(loader)
    assert len(batches) == 5 and batches[0] == (5, (16, 16, 3), 0)


def test_inside_torch_fork_workers_after_native_epoch(folder):
    pytest.importorskip("torch")
    code = textwrap.dedent(f"""
        import warnings
        import torch
        import loaderlib as ll
        from loaderlib import transforms as T
        base = ll.ImageFolderDataset({folder!r})
        ds = base.transform_first(T.Resize((24, 24)))
        assert sum(len(y) for _, y in ll.DataLoader(ds, batch_size=4, num_threads=2)) == len(ds)

        class Wrapped(torch.utils.data.Dataset):
            def __len__(self):
                return 4
            def __getitem__(self, k):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return sum(int(y.sum()) for _, y in ll.DataLoader(ds, batch_size=3, num_threads=2))

        ctx = "fork"
        out = list(torch.utils.data.DataLoader(Wrapped(), batch_size=2, num_workers=2,
                                               multiprocessing_context=ctx, timeout=60))
        want = int(base.labels.sum())
        assert [int(v) for b in out for v in b] == [want] * 4, out
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_unlabelled_image_list_yields_images_only(folder):
    ds = ll.ImageFolderDataset(folder)
    paths = [p for p, _ in ds.items[:7]]
    chain = T.Compose([T.Decode(dct_scaling=False), T.Resize((12, 12))])
    loader = DataLoader(ll.ImageListDataset(paths).transform_first(chain), batch_size=4)
    assert loader.engine == "native"
    batches = list(loader)
    assert [b.shape for b in batches] == [(4, 12, 12, 3), (3, 12, 12, 3)]
    ref = chain(ds[5][0])
    np.testing.assert_array_equal(batches[1][1], ref)


def test_truncated_jpeg_raises_and_damage_warns(folder, tmp_path):
    data = encode(photo()[:300, :300], quality=90)
    cut = str(tmp_path / "cut.jpg")
    with open(cut, "wb") as f:
        f.write(data[: len(data) * 2 // 3])
    with pytest.raises(ll.DecodeError, match=r"cut.jpg.*truncated"):
        next(iter(DataLoader(ll.ImageListDataset([cut], [0]).transform_first(T.Resize((16, 16))), batch_size=1)))
    bad = str(tmp_path / "damaged.jpg")
    with open(bad, "wb") as f:
        f.write(damaged(data))
    lst = ll.ImageListDataset([bad], [0])
    with pytest.warns(ll.DecodeWarning, match="damaged.jpg"):
        x, _ = next(iter(DataLoader(lst.transform_first(T.Resize((16, 16))), batch_size=1)))
    assert x.shape == (1, 16, 16, 3)
    strict = T.Compose([T.Decode(strict=True), T.Resize((16, 16))])
    with pytest.raises(ll.DecodeError, match="damaged.jpg"):
        next(iter(DataLoader(lst.transform_first(strict), batch_size=1)))


def test_png_in_a_jpeg_folder(tmp_path):
    img = photo()[:200, :240]
    os.makedirs(tmp_path / "a")
    with open(tmp_path / "a" / "x.jpg", "wb") as f:
        f.write(encode(img))
    with open(tmp_path / "a" / "y.PNG", "wb") as f:
        f.write(encode(img, ext=".png"))
    chain = T.Compose([T.Decode(dct_scaling=False), T.Resize((20, 24))])
    ds = ll.ImageFolderDataset(tmp_path)
    ((x, y),) = list(DataLoader(ds.transform_first(chain), batch_size=2))
    ref = chain(img[:, :, ::-1].copy())
    assert y.tolist() == [0, 0]
    np.testing.assert_array_equal(x[1], ref)            # PNG is lossless: exact
    assert np.abs(x[0].astype(int) - ref).max() <= 12   # the JPEG differs by its compression only


@pytest.fixture(scope="module")
def small_jpegs(tmp_path_factory):
    """60-160 px JPEGs: Resize(32) shrinks them 2-5x, so the fused chain decodes at a DCT scale."""
    root = tmp_path_factory.mktemp("small")
    rng = np.random.default_rng(0)
    for c in "ab":
        os.makedirs(root / c)
        for i in range(20):
            w, h = int(rng.integers(60, 161)), int(rng.integers(60, 161))
            img = cv2.GaussianBlur(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), (7, 7), 0)
            cv2.imwrite(str(root / c / f"{i}.jpg"), img)
    return ll.ImageFolderDataset(str(root))


def _delivered(loader, epoch):
    """Each dataset index -> the image the loader delivered for it in ``epoch``."""
    order = loader.sampler.order(epoch)
    loader.set_epoch(epoch)
    xs = np.concatenate([x.copy() for x, _ in loader])
    return {int(i): xs[pos] for pos, i in enumerate(order)}


@pytest.mark.parametrize("chain", [T.Compose([T.Resize(32), T.CenterCrop(32)]),
                                   T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToCHW()])],
                         ids=["resize-crop", "rrc-flip"])
def test_preview_is_exactly_the_delivered_sample(small_jpegs, chain):
    """NOTE [ Exact preview ]: loader.preview(i, epoch) runs the fused kernel on the file's bytes."""
    loader = DataLoader(small_jpegs.transform_first(chain), batch_size=8, shuffle=True, seed=5, num_threads=2)
    assert loader.engine == "native"
    array_differs = 0
    for epoch in (0, 3):
        got = _delivered(loader, epoch)
        for i, x in got.items():
            image, label = loader.preview(i, epoch=epoch)
            np.testing.assert_array_equal(image, x, err_msg=f"sample {i} of epoch {epoch}")
            assert label == small_jpegs.items[i][1]
            decoded = cv2.cvtColor(cv2.imread(small_jpegs.items[i][0]), cv2.COLOR_BGR2RGB)
            array_differs += not np.array_equal(chain(decoded, seed=5, epoch=epoch, index=i), x)
    # The array preview is not exact here (DCT-scaled decode), which is why preview() exists.
    assert array_differs > 0
    loader.set_epoch(3)
    np.testing.assert_array_equal(loader.preview(7)[0], loader.preview(7, epoch=3)[0])   # default: loader.epoch
    with pytest.raises(IndexError, match=r"index must be an integer in \[0, 40\), got 40"):
        loader.preview(40)


def test_array_preview_is_exact_at_full_scale_decode(small_jpegs):
    """The rule for the array preview (docs/preview.md): exact where the loader decodes at full resolution."""
    chain = T.Compose([T.Decode(dct_scaling=False), T.Resize(32), T.CenterCrop(32)])
    loader = DataLoader(small_jpegs.transform_first(chain), batch_size=8, shuffle=True, seed=5, num_threads=2)
    assert loader.engine == "native"
    for i, x in _delivered(loader, 2).items():
        with open(small_jpegs.items[i][0], "rb") as f:
            data = f.read()
        np.testing.assert_array_equal(chain(data, seed=5, epoch=2, index=i), x, err_msg=f"sample {i}")
