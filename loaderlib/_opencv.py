"""OpenCV, imported only where loaderlib needs it, with an error that says which package to install.

NOTE [ Optional OpenCV ]
JPEG decoding and every native transform run on loaderlib's own kernels (libjpeg-turbo), so
OpenCV is not a hard dependency. It is needed for: decoding images that are not JPEG (PNG,
WebP, BMP, TIFF, ... through ``cv2.imdecode``), resizing float images in a transform called
from Python, and ``python -m loaderlib bench`` (its demo dataset and its Python baseline).
Two PyPI distributions provide the same ``cv2`` module, ``opencv-python-headless`` and
``opencv-python`` (with GUI functions); installing both makes them overwrite each other's
files, so loaderlib requires neither: the ``[opencv]`` extra names the headless one, and a
user who already has ``opencv-python`` keeps it. Import sites write ``from ._opencv import
cv2``; when no distribution is installed that raises ``ModuleNotFoundError`` (name ``cv2``)
with this advice instead of a bare "No module named 'cv2'".
"""

from __future__ import annotations

MISSING_MESSAGE = (
    "loaderlib needs OpenCV (the cv2 module) for this: decoding images that are not JPEG (PNG, WebP, "
    "BMP, TIFF, ...), resizing float images, and `python -m loaderlib bench`. JPEG decoding and the "
    "native transforms do not need it. Install ONE of the two distributions that provide cv2: "
    "pip install \"loaderlib[opencv]\" (opencv-python-headless), or pip install opencv-python "
    "(with OpenCV's GUI functions); never both, they overwrite each other's files."
)

try:
    import cv2
except ImportError as e:
    raise ModuleNotFoundError(f"{MISSING_MESSAGE} (import failed: {e})", name="cv2") from e

__all__ = ["MISSING_MESSAGE", "cv2"]
