"""Photo-like JPEG fixtures for the kernel and engine tests, generated from loaderlib's sample
photo, and the one recoverably damaged JPEG they use."""

from __future__ import annotations

import os

import cv2
import numpy as np

from benchmarks._synth import base_photo


def photo() -> np.ndarray:
    """grace_hopper.jpg as BGR (512x600), read-only."""
    return base_photo()


def encode(img: np.ndarray, quality: int = 90, sampling: int | None = None, ext: str = ".jpg") -> bytes:
    params = [cv2.IMWRITE_JPEG_QUALITY, quality] if ext.lower() in (".jpg", ".jpeg") else []
    if sampling is not None:
        params += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, sampling]
    ok, buf = cv2.imencode(ext if ext.lower() != ".jpeg" else ".jpg", img, params)
    assert ok
    return buf.tobytes()


def damaged(jpeg: bytes) -> bytes:
    """A bogus restart marker in the middle of the scan: libjpeg recovers with a warning
    (a DecodeWarning by default, an error with strict=True)."""
    mid = jpeg.index(b"\xff\xda") + 2000
    return jpeg[:mid] + b"\xff\xd0" + jpeg[mid:]


def make_image_folder(root, num_classes: int = 3, per_class: int = 6, seed: int = 0) -> str:
    """root/c<k>/img<i>.jpg|.JPEG: random crops of the photo, several sizes and subsamplings."""
    img = photo()
    rng = np.random.default_rng(seed)
    samplings = [cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444,
                 cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422]
    k = 0
    for c in range(num_classes):
        d = os.path.join(root, f"class{c}")
        os.makedirs(d, exist_ok=True)
        for i in range(per_class):
            h, w = int(rng.integers(200, 400)), int(rng.integers(200, 450))
            y, x = int(rng.integers(0, 512 - h)), int(rng.integers(0, 600 - w))
            ext = ".JPEG" if k % 2 else ".jpg"
            data = encode(img[y:y + h, x:x + w], quality=int(rng.integers(70, 96)), sampling=samplings[k % 3])
            with open(os.path.join(d, f"img{i:03d}{ext}"), "wb") as f:
                f.write(data)
            k += 1
    return str(root)
