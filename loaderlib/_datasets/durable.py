"""What the dataset writers (``pack``, ``write_tokens``) share to publish files that survive a crash."""

from __future__ import annotations

import os

__all__ = ["fsync_dir"]


def fsync_dir(path: str) -> None:
    """Flush the directory entry of ``path`` (after an ``os.replace`` or ``os.link`` into it), so
    a crash cannot lose the file's name; filesystems that refuse are skipped."""
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
