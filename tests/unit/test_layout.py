"""The package's layout stays readable: no module of ``loaderlib/`` (or ``profiling/``) is over
900 lines; a module that grows past it is split along its seams (docs/architecture.md)."""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIMIT = 900


def test_no_module_over_the_limit():
    long = {}
    for top in ("loaderlib", "profiling"):
        for dirpath, _dirs, files in os.walk(os.path.join(ROOT, top)):
            for fn in files:
                if fn.endswith(".py"):
                    path = os.path.join(dirpath, fn)
                    with open(path, encoding="utf-8") as f:
                        n = sum(1 for _ in f)
                    if n > LIMIT:
                        long[os.path.relpath(path, ROOT)] = n
    assert not long, f"modules over {LIMIT} lines: {long}"
