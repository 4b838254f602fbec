import gc
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

from loaderlib.arena import ALIGNMENT, BatchArena, BatchLayout, aligned_empty, arena_counters


def _layout(n=8):
    return BatchLayout.of([((n, 3, 5, 7), np.float32), ((n,), np.int64), ((n, 3), np.uint8)])


def test_parts_are_aligned_contiguous_views():
    arena = BatchArena(2)
    _lease, parts = arena.acquire(_layout())
    for p in parts:
        assert p.ctypes.data % ALIGNMENT == 0
        assert p.flags.c_contiguous and p.flags.writeable
    assert [p.shape for p in parts] == [(8, 3, 5, 7), (8,), (8, 3)]
    # the parts do not overlap
    parts[0][...] = 1
    parts[1][...] = 2
    parts[2][...] = 3
    assert (parts[0] == 1).all() and (parts[1] == 2).all() and (parts[2] == 3).all()


def test_slot_reused_only_after_every_view_is_gone():
    arena = BatchArena(1)
    lay = _layout()
    arena.reserve(lay)
    lease, (a, b, c) = arena.acquire(lay)
    del lease, b, c
    kept = a[2:5]            # a view of a view keeps the slot
    del a
    gc.collect()
    assert arena.stats["leased"] == 1
    lease2, (a2, _, _) = arena.acquire(lay)   # must not hand out the kept slot
    assert not np.shares_memory(a2, kept)
    assert arena.stats["slots"] == 2
    del kept
    assert arena.stats["leased"] == 1
    del lease2, a2, _
    assert arena.stats["leased"] == 0


def test_steady_state_allocates_nothing():
    arena = BatchArena(3)
    lay = _layout(16)
    arena.reserve(lay)
    before = arena.stats["allocations"]
    counters = arena_counters()["allocations"]
    addresses = set()
    for _ in range(200):
        lease, parts = arena.acquire(lay)
        addresses.add(parts[0].ctypes.data)
        del lease, parts
    assert arena.stats["allocations"] == before
    assert arena_counters()["allocations"] == counters
    assert len(addresses) <= 3


def test_growth_for_larger_batches_is_geometric():
    arena = BatchArena(1)
    sizes = []
    for n in range(1, 60):
        lease, parts = arena.acquire(BatchLayout.of([((n, 100), np.uint8)]))
        sizes.append(lease.nbytes)
        del lease, parts
    assert arena.stats["slots"] == 1
    needs = [n * 100 for n in range(1, 60)]
    assert all(size >= need for size, need in zip(sizes, needs))    # every lease holds its batch
    assert sizes == sorted(sizes)                                     # one slot, never shrunk
    grown = sorted(set(sizes))
    assert all(b >= 1.5 * a for a, b in itertools.pairwise(grown))        # each growth is geometric
    assert len(grown) == arena.stats["allocations"] < 15              # so logarithmic in the largest size


def test_aligned_empty():
    a = aligned_empty((5, 7), np.float64)
    assert a.ctypes.data % 64 == 0 and a.shape == (5, 7) and (a == 0).all()


def test_clear_frees_only_free_slots():
    arena = BatchArena(2)
    lay = _layout()
    arena.reserve(lay)
    _lease, parts = arena.acquire(lay)
    parts[0][...] = 5
    arena.clear()
    assert (parts[0] == 5).all()   # still valid memory
    assert arena.stats["capacity_bytes"] == lay.nbytes


def test_torch_zero_copy():
    torch = pytest.importorskip("torch")
    arena = BatchArena(1)
    lease, (a, b, _) = arena.acquire(_layout())
    t = torch.from_numpy(a)
    assert t.data_ptr() == a.ctypes.data
    del lease, a, b, _
    gc.collect()
    assert arena.stats["leased"] == 1   # the tensor keeps the slot
    del t
    assert arena.stats["leased"] == 0


_PAGES_CHILD = """
import numpy as np
from loaderlib.arena import aligned_empty
a = aligned_empty((12 << 20,), np.uint8)   # a 12 MB buffer: a mapping of its own
a[...] = 1
addr = a.ctypes.data
flags = []
with open("/proc/self/smaps") as f:
    inside = False
    for line in f:
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr + (6 << 20) < hi      # the mapping holding the buffer's middle
        elif inside and head == "VmFlags:":
            flags = line.split()[1:]
print(" ".join(flags))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/PID/smaps")
@pytest.mark.parametrize("env, want, not_want", [("", "nh", "hg"), ("0", "nh", "hg"), ("1", "hg", "nh")])
def test_large_slots_are_kept_out_of_huge_pages_unless_asked(env, want, not_want):
    # NOTE [ Slots in small pages ]: the kernel's VmFlags show the advice (nh: MADV_NOHUGEPAGE,
    # hg: MADV_HUGEPAGE) on the mapping that holds the buffer.
    out = subprocess.run([sys.executable, "-c", _PAGES_CHILD], capture_output=True, text=True, check=True,
                         env={**os.environ, "LOADERLIB_HUGE_PAGES": env}).stdout.split()
    assert want in out and not_want not in out, out
