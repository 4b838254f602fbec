"""Kept for imports written before the generator moved: it lives in ``benchmarks/_synth.py``
(CONTRIBUTING.md says why). New code imports ``benchmarks._synth``."""

from benchmarks._synth import SAMPLING_NAMES, base_photo, encode_jpeg, photo_like  # noqa: F401
