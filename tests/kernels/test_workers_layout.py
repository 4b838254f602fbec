"""The per-thread pool's entries own their cache lines (NOTE [ Per-thread entries own their
cache lines ] in pyx/include/ll_worker.h): no two threads' decoders share a line."""

import pytest

from loaderlib._ext import _jpeg


@pytest.mark.parametrize("n", [1, 3, 64])
def test_entries_are_cache_line_aligned(n):
    address, entry, line = _jpeg.Workers(n).layout
    assert line >= 64
    assert address % line == 0
    assert entry % line == 0
    # entry k spans [address + k*entry, address + (k+1)*entry): whole lines, none shared
    starts = [address + k * entry for k in range(n)]
    assert all(s % line == 0 for s in starts)


def test_size_must_be_positive():
    with pytest.raises(ValueError, match="size must be >= 1"):
        _jpeg.Workers(0)
