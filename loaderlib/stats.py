"""``Stats``: the snapshot of a loader's per-stage timings (what ``loader.stats`` returns), and
the one accounting every profiling figure is computed with (``Window``, ``window_of``;
NOTE [ One accounting ] in ``loaderlib/_observe/stats.py``).
"""

from __future__ import annotations

from ._observe.stats import (
    FONT_CSS,  # noqa: F401 - a public constant, not in __all__
    STAGES,
    Delivery,
    ExtractStats,
    Stats,
    Window,
    busy_fraction,
    clock_ns,
    split_window,
    window_of,
)

__all__ = ["STAGES", "Delivery", "ExtractStats", "Stats", "Window", "busy_fraction", "clock_ns", "split_window",
           "window_of"]
