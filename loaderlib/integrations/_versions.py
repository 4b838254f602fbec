"""The framework versions each integration is tested with, checked when it is imported.

NOTE [ Framework version ranges ]
Each adapter in ``loaderlib.integrations`` leans on how one framework treats a loader (what it
saves, when it calls ``set_epoch``, what it asks of a dataset), which a release can change
without an error of its own: the training would run on with the wrong batches. So each module
declares ``SUPPORTED = ((lowest), (first unsupported))`` as ``(major, minor)``, from the release
that brought what it relies on (or the line tested, when that is all that is known) to the next
release line that may break it, and its import raises ``ImportError`` naming the framework,
the range, what the range rests on and the version installed. The loader guide's table and
each framework page name the version tested (requirements-frameworks.txt pins them).
"""

from __future__ import annotations

import re

Version = tuple[int, int]


def version_of(text: str) -> Version:
    """``(major, minor)`` of a version string (``"2.6.6"``, ``"2.13.0+cpu"``, ``"5.0rc1"``)."""
    m = re.match(r"\s*v?(\d+)(?:\.(\d+))?", text)
    if m is None:
        raise ImportError(f"cannot read the version {text!r}")
    return int(m.group(1)), int(m.group(2) or 0)


def check_version(module: str, framework: str, package: str, text: str, supported: tuple[Version, Version],
                  why: str) -> None:
    """Raise ``ImportError`` unless ``text`` is in ``supported`` (NOTE [ Framework version ranges ])."""
    low, high = supported
    if not low <= version_of(text) < high:
        raise ImportError(f"loaderlib.integrations.{module} needs {framework} >= {low[0]}.{low[1]} and < "
                          f"{high[0]}.{high[1]} ({why}), but {package} {text} is installed")
