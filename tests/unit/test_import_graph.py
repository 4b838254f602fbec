"""No import circle between loaderlib's modules.

Every module under ``loaderlib/`` is parsed with ``ast`` (nothing is imported), and each
``import``/``from ... import`` that names a loaderlib module becomes an edge, wherever it
stands: at module level or inside a function (a function-local import is still a dependency,
only a later one). Imports under ``if TYPE_CHECKING:`` count too: a circle that only type
checkers follow still ties the modules together (a small ``Protocol`` breaks it).
``from . import x`` is an edge to the submodule ``x`` when ``x`` is one, else to the package.
``from .x import y`` is an edge to ``x``. Importing ``a.b.c`` runs the packages ``a`` and
``a.b`` too, but a package's ``__init__`` is an edge only when it is named. Modules that are
not files under ``loaderlib/`` (``loaderlib.profiling`` lives in ``profiling/``) are outside
the graph.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "loaderlib"


def modules() -> dict[str, pathlib.Path]:
    """``{dotted name: path}`` of every Python module of the package (``pkg`` for ``pkg/__init__.py``)."""
    out = {}
    for f in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree``, those under ``if TYPE_CHECKING:`` included."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def edges(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The loaderlib modules that module ``name`` imports."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    out = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = here[:len(here) - node.level + 1] if node.level else []
            if node.module:
                base = [*base, *node.module.split(".")]
            mod = ".".join(base)
            targets = [f"{mod}.{alias.name}" if f"{mod}.{alias.name}" in known else mod for alias in node.names]
        # A name that is no module under loaderlib/ (the stdlib, numpy, ``loaderlib.profiling``,
        # which lives in profiling/) is outside the graph.
        out.update(t for t in targets if t in known and t != name)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: edges(name, path, known) for name, path in mods.items()}


def components(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each sorted): the modules
    that import each other, directly or through others."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []
    counter = [0]

    def connect(v: str) -> None:   # Tarjan; the graph is small, recursion is fine
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            connect(v)
    return sorted(comps)


def cycle_in(g: dict[str, set[str]], comp: list[str]) -> list[str]:
    """A cycle of component ``comp`` as a path ``a -> ... -> a``: the shortest through its first module."""
    members = set(comp)
    start = comp[0]
    # The shortest path back to start inside the component (breadth first).
    prev: dict[str, str] = {}
    frontier = [start]
    found = None
    while frontier and found is None:
        nxt = []
        for v in frontier:
            for w in sorted(g[v] & members):
                if w == start:
                    found = v
                    break
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
            if found is not None:
                break
        frontier = nxt
    path = [found]
    while path[-1] != start:
        path.append(prev[path[-1]])
    return [*reversed(path), start]


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component (:func:`cycle_in`)."""
    return [cycle_in(g, c) for c in components(g)]


def test_the_graph_sees_relative_and_function_local_imports(tmp_path):
    g = graph()
    assert "loaderlib.datasets" in g["loaderlib"]   # from .datasets import (...)
    assert "loaderlib.transforms" in g["loaderlib"]   # from . import batchify, sampler, transforms
    assert all(m.startswith(PACKAGE) for deps in g.values() for m in deps)


def test_type_only_imports_are_edges(tmp_path):
    pkg = tmp_path / "loaderlib"
    pkg.mkdir()
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    (pkg / "b.py").write_text("from . import a\n")
    known = {"loaderlib.a", "loaderlib.b"}
    g = {"loaderlib.a": edges("loaderlib.a", pkg / "a.py", known), "loaderlib.b": edges("loaderlib.b", pkg / "b.py", known)}
    assert g == {"loaderlib.a": {"loaderlib.b"}, "loaderlib.b": {"loaderlib.a"}}
    assert cycles(g) == [["loaderlib.a", "loaderlib.b", "loaderlib.a"]]


def test_cycles_finds_a_circle_and_prints_its_path():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert cycles(g) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def _report(g: dict[str, set[str]], comps: list[list[str]]) -> str:
    return "\n".join(f"{' -> '.join(cycle_in(g, c))}   (modules in the circle: {', '.join(c)})" for c in comps)


PIPELINE_WING = ("loaderlib.pipeline", "loaderlib._pipeline", "loaderlib._autotune", "loaderlib._tree")


#: The thin public modules over the private subpackages of the dataset families and of the
#: observation tools (tests/unit/test_layout.py checks that they hold nothing else).
THIN = ("loaderlib.datasets", "loaderlib.records", "loaderlib.webdataset", "loaderlib.recordio",
        "loaderlib.stats")


def test_the_implementation_never_goes_through_the_thin_public_modules():
    g = graph()
    for mod in THIN:
        private = ("loaderlib._datasets", "loaderlib._observe")
        assert g[mod] and all(m.startswith(private) for m in g[mod]), mod
    # The package root re-exports them; every other module imports the private implementation.
    assert {m for m, deps in g.items() if deps & set(THIN)} == {"loaderlib"}


def test_no_import_cycle_touches_the_pipeline_wing():
    g = graph()
    mine = [c for c in components(g) if any(m.startswith(PIPELINE_WING) for m in c)]
    assert not mine, "import cycles through the Pipeline wing:\n" + _report(g, mine)


def test_no_import_cycle():
    g = graph()
    found = components(g)
    assert not found, "import cycles between loaderlib modules:\n" + _report(g, found)


def benchmark_graph() -> dict[str, set[str]]:
    """The same graph for the scripts in ``benchmarks/``, which import each other by their
    bare names (the folder is on ``sys.path`` when one runs); ``benchmarks.x`` counts too."""
    where = ROOT / "benchmarks"
    names = {f.stem for f in where.glob("*.py")}
    out: dict[str, set[str]] = {}
    for f in sorted(where.glob("*.py")):
        deps = set()
        for node in _imports(ast.parse(f.read_text(), str(f))):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for m in mods:
                parts = m.split(".")
                if parts[0] == "benchmarks" and len(parts) > 1:
                    parts = parts[1:]
                if parts[0] in names and parts[0] != f.stem and not (isinstance(node, ast.ImportFrom) and node.level):
                    deps.add(parts[0])
        out[f.stem] = deps
    return out


def test_no_import_cycle_between_benchmark_scripts():
    g = benchmark_graph()
    assert "loader" in g["storage"] and "loader" in g["_remote_bench"]   # the graph sees them
    found = components(g)
    assert not found, "import cycles between benchmarks/ scripts:\n" + _report(g, found)
