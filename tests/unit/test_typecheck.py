"""The typed modules type-check: mypy, pinned, on the files pyproject.toml's ``[tool.mypy]`` lists.

As with ruff (test_lint.py), a missing or differently versioned mypy fails the test instead of
skipping it. ``make typecheck`` runs the same check on its own.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pinned_version() -> str:
    with open(os.path.join(ROOT, "requirements-test.txt")) as f:
        m = re.search(r"^mypy==(\S+)", f.read(), re.M)
    assert m, "requirements-test.txt must pin mypy exactly (mypy==X.Y.Z)"
    return m.group(1)


def _mypy(*args: str) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed: `make test` installs it, or pip install -r requirements-test.txt")
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=600)


def test_mypy_is_the_pinned_version():
    out = _mypy("--version")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split()[1] == _pinned_version(), (
        f"{out.stdout.strip()} is not the pinned mypy {_pinned_version()}: pip install -r requirements-test.txt")


@pytest.mark.long   # among the slowest tests: `make test` leaves it to `make test-long` (.ci/run runs both)
def test_mypy_clean():
    # No arguments: the files and options are pyproject.toml's [tool.mypy].
    out = _mypy()
    assert out.returncode == 0, "mypy found type errors:\n" + out.stdout + out.stderr
