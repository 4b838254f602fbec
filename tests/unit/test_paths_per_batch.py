"""NOTE [ Paths per batch ] (loaderlib/_extract/source.py): the native engine's driver encodes a
batch's file names in one pass, and makes the names for messages only for items that fail.

The reference is the plain-Python rule it replaces, ``[os.fsencode(paths[i]) for i in rows]``,
and the files themselves read through the public ``NativePlan.run_files_into``.
"""

from __future__ import annotations

import os
import pathlib
import shutil

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T
from loaderlib._chain import FileNames, compile_chain
from loaderlib._extract.source import encode_paths
from tests.kernels._loader_images import make_image_folder


def _reference(paths, rows):
    return [os.fsencode(paths[i]) for i in rows]


@pytest.mark.parametrize("paths", [
    ["/data/a.jpg", "/data/b c.JPEG", "/données/été.jpg", "/data/\udcff-undecodable.jpg", "relative/x.jpg"],
    [pathlib.Path("/p/a.jpg"), "/p/b.jpg", pathlib.Path("/p/ç.jpg")],                   # path-like: one by one
    [b"/bytes/a.jpg", b"/bytes/\xff.jpg", "/bytes/str.jpg"],                                # bytes
    ["/a\0b.jpg", "/c.jpg"],                                                                # NUL: one by one
], ids=["str", "pathlike", "bytes", "nul"])
def test_encoded_like_fsencode_one_by_one(paths):
    for rows in ([], [0], [len(paths) - 1, 0], list(range(len(paths))) * 3):
        enc, picked = encode_paths(paths, rows)
        assert enc == _reference(paths, rows)
        assert all(type(e) is bytes for e in enc)
        assert list(picked) == [paths[i] for i in rows]


def test_unencodable_name_raises_as_fsencode_does():
    bad = ["/ok.jpg", "/\ud800.jpg"]        # a lone surrogate that is not an escaped byte
    with pytest.raises(UnicodeEncodeError, match="surrogate"):
        os.fsencode(bad[1])
    with pytest.raises(UnicodeEncodeError, match="surrogate"):
        encode_paths(bad, [0, 1])


def test_file_names_are_made_on_demand():
    names = FileNames((b"/x/\xff.jpg", "/x/b.jpg", pathlib.Path("/x/c.jpg")))
    assert len(names) == 3
    assert names[0] == os.fsdecode(b"/x/\xff.jpg") and names[1] == "/x/b.jpg" and names[2] == "/x/c.jpg"
    assert names[1:] == ["/x/b.jpg", "/x/c.jpg"]
    assert names.path(2) == "/x/c.jpg" and names.path(0) == b"/x/\xff.jpg"


def _folder(tmp_path):
    root = make_image_folder(tmp_path / "imgs", num_classes=2, per_class=5)
    # non-ASCII names, and one corrupt file
    for i, p in enumerate(sorted(pathlib.Path(root).rglob("*.jpg"))[:3]):
        p.rename(p.with_name(f"été-{i}.jpg"))
    broken = pathlib.Path(root) / "class1" / "zz-broken.jpg"
    broken.write_bytes(b"\xff\xd8 not a jpeg")
    return root, str(broken)


def _chain():
    return T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip()])


@pytest.mark.parametrize("threads", [1, 2])
def test_loader_batches_equal_the_plan_on_the_same_files(tmp_path, threads):
    root, broken = _folder(tmp_path)
    ds = ll.ImageFolderDataset(root)
    good = [i for i, p in enumerate(ds.paths) if p != broken]
    loader = ll.DataLoader(ds.transform_first(_chain()), batch_size=4, sampler=good, num_threads=threads, seed=3)
    got = [(x.copy(), y.copy()) for x, y in loader]
    plan = compile_chain(_chain())
    try:
        for k, (x, _y) in enumerate(got):
            idx = np.asarray(good[4 * k:4 * k + len(x)], np.int64)
            ref = np.empty_like(x)
            st = plan.run_files_into([ds.paths[i] for i in idx], ref, idx, seed=3, epoch=0, num_threads=1)
            assert st.ok.all()
            np.testing.assert_array_equal(x, ref)
    finally:
        plan.close()


def test_a_failed_file_is_named_by_its_path(tmp_path, monkeypatch):
    root, broken = _folder(tmp_path)
    ds = ll.ImageFolderDataset(root)
    loader = ll.DataLoader(ds.transform_first(_chain()), batch_size=4, num_threads=2, on_error="skip")
    with pytest.warns(ll.SkipWarning, match="skipped"):
        n = sum(len(x) for x, _ in loader)
    assert n == len(ds) - 1
    assert [f.source for f in loader.errors] == [broken]
    with pytest.raises(ll.DecodeError, match=r"zz-broken\.jpg"):
        list(ll.DataLoader(ds.transform_first(_chain()), batch_size=4, num_threads=2))


def test_the_driver_encodes_no_path_one_by_one(tmp_path, monkeypatch):
    # The per-batch Python work of NOTE [ Paths per batch ]: with str paths nothing calls
    # os.fsencode or os.fsdecode per file while an epoch runs (the old driver called each
    # once per file and os.fspath three times).
    root = make_image_folder(tmp_path / "imgs", num_classes=2, per_class=8)
    shutil.copy(os.path.join(root, "class0", os.listdir(os.path.join(root, "class0"))[0]),
                os.path.join(root, "class0", "ümlaut.jpg"))
    ds = ll.ImageFolderDataset(root)
    loader = ll.DataLoader(ds.transform_first(_chain()), batch_size=8, num_threads=2)
    calls = {"fsencode": 0, "fsdecode": 0}
    real_enc, real_dec = os.fsencode, os.fsdecode

    def enc(p):
        calls["fsencode"] += 1
        return real_enc(p)

    def dec(p):
        calls["fsdecode"] += 1
        return real_dec(p)

    monkeypatch.setattr(os, "fsencode", enc)
    monkeypatch.setattr(os, "fsdecode", dec)
    n = sum(len(x) for x, _ in loader)
    assert n == len(ds)
    assert calls == {"fsencode": 0, "fsdecode": 0}
