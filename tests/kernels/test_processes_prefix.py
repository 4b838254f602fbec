"""The processes engine runs a chain's native prefix inside each worker (NOTE [ Native prefix
in workers ]): the samples equal the threads engine's (same keyed randomness), errors name
the file, and on_error="skip" keeps batches whole."""

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import DataLoader
from loaderlib import transforms as T
from tests.kernels._loader_images import make_image_folder

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp("imgs"), num_classes=2, per_class=7)


def _upside_down(im):
    return np.ascontiguousarray(im[::-1])


def _chain(*head):
    # native head (decode + crop + flip), a Python step, then a random loaderlib transform
    # whose randomness must come from the run's key in the worker too
    return T.Compose([*head, T.RandomResizedCrop(40), T.RandomHorizontalFlip(), _upside_down, T.RandomHorizontalFlip(),
                      T.Normalize(MEAN, STD)])


def _batches(loader, epochs=2):
    out = []
    for _ in range(epochs):
        out.append([(x.copy(), y.copy()) for x, y in loader])
    return out


def test_workers_run_the_native_prefix_and_match_threads(folder):
    ds = ll.ImageFolderDataset(folder).transform_first(_chain())
    with DataLoader(ds, batch_size=4, shuffle=True, seed=5, num_workers=2, timeout=60) as procs:
        assert procs.engine == "processes"
        text = procs.explain()
        assert "worker  random resized crop" in text and "_upside_down" in text
        got = _batches(procs)
    with DataLoader(ds, batch_size=4, shuffle=True, seed=5, num_threads=2) as threads:
        assert threads.engine == "threads"
        want = _batches(threads)
    assert [len(e) for e in got] == [len(e) for e in want] == [4, 4]
    for e_got, e_want in zip(got, want):
        for (x1, y1), (x2, y2) in zip(e_got, e_want):
            np.testing.assert_array_equal(x1, x2)
            np.testing.assert_array_equal(y1, y2)
    assert not np.array_equal(got[0][0][0], got[1][0][0])   # epochs draw new crops


def test_worker_output_is_the_chain_applied_by_hand(folder):
    base = ll.ImageFolderDataset(folder)
    chain = _chain(T.Decode(dct_scaling=False))   # decoded at full size, as ds[i] decodes
    with DataLoader(base.transform_first(chain), batch_size=5, seed=11, num_workers=2, timeout=60) as loader:
        x, y = next(iter(loader))
    for j in range(5):
        np.testing.assert_array_equal(x[j], chain(base[j][0], seed=11, epoch=0, index=j))
        assert y[j] == base.labels[j]


def test_worker_decode_error_names_the_file_and_skip_keeps_batches_whole(folder, tmp_path):
    base = ll.ImageFolderDataset(folder)
    paths = [p for p, _ in base.items[:9]]
    bad = str(tmp_path / "broken.jpg")
    with open(bad, "wb") as f:
        f.write(b"\xff\xd8\xff\xe0 not a jpeg at all")
    paths.insert(3, bad)
    ds = ll.ImageListDataset(paths, list(range(10))).transform_first(_chain())
    with DataLoader(ds, batch_size=3, num_workers=2, timeout=60) as loader, \
            pytest.raises(ll.DecodeError, match="broken.jpg") as info:
        list(loader)
    assert info.value.index == 3
    with DataLoader(ds, batch_size=3, num_workers=2, on_error="skip", timeout=60) as loader:
        labels = [y.tolist() for _, y in loader]
        assert labels == [[0, 1, 2], [4, 5, 6], [7, 8, 9]]
        assert [(e.index, e.source) for e in loader.errors] == [(3, bad)]


def test_python_step_error_in_the_tail_names_the_sample(folder):
    def boom(im):
        raise RuntimeError("tail failed")

    ds = ll.ImageFolderDataset(folder).transform_first(T.Compose([T.Resize((16, 16)), boom]))
    with DataLoader(ds, batch_size=2, num_workers=1, timeout=60) as loader, \
            pytest.raises(RuntimeError, match="tail failed"):
        next(iter(loader))
