"""mkdocs hooks: fill the architecture page's generated parts (see docs/_notes.py), keep one
known docstring-layout message from failing the strict build, and keep the dashboard's static
view on the notebook pages (NOTE [ Static dashboards in the docs ])."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _notes  # noqa: E402  (docs/ is not a package; mkdocs loads this file by path)

# NOTE [ Static dashboards in the docs ]
# mkdocs-jupyter executes the notebooks with the widget state stored, so nbconvert renders a
# widget's output as the widget view, which needs the widget manager's JavaScript and a live
# model: the dashboard's cells came out blank. The dashboard's MIME bundle carries a static
# view of its last frame beside the widget view (NOTE [ Dashboard static view ] in
# profiling/dashboard.py); the preprocessor below, run after the execution, drops the widget
# view from every output that has such a static view, so the page shows the picture (the
# knobs cannot act on a static page anyway). mkdocs-jupyter takes no preprocessor from its
# configuration, so ``on_startup`` gives its converter an exporter that appends it. After
# each page is built, ``on_post_page`` checks that every notebook page which displays a
# Dashboard shows one image per dashboard, and fails the build otherwise.
STATIC_MARK = "loaderlib-dashboard-static"
FRAME_MARK = "loaderlib-dashboard-frame"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def keep_static_views(nb):
    """Drop the widget view from outputs that carry a loaderlib static view; returns ``nb``."""
    for cell in nb.get("cells", ()):
        for out in cell.get("outputs", ()):
            data = out.get("data", {})
            if WIDGET_VIEW in data and STATIC_MARK in str(data.get("text/html", "")):
                del data[WIDGET_VIEW]
    return nb


def dashboards_expected(source: str) -> int:
    """How many dashboards a notebook displays: code cells ending in an expression that is a
    name bound to ``Dashboard(...)`` or ``x.dashboard(...)`` in that notebook."""
    import json
    import re

    nb = json.loads(source)
    names: set[str] = set()
    shown = 0
    for cell in nb.get("cells", ()):
        if cell.get("cell_type") != "code":
            continue
        src = "".join(cell.get("source", ()))
        names.update(re.findall(r"^(\w+)\s*=\s*(?:Dashboard\(|\S*\.dashboard\()", src, re.M))
        lines = [ln for ln in src.strip().splitlines() if ln.strip()]
        if lines and lines[-1].strip() in names:
            shown += 1
    return shown


def _install_preprocessor() -> None:
    try:
        from mkdocs_jupyter import nbconvert2
        from nbconvert.preprocessors import Preprocessor
    except ImportError:   # mkdocs-jupyter missing: the build fails on its own, saying so
        return
    if getattr(nbconvert2.HTMLExporter, "_loaderlib_static", False):
        return

    class KeepStaticViews(Preprocessor):
        def preprocess(self, nb, resources):
            return keep_static_views(nb), resources

    base = nbconvert2.HTMLExporter

    class Exporter(base):
        _loaderlib_static = True

        def __init__(self, *args, preprocessors=(), **kwargs):
            super().__init__(*args, preprocessors=[*preprocessors, KeepStaticViews], **kwargs)

    nbconvert2.HTMLExporter = Exporter

# NOTE [ Free paragraphs in Parameters ]
# The DataLoader docstring has a paragraph inside its Parameters section that belongs to the
# parameters above it (numpydoc renders it as such); griffe's numpy parser expects a
# ``name : type`` line there and warns, which --strict turns into a failed build. The page
# renders that paragraph as text either way, so this one message is shown as INFO. Any other
# docstring warning still fails the build.
_TOLERATED = ("Could not parse line '``num_threads`` and ``prefetch`` also take",)


class _Tolerate(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and any(t in record.getMessage() for t in _TOLERATED):
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def on_startup(command: str, dirty: bool) -> None:
    for handler in logging.getLogger("mkdocs").handlers:
        handler.addFilter(_Tolerate())
    _api_tree()
    _install_preprocessor()


def _api_tree() -> None:
    """``build/docs-api/loaderlib``: the package as it is installed, for the API reference.

    ``loaderlib.profiling`` is installed from the top-level ``profiling/`` folder (setup.py's
    ``package_dir``), so a reader of the source tree (griffe, which mkdocstrings uses) finds no
    ``loaderlib/profiling``. This tree links every entry of ``loaderlib/`` and adds
    ``profiling`` where it is installed; mkdocs.yml points mkdocstrings at it.
    """
    root = Path(__file__).resolve().parents[1]
    tree = root / "build" / "docs-api" / "loaderlib"
    tree.mkdir(parents=True, exist_ok=True)
    wanted = {p.name: p for p in (root / "loaderlib").iterdir() if p.name != "__pycache__"}
    wanted["profiling"] = root / "profiling"
    for entry in tree.iterdir():
        if entry.name not in wanted or not entry.is_symlink() or entry.resolve() != wanted[entry.name].resolve():
            entry.unlink()
    for name, target in wanted.items():
        if not (tree / name).is_symlink():
            (tree / name).symlink_to(target)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri == "architecture.md":
        markdown = markdown.replace("<!-- modules -->", _notes.module_lines())
        markdown = markdown.replace("<!-- notes -->", _notes.notes_markdown())
    return markdown


def on_post_page(output: str, page, config) -> str:
    """NOTE [ Static dashboards in the docs ]: a notebook page shows each dashboard's image."""
    src = page.file.abs_src_path or ""
    if src.endswith(".ipynb") and _executed(config):
        want = dashboards_expected(Path(src).read_text(encoding="utf-8"))
        got = output.count(FRAME_MARK)
        if got < want:
            from mkdocs.exceptions import PluginError

            raise PluginError(f"{page.file.src_uri}: {want} dashboard(s) displayed but {got} static image(s) on the "
                              "page (NOTE [ Static dashboards in the docs ] in docs/_hooks.py)")
    return output


def _executed(config) -> bool:
    plugin = config.plugins.get("mkdocs-jupyter")
    return bool(plugin is not None and plugin.config.get("execute"))
