"""``import loaderlib`` leaves out the modules only some calls need (NOTE [ What import costs ]
in ``loaderlib/__init__.py``), and those calls still work once they import them."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

#: Imported inside the calls that need them, never by ``import loaderlib``.
LAZY = ("hashlib", "tarfile", "zipfile", "tempfile", "uuid", "shutil", "html", "statistics")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_loaderlib_leaves_the_call_only_modules_out():
    mods = _modules_after("import loaderlib, loaderlib.transforms")
    assert "loaderlib" in mods
    assert sorted(m for m in LAZY if m in mods) == []


def test_a_native_epoch_needs_none_of_them(tmp_path):
    # The common path: an image folder through the native engine, two batches.
    code = f"""
import numpy as np, cv2, os
import loaderlib as ll
from loaderlib import transforms as T
root = {str(tmp_path)!r}
os.makedirs(os.path.join(root, "a"))
for i in range(8):
    cv2.imwrite(os.path.join(root, "a", f"{{i}}.jpg"), np.full((40, 50, 3), i * 20, np.uint8))
ds = ll.ImageFolderDataset(root).transform_first(T.Compose([T.Resize((16, 16)), T.Normalize((0.5,) * 3, (0.25,) * 3), T.ToCHW()]))
for x, y in ll.DataLoader(ds, batch_size=4, num_threads=2):
    assert x.shape == (4, 3, 16, 16)
"""
    mods = _modules_after(code)
    # numpy.random (the sampler's seed) imports hashlib itself, through secrets.
    assert sorted(m for m in LAZY if m in mods and m != "hashlib") == []


def test_the_calls_that_need_them_still_work(tmp_path):
    import loaderlib as ll

    # records: tempfile + uuid when writing, zipfile when checking the index
    imgs = np.random.default_rng(0).integers(0, 255, (4, 8, 8, 3), np.uint8)
    import cv2

    blobs = [cv2.imencode(".jpg", im)[1].tobytes() for im in imgs]
    base = str(tmp_path / "r")
    ll.write_records(base, blobs, labels=[0, 1, 2, 3])
    ds = ll.RecordFileDataset(base)
    assert len(ds) == 4
    # decoding them reads the index again (zipfile's error type in the check)
    x, y = next(iter(ll.DataLoader(ds, batch_size=4, num_threads=1)))
    assert list(y) == [0, 1, 2, 3]
    # the stats table in a notebook (html)
    loader = ll.DataLoader(ll.ArrayDataset(np.arange(8.0)), batch_size=4, profile=True)
    for _ in loader:
        pass
    assert "<table>" in loader.stats._repr_html_()
