"""mkdocs hooks: fill the architecture page's generated parts (see docs/_notes.py), and keep
one known docstring-layout message from failing the strict build."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _notes  # noqa: E402  (docs/ is not a package; mkdocs loads this file by path)

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
