"""MXNet RecordIO, from files built byte by byte from the published layout (mxnet itself does
not install beside numpy 2 here): native reads equal decoding the same bytes directly."""

from __future__ import annotations

import struct

import cv2
import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T

MAGIC = 0xCED7230A


def _record(payload: bytes) -> bytes:
    pad = -len(payload) % 4
    return struct.pack("<II", MAGIC, len(payload)) + payload + b"\0" * pad


def _pack_img(label, image: bytes, key: int) -> bytes:
    """mxnet.recordio.pack_img's layout: IRHeader(flag, label, id, id2) [+ flag floats] + image."""
    if isinstance(label, (list, tuple)):
        head = struct.pack("<IfQQ", len(label), 0.0, key, 0) + struct.pack(f"<{len(label)}f", *label)
    else:
        head = struct.pack("<IfQQ", 0, float(label), key, 0)
    return head + image


def _write(tmp_path, name, labels, images, with_idx=True):
    rec = tmp_path / f"{name}.rec"
    lines = []
    with open(rec, "wb") as f:
        for k, (lab, img) in enumerate(zip(labels, images)):
            lines.append(f"{k}\t{f.tell()}\n")
            f.write(_record(_pack_img(lab, img, k)))
    if with_idx:
        (tmp_path / f"{name}.idx").write_text("".join(lines))
    return rec


def _jpegs(n):
    rng = np.random.default_rng(4)
    out = []
    for i in range(n):
        _ok, buf = cv2.imencode(".jpg", rng.integers(0, 256, (30 + i, 33 - i % 4, 3), dtype=np.uint8))
        out.append(buf.tobytes())
    return out


def _rgb(data):
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)[:, :, ::-1]


@pytest.mark.parametrize("with_idx", [True, False])
def test_items_and_native_loader(tmp_path, with_idx):
    images = _jpegs(9)
    rec = _write(tmp_path, "train", [float(i % 3) for i in range(9)], images, with_idx)
    ds = ll.ImageRecordDataset(rec)
    assert len(ds) == 9 and ds.labels.dtype == np.int64 and ds.labels.tolist() == [i % 3 for i in range(9)]
    for i in (0, 4, 8):
        img, lab = ds[i]
        np.testing.assert_array_equal(img, _rgb(images[i]))
        assert lab == i % 3
    # The same images as files through the same fused chain: identical batches (the chain may
    # decode at a DCT scale, so the reference is the kernel's file path, not a full decode).
    paths = []
    for k, data in enumerate(images):
        p = tmp_path / f"{k}.jpg"
        p.write_bytes(data)
        paths.append(str(p))
    chain = T.Compose([T.Resize((16, 16)), T.ToCHW()])
    loader = ll.DataLoader(ds.transform_first(chain), batch_size=4, num_threads=2, shuffle=True, seed=3)
    ref = ll.DataLoader(ll.ImageListDataset(paths, [i % 3 for i in range(9)]).transform_first(chain), batch_size=4,
                        num_threads=1, shuffle=True, seed=3)
    assert loader.engine == "native"
    for (a, b), (ra, rb) in zip(loader, ref):
        np.testing.assert_array_equal(b, rb)
        np.testing.assert_array_equal(a, ra)


def test_multi_float_labels(tmp_path):
    images = _jpegs(4)
    rec = _write(tmp_path, "multi", [[0.5, 1.0], [1.5, 2.0], [2.5, 3.0], [3.5, 4.0]], images)
    ds = ll.ImageRecordDataset(rec)
    assert ds.labels.shape == (4, 2) and ds.labels.dtype == np.float32
    batches = list(ll.DataLoader(ds.transform_first(T.Resize((8, 8))), batch_size=4))
    np.testing.assert_array_equal(batches[0][1], ds.labels)


def test_damaged_files_are_named(tmp_path):
    images = _jpegs(3)
    rec = _write(tmp_path, "d", [0, 1, 2], images)
    data = rec.read_bytes()
    rec.write_bytes(data[:-40])
    with pytest.raises(ll.LoaderError, match="record 2"):
        ll.ImageRecordDataset(rec)
    (tmp_path / "d.idx").write_text("0\t0\n1\t7\n")
    rec.write_bytes(data)
    with pytest.raises(ll.LoaderError, match="record 1 .* no RecordIO magic"):
        ll.ImageRecordDataset(rec)
    (tmp_path / "d.idx").write_text("zero\tzero\n")
    with pytest.raises(ll.LoaderError, match="line 1"):
        ll.ImageRecordDataset(rec)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ll.ImageRecordDataset(tmp_path / "none.rec")
    (tmp_path / "junk.rec").write_bytes(b"\0" * 64)
    with pytest.raises(ll.LoaderError, match="no RecordIO magic at byte 0"):
        ll.ImageRecordDataset(tmp_path / "junk.rec")


_MX_WRITER = r"""
import sys
import mxnet as mx

out, paths = sys.argv[1], sys.argv[2:]
rec = mx.recordio.MXIndexedRecordIO(out + ".idx", out + ".rec", "w")
for i, path in enumerate(paths):
    with open(path, "rb") as f:
        data = f.read()
    header = mx.recordio.IRHeader(2, [float(i), 0.5], i, 0)   # two float labels per record
    rec.write_idx(i, mx.recordio.pack(header, data))
rec.close()
"""


def test_files_written_by_mxnet(tmp_path):
    """An independent writer: mxnet.recordio in the side environment `make test` creates."""
    import os
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    mx_python = os.environ.get("LOADERLIB_MXNET_PYTHON", os.path.join(root, ".venv-mxnet", "bin", "python"))
    if not os.path.exists(mx_python):
        pytest.skip("no mxnet side environment (make test creates .venv-mxnet)")
    images = _jpegs(4)
    paths = []
    for k, data in enumerate(images):
        p = tmp_path / f"{k}.jpg"
        p.write_bytes(data)
        paths.append(str(p))
    (tmp_path / "w.py").write_text(_MX_WRITER)
    r = subprocess.run([mx_python, str(tmp_path / "w.py"), str(tmp_path / "mx"), *paths], capture_output=True,
                       text=True, timeout=120, check=False)
    if r.returncode != 0 and "No module named 'mxnet'" in r.stderr:
        pytest.skip("mxnet is not importable in the side environment")
    assert r.returncode == 0, r.stderr
    ds = ll.ImageRecordDataset(tmp_path / "mx.rec")
    assert len(ds) == 4 and ds.keys == [0, 1, 2, 3]
    np.testing.assert_array_equal(ds.labels, np.array([[k, 0.5] for k in range(4)], np.float32))
    for k in range(4):
        np.testing.assert_array_equal(ds[k][0], _rgb(images[k]))
