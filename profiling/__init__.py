"""Per-stage instrumentation, the infinitely-fast-model harness and notebook dashboards.

Installed as ``loaderlib.profiling``. It reads the core's public API and is never imported
by it: the recorder and the ``Stats`` snapshot live in the core (``loaderlib._observe``,
``loaderlib.stats``) and are re-exported here. ipywidgets and matplotlib are imported lazily,
only by the functions that draw; everything else is loaded on first use. Baselines for
comparisons (a plain Python thread-pool loader) live in ``loaderlib.profiling.baselines``.
"""

from __future__ import annotations

import importlib
from typing import Any

from .. import StageRecorder
from ..stats import STAGES, Stats

__all__ = [
    "STAGES",
    "Dashboard",
    "Report",
    "StageRecorder",
    "Stats",
    "Verdict",
    "benchmark",
    "build_demo_dataset",
    "diagnose",
]

_LAZY = {
    "benchmark": ".harness",
    "Report": ".report",
    "Verdict": ".verdict",
    "diagnose": ".verdict",
    "build_demo_dataset": ".demo",
    "Dashboard": ".dashboard",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(mod, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
