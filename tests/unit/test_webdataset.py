"""WebDataset shards written by the webdataset package's own TarWriter, read natively."""

from __future__ import annotations

import json
import tarfile

import cv2
import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T

wds = pytest.importorskip("webdataset")


def _jpeg(rng, h, w):
    _ok, buf = cv2.imencode(".jpg", rng.integers(0, 256, (h, w, 3), dtype=np.uint8), [cv2.IMWRITE_JPEG_QUALITY, 90])
    return buf.tobytes()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """3 shards of 7 samples: jpg + cls, one sample with a json label, varying sizes."""
    root = tmp_path_factory.mktemp("wds")
    rng = np.random.default_rng(0)
    images, labels, paths = [], [], []
    k = 0
    for s in range(3):
        path = root / f"train-{s:04d}.tar"
        with wds.TarWriter(str(path)) as sink:
            for _ in range(7):
                data = _jpeg(rng, 24 + k % 5, 30 + k % 3)
                sample = {"__key__": f"sample{k:04d}", "jpg": data}
                if k == 4:
                    sample["json"] = json.dumps({"label": k % 4}).encode()
                else:
                    sample["cls"] = str(k % 4).encode()
                sink.write(sample)
                images.append(data)
                labels.append(k % 4)
                k += 1
        paths.append(str(path))
    return paths, images, labels


def _rgb(data):
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)[:, :, ::-1]


def test_index_and_getitem_match_opencv(shards):
    paths, images, labels = shards
    ds = ll.WebDataset(paths)
    assert len(ds) == 21 and ds.labels.tolist() == labels
    assert ds.keys[0] == "sample0000" and ds.source(8).endswith("train-0001.tar:sample0008.jpg")
    for i in (0, 4, 20):
        img, lab = ds[i]
        np.testing.assert_array_equal(img, _rgb(images[i]))
        assert lab == labels[i]


@pytest.mark.parametrize("spec", ["{0000..0002}", "*"])
def test_brace_ranges_and_globs(shards, spec):
    paths, _, _ = shards
    pattern = paths[0].replace("0000", spec)
    assert ll.WebDataset(pattern).paths == paths


@pytest.mark.parametrize("threads", [1, 2])
def test_native_loader_equals_decoding_the_files(shards, threads):
    paths, images, labels = shards
    ds = ll.WebDataset(paths).transform_first(T.Compose([T.Resize((16, 16)), T.ToCHW()]))
    loader = ll.DataLoader(ds, batch_size=5, shuffle=True, seed=3, num_threads=threads)
    assert loader.engine == "native"
    seen = []
    for batch, lab in loader:
        for img, idx_label in zip(batch, lab):
            seen.append((np.array(img), int(idx_label)))
    assert len(seen) == 21
    # The same samples through the one-image path (decode, then the same transforms).
    ref = ll.DataLoader(ll.WebDataset(paths).transform_first(T.Compose([T.Resize((16, 16)), T.ToCHW()])),
                        batch_size=5, shuffle=True, seed=3, num_threads=1)
    ref_batches = [(np.array(b), np.array(lb)) for b, lb in ref]
    got = np.concatenate([np.stack([a for a, _ in seen])])
    np.testing.assert_array_equal(got, np.concatenate([b for b, _ in ref_batches]))
    direct = T.Compose([T.Resize((16, 16)), T.ToCHW()])
    order = ll.sampler.RandomSampler(21, seed=3).order(0)
    for j, i in enumerate(order.tolist()):
        np.testing.assert_array_equal(seen[j][0], direct(_rgb(images[i])))
        assert seen[j][1] == labels[i]


def test_truncated_member_is_named(tmp_path, shards):
    _paths, images, _ = shards
    bad = tmp_path / "bad.tar"
    with wds.TarWriter(str(bad)) as sink:
        sink.write({"__key__": "ok", "jpg": images[0], "cls": b"1"})
        sink.write({"__key__": "broken", "jpg": images[1][:30], "cls": b"2"})
    ds = ll.WebDataset(str(bad)).transform_first(T.Resize((8, 8)))
    with pytest.raises(ll.DecodeError, match="bad.tar:broken.jpg"):
        list(ll.DataLoader(ds, batch_size=2))
    loader = ll.DataLoader(ds, batch_size=2, on_error="skip")
    assert [len(b[1]) for b in loader] == [1]
    assert loader.errors[0].source.endswith("bad.tar:broken.jpg")


def test_bad_shards_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ll.WebDataset(str(tmp_path / "none.tar"))
    (tmp_path / "junk.tar").write_bytes(b"not a tar file at all" * 10)
    with pytest.raises(ll.LoaderError, match="not an uncompressed tar"):
        ll.WebDataset(str(tmp_path / "junk.tar"))
    gz = tmp_path / "x.tar.gz"
    with tarfile.open(gz, "w:gz") as tf:
        f = tmp_path / "a.jpg"
        f.write_bytes(b"\xff\xd8")
        tf.add(f, arcname="a.jpg")
    with pytest.raises(ll.LoaderError, match="not an uncompressed tar"):
        ll.WebDataset(str(gz))
    with pytest.raises(FileNotFoundError, match="no shard matches"):
        ll.WebDataset(str(tmp_path / "nothing-*.tar"))


def test_samples_without_image_are_skipped_with_a_warning(tmp_path, shards):
    _, images, _ = shards
    path = tmp_path / "mixed.tar"
    with wds.TarWriter(str(path)) as sink:
        sink.write({"__key__": "a", "jpg": images[0], "cls": b"0"})
        sink.write({"__key__": "b", "txt": b"caption only"})
    with pytest.warns(RuntimeWarning, match="1 sample"):
        ds = ll.WebDataset(str(path))
    assert len(ds) == 1
