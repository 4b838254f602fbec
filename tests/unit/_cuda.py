"""Simulated or real CUDA for the accelerator tests (tests/unit/test_accelerator.py,
tests/unit/test_pinned_processes.py).

This project's test machines have no GPU, so those tests simulate the few CUDA calls the
loader makes. With ``LOADERLIB_REAL_CUDA=1`` (``benchmarks/device_check.py`` sets it on a
machine with a GPU) the simulation is off: the same tests run against the real
``torch.cuda``, its fixtures only recording the calls on their way through.
"""

from __future__ import annotations

import os

import pytest

#: Set to 1 to run the accelerator tests against real CUDA (fakes off).
REAL_CUDA_ENV = "LOADERLIB_REAL_CUDA"


def real_cuda(torch) -> bool:
    """Whether the tests run on real CUDA: asked for by ``LOADERLIB_REAL_CUDA=1``. Asked for
    on a machine where torch sees no CUDA device, the test is skipped saying so."""
    if os.environ.get(REAL_CUDA_ENV, "") != "1":
        return False
    if not torch.cuda.is_available():
        pytest.skip(f"{REAL_CUDA_ENV}=1 but torch {torch.__version__} sees no CUDA device")
    return True
