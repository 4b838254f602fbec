"""Dependencies that earn their place: every import is declared, the core needs only numpy at
import time, and OpenCV is optional with an error that names both of its distributions."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import cv2
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
tomllib = pytest.importorskip("tomllib")

# Import name -> the distribution that provides it, where they differ.
DISTRIBUTION = {"cv2": "opencv-python-headless", "IPython": "ipython"}
# Libraries that loaderlib integrates with: only users who already have them reach that code.
INTEGRATIONS = {"torch", "datasets", "jax", "ray", "lightning", "pytorch_lightning", "transformers", "keras",
                "orbax"}
# Installed by a declared extra as its own dependency.
PROVIDED_BY = {"ipython": "ipywidgets"}


def _requirement_names(lines) -> set[str]:
    names = set()
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0].lower())
    return names


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    core = _requirement_names(project["project"]["dependencies"])
    extras = {}
    for name, spec in project["tool"]["setuptools"]["dynamic"]["optional-dependencies"].items():
        lines = []
        for path in spec["file"]:
            with open(os.path.join(ROOT, path)) as f:
                lines += f.read().splitlines()
        extras[name] = _requirement_names(lines)
    return core, extras


def _imports(folder: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
        for fn in files:
            if not fn.endswith(".py"):
                continue
            path = os.path.join(dirpath, fn)
            with open(path) as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip"
                        and node.args and isinstance(node.args[0], ast.Constant)):
                    names = [node.args[0].value]   # pytest.importorskip("datasets")
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], set()).add(os.path.relpath(path, ROOT))
    return found


def test_every_import_of_the_package_is_declared():
    core, extras = _declared()
    all_extras = set().union(*extras.values())
    undeclared = {}
    for folder in ("loaderlib", "profiling"):
        for name, where in _imports(folder).items():
            if name in sys.stdlib_module_names or name in ("loaderlib", "__future__") or name in INTEGRATIONS:
                continue
            dist = DISTRIBUTION.get(name, name).lower()
            dist = PROVIDED_BY.get(dist, dist)
            if dist not in core and dist not in all_extras:
                undeclared[name] = sorted(where)
    assert undeclared == {}
    assert {"numpy", "cloudpickle", "tqdm", "psutil"} <= core
    assert not core & {"opencv-python-headless", "opencv-python", "matplotlib", "ipywidgets", "nbmake"}
    assert extras["opencv"] == {"opencv-python-headless"}
    assert extras["notebook"] == {"ipywidgets", "matplotlib"}


def test_the_package_never_imports_test_helpers():
    for folder in ("loaderlib", "profiling"):
        imported = _imports(folder)
        assert "tests" not in imported, imported.get("tests")
        assert "matplotlib" not in imported or imported["matplotlib"] <= {"profiling/_plot.py",
                                                                          "profiling/dashboard.py"}
    assert not os.path.exists(os.path.join(ROOT, "loaderlib", "_synth.py"))


def test_test_requirements_are_all_used():
    _, extras = _declared()
    used = set(_imports("tests")) | set(_imports("benchmarks"))
    import_name = {"pillow": "PIL", "opencv-python-headless": "cv2", "scikit-image": "skimage"}
    for dist in extras["test"]:
        if dist in ("ruff", "mypy"):   # run as programs by tests/unit/test_lint.py and test_typecheck.py
            continue
        assert import_name.get(dist, dist) in used or dist == "ipykernel" and "nbclient" in used, dist


def test_import_loaderlib_loads_only_numpy_from_outside():
    code = ("import sys; import loaderlib; import loaderlib.transforms, loaderlib.datasets; "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    # cython_runtime: the module object Cython creates for its own bookkeeping (no distribution).
    third_party = set(res.stdout.split()) - set(sys.stdlib_module_names) - {"loaderlib", "cython_runtime"}
    assert {m for m in third_party if not m.startswith("_")} == {"numpy"}


def test_without_opencv_jpeg_works_and_other_formats_name_both_distributions(tmp_path):
    ok, png = cv2.imencode(".png", np.full((5, 7, 3), 9, np.uint8))
    ok2, jpg = cv2.imencode(".jpg", np.full((8, 8, 3), 128, np.uint8))
    assert ok and ok2
    (tmp_path / "a.png").write_bytes(png.tobytes())
    (tmp_path / "a.jpg").write_bytes(jpg.tobytes())
    code = f"""
import sys
sys.modules["cv2"] = None   # as if no OpenCV distribution were installed
import loaderlib as ll
img = ll.decode(open({str(tmp_path / 'a.jpg')!r}, "rb").read())
print("jpeg", img.shape)
try:
    ll.decode(open({str(tmp_path / 'a.png')!r}, "rb").read())
except ModuleNotFoundError as e:
    print("png", e.name, "|", e)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    lines = res.stdout.splitlines()
    assert lines[0] == "jpeg (8, 8, 3)"
    assert lines[1].startswith("png cv2 | loaderlib needs OpenCV (the cv2 module) for this: decoding images "
                               "that are not JPEG")
    assert "pip install \"loaderlib[opencv]\" (opencv-python-headless)" in lines[1]
    assert "pip install opencv-python (with OpenCV's GUI functions)" in lines[1]


def test_what_the_docs_and_the_build_config_point_to_exists():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    scripts = re.findall(r"\{project\}/(\S+)", project["tool"]["cibuildwheel"]["test-command"])
    assert scripts and all(os.path.isfile(os.path.join(ROOT, p)) for p in scripts), scripts
    for folder in ("loaderlib", "profiling"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for fn in files:
                if fn.endswith(".py"):
                    with open(os.path.join(dirpath, fn)) as f:
                        for cited in re.findall(r"[\w./-]+\.md\b", f.read()):
                            assert os.path.isfile(os.path.join(ROOT, cited)), f"{fn} cites {cited}"
    docs = [os.path.join(ROOT, "README.md")] + [os.path.join(ROOT, "docs", f) for f in os.listdir(
        os.path.join(ROOT, "docs")) if f.endswith(".md")]
    for path in docs:
        with open(path) as f:
            mine = re.findall(r"(?<![\w.])/(?:work|Users|root)/[\w./-]+", f.read())
        assert not mine, f"{os.path.relpath(path, ROOT)} cites paths of a developer's machine: {mine}"
    import loaderlib as ll

    assert "is materialised" not in ll.DataLoader.__doc__ and "never materialised" in ll.DataLoader.__doc__

# Paths the tests build from the source tree's root (os.path.join(ROOT, "a", "b"), or root).
_TREE_PATH = re.compile(r"os\.path\.join\((?:ROOT|root),((?:\s*\"[^\"]+\",?)+)\)")


def _paths_the_tests_open() -> set[str]:
    found = set()
    for dirpath, _, files in os.walk(os.path.join(ROOT, "tests")):
        for fn in files:
            if fn.endswith(".py"):
                with open(os.path.join(dirpath, fn)) as f:
                    for m in _TREE_PATH.finditer(f.read()):
                        found.add("/".join(re.findall(r"\"([^\"]+)\"", m.group(1))))
    return found


def _collected(cwd: str) -> list[str]:
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
                         cwd=cwd, capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ids = [line for line in res.stdout.splitlines() if "::" in line]
    assert ids, res.stdout[-2000:]
    return ids


@pytest.mark.slow
@pytest.mark.long   # among the slowest tests: `make test` leaves it to `make test-long` (.ci/run runs both)
def test_the_sdist_holds_what_its_tests_need(tmp_path):
    """Build the sdist from the tracked files, unpack it, collect the test suite there: the same tests
    as in the source tree, and every file the tests open from the tree is in it."""
    import shutil
    import tarfile

    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout (this test builds the sdist from the tracked files)")
    src = tmp_path / "src"
    for rel in tracked.stdout.splitlines():
        if os.path.isfile(os.path.join(ROOT, rel)):
            os.makedirs(src / os.path.dirname(rel), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, rel), src / rel)
    for c in os.listdir(os.path.join(ROOT, "pyx")):   # Cython's output, if built: cythonize then skips it
        if c.endswith(".c"):
            shutil.copy2(os.path.join(ROOT, "pyx", c), src / "pyx" / c)
    res = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")], cwd=src,
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    (sdist,) = (tmp_path / "dist").glob("loaderlib-*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    (unpacked,) = (tmp_path / "unpacked").iterdir()

    files = tracked.stdout.splitlines()
    in_tree = {p for p in _paths_the_tests_open() if p in files or any(f.startswith(p + "/") for f in files)}
    missing = sorted(p for p in in_tree if not os.path.exists(unpacked / p))
    assert {"tests/kernels/pool_stress.c", "tests/unit/_ranks.py", "fuzz/corpus"} <= _paths_the_tests_open()
    assert not missing, f"the sdist lacks files its tests open: {missing}"
    for rel in ("notebooks", "benchmarks"):   # read by the notebook tests and the lint/packaging tests
        want = {p for p in files if p.startswith(rel + "/")}
        assert want and all((unpacked / p).exists() for p in want), rel

    # The unpacked tree imports its own loaderlib (rootdir on sys.path): give it the built extensions.
    ext = os.path.join(ROOT, "loaderlib", "_ext")
    for so in os.listdir(ext):
        if so.endswith((".so", ".pyd")):
            shutil.copy2(os.path.join(ext, so), unpacked / "loaderlib" / "_ext" / so)
    assert _collected(str(unpacked)) == _collected(ROOT)
