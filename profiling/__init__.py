"""Per-stage instrumentation, the infinitely-fast-model harness and notebook dashboards.

Installed as ``loaderlib.profiling``. ipywidgets and matplotlib are imported lazily, only
by the functions that draw.
"""

__all__: list[str] = []
