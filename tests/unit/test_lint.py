"""The code is ruff clean (the configuration is in pyproject.toml)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_ruff_clean():
    ruff = shutil.which("ruff", path=os.path.dirname(sys.executable)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (make test installs it)")
    out = subprocess.run([ruff, "check", "--output-format", "concise", "loaderlib", "profiling", "tests", "fuzz",
                          "benchmarks"], cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
