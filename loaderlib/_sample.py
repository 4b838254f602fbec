"""The one sample photograph shipped with loaderlib (``loaderlib/_data/grace_hopper.jpg``).

A 512x600 baseline JPEG of Rear Admiral Grace Hopper, a U.S. Navy
photograph in the public domain (the same file matplotlib ships as sample data). The demo
dataset of ``python -m loaderlib bench`` is cut from it (NOTE [ Demo dataset ] in
``loaderlib.profiling.demo``) and ``python -m loaderlib doctor`` decodes it for its self-check,
so neither needs matplotlib or a network.
"""

from __future__ import annotations

import functools
from importlib import resources

import numpy as np

__all__ = ["SAMPLE_NAME", "sample_jpeg", "sample_photo_bgr"]

SAMPLE_NAME = "grace_hopper.jpg"


@functools.lru_cache(maxsize=1)
def sample_jpeg() -> bytes:
    """The sample photo's JPEG bytes."""
    return resources.files(__package__).joinpath("_data", SAMPLE_NAME).read_bytes()


@functools.lru_cache(maxsize=1)
def sample_photo_bgr() -> np.ndarray:
    """The sample photo decoded by OpenCV: a read-only (600, 512, 3) BGR uint8 array."""
    from ._opencv import cv2

    img = cv2.imdecode(np.frombuffer(sample_jpeg(), np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        raise RuntimeError(f"OpenCV cannot decode loaderlib's sample photo {SAMPLE_NAME} (damaged install?)")
    img.setflags(write=False)
    return img
