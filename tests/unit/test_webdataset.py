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


def _jpegs(n: int, seed: int = 0) -> tuple[list[bytes], list[int]]:
    """``n`` small JPEGs of varying sizes and their labels."""
    rng = np.random.default_rng(seed)
    return [_jpeg(rng, 24 + k % 5, 30 + 3 * (k % 4)) for k in range(n)], [k % 5 for k in range(n)]


def _idx_lines(path):
    """An .idx read by hand: (header fields, [[(ext, offset, size, name), ...] per sample])."""
    with open(path) as f:
        lines = f.read().splitlines()
    rows = []
    for line in lines[1:]:
        tok = line.split()
        rows.append([(tok[k], int(tok[k + 1]), int(tok[k + 2]), tok[k + 3]) for k in range(0, len(tok), 4)])
    return lines[0].split(), rows


def _tar_truth(path):
    """Each file member of a tar as Python's tarfile sees it: (name, data offset, size, bytes)."""
    with tarfile.open(path) as tf:
        return [(m.name, m.offset_data, m.size, tf.extractfile(m).read()) for m in tf if m.isfile()]


def test_write_webdataset_round_trips_with_dalis_index(tmp_path):
    """NOTE [ WebDataset sidecar index ]: each shard written gets a v1.2 .idx whose ranges of
    the shard are exactly its members (checked against tarfile and the bytes written), and the
    webdataset library reads the shards back."""
    images, labels = _jpegs(20)
    paths = ll.write_webdataset(tmp_path / "train", images, labels, shard_size=6 * min(map(len, images)))
    assert len(paths) >= 3 and paths[0].endswith("train-00000.tar")
    k = 0
    for path in paths:
        head, rows = _idx_lines(path[:-4] + ".idx")
        truth = _tar_truth(path)
        assert head == ["v1.2", str(len(rows))] and len(truth) == 2 * len(rows)
        blob = open(path, "rb").read()
        flat = [c for row in rows for c in row]
        assert [(n, o, s) for n, o, s, _ in truth] == [(name, o, s) for _, o, s, name in flat]
        for row in rows:
            (e1, o1, s1, _), (e2, o2, s2, _) = row
            assert (e1, e2) == ("jpg", "cls")
            assert blob[o1:o1 + s1] == images[k] and blob[o2:o2 + s2] == str(labels[k]).encode()
            k += 1
    assert k == len(images)
    got = [(s["jpg"], int(s["cls"])) for p in paths for s in wds.WebDataset(p, shardshuffle=False)]
    assert got == list(zip(images, labels))
    ds = ll.WebDataset(str(tmp_path / "train-*"))   # the glob leaves the .idx files out
    assert ds.paths == paths and np.array_equal(ds.labels, labels)


def test_write_webdataset_index_of_a_shard_written_by_webdataset(shards):
    paths, _images, _labels = shards
    for path in paths:
        idx = ll.write_webdataset_index(path)
        assert idx == path[:-4] + ".idx"
        _head, rows = _idx_lines(idx)
        assert [(n, o, s) for n, o, s, _ in _tar_truth(path)] == [(name, o, s) for row in rows for _, o, s, name in row]


def test_write_webdataset_refuses_bad_keys_and_existing_shards(tmp_path):
    images, labels = _jpegs(2)
    with pytest.raises(ValueError, match=r"key 'a\.b' of sample 0 must be non-empty, without dots"):
        ll.write_webdataset(tmp_path / "x", images, labels, keys=["a.b", "c"])
    assert not (tmp_path / "x.tar").exists()
    ll.write_webdataset(tmp_path / "x", images, labels)
    with pytest.raises(FileExistsError, match=r"x\.tar' exists \(pass overwrite=True"):
        ll.write_webdataset(tmp_path / "x", images, labels)
    assert ll.write_webdataset(tmp_path / "x", images[:1], overwrite=True) == [str(tmp_path / "x.tar")]
    assert len(ll.WebDataset(tmp_path / "x.tar")) == 1


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
