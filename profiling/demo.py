"""The embedded demo dataset: photo-like JPEGs of about ImageNet size, built once and cached.

NOTE [ Demo dataset ]
``python -m loaderlib bench`` needs realistic JPEGs on a fresh machine with no network, so
the images are derived from the one real photograph that ships with loaderlib
(``loaderlib/_data/grace_hopper.jpg``, 512x600, see ``loaderlib._sample``): each image is a random crop of it (1/4 to all of the area,
aspect 3/4 to 4/3), resized so its longer side is 300-500 px (the ImageNet range), colour
jittered (brightness, contrast, saturation, hue), sometimes mirrored, given mild sensor
noise (an upscaled crop is smoother than a photo and would decode unrealistically fast),
and encoded at a quality of 70-95 with 4:2:0, 4:2:2 or 4:4:4 chroma subsampling, some of
them progressive. Every draw comes from a generator keyed by ``(seed, image index)``, so
the bytes are the same on every run with the same OpenCV/libjpeg. The tree is an
ImageFolder layout (``class_XX/NNNNN.jpg``), built in a temporary folder and renamed into
the cache when complete, so an interrupted build never leaves a half dataset behind.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import pathlib
import shutil
import tempfile

import numpy as np

from .._sample import SAMPLE_NAME, sample_photo_bgr

__all__ = ["build_demo_dataset", "demo_cache_dir"]

logger = logging.getLogger(__name__)

_VERSION = "demo-v1"
# Hidden, so that ImageFolderDataset (which skips dot files) does not see it.
MANIFEST = ".loaderlib-demo.json"


def demo_cache_dir() -> pathlib.Path:
    """``$XDG_CACHE_HOME/loaderlib/demo-v1`` (``~/.cache/loaderlib/demo-v1`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "loaderlib" / _VERSION


def _make_image(src: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, list[int], dict]:
    from .._opencv import cv2

    h, w = src.shape[:2]
    for _ in range(20):
        area = h * w * rng.uniform(0.25, 1.0)
        ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        cw, ch = round(np.sqrt(area * ratio)), round(np.sqrt(area / ratio))
        if cw <= w and ch <= h:
            break
    else:
        cw, ch = w, h
    y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    crop = src[y:y + ch, x:x + cw]
    longer = int(rng.integers(300, 501))
    scale = longer / max(ch, cw)
    size = (max(1, round(cw * scale)), max(1, round(ch * scale)))
    img = cv2.resize(crop, size, interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC)
    if rng.random() < 0.5:
        img = img[:, ::-1]
    hsv = cv2.cvtColor(np.ascontiguousarray(img), cv2.COLOR_BGR2HSV).astype(np.float32)
    hsv[..., 0] = (hsv[..., 0] + rng.uniform(-12, 12)) % 180
    hsv[..., 1] *= rng.uniform(0.6, 1.4)
    hsv[..., 2] *= rng.uniform(0.7, 1.3)
    img = cv2.cvtColor(np.clip(hsv, 0, 255).astype(np.uint8), cv2.COLOR_HSV2BGR).astype(np.float32)
    contrast = np.float32(rng.uniform(0.75, 1.25))
    mean = np.float32(img.mean())
    noise = rng.standard_normal(img.shape, dtype=np.float32)
    noise *= np.float32(rng.uniform(1.5, 4.0))
    img -= mean
    img *= contrast
    img += mean
    img += noise
    img = np.clip(img, 0, 255, out=img).astype(np.uint8)
    quality = int(rng.choice([70, 75, 80, 85, 90, 95]))
    sampling_name = str(rng.choice(["420", "420", "420", "422", "444"]))
    progressive = bool(rng.random() < 0.15)
    sampling = getattr(cv2, f"IMWRITE_JPEG_SAMPLING_FACTOR_{sampling_name}")
    params = [cv2.IMWRITE_JPEG_QUALITY, quality, cv2.IMWRITE_JPEG_SAMPLING_FACTOR, sampling,
              cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive)]
    meta = {"quality": quality, "subsampling": sampling_name, "progressive": progressive,
            "size": [int(img.shape[1]), int(img.shape[0])]}
    return img, params, meta


def build_demo_dataset(
    root: str | os.PathLike | None = None,
    *,
    n_images: int = 512,
    n_classes: int = 8,
    seed: int = 0,
    progress: bool = True,
    force: bool = False,
) -> pathlib.Path:
    """Build (once) the demo ImageFolder dataset and return its root folder.

    See NOTE [ Demo dataset ] in this module for how the images are made.

    Parameters
    ----------
    root : path, optional
        Parent folder of the dataset; :func:`demo_cache_dir` by default. The dataset itself
        goes to ``root / f"n{n_images}-c{n_classes}-s{seed}"``.
    n_images, n_classes, seed : int
        Size, number of class folders and the seed of every random draw.
    progress : bool
        Show a ``tqdm.auto`` progress bar while building.
    force : bool
        Rebuild even if a complete dataset is cached.

    Returns
    -------
    pathlib.Path
        The dataset root, with ``class_00/ ... class_{n_classes-1}/`` of ``.jpg`` files and a
        hidden ``.loaderlib-demo.json`` manifest describing each image.
    """
    from .._opencv import cv2

    if n_images < 1 or n_classes < 1:
        raise ValueError("n_images and n_classes must be >= 1")
    parent = pathlib.Path(root) if root is not None else demo_cache_dir()
    final = parent / f"n{n_images}-c{n_classes}-s{seed}"
    if (final / MANIFEST).exists() and not force:
        return final
    parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".building-", dir=parent))
    try:
        src = sample_photo_bgr()
        for c in range(n_classes):
            (tmp / f"class_{c:02d}").mkdir()
        from tqdm.auto import tqdm

        from .. import available_cpus

        def make(i: int) -> dict:
            # Each image depends only on (seed, i), so building on threads changes nothing.
            img, params, meta = _make_image(src, np.random.default_rng((seed, i)))
            ok, buf = cv2.imencode(".jpg", img, params)
            if not ok:
                raise RuntimeError(f"OpenCV could not encode demo image {i}")
            rel = f"class_{i % n_classes:02d}/{i:05d}.jpg"
            (tmp / rel).write_bytes(buf.tobytes())
            return {"file": rel, "label": i % n_classes, **meta}

        with concurrent.futures.ThreadPoolExecutor(available_cpus()) as pool:
            manifest = list(tqdm(pool.map(make, range(n_images)), total=n_images, desc="building demo dataset",
                                 unit="img", disable=not progress, leave=False))
        (tmp / MANIFEST).write_text(json.dumps(
            {"version": _VERSION, "seed": seed, "source": f"loaderlib/_data/{SAMPLE_NAME}",
             "images": manifest}, indent=1))
        if force and final.exists():
            shutil.rmtree(final)
        try:
            tmp.rename(final)
        except OSError:
            if not (final / MANIFEST).exists():  # not a concurrent build that finished first
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        logger.info("built the demo dataset (%d images) in %s", n_images, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
