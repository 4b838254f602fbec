"""Exception types. Every loaderlib error derives from :class:`LoaderError`."""

from __future__ import annotations

import sys
from dataclasses import dataclass

__all__ = [
    "DecodeError",
    "DecodeWarning",
    "LoaderError",
    "LoaderTimeoutError",
    "RemoteReadError",
    "SampleFailure",
    "SkipWarning",
    "StateError",
    "WorkerError",
]


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

    @classmethod
    def from_status(cls, status: int, message: str, index: int | None = None,
                    source: str | None = None) -> DecodeError:
        """The error for a kernel's per-item status code and message: the one place a
        status becomes a DecodeError (NOTE [ Status codes ] in ``pyx/include/ll_common.h``).

        Parameters
        ----------
        status : int
            The item's (negative) status code.
        message : str
            The reason the kernel or the owner wrote; empty: the code's own message.
        index, source
            As in the constructor.
        """
        from ._ext._jpeg import Status

        try:
            code = Status(status)
        except ValueError:
            return cls(message or f"unknown decoder status {status}", index, source)
        reason = message or code.message
        if code == Status.ERR_STRICT and message:
            reason = f"corrupt data ({message}); refused because strict=True"
        return cls(reason, index, source)


class DecodeWarning(UserWarning):
    """An image decoded, but the decoder had to recover from corrupt data."""


class SkipWarning(UserWarning):
    """An epoch ended with samples dropped by ``on_error="skip"`` (listed in ``loader.errors``)."""


class LoaderTimeoutError(LoaderError, TimeoutError):
    """No batch arrived within the loader's ``timeout``."""


class RemoteReadError(LoaderError, OSError):
    """A read from an object store or HTTP server failed after its retries, or was refused.

    403/404 and other client errors are raised at once; 5xx, 429, dropped connections,
    timeouts and short bodies are raised only once the retries are spent.

    Attributes
    ----------
    url : str
        The object's URL.
    status : int or None
        The HTTP status of the last answer, ``None`` when there was none (a timeout, a
        dropped connection, a short body).
    index : int or None
        The sample index the read was for, when known.
    reason : str
        What went wrong, in the storage library's words.
    """

    def __init__(self, url: str, reason: str, status: int | None = None, index: int | None = None):
        self.url = url
        self.reason = reason
        self.status = status
        self.index = index
        what = f"sample {index}: " if index is not None else ""
        code = f"HTTP {status}" if status is not None else "no HTTP status"
        super().__init__(f"{what}cannot read {url} ({code}): {reason}")

    def __reduce__(self):
        return (type(self), (self.url, self.reason, self.status, self.index))

    def with_index(self, index: int | None) -> RemoteReadError:
        """The same error naming ``index`` as the sample it was read for."""
        return type(self)(self.url, self.reason, self.status, index)


class WorkerError(LoaderError, RuntimeError):
    """A worker process died or could not start."""


@dataclass(frozen=True)
class SampleFailure:
    """A sample dropped by ``on_error="skip"`` (kept in ``loader.errors``)."""

    index: int
    source: str | None
    reason: str
    epoch: int


class StateError(LoaderError, ValueError):
    """A saved loader state does not fit this loader (other dataset length, seed, sampler or version)."""


def _add_context(exc: BaseException, note: str, **attrs: object) -> BaseException:
    """Set ``attrs`` on ``exc`` and add ``note`` to its traceback (``add_note``, Python 3.11+);
    an exception that refuses attributes is left as it is. Returns ``exc``."""
    try:
        for k, v in attrs.items():
            setattr(exc, k, v)
        if sys.version_info >= (3, 11):   # add_note is new in 3.11
            exc.add_note(note)
    except (AttributeError, TypeError):
        pass
    return exc
