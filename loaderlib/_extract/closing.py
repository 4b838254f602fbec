"""How long closing a read-ahead waits for the reads in progress (NOTE [ Closing the
read-ahead ] in ``pyx/include/ll_readahead.h``), shared by the local and the remote stage."""

from __future__ import annotations

import logging
import warnings

__all__ = ["CLOSE_WAIT_S", "left_running"]

_log = logging.getLogger(__name__)

#: How long closing waits for reads in progress to return: a read normally returns within its
#: latency; one that has not after this long (a hung mount, a stalled server) is left to its
#: thread, with a warning.
CLOSE_WAIT_S = 10.0


def left_running(n: int, what: str) -> None:
    """Warn that ``n`` reads were still in progress when a closing read-ahead stopped waiting."""
    if n:
        text = (f"loaderlib: {n} {what} still in progress {CLOSE_WAIT_S:g} s after close(); their threads are "
                "left to finish on their own (the storage may be hung)")
        _log.warning(text)
        warnings.warn(text, ResourceWarning, stacklevel=3)
