"""The code is ruff clean, with the pinned ruff and the rules selected in pyproject.toml.

A missing or differently versioned ruff fails the test instead of skipping it: a skipped lint
check reads as a green one. ``make test`` installs the pinned version (requirements-test.txt).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pinned_version() -> str:
    with open(os.path.join(ROOT, "requirements-test.txt")) as f:
        m = re.search(r"^ruff==(\S+)", f.read(), re.M)
    assert m, "requirements-test.txt must pin ruff exactly (ruff==X.Y.Z)"
    return m.group(1)


def _ruff() -> str:
    ruff = shutil.which("ruff", path=os.path.dirname(sys.executable)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: `make test` installs it, or pip install -r requirements-test.txt")
    return ruff


def test_ruff_is_the_pinned_version():
    out = subprocess.run([_ruff(), "--version"], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split()[-1] == _pinned_version(), (
        f"{out.stdout.strip()} is not the pinned ruff {_pinned_version()}: pip install -r requirements-test.txt")


def test_ruff_clean():
    out = subprocess.run([_ruff(), "check", "--output-format", "concise", "loaderlib", "profiling", "tests", "fuzz",
                          "benchmarks", "docs"], cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
