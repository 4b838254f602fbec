"""The package's layout stays readable: no module of ``loaderlib/`` (or ``profiling/``) is over
900 lines; a module that grows past it is split along its seams (docs/architecture.md). The
public modules of the dataset families and of the observation tools are thin: they re-export
what ``loaderlib/_datasets/`` and ``loaderlib/_observe/`` implement."""

from __future__ import annotations

import ast
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


#: The public modules over ``_datasets/`` (one family each, or all of them) and ``_observe/``.
THIN = {"datasets.py": "_datasets", "records.py": "_datasets", "webdataset.py": "_datasets",
        "recordio.py": "_datasets", "stats.py": "_observe"}


def _thin_problems(path: str, subpackage: str) -> list[str]:
    """What makes the module at ``path`` more than a docstring, imports from ``subpackage`` and
    an ``__all__`` of names it imported."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    problems, imported, exported = [], set(), None
    for k, node in enumerate(tree.body):
        if k == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue   # the docstring
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 1 and (node.module or "").startswith(subpackage + "."):
            imported.update(a.asname or a.name for a in node.names)
            continue
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "__all__"):
            exported = ast.literal_eval(node.value)
            continue
        problems.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}")
    if exported is None:
        problems.append("no __all__")
    else:
        problems += [f"{name!r} in __all__ is not imported from {subpackage}"
                     for name in exported if name not in imported]
    return problems


def test_the_family_and_observation_modules_are_thin():
    found = {fn: _thin_problems(os.path.join(ROOT, "loaderlib", fn), sub) for fn, sub in THIN.items()}
    assert {fn: p for fn, p in found.items() if p} == {}


def test_thin_problems_sees_code_and_names_from_elsewhere(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text('"""Doc."""\nfrom ._datasets.a import A\nfrom .b import B\n__all__ = ["A", "B"]\nX = 1\n')
    assert _thin_problems(str(mod), "_datasets") == ["line 3: from .b import B", "line 5: X = 1",
                                                     "'B' in __all__ is not imported from _datasets"]
