"""A native Pipeline is the DataLoader's engine: same batches, bit for bit, and explain() says so."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T

from .test_pipeline_ops import m_batch, m_shuffle

N = 13
SEED = 11


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipe_folder")
    rng = np.random.default_rng(1)
    for c in range(3):
        (root / f"class{c}").mkdir()
    for i in range(N):
        img = rng.integers(0, 256, (30 + i, 40 + 2 * i, 3), dtype=np.uint8)
        cv2.imwrite(str(root / f"class{i % 3}" / f"img{i:02d}.jpg"), img)
    return str(root)


def chain():
    return T.Compose([T.RandomResizedCrop(12), T.RandomHorizontalFlip(), T.ToCHW()])


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x[0].shape == y[0].shape and np.array_equal(x[0], y[0])
        assert np.array_equal(x[1], y[1])


@pytest.mark.parametrize("threads", [1, 2])
def test_native_pipeline_equals_dataloader(folder, threads):
    pipe = ll.Pipeline.from_folder(folder).map(chain()).batch(4).with_options(seed=SEED, num_threads=threads)
    assert pipe.engine == "native"
    text = pipe.explain()
    assert "engine: native" in text and "random resized crop" in text
    loader = ll.DataLoader(ll.ImageFolderDataset(folder).transform_first(chain()), batch_size=4, seed=SEED,
                           num_threads=threads)
    for _ in range(2):   # iteration k of the pipeline is epoch k of the loader
        _same([(x.copy(), y.copy()) for x, y in pipe], [(x.copy(), y.copy()) for x, y in loader])
        # the next iteration's first batches are already on their way (NOTE [ Warm iterations ])
        assert [e._warm.key[0] for e in pipe._engines.values()] == [pipe._iteration]
    spec = pipe.element_spec
    assert spec[0] == ll.pipeline.TensorSpec((None, 3, 12, 12), np.uint8)
    assert spec[1] == ll.pipeline.TensorSpec((None,), np.int64)


def test_shuffled_native_pipeline_equals_dataloader_with_that_order(folder):
    pipe = ll.Pipeline.from_folder(folder).shuffle(5).map(chain()).batch(4, drop_remainder=True)
    pipe = pipe.with_options(seed=SEED)
    order = m_shuffle(list(range(N)), 5, SEED, 1)
    loader = ll.DataLoader(ll.ImageFolderDataset(folder).transform_first(chain()), batch_size=4, sampler=order,
                           drop_last=True, seed=SEED)
    _same(list(pipe), list(loader))


def test_records_pipeline_equals_dataloader(folder, tmp_path):
    ds = ll.ImageFolderDataset(folder)
    path = str(tmp_path / "recs")
    ll.write_records(path, [Path(p).read_bytes() for p in ds.paths], ds.labels)
    pipe = ll.Pipeline.from_records(path).map(chain()).batch(5).with_options(seed=SEED)
    assert pipe.engine == "native"
    loader = ll.DataLoader(ll.RecordFileDataset(path).transform_first(chain()), batch_size=5, seed=SEED)
    _same(list(pipe), list(loader))


def test_repeat_gives_each_pass_its_own_augmentation(folder):
    pipe = ll.Pipeline.from_folder(folder).map(chain()).repeat(2).batch(N).with_options(seed=SEED)
    batches = list(pipe)
    assert [b[0].shape[0] for b in batches] == [N, N]
    labels = ll.ImageFolderDataset(folder).labels
    assert np.array_equal(batches[0][1], labels) and np.array_equal(batches[1][1], labels)
    assert not np.array_equal(batches[0][0], batches[1][0])   # pass 2 keyed as samples N..2N-1
    # a batch across the pass boundary holds the tail of pass 1 and the head of pass 2
    cross = list(ll.Pipeline.from_folder(folder).map(chain()).repeat(2).batch(N + 3).with_options(seed=SEED))
    whole = np.concatenate([batches[0][0], batches[1][0]])
    assert np.array_equal(np.concatenate([c[0] for c in cross]), whole)


def test_python_map_runs_on_threads_engine_same_output_any_thread_count(folder):
    def brighten(img, label):
        return np.minimum(img.astype(np.int16) + 10, 255).astype(np.uint8), label

    outs = []
    for threads in (1, 2):
        pipe = (ll.Pipeline.from_folder(folder).map(T.Compose([T.Resize((10, 10))])).map(brighten)
                .map(T.RandomHorizontalFlip()).batch(4).with_options(seed=SEED, num_threads=threads))
        assert pipe.engine == "threads"
        assert "engine: threads" in pipe.explain()
        outs.append([(x.copy(), y.copy()) for x, y in pipe])
    _same(outs[0], outs[1])
    # the reference: each step applied by hand, the flip keyed by (seed, iteration 0, index)
    ds = ll.ImageFolderDataset(folder)
    for k in range(N):
        img, lab = ds[k]
        ref = np.minimum(T.Resize((10, 10))(img).astype(np.int16) + 10, 255).astype(np.uint8)
        ref = T.RandomHorizontalFlip()(ref, seed=SEED, epoch=0, index=k)
        assert np.array_equal(outs[0][k // 4][0][k % 4], ref) and outs[0][k // 4][1][k % 4] == lab


def test_unbatched_native_elements(folder):
    pipe = ll.Pipeline.from_folder(folder).map(chain()).with_options(seed=SEED)
    els = list(pipe)
    batch = next(iter(ll.Pipeline.from_folder(folder).map(chain()).batch(N).with_options(seed=SEED)))
    assert len(els) == N and all(np.array_equal(e[0], batch[0][k]) and e[1] == batch[1][k] for k, e in enumerate(els))
    assert pipe.element_spec[0].shape == (3, 12, 12)


@pytest.mark.parametrize("k", [0, 1, 3])
def test_native_resume_exact(folder, k):
    def make():
        return ll.Pipeline.from_folder(folder).shuffle(6).repeat(2).map(chain()).batch(4).with_options(seed=SEED)

    full = [(x.copy(), y.copy()) for x, y in make()]
    p = make()
    it = iter(p)
    head = [(x.copy(), y.copy()) for x, y in (next(it) for _ in range(k))]
    state = json.loads(json.dumps(it.state_dict()))
    it.close()
    fresh = make()
    fresh.load_state_dict(state)
    _same(head + [(x.copy(), y.copy()) for x, y in fresh], full)


def test_native_spec_error_names_the_step():
    pipe = ll.Pipeline.from_arrays(np.zeros((4, 5), np.uint8)).map(T.RandomResizedCrop(8))
    with pytest.raises(ValueError, match=r"step 1 \.map\(RandomResizedCrop.*needs an HWC image"):
        _ = pipe.element_spec


def test_from_dataset_python(folder):
    class Squares:
        def __len__(self):
            return 7

        def __getitem__(self, i):
            return np.full((2,), i * i, np.int64), i

    pipe = ll.Pipeline.from_dataset(Squares()).shuffle(3).batch(3).with_options(seed=SEED)
    order = m_shuffle(list(range(7)), 3, SEED, 1)
    got = [(x.tolist(), y.tolist()) for x, y in pipe]
    assert got == [([[i * i] * 2 for i in b], b) for b in m_batch(order, 3)]
    assert pipe.element_spec[0].shape == (None, 2)


@pytest.mark.parametrize("threads", [1, 2])
def test_pixels_kernel_equals_step_by_step(folder, threads):
    from loaderlib._chain import compile_chain

    imgs = [ll.ImageFolderDataset(folder)[k][0] for k in range(N)]
    for chain_ in (chain(), T.Compose([T.Resize(20), T.CenterCrop(16), T.Normalize((0.4,) * 3, (0.2,) * 3)]),
                   T.Compose([T.Resize((30, 25)), T.RandomResizedCrop(9), T.RandomHorizontalFlip()])):
        plan = compile_chain(chain_)
        out = np.zeros((N, *plan.sample_shape), plan.dtype)
        st = plan.run_pixels_into(imgs, out, np.arange(N) + 100, seed=SEED, epoch=3, num_threads=threads)
        assert st.ok.all()
        ref = np.stack([chain_(im, seed=SEED, epoch=3, index=k + 100) for k, im in enumerate(imgs)])
        assert np.array_equal(out, ref)


def test_pixels_kernel_refuses_bad_images():
    from loaderlib._chain import compile_chain

    plan = compile_chain(chain())
    bad = [np.zeros((5, 5), np.uint8), np.zeros((0, 4, 3), np.uint8), np.zeros((6, 6, 1), np.uint8),
           np.zeros((6, 6, 3), np.float32), np.zeros((6, 6, 3), np.uint8)[:, ::2]]
    out = np.zeros((len(bad), *plan.sample_shape), plan.dtype)
    st = plan.run_pixels_into(bad, out, np.arange(len(bad)), seed=1, epoch=0, num_threads=2)
    assert st.ok.tolist() == [False, False, False, False, True]   # a strided view is copied, then fine
    assert "must be HWC uint8 with 3 channels, got (5, 5) uint8" in str(st.errors[0])
    assert "0 bytes is not 0x4x3" in str(st.errors[1])
    assert "got (6, 6, 3) float32" in str(st.errors[3])


def _double(x):
    return x * 2


def test_python_map_on_processes_engine():
    x = np.arange(30, dtype=np.int64)
    pipe = ll.Pipeline.from_arrays(x).shuffle(7).map(_double).batch(4).with_options(seed=SEED, num_workers=2)
    assert pipe.engine == "processes"
    threads = ll.Pipeline.from_arrays(x).shuffle(7).map(_double).batch(4).with_options(seed=SEED)
    assert threads.engine == "threads"
    got = [b.tolist() for b in pipe]
    assert got == [b.tolist() for b in threads] == m_batch([2 * i for i in m_shuffle(list(range(30)), 7, SEED, 1)], 4)
    pipe.close()
    flip = ll.Pipeline.from_arrays(np.zeros((4, 8, 8, 3), np.uint8)).map(_double).map(T.RandomHorizontalFlip())
    with pytest.raises(ValueError, match=r"step 2 \.map\(RandomHorizontalFlip.*cannot run in worker processes"):
        list(flip.batch(2).with_options(num_workers=2))
