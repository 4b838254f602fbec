"""Hugging Face datasets: an image column goes to the native decoder as bytes, without PIL."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T

datasets = pytest.importorskip("datasets")

from loaderlib.integrations.huggingface import HFImageDataset


def _jpegs(n):
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        _ok, buf = cv2.imencode(".jpg", rng.integers(0, 256, (28 + i % 3, 31, 3), dtype=np.uint8))
        out.append(buf.tobytes())
    return out


def _rgb(data):
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)[:, :, ::-1]


@pytest.fixture
def hf_and_files(tmp_path):
    images = _jpegs(10)
    paths = []
    for k, data in enumerate(images):
        p = tmp_path / f"{k}.jpg"
        p.write_bytes(data)
        paths.append(str(p))
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    hf = datasets.Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in images],
                                     "label": [k % 4 for k in range(10)]}, features=features)
    return hf, images, paths


def test_items_equal_opencv(hf_and_files):
    hf, images, _ = hf_and_files
    ds = HFImageDataset(hf)
    assert len(ds) == 10 and ds.labels.tolist() == [k % 4 for k in range(10)]
    img, lab = ds[3]
    np.testing.assert_array_equal(img, _rgb(images[3]))
    assert lab == 3


@pytest.mark.parametrize("threads", [1, 2])
def test_native_loader_equals_the_same_files(hf_and_files, threads):
    hf, _, paths = hf_and_files
    chain = T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ToCHW()])
    loader = ll.DataLoader(HFImageDataset(hf).transform_first(chain), batch_size=4, shuffle=True, seed=2,
                           num_threads=threads)
    assert loader.engine == "native"
    ref = ll.DataLoader(ll.ImageListDataset(paths, [k % 4 for k in range(10)]).transform_first(chain), batch_size=4,
                        shuffle=True, seed=2, num_threads=1)
    for (a, b), (ra, rb) in zip(loader, ref):
        np.testing.assert_array_equal(b, rb)
        np.testing.assert_array_equal(a, ra)


def test_bad_columns_are_named(hf_and_files):
    hf, _, _ = hf_and_files
    with pytest.raises(ll.LoaderError, match="no column 'img'"):
        HFImageDataset(hf, image_column="img")
    with pytest.raises(ll.LoaderError, match="no column 'cls'"):
        HFImageDataset(hf, label_column="cls")
    assert HFImageDataset(hf, label_column=None)[0].shape[2] == 3
