import os
import subprocess
import sys

import cv2
import numpy as np
import pytest

import loaderlib as ll
from loaderlib.datasets import (
    ArrayDataset,
    ImageFolderDataset,
    ImageListDataset,
    SimpleDataset,
    TupleDataset,
)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "kernels"))
from _loader_images import make_image_folder

from loaderlib import RecordFileDataset, write_records


def _ref(path):
    return cv2.imread(path, cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)[:, :, ::-1]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder")
    make_image_folder(root, num_classes=3, per_class=4)
    with open(os.path.join(root, "class1", "notes.txt"), "w") as f:
        f.write("not an image")
    with open(os.path.join(root, "README"), "w") as f:
        f.write("top-level file")
    return str(root)


def test_array_dataset():
    x = np.arange(12).reshape(6, 2)
    y = list(range(6))
    ds = ArrayDataset(x, y)
    assert len(ds) == 6
    a, b = ds[3]
    np.testing.assert_array_equal(a, x[3])
    assert b == 3
    assert ArrayDataset(x)[2].tolist() == [4, 5]
    with pytest.raises(ValueError, match="same length"):
        ArrayDataset(x, y[:3])


def test_transform_and_transform_first():
    ds = ArrayDataset(np.arange(5), np.arange(5) * 10)
    t = ds.transform(lambda a, b: (a + 1, b + 1))
    assert t[2] == (3, 21)
    tf = ds.transform_first(lambda a: a * 100)
    assert tf[2] == (200, 20)
    eager = ds.transform_first(lambda a: -a, lazy=False)
    assert isinstance(eager, SimpleDataset) and eager[4] == (-4, 40)
    single = SimpleDataset([1, 2, 3]).transform(lambda v: v * 2)
    assert [single[i] for i in range(3)] == [2, 4, 6]


def test_tuple_dataset():
    d = TupleDataset([SimpleDataset([1, 2]), SimpleDataset(["a", "b"])])
    assert d[1] == (2, "b") and len(d) == 2
    assert TupleDataset(SimpleDataset([1]), SimpleDataset([2]))[0] == (1, 2)
    with pytest.raises(ValueError, match="TupleDataset: dataset 0 has 1 samples, dataset 1 has 2"):
        TupleDataset([SimpleDataset([1]), SimpleDataset([1, 2])])


def test_image_folder(folder):
    with pytest.warns(UserWarning, match="skipped 2 file"):
        ds = ImageFolderDataset(folder)
    assert ds.synsets == ["class0", "class1", "class2"]
    assert len(ds) == 12 and len(ds.items) == 12
    # .JPEG (upper case) files are found too
    assert any(p.endswith(".JPEG") for p, _ in ds.items) and any(p.endswith(".jpg") for p, _ in ds.items)
    assert [lab for _, lab in ds.items] == [0] * 4 + [1] * 4 + [2] * 4
    img, label = ds[5]
    path = ds.items[5][0]
    assert label == 1
    np.testing.assert_array_equal(img, _ref(path))
    assert ds.source(5) == path
    with pytest.raises(IndexError, match="index 12 out of range"):
        ds[12]


def test_image_list(folder):
    paths = sorted(os.path.join(folder, "class0", f) for f in os.listdir(os.path.join(folder, "class0")))
    ds = ImageListDataset(paths, labels=[7, 8, 9, 10])
    img, lab = ds[2]
    assert lab == 9
    np.testing.assert_array_equal(img, _ref(paths[2]))
    only = ImageListDataset(paths)
    np.testing.assert_array_equal(only[0], _ref(paths[0]))
    with pytest.raises(ValueError, match="labels"):
        ImageListDataset(paths, labels=[1])


def test_records_roundtrip(folder, tmp_path):
    with pytest.warns(UserWarning):
        src = ImageFolderDataset(folder)
    paths = [p for p, _ in src.items]
    data_path, index_path = write_records(tmp_path / "pack", paths, src.labels, synsets=src.synsets)
    assert data_path.endswith(".llrec") and os.path.exists(index_path)
    rec = RecordFileDataset(tmp_path / "pack.llrec")
    assert len(rec) == len(src) and rec.synsets == src.synsets and rec.keys == paths
    for i in (0, 5, 11):
        img, lab = rec[i]
        assert lab == src.labels[i]
        np.testing.assert_array_equal(img, _ref(paths[i]))
        with open(paths[i], "rb") as f:
            assert rec.read(i) == f.read()
    raw = RecordFileDataset(tmp_path / "pack", raw=True)
    with open(paths[3], "rb") as f:
        assert raw[3][0] == f.read()


def test_write_records_bytes_and_errors(tmp_path):
    blobs = [b"abc", b"", b"xyz123"]
    write_records(tmp_path / "b.rec", blobs, labels=[1, 2, 3], keys=["k0", "k1", "k2"])
    rec = RecordFileDataset(tmp_path / "b", raw=True)
    assert [rec[i] for i in range(3)] == [(b"abc", 1), (b"", 2), (b"xyz123", 3)]
    with pytest.raises(ll.DecodeError, match="k0"):
        RecordFileDataset(tmp_path / "b")[0]
    with pytest.raises(ValueError, match="labels"):
        write_records(tmp_path / "c", blobs, labels=[1])
    assert not os.path.exists(tmp_path / "c.llrec")


def test_pack_command(folder, tmp_path):
    out = tmp_path / "packed"
    res = subprocess.run([sys.executable, "-m", "loaderlib", "pack", folder, str(out)],
                         check=False, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    rec = RecordFileDataset(out)
    with pytest.warns(UserWarning):
        src = ImageFolderDataset(folder)
    assert len(rec) == len(src) and rec.labels.tolist() == src.labels.tolist()
    np.testing.assert_array_equal(rec[4][0], src[4][0])


def test_special_files_are_refused_without_blocking(tmp_path):
    """A FIFO (a stand-in for a hung mount) or a device named .jpg is refused, never read
    without bound or waited on, by the Python path and by the native reader alike."""
    from loaderlib import transforms as T

    fifo = tmp_path / "stuck.jpg"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.jpg"
    os.symlink("/dev/zero", zero)
    for special in (fifo, zero):
        ds = ImageListDataset([str(special)], [0])
        with pytest.raises(OSError, match="not a regular file"):
            ds[0]
        loader = ll.DataLoader(ds.transform_first(T.Resize((8, 8))), batch_size=1, timeout=30)
        with pytest.raises(ll.DecodeError, match="not a regular file"):
            next(iter(loader))
    with pytest.raises(ll.LoaderError, match="not a regular file"):
        write_records(tmp_path / "p", [str(fifo)])
