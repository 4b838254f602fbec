"""Per-stage instrumentation, the infinitely-fast-model harness and notebook dashboards.

Installed as ``loaderlib.profiling``. ipywidgets and matplotlib are imported lazily, only
by the functions that draw. The recorder and the ``Stats`` snapshot are imported eagerly
(the engines need them and they depend on numpy alone); everything else is loaded on first
use, which also keeps ``import loaderlib`` free of import cycles (the engine imports the
recorder while ``loaderlib`` itself is still being imported).
"""

from __future__ import annotations

import importlib
from typing import Any

from .recorder import StageRecorder
from .stats import STAGES, Stats

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
    "python_thread_loader",
    "replay_consumer",
]

_LAZY = {
    "benchmark": ".harness",
    "Report": ".report",
    "Verdict": ".verdict",
    "diagnose": ".verdict",
    "replay_consumer": ".harness",
    "python_thread_loader": ".baselines",
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
