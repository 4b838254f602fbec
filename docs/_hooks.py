"""mkdocs hooks: fill the architecture page's generated parts (see docs/_notes.py), keep one
known docstring-layout message from failing the strict build, keep the dashboard's static
view on the notebook pages (NOTE [ Static dashboards in the docs ]) and run the example of
every framework page (NOTE [ Framework pages run their example in the docs build ])."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
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


# NOTE [ Framework pages run their example in the docs build ]
# Each page under docs/integrations/ shows how a framework trains on a loaderlib loader, and its
# ```python blocks (joined, in order) form one program that must run as printed: the docs build
# runs each in a new Python process (the frameworks pick backends and process groups at import,
# so no two share one) in a temporary directory of its own (the examples write checkpoints
# into the working directory), and fails naming the page and the error when one fails or
# holds no example. The runs start when the build starts (``on_files``), at most as many at a
# time as the machine has CPUs, and are awaited when the pages are written (``on_post_build``),
# so they overlap the notebooks and the API pages. The environment is the build's own (the
# same Python; PYTHONPATH passes through). LOADERLIB_DOCS_EXECUTE=false, which renders the
# notebooks without running them, skips these runs too. tests/frameworks checks what each
# example computes; this checks that the page as published runs.
_log = logging.getLogger("mkdocs.hooks.loaderlib")
EXAMPLE_PAGES = "integrations/"
EXAMPLE_TIMEOUT_S = 900
_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def page_example(markdown: str) -> str:
    """The program a page's ```python blocks form, joined in order ('' when it has none)."""
    return "\n\n".join(block.rstrip() for block in _PYTHON_BLOCK.findall(markdown))


def run_example(code: str, name: str, timeout: float = EXAMPLE_TIMEOUT_S,
                running: list[subprocess.Popen] | None = None) -> str | None:
    """Run ``code`` in a new Python process in a new temporary directory; ``None`` when it
    exits 0, otherwise what went wrong (its exit status and the end of its output)."""
    if not code.strip():
        return "it has no ```python example"
    where = tempfile.mkdtemp(prefix="loaderlib-docs-example-")
    try:
        with open(os.path.join(where, "output.txt"), "w+", encoding="utf-8", errors="replace") as out:
            proc = subprocess.Popen([sys.executable, "-c", code], cwd=where, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
            if running is not None:
                running.append(proc)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                rc = None
            out.seek(0)
            text = out.read()
    finally:
        shutil.rmtree(where, ignore_errors=True)
    if rc == 0:
        return None
    what = f"it ran past {timeout:g} s" if rc is None else f"it exited with status {rc}"
    return f"{what} in a new process ({name}); the end of its output:\n{text[-3000:]}"


class _Examples:
    """The example runs of one build (NOTE [ Framework pages run their example in the docs build ])."""

    def __init__(self) -> None:
        self.pool: ThreadPoolExecutor | None = None
        self.runs: dict[str, Future] = {}
        self.running: list[subprocess.Popen] = []
        self.seconds: dict[str, float] = {}   # how long each page's example ran

    def start(self, pages: dict[str, str]) -> None:
        self.stop()
        if not pages:
            return
        self.seconds = {}
        self.pool = ThreadPoolExecutor(max_workers=min(len(pages), os.cpu_count() or 1),
                                       thread_name_prefix="docs-example")
        self.runs = {uri: self.pool.submit(self._timed, uri, page_example(text)) for uri, text in sorted(pages.items())}

    def _timed(self, uri: str, code: str) -> str | None:
        began = time.monotonic()
        try:
            return run_example(code, f"docs/{uri}", EXAMPLE_TIMEOUT_S, self.running)
        finally:
            self.seconds[uri] = time.monotonic() - began

    def failures(self) -> list[str]:
        """Wait for every run; one line per page whose example failed, naming it."""
        waited = time.monotonic()
        failed = [f"docs/{uri}: its example failed: {err}" for uri, run in self.runs.items()
                  if (err := run.result()) is not None]
        if self.runs:
            _log.info("ran the examples of %d framework pages (%s); the build waited %.0f s for them", len(self.runs),
                      ", ".join(f"{Path(uri).stem} {s:.0f} s" for uri, s in sorted(self.seconds.items())),
                      time.monotonic() - waited)
        self.stop()
        return failed

    def check(self) -> None:
        failed = self.failures()
        if failed:
            from mkdocs.exceptions import PluginError

            raise PluginError("\n\n".join(failed) + "\n(NOTE [ Framework pages run their example in the docs build ] "
                              "in docs/_hooks.py)")

    def stop(self) -> None:
        for proc in self.running:
            if proc.poll() is None:
                proc.kill()
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        self.pool, self.runs, self.running = None, {}, []


_EXAMPLES = _Examples()


def on_files(files, config):
    if _executed(config):
        _EXAMPLES.start({f.src_uri: Path(f.abs_src_path).read_text(encoding="utf-8") for f in files
                         if f.src_uri.startswith(EXAMPLE_PAGES) and f.src_uri.endswith(".md")})
    return files


def on_post_build(config) -> None:
    _EXAMPLES.check()


def on_build_error(error) -> None:
    _EXAMPLES.stop()


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
