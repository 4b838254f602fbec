"""Arena slots are leased atomically: concurrent acquirers never share a slot."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

import loaderlib as ll
from loaderlib.arena import AlignedBuffer, BatchArena, BatchLayout


@pytest.fixture
def tiny_switch_interval():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def test_concurrent_acquire_never_shares_a_slot(tiny_switch_interval):
    def allocator(n):
        time.sleep(0)           # Python code between choosing a slot and using it: a switch point
        return AlignedBuffer(n, 64)

    arena = BatchArena(2, allocator=allocator)
    layout = BatchLayout.of([((8,), np.uint8)])
    live: dict = {}
    clash = []
    lock = threading.Lock()

    def worker():
        for k in range(300):
            lease, (view,) = arena.acquire(BatchLayout.of([((8 + (k % 5) * 64,), np.uint8)]) if k % 7 == 0
                                           else layout)
            with lock:
                if lease.slot in live:
                    clash.append(lease.slot)
                live[lease.slot] = lease
            time.sleep(0)
            with lock:
                del live[lease.slot]
            del lease, view

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clash == []
    assert arena.stats["leased"] == 0


def test_two_iterators_in_two_threads_never_share_memory(tiny_switch_interval):
    x = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    y = np.arange(64)
    loader = ll.DataLoader(ll.ArrayDataset(x, y), batch_size=8, num_threads=1, prefetch=2)
    kept: list = [[], []]

    def consume(k):
        for images, labels in loader:
            kept[k].append((images, labels))

    threads = [threading.Thread(target=consume, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batches = kept[0] + kept[1]
    assert len(batches) == 16
    for i, (a, la) in enumerate(batches):
        np.testing.assert_array_equal(a, x[la])      # every image matches its label
        for b, _lb in batches[i + 1:]:
            assert not np.shares_memory(a, b)
