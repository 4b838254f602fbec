"""pin_memory=True on the processes engine: shared-memory slots registered with CUDA.

This machine has no GPU. ``torch.cuda.cudart()`` is replaced by a simulated runtime that
answers ``cudaHostRegister`` / ``cudaHostUnregister`` as CUDA does (already registered, not
registered) and records each call with the device current at the time and what
``/proc/self/maps`` shows at the address then: the kernel's view of the mapping, independent
of the engine's own bookkeeping. The engine's code runs for real (workers, shared memory, slot
growth, a killed worker); only the two CUDA calls are simulated. With ``LOADERLIB_REAL_CUDA=1``
on a machine with a GPU (tests/unit/_cuda.py) nothing is simulated: the calls go to the real
runtime and are recorded on their way through, and a batch counts as pinned only if CUDA says
so too (``Tensor.is_pinned``); the one refusal a test injects is still injected.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal

import numpy as np
import pytest

import loaderlib as ll
from loaderlib._engines.processes import shm_prefix
from loaderlib.datasets import ArrayDataset
from tests.unit._cuda import real_cuda

torch = pytest.importorskip("torch")

#: Among the slowest tests of the suite: `make test` leaves them to `make test-long` (.ci/run runs both).
pytestmark = pytest.mark.long

#: CUDA's codes for the two refusals the simulated runtime gives.
ALREADY_REGISTERED = 712
NOT_REGISTERED = 713
MEMORY_ALLOCATION = 2


def _mapping(address):
    """``(start, end, path)`` of the mapping of this process that holds ``address``, or None."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            start, end = (int(v, 16) for v in fields[0].split("-"))
            if start <= address < end:
                return start, end, fields[5].strip() if len(fields) > 5 else ""
    return None


def _shm_names():
    return {n for n in os.listdir("/dev/shm") if n.startswith(shm_prefix())}


def _is_slot(mapping):
    return mapping is not None and "/dev/shm/psm_ll" in mapping[2]


class FakeCudart:
    """The CUDA runtime's host-registration calls (their names are CUDA's), recording each.

    ``real``: the real runtime (``torch.cuda.cudart()``) answers each call, and the current
    device is CUDA's own."""

    def __init__(self, fail_at=None, real=None):
        self.current = 0            # the current device (torch.cuda.device sets it)
        self.live = {}              # address -> size, registered now
        self.registers = []         # (address, size, flags, device, mapping at the call)
        self.unregisters = []       # (address, device, mapping at the call)
        self.fail_at = fail_at      # the n-th registration (1-based) fails as out of memory
        self.real = real

    def _device(self):
        return torch.cuda.current_device() if self.real is not None else self.current

    def cudaHostRegister(self, address, size, flags):
        if self.fail_at is not None and len(self.registers) + 1 == self.fail_at:
            self.fail_at = None
            return MEMORY_ALLOCATION
        if self.real is not None:
            code = int(self.real.cudaHostRegister(address, size, flags))
            if code:
                return code
        elif any(a < address + size and address < a + n for a, n in self.live.items()):
            return ALREADY_REGISTERED
        self.registers.append((address, size, flags, self._device(), _mapping(address)))
        self.live[address] = size
        return 0

    def cudaHostUnregister(self, address):
        if self.real is not None:
            code = int(self.real.cudaHostUnregister(address))
            if code:
                return code
        elif address not in self.live:
            return NOT_REGISTERED
        del self.live[address]
        self.unregisters.append((address, self._device(), _mapping(address)))
        return 0

    def __getattr__(self, name):   # the runtime's other calls (error names): the real ones, if any
        real = self.__dict__.get("real")
        if real is None:
            raise AttributeError(name)
        return getattr(real, name)

    def pinned(self, array):
        """Whether ``array``'s bytes lie inside memory registered now (and, on real CUDA,
        whether CUDA counts them as page-locked)."""
        lo = array.__array_interface__["data"][0]
        ours = any(a <= lo and lo + array.nbytes <= a + n for a, n in self.live.items())
        return ours and (self.real is None or torch.from_numpy(array).is_pinned())


#: The second device when simulated (2 GPUs); on real CUDA the last device there is.
def _second_device():
    return min(1, torch.cuda.device_count() - 1) if real_cuda(torch) else 1


@pytest.fixture
def cuda(monkeypatch):
    """A simulated 2-GPU CUDA: availability, device contexts and the runtime's calls; on real
    CUDA, the real runtime's calls recorded."""
    if real_cuda(torch):
        rt = FakeCudart(real=torch.cuda.cudart())
        monkeypatch.setattr(torch.cuda, "cudart", lambda: rt)
        return rt
    rt = FakeCudart()

    @contextlib.contextmanager
    def device(dev):
        before, rt.current = rt.current, dev.index
        try:
            yield
        finally:
            rt.current = before

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: rt)
    return rt


def _double(a, b):
    return a * 2, b


def _dataset(n=40, width=4):
    x = np.arange(n * width, dtype=np.float32).reshape(n, width)
    return ArrayDataset(x, np.arange(n, dtype=np.int64)).transform(_double)


def _loader(ds, **kw):
    kw = {"batch_size": 4, "num_workers": 2, "timeout": 60, "shuffle": True, "seed": 5, **kw}
    return ll.DataLoader(ds, **kw)


def _reference(ds, epochs=1, **kw):
    """The same batches from an unpinned loader."""
    with _loader(ds, **kw) as loader:
        out = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            out.append([(x.copy(), y.copy()) for x, y in loader])
    return out


def _consume(loader, rt, epochs=1, stop_after=None):
    """Copies of the batches of ``epochs`` epochs, checking each was in registered memory."""
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        got = []
        for k, (x, y) in enumerate(loader):
            assert rt.pinned(x) and rt.pinned(y)
            got.append((x.copy(), y.copy()))
            if stop_after is not None and k + 1 == stop_after:
                break
        out.append(got)
        del x, y
    return out


def _snapshot(pool, rt):
    """Registrations and slot counts read together, under the pool's lock: the loader may be
    making a slot for its warm next epoch meanwhile (slots are made, and registered, under
    that lock), and the counts must come from one moment."""
    with pool._lock:
        stats = pool.arena.stats
        return (len(rt.registers), stats["allocations"], stats["slots"], list(rt.unregisters), sorted(rt.live),
                sorted(b.address for b in pool._blocks))


def _check_lifecycle(rt, device=None):
    """Every registration: the whole mapping of one slot, portable, undone exactly once while
    that mapping still existed, and the mapping gone now."""
    assert rt.registers and not rt.live
    addresses = [r[0] for r in rt.registers]
    assert sorted(u[0] for u in rt.unregisters) == sorted(addresses)
    for address, size, flags, dev, mapping in rt.registers:
        assert flags == 1                                  # cudaHostRegisterPortable
        assert _is_slot(mapping) and mapping[0] == address and mapping[1] - mapping[0] >= size > 0
        if device is not None:
            assert dev == device
    for address, dev, mapping in rt.unregisters:
        assert _is_slot(mapping) and mapping[0] == address   # unregistered before munmap
        if device is not None:
            assert dev == device
    gone = [_mapping(a) for a in addresses]
    assert not any(_is_slot(m) and m[0] == a for m, a in zip(gone, addresses))


def _equal(got, ref):
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert len(g) == len(r)
        for (x, y), (rx, ry) in zip(g, r):
            np.testing.assert_array_equal(x, rx)
            np.testing.assert_array_equal(y, ry)


def test_every_slot_registered_once_before_use_and_unregistered_before_unmap(cuda):
    ds = _dataset()
    ref = _reference(ds, epochs=3)
    second = _second_device()
    loader = _loader(ds, pin_memory=True, pin_memory_device=f"cuda:{second}")
    assert loader.engine == "processes"
    got = _consume(loader, cuda, epochs=3)
    _equal(got, ref)
    registers, allocations, slots, unregisters, live, blocks = _snapshot(loader._workers, cuda)
    assert registers == allocations == slots      # once per slot
    assert not unregisters                        # the slots live as long as the pool
    assert live == blocks
    loader.close()
    gc.collect()
    _check_lifecycle(cuda, device=second)


def test_early_drop_keeps_the_registrations_and_dropping_the_loader_undoes_them(cuda):
    ds = _dataset()
    ref = _reference(ds)
    loader = _loader(ds, pin_memory=True)
    got = _consume(loader, cuda, stop_after=2)
    _equal(got, [ref[0][:2]])
    gc.collect()
    assert cuda.registers and not cuda.unregisters
    _equal(_consume(loader, cuda), ref)            # the next epoch reuses the registered slots
    registers, allocations, _slots, unregisters, _live, _blocks = _snapshot(loader._workers, cuda)
    assert registers == allocations and not unregisters
    del loader                                     # no close(): the pool goes with the loader
    gc.collect()
    _check_lifecycle(cuda, device=0)


def test_a_kept_batch_keeps_its_slot_registered_until_dropped(cuda):
    loader = _loader(_dataset(), pin_memory=True)
    x, y = next(iter(loader))
    loader.close()
    gc.collect()
    assert cuda.pinned(x) and len(cuda.live) == 1   # only the slot the user still holds
    np.testing.assert_array_equal(x, 2 * np.arange(40 * 4, dtype=np.float32).reshape(40, 4)[y])
    del x, y
    gc.collect()
    _check_lifecycle(cuda)


class _Fails:
    """Raises on sample ``bad``."""

    def __init__(self, n, bad):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError(f"sample {i} is broken")
        return np.full(3, i, np.float32), i


def test_an_error_in_a_worker_leaks_no_registration(cuda):
    loader = ll.DataLoader(_Fails(40, 21), batch_size=4, num_workers=2, timeout=60, pin_memory=True)
    with pytest.raises(ValueError, match="sample 21 is broken"):
        for x, y in loader:
            assert cuda.pinned(x) and cuda.pinned(y)
    del x, y
    loader.close()
    gc.collect()
    _check_lifecycle(cuda)


def test_a_sigkilled_worker_leaks_no_registration(cuda):
    ds = _dataset(80)
    ref = _reference(ds, shuffle=False)
    loader = _loader(ds, pin_memory=True, shuffle=False)
    it = iter(loader)
    next(it)
    os.kill(loader._workers.workers[0].proc.pid, signal.SIGKILL)
    with pytest.raises(ll.WorkerError, match="worker 0 .*killed by signal SIGKILL"):
        for batch in it:
            assert cuda.pinned(batch[0])
    del it, batch
    gc.collect()
    _equal(_consume(loader, cuda), ref)            # a fresh worker, the same registered slots
    registers, allocations, _slots, unregisters, _live, _blocks = _snapshot(loader._workers, cuda)
    assert registers == allocations and not unregisters
    loader.close()
    gc.collect()
    _check_lifecycle(cuda)


def test_slots_made_for_more_prefetch_are_registered_too(cuda):
    ds = _dataset()
    loader = _loader(ds, pin_memory=True, prefetch=1)
    _consume(loader, cuda)
    first = len(cuda.registers)
    loader.prefetch = 6
    _equal(_consume(loader, cuda), _reference(ds))
    registers, _allocations, slots, _unregisters, _live, _blocks = _snapshot(loader._workers, cuda)
    assert registers == slots > first
    loader.close()
    gc.collect()
    _check_lifecycle(cuda)


def test_batches_that_outgrow_the_slots_are_delivered_pinned(cuda):
    # 2 MiB of images per batch: more than the first slots hold, so the first batches come
    # pickled, the slots are remade larger, and the small ones are unregistered as they go.
    ds = _dataset(24, width=1 << 17)
    ref = _reference(ds, epochs=2)
    loader = _loader(ds, pin_memory=True)
    got = _consume(loader, cuda, epochs=2)
    _equal(got, ref)
    small = {r[0] for r in cuda.registers if r[1] < 4 * (1 << 17) * 4}
    assert small & {u[0] for u in cuda.unregisters}                        # replaced ones undone as they go
    assert all(_is_slot(m) and m[0] == a for a, _, m in cuda.unregisters)  # each before its munmap
    loader.close()
    gc.collect()
    _check_lifecycle(cuda)


@pytest.mark.parametrize("width", [5, 1 << 17], ids=["small", "outgrows-the-slots"])
def test_iterable_dataset_on_workers_is_pinned(cuda, width):
    class Stream:
        def __iter__(self):
            for i in range(30):
                yield np.full(width, i, np.float32), i

    def run(**kw):
        with ll.DataLoader(Stream(), batch_size=4, num_workers=2, timeout=60, **kw) as loader:
            out = []
            for x, y in loader:
                if kw:
                    assert cuda.pinned(x) and cuda.pinned(y)
                out.append((x.copy(), y.copy()))
            return out

    ref = run()
    _equal([run(pin_memory=True)], [ref])
    if width > 5:   # the slots grew to the batch (4 images of 512 KiB) after the first ones
        assert max(r[1] for r in cuda.registers) >= 4 * width * 4
    gc.collect()
    _check_lifecycle(cuda)


def test_a_refused_registration_raises_and_leaks_nothing(cuda):
    shm0 = _shm_names()
    cuda.fail_at = 3
    loader = _loader(_dataset(), pin_memory=True)
    with pytest.raises(ll.LoaderError, match=r"cudaHostRegister of a \d+-byte shared-memory slot failed with CUDA "
                                             r"error 2( \([^)]*\))?; pass pin_memory=False"):
        list(loader)
    assert len(cuda.registers) == 2
    loader.close()
    gc.collect()
    _check_lifecycle(cuda)
    assert _shm_names() == shm0                    # the refused block was unlinked too


def test_pin_memory_on_workers_without_cuda_warns_and_loads_unpinned():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    ds = _dataset()
    ref = _reference(ds)
    with pytest.warns(UserWarning, match="pin_memory=True: no CUDA device"):
        loader = _loader(ds, pin_memory=True)
    with loader:
        assert loader._host_registrar() is None
        _equal([[tuple(a.copy() for a in b) for b in loader]], ref)
