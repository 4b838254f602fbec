"""The storage library, imported only when a URL is read (NOTE [ Protocol library ] in
``store.py``); ``import loaderlib`` never needs it."""

from __future__ import annotations

from types import ModuleType

__all__ = ["obstore"]

INSTALL_HINT = "pip install loaderlib[remote]"


def obstore() -> ModuleType:
    """The ``obstore`` module, or ``ImportError`` saying which extra installs it."""
    try:
        import obstore as mod
        import obstore.store
    except ImportError as e:
        raise ImportError(f"reading s3://, gs:// or http(s):// URLs needs the obstore package: "
                          f"`{INSTALL_HINT}` ({e})") from e
    return mod
