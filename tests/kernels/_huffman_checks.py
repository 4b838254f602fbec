"""What tests/kernels/test_huffman.py and test_progressive.py share: comparing loaderlib's
Huffman decoders with libjpeg's on one file (``switch`` is the ``decoders`` fixture of
tests/kernels/conftest.py)."""

from __future__ import annotations

import warnings

import cv2
import numpy as np

from loaderlib import jpeg_info
from loaderlib._ext import _jpeg
from loaderlib.decoding import decode, decode_batch
from loaderlib.errors import DecodeError, DecodeWarning


def noise(w: int, h: int, seed: int) -> np.ndarray:
    """Noise: large coefficients, long codes, stuffed 0xFF bytes."""
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def variants(data: bytes) -> list[tuple[str, dict]]:
    """The decodes each valid file is compared in: full, gray, two DCT scales, two crops."""
    info = jpeg_info(data)
    w, h = info.width, info.height
    out = [("full", {}), ("gray", {"mode": "GRAY"}), ("half", {"scale": 0.5}), ("eighth", {"scale": 0.125})]
    if w > 20 and h > 20:
        out.append(("crop", {"crop": (w // 3, h // 4, w // 2, h // 2)}))
        out.append(("crop-bottom", {"crop": (1, h - 9, w - 3, 9)}))
    return out


def outcome(data: bytes, **kw):
    """("error", message) or ("ok", pixels, warnings) of one decode."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            img = decode(data, **kw)
        except DecodeError as e:
            return ("error", str(e))
    return ("ok", img.tobytes(), [str(w.message) for w in caught if issubclass(w.category, DecodeWarning)])


def with_each_decoder(switch, fn, data: bytes, **kw):
    """(ours, libjpeg's, installed, handed_back): ``fn(data, **kw)`` with libjpeg's decoder, then
    with ours, and how many images ours took and handed back meanwhile."""
    switch(False)
    theirs = fn(data, **kw)
    switch(True)
    _, i0, b0 = _jpeg.huffman_decoder()
    ours = fn(data, **kw)
    _, i1, b1 = _jpeg.huffman_decoder()
    return ours, theirs, i1 - i0, b1 - b0


def both(switch, data: bytes, **kw):
    """(ours, libjpeg's, finished, handed_back): the outcome with each decoder, and whether
    ours finished the file or handed it back."""
    ours, theirs, installed, bailed = with_each_decoder(switch, outcome, data, **kw)
    return ours, theirs, installed > 0 and bailed == 0, bailed > 0


def assert_valid_file_decodes_as_libjpeg_and_opencv(name: str, data: bytes, switch) -> None:
    """Every variant equals libjpeg's decode and our decoder finished it; the full decode
    equals OpenCV's."""
    ref = cv2.cvtColor(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION),
                       cv2.COLOR_BGR2RGB)
    for label, kw in variants(data):
        ours, theirs, installed, bailed = with_each_decoder(switch, decode, data, **kw)
        assert (installed, bailed) == (1, 0), f"{name} {label}: our decoder did not finish it"
        np.testing.assert_array_equal(ours, theirs, err_msg=f"{name} {label}")
        if label == "full":
            np.testing.assert_array_equal(ours, ref, err_msg=f"{name}: differs from OpenCV")


def assert_batch_equal_on_one_and_two_threads(files: list[tuple[str, bytes]], switch) -> None:
    """decode_batch of every file with our decoders, at 1 and at 2 threads, equals libjpeg's."""
    datas = [d for _, d in files]
    switch(False)
    theirs = decode_batch(datas, _single=True, num_threads=1)
    switch(True)
    one = decode_batch(datas, num_threads=1)
    two = decode_batch(datas, num_threads=2)
    for (name, _), a, b, c in zip(files, theirs.images, one.images, two.images):
        np.testing.assert_array_equal(b, a, err_msg=name)
        np.testing.assert_array_equal(c, a, err_msg=name)
