"""The SIMD kernels equal their scalar twins bitwise (NOTE [ SIMD switch ], NOTE [ Wide taps in
pairs ], NOTE [ Horizontal pass in AVX2 ] and NOTE [ Vertical pass in SIMD ] in
pyx/include/ll_resize.h, NOTE [ Horizontal pass in AVX-512 ], NOTE [ Emitting float planes in
AVX2 ] and NOTE [ Emitting float planes in AVX-512 ] in ll_chain.h): the same chains on random sizes and crops, run in subprocesses at every
SIMD level this CPU has (LOADERLIB_SIMD=avx512, avx2, sse2, scalar)."""

import os
import subprocess
import sys
import textwrap

import numpy as np

CODE = textwrap.dedent("""
    import os, sys, tempfile
    import numpy as np
    import loaderlib as ll
    from loaderlib import transforms as T
    from benchmarks._synth import encode_jpeg, photo_like

    rng = np.random.default_rng(7)
    tmp = tempfile.mkdtemp()
    outs = []
    for k in range(12):
        h, w = int(rng.integers(40, 700)), int(rng.integers(40, 900))
        img = photo_like(w, h, seed=k)
        size = (int(rng.integers(8, 300)), int(rng.integers(8, 300)))
        aa = bool(k % 3)   # antialias on (wide taps when downscaling) and off (two taps)
        chains = [T.Compose([T.Resize(size, antialias=aa)]),
                  T.Compose([T.RandomResizedCrop(size, antialias=aa), T.RandomHorizontalFlip()]),
                  T.Compose([T.Resize(int(rng.integers(16, 400)), antialias=aa), T.CenterCrop(8)]),
                  T.Compose([T.RandomResizedCrop(size, antialias=aa), T.RandomHorizontalFlip(),
                             T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), T.ToCHW()])]
        path = os.path.join(tmp, f"{k}.jpg")
        with open(path, "wb") as f:
            f.write(encode_jpeg(img, quality=90))
        decoded = ll.decode(open(path, "rb").read())
        for chain in chains:
            outs.append(chain(decoded, seed=k, epoch=0, index=k))            # single-image path
            ds = ll.ImageListDataset([path], [0]).transform_first(chain)     # fused decode + chain
            x, _ = next(iter(ll.DataLoader(ds, batch_size=1, seed=k, num_threads=1)))
            outs.append(x[0].copy())
    np.savez(sys.argv[1], *outs)
    from loaderlib._ext import _chain
    print(_chain.simd_level())
""")


AUG_CODE = textwrap.dedent("""
    import os, sys, tempfile
    import numpy as np
    import loaderlib as ll
    from loaderlib import transforms as T
    from tests._synth import encode_jpeg, photo_like

    rng = np.random.default_rng(11)
    outs = []
    # every primitive of the policies (and hue) through RandAugment's op list, at several
    # magnitudes, both interpolations and with and without a fill
    prims = [T.RandAugment(num_ops=1), T.RandAugment(num_ops=1, interpolation="bilinear"),
             T.RandAugment(num_ops=1, fill=(10, 200, 30)),
             T.RandAugment(num_ops=1, interpolation="bilinear", fill=(10.4, 200.5, 30.5))]
    sizes = [(224, 224), (37, 53), (3, 301), (129, 1031), (1, 1), (2, 5)]
    for k, (h, w) in enumerate(sizes):
        img = np.ascontiguousarray(photo_like(w, h, seed=k))
        for im in (img, np.ascontiguousarray(img[:, :, 1:2])):
            for op in prims:
                for prim in range(16):
                    for mag in (-0.93, -0.31, 0.0, 0.12, 0.55, 0.99, 7.0, 33.3, -140.7):
                        prm = np.zeros(T._transform.AUG_NPRM)
                        prm[:3] = (1, prim, mag if prim != 10 else abs(mag) % 9)
                        outs.append(op.apply_params(im, prm))
            for t in [T.ColorJitter(0.4, 0.4, 0.4), T.ColorJitter(0.8, 0.8, 0.8, 0.5), T.ColorJitter(hue=0.5),
                      T.GaussianBlur(23, (0.1, 5.0)), T.GaussianBlur((3, 9)), T.RandomGrayscale(1.0),
                      T.RandomRotation(45), T.RandomRotation(30, interpolation="bilinear", fill=(1, 2, 3)),
                      T.RandomAffine(20, (0.1, 0.2), (0.8, 1.2), (-10, 10, -5, 5)),
                      T.TrivialAugmentWide(), T.RandAugment(), T.AutoAugment()]:
                for seed in range(4):
                    outs.append(t(im, seed=seed, epoch=1, index=k))
    # a fused recipe through the loader (decode, crop, augmentations, Normalize, erasing)
    tmp = tempfile.mkdtemp()
    paths = []
    for k in range(6):
        path = os.path.join(tmp, f"{k}.jpg")
        with open(path, "wb") as f:
            f.write(encode_jpeg(photo_like(int(rng.integers(180, 500)), int(rng.integers(180, 500)), seed=k),
                                quality=90))
        paths.append(path)
    recipe = T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.TrivialAugmentWide(),
                        T.ColorJitter(0.4, 0.4, 0.4), T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
                        T.ToCHW(), T.RandomErasing(0.25)])
    ds = ll.ImageListDataset(paths, list(range(6))).transform_first(recipe)
    loader = ll.DataLoader(ds, batch_size=6, seed=5, num_threads=1)
    for epoch in range(3):
        loader.set_epoch(epoch)
        x, _ = next(iter(loader))
        outs.append(x.copy())
    np.savez(sys.argv[1], *outs)
    from loaderlib._ext import _chain
    print(_chain.simd_level())
""")


def _run(path, level, nt_stores=False, code=CODE):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "LOADERLIB_SIMD": level,
           "LOADERLIB_NT_STORES": "1" if nt_stores else "0"}
    env.pop("LOADERLIB_NO_SIMD", None)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", code, str(path)], env=env, cwd=root, capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    with np.load(path) as z:
        return r.stdout.split()[-1], [z[k] for k in sorted(z.files, key=lambda s: int(s.split("_")[1]))]


def test_simd_and_scalar_passes_agree_bitwise(tmp_path):
    from loaderlib._ext import _chain

    best = _chain.simd_level()
    levels = {"avx512": ["avx512", "avx2", "sse2", "scalar"], "avx2": ["avx2", "sse2", "scalar"],
              "sse2": ["sse2", "scalar"]}.get(best, ["scalar"])
    runs = {lv: _run(tmp_path / f"{lv}.npz", lv) for lv in levels}
    if best != "scalar":   # the float planes with non-temporal stores (NOTE [ Emitting float planes in AVX2 ])
        runs["nt"] = _run(tmp_path / "nt.npz", best, nt_stores=True)
    scalar_level, scalar = runs["scalar"]
    assert scalar_level == "scalar"
    assert len(scalar) == 96
    for lv in [*levels[:-1], *(["nt"] if "nt" in runs else [])]:
        got_level, outs = runs[lv]
        assert got_level == (best if lv == "nt" else lv)   # the switch took effect
        for k, (a, b) in enumerate(zip(outs, scalar)):
            assert a.shape == b.shape and a.dtype == b.dtype, k
            np.testing.assert_array_equal(a, b, err_msg=f"{lv} output {k}")


def test_augmentation_twins_agree_bitwise(tmp_path):
    from loaderlib._ext import _chain

    best = _chain.simd_level()
    levels = {"avx512": ["avx512", "avx2", "sse2", "scalar"], "avx2": ["avx2", "sse2", "scalar"],
              "sse2": ["sse2", "scalar"]}.get(best, ["scalar"])
    runs = {lv: _run(tmp_path / f"aug-{lv}.npz", lv, code=AUG_CODE) for lv in levels}
    scalar_level, scalar = runs["scalar"]
    assert scalar_level == "scalar"
    assert len(scalar) > 3000
    for lv in levels[:-1]:
        got_level, outs = runs[lv]
        assert got_level == lv   # the switch took effect
        assert len(outs) == len(scalar)
        for k, (a, b) in enumerate(zip(outs, scalar)):
            assert a.shape == b.shape and a.dtype == b.dtype, k
            np.testing.assert_array_equal(a, b, err_msg=f"{lv} augmentation output {k}")


def test_no_simd_switch_means_scalar():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "LOADERLIB_NO_SIMD": "1"}
    env.pop("LOADERLIB_SIMD", None)
    r = subprocess.run([sys.executable, "-c", "from loaderlib._ext import _chain; print(_chain.simd_level())"],
                       env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.stdout.strip() == "scalar", r.stderr
