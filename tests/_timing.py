"""The verdict checks that read real clocks (``-m timing``): a run without a verdict is a skip, never a pass.

On a loaded machine "not enough evidence" is an allowed answer (the verdict must never name a
wrong stage), but a test that returned early on it would pass without checking anything. So
such a run is reported as skipped with the verdict's reason, and ``tests/conftest.py`` prints
how many timing checks ended that way at the end of the session. With
``LOADERLIB_TIMING_STRICT=1`` it fails instead (for a quiet machine, where a verdict is due).
"""

from __future__ import annotations

import os

import pytest

NO_VERDICT = "no verdict (not enough evidence)"


def judged(report, expected: str) -> None:
    """The verdict names ``expected``; "not enough evidence" skips the rest of the test, counted."""
    v = report.verdict
    assert report.bottleneck == expected or not v.enough, report
    if not v.enough:
        if os.environ.get("LOADERLIB_TIMING_STRICT") == "1":
            pytest.fail(f"{NO_VERDICT} where {expected!r} was due: {v.summary}")
        pytest.skip(f"{NO_VERDICT}: {v.summary}")
