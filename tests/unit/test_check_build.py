"""NOTE [ Check the build first ]: a missing or broken extension gives advice, not a bare ImportError.

Each case imports a temporary copy of the package in a subprocess (its folder first on
sys.path), so the real installation is never touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

import loaderlib

PKG = os.path.dirname(loaderlib.__file__)


def _copy(tmp_path, keep_extensions: bool):
    dst = tmp_path / "loaderlib"
    shutil.copytree(PKG, dst, ignore=shutil.ignore_patterns("__pycache__", *([] if keep_extensions else ["*.so",
                                                                                                           "*.pyd"])))
    return dst


def _import(root) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import loaderlib"], cwd=root, capture_output=True, text=True,
                          timeout=120, check=False)


def test_missing_extensions_in_an_installed_copy(tmp_path):
    dst = _copy(tmp_path, keep_extensions=False)
    res = _import(tmp_path)
    assert res.returncode == 1
    err = res.stderr
    assert "ImportError: loaderlib's compiled extension loaderlib._ext._arena cannot be imported:" in err
    assert f"It was looked for in {dst / '_ext'}, which holds:\n    (no compiled modules)\n" in err
    assert "pip install --force-reinstall --no-cache-dir loaderlib" in err
    assert "did not load" not in err


def test_missing_extensions_in_a_checkout_say_make_build(tmp_path):
    _copy(tmp_path, keep_extensions=False)
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "pyx").mkdir()
    res = _import(tmp_path)
    assert res.returncode == 1
    assert f"This is a source checkout ({tmp_path}): build the extensions in place with" in res.stderr
    assert "make build" in res.stderr and "pip install -e ." in res.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="an ELF shared object is replaced")
def test_a_damaged_extension_is_named_with_the_loader_error(tmp_path):
    dst = _copy(tmp_path, keep_extensions=True)
    jpeg = next(p for p in (dst / "_ext").iterdir() if p.name.startswith("_jpeg.") and p.suffix == ".so")
    jpeg.write_bytes(b"not a shared object")
    res = _import(tmp_path)
    assert res.returncode == 1
    assert "loaderlib's compiled extension loaderlib._ext._jpeg cannot be imported:" in res.stderr
    assert str(jpeg) in res.stderr            # the loader's own message names the file
    assert f"    {jpeg.name}\n" in res.stderr   # and the listing shows it is there
    assert "The module file is there but did not load" in res.stderr


def test_a_complete_copy_imports(tmp_path):
    _copy(tmp_path, keep_extensions=True)
    res = subprocess.run([sys.executable, "-c", "import loaderlib; print(loaderlib.__file__)"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(tmp_path / "loaderlib" / "__init__.py")


@pytest.mark.parametrize("user", [None, "active"])
def test_openmp_waits_passively_unless_the_user_says(user):
    # NOTE [ OpenMP threads wait passively ]: libgomp reports what it read (OMP_DISPLAY_ENV);
    # the variable is gone again after the import unless the user had set it.
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["OMP_DISPLAY_ENV"] = "true"
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    if user:
        env["OMP_WAIT_POLICY"] = user
    r = subprocess.run([sys.executable, "-c", "import os, loaderlib; print('after', os.environ.get('OMP_WAIT_POLICY'))"],
                       env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert f"OMP_WAIT_POLICY = '{(user or 'passive').upper()}'" in r.stderr
    assert r.stdout.split()[-1] == str(user)
