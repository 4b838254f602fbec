"""loaderlib: a data loader whose common path runs in nogil kernels on an OpenMP pool."""

from . import transforms
from ._build import build_info
from .decode import DecodeError, decode, decode_batch, jpeg_info
from .errors import DecodeWarning, LoaderError

__version__ = "0.1.0"

__all__ = [
    "build_info",
    "decode",
    "decode_batch",
    "jpeg_info",
    "DecodeError",
    "DecodeWarning",
    "LoaderError",
    "transforms",
]
