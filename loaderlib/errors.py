"""Exception types. Every loaderlib error derives from :class:`LoaderError`."""

from __future__ import annotations

__all__ = ["DecodeError", "DecodeWarning", "LoaderError"]


class LoaderError(Exception):
    """Base class of every error loaderlib raises on purpose."""


class DecodeError(LoaderError, ValueError):
    """An image could not be decoded.

    Attributes
    ----------
    index : int or None
        Position of the failing item in the call (or sample index in a loader).
    source : str or None
        Where the bytes came from (a file path, a record key), when known.
    reason : str
        The decoder's own message (libjpeg's, or OpenCV's verdict).
    """

    def __init__(self, reason: str, index: int | None = None, source: str | None = None):
        self.reason = reason
        self.index = index
        self.source = source
        where = []
        if index is not None:
            where.append(f"item {index}")
        if source is not None:
            where.append(repr(str(source)))
        prefix = f"cannot decode {' '.join(where)}: " if where else "cannot decode image: "
        super().__init__(prefix + reason)

    def __reduce__(self):
        return (type(self), (self.reason, self.index, self.source))


class DecodeWarning(UserWarning):
    """An image decoded, but the decoder had to recover from corrupt data."""
