"""Deterministic photo-like test images, derived from the real photo loaderlib ships
(``loaderlib/_data/grace_hopper.jpg``, a 512x600 portrait; see ``loaderlib._sample``). Used by
the test suite and the benchmarks, so that every measurement runs on natural image statistics
rather than on flat colours or noise (both of which make JPEG decoding unrealistically fast or
slow). Test data only: nothing in the ``loaderlib`` package imports this module."""

from __future__ import annotations

import numpy as np

from loaderlib._sample import sample_photo_bgr

__all__ = ["SAMPLING_NAMES", "base_photo", "encode_jpeg", "photo_like"]

SAMPLING_NAMES = ("420", "422", "444")


def base_photo() -> np.ndarray:
    """The sample photo as a read-only BGR uint8 array (decoded by OpenCV)."""
    return sample_photo_bgr()


def photo_like(width: int, height: int, seed: int = 0, jitter: int = 20) -> np.ndarray:
    """A BGR image of the given size: a random crop of the sample photo (possibly
    mirrored), resized, with a per-seed colour shift of up to ``jitter`` levels."""
    import cv2

    base = base_photo()
    rng = np.random.default_rng(seed)
    H, W = base.shape[:2]
    cw = int(rng.integers(W // 3, W + 1))
    ch = int(rng.integers(H // 3, H + 1))
    x = int(rng.integers(0, W - cw + 1))
    y = int(rng.integers(0, H - ch + 1))
    crop = base[y : y + ch, x : x + cw]
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    interp = cv2.INTER_AREA if width < cw else cv2.INTER_CUBIC
    img = cv2.resize(np.ascontiguousarray(crop), (width, height), interpolation=interp).astype(np.int16)
    if jitter:
        img += rng.integers(-jitter, jitter + 1, size=3).astype(np.int16)
    return np.clip(img, 0, 255).astype(np.uint8)


def encode_jpeg(img: np.ndarray, quality: int = 90, sampling: str = "420", progressive: bool = False) -> bytes:
    """Encode a BGR (or grayscale) image with OpenCV's libjpeg-turbo."""
    import cv2

    factors = {
        "420": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420,
        "422": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422,
        "444": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444,
    }
    params = [cv2.IMWRITE_JPEG_QUALITY, int(quality), cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive)]
    if img.ndim == 3:
        params += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, factors[sampling]]
    ok, buf = cv2.imencode(".jpg", img, params)
    if not ok:
        raise RuntimeError("cv2.imencode failed")
    return buf.tobytes()
