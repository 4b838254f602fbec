"""Hand-off to the accelerator: output="torch", pinned slots, ll.to_device.

This machine has no GPU: the CUDA copy path is exercised through an injected copy backend
whose completion the test controls (the same interface as the CUDA one), the pinned
allocator with a simulated torch.cuda, and the CPU device paths for real. With
``LOADERLIB_REAL_CUDA=1`` on a machine with a GPU (tests/unit/_cuda.py) the simulation is off
and the tests marked so run the CUDA paths for real.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T
from loaderlib._device import DeviceLoader, _Copy
from loaderlib._tree import tree_map
from tests.kernels._loader_images import make_image_folder
from tests.unit._cuda import real_cuda

torch = pytest.importorskip("torch")

N = 20


def _arrays():
    x = np.arange(N * 6, dtype=np.float32).reshape(N, 2, 3)
    return ll.ArrayDataset(x, np.arange(N, dtype=np.int64) * 7)


def _leased(loader):
    return loader._arena_ring.stats["leased"]


# -- output="torch" ----------------------------------------------------------------------------

def test_output_torch_gives_tensors_equal_to_numpy_batches():
    ref = [(x.copy(), y.copy()) for x, y in ll.DataLoader(_arrays(), batch_size=6, shuffle=True, seed=1)]
    loader = ll.DataLoader(_arrays(), batch_size=6, shuffle=True, seed=1, output="torch")
    got = list(loader)
    assert len(got) == len(ref)
    for (x, y), (rx, ry) in zip(got, ref):
        assert isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
        assert x.dtype == torch.float32 and y.dtype == torch.int64
        np.testing.assert_array_equal(x.numpy(), rx)
        np.testing.assert_array_equal(y.numpy(), ry)


def test_output_torch_is_zero_copy_and_keeps_the_slot_leased():
    loader = ll.DataLoader(_arrays(), batch_size=5, num_threads=0, output="torch")
    it = iter(loader)
    x, y = next(it)
    ring = loader._arena_ring
    slots = [ring._ring.buffer(i) for i in range(ring.stats["slots"])]
    assert any(b.address <= x.data_ptr() < b.address + b.nbytes for b in slots if b is not None)   # in a slot
    assert _leased(loader) == 1
    del y
    assert _leased(loader) == 1          # the image tensor still views the slot
    del x
    assert _leased(loader) == 0
    it.close()


def test_torch_dataset_gets_tensors_back_by_default():
    class TorchDS(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return torch.full((2, 2), float(i)), i

    loader = ll.DataLoader(TorchDS(), batch_size=4)
    assert loader.output == "torch"
    x, y = next(iter(loader))
    assert isinstance(x, torch.Tensor) and x.shape == (4, 2, 2) and y.dtype == torch.int64
    assert y.tolist() == [0, 1, 2, 3] and x[3, 1, 1].item() == 3.0
    assert ll.DataLoader(TorchDS(), batch_size=4, output="numpy").output == "numpy"
    assert isinstance(next(iter(ll.DataLoader(TorchDS(), batch_size=4, output="numpy")))[0], np.ndarray)


def test_output_torch_bfloat16_images(tmp_path):
    root = make_image_folder(tmp_path, num_classes=2, per_class=2)

    def loader(output):
        ds = ll.ImageFolderDataset(root).transform_first(T.Compose([
            T.Resize((16, 16)), T.Normalize(0.5, 0.25, dtype="bfloat16"), T.ToCHW()]))
        return ll.DataLoader(ds, batch_size=4, num_threads=2, output=output)

    (bits, _), = [(x.copy(), y.copy()) for x, y in loader("numpy")]
    (x, y), = list(loader("torch"))
    assert x.dtype == torch.bfloat16 and y.dtype == torch.int64
    np.testing.assert_array_equal(x.view(torch.int16).numpy().view(np.uint16), bits)
    # the values: bfloat16 bits widened to float32 by shifting
    np.testing.assert_array_equal(x.float().numpy(), (bits.astype(np.uint32) << 16).view(np.float32))


@pytest.mark.parametrize("engine", ["threads", "processes"])
def test_output_torch_on_python_engines(engine):
    ds = _arrays().transform(lambda x, y: (x * 2, y))       # a Python step: not the native engine
    kw = {"num_workers": 1} if engine == "processes" else {"num_threads": 2}
    with ll.DataLoader(ds, batch_size=6, output="torch", **kw) as loader:
        assert loader.engine == engine
        got = list(loader)
    x = torch.cat([b[0] for b in got])
    y = torch.cat([b[1] for b in got])
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    np.testing.assert_array_equal(x.numpy(), 2 * np.arange(N * 6, dtype=np.float32).reshape(N, 2, 3))
    np.testing.assert_array_equal(y.numpy(), np.arange(N) * 7)


def test_output_validated():
    with pytest.raises(ValueError, match="output must be 'numpy' or 'torch'"):
        ll.DataLoader(_arrays(), batch_size=4, output="jax")


# -- pinned slots ------------------------------------------------------------------------------

@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda as on a 1-GPU machine; pinned allocations and device contexts recorded.

    On real CUDA (``LOADERLIB_REAL_CUDA=1``) nothing is simulated: the real ``torch.empty``
    (pinned for real) and ``torch.cuda.device`` are only recorded on their way through."""
    calls = {"pinned": [], "device": [], "real": real_cuda(torch)}
    real_empty = torch.empty
    real_device = torch.cuda.device

    def fake_empty(*args, pin_memory=False, **kwargs):
        calls["pinned"].append(pin_memory)
        if calls["real"]:
            return real_empty(*args, pin_memory=pin_memory, **kwargs)
        return real_empty(*args, **kwargs)

    @contextlib.contextmanager
    def fake_device(dev):
        calls["device"].append(dev.index)
        if calls["real"]:
            with real_device(dev):
                yield
        else:
            yield

    if not calls["real"]:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "device", fake_device)
    monkeypatch.setattr(torch, "empty", fake_empty)
    return calls


def test_pin_memory_device_is_honoured(fake_cuda):
    loader = ll.DataLoader(_arrays(), batch_size=4, pin_memory=True, pin_memory_device="cuda:0", prefetch=2)
    got = np.concatenate([x.copy() for x, _ in loader])
    np.testing.assert_array_equal(got, np.arange(N * 6, dtype=np.float32).reshape(N, 2, 3))
    slots = loader._arena_ring.stats["allocations"]
    assert fake_cuda["pinned"] and all(fake_cuda["pinned"]) and len(fake_cuda["pinned"]) == slots
    assert fake_cuda["device"] == [0] * slots          # every slot allocated with cuda:0 current
    if fake_cuda["real"]:   # the batches the user gets lie in page-locked memory
        assert all(torch.from_numpy(x).is_pinned() for x, _ in loader)
    for _ in range(3):
        list(loader)
    assert len(fake_cuda["pinned"]) <= slots + 2         # once per slot, never per batch


def test_pin_memory_device_rejected(fake_cuda):
    with pytest.raises(ValueError, match="CUDA devices only"):
        ll.DataLoader(_arrays(), batch_size=4, pin_memory=True, pin_memory_device="cpu")
    with pytest.raises(ValueError, match=rf"this machine has {torch.cuda.device_count()} CUDA device"):
        ll.DataLoader(_arrays(), batch_size=4, pin_memory=True, pin_memory_device="cuda:3")
    with pytest.raises(ValueError, match="is not a device"):
        ll.DataLoader(_arrays(), batch_size=4, pin_memory=True, pin_memory_device="gpu#1")


def test_pin_memory_without_cuda_warns_and_loads_unpinned():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.warns(UserWarning, match=r"pin_memory=True, pin_memory_device='cuda:0': no CUDA device .* unpinned"):
        loader = ll.DataLoader(_arrays(), batch_size=4, pin_memory=True, pin_memory_device="cuda:0")
    got = np.concatenate([x.copy() for x, _ in loader])
    np.testing.assert_array_equal(got, np.arange(N * 6, dtype=np.float32).reshape(N, 2, 3))
    assert loader._pinned_allocator() is None


# -- to_device ---------------------------------------------------------------------------------

def test_to_device_cpu_same_batches_in_order_and_slots_free_at_once():
    ref = [(x.copy(), y.copy()) for x, y in ll.DataLoader(_arrays(), batch_size=6, shuffle=True, seed=2)]
    loader = ll.DataLoader(_arrays(), batch_size=6, shuffle=True, seed=2, num_threads=0)
    dev = ll.to_device(loader, "cpu", prefetch=2)
    kept = []
    for x, y in dev:
        kept.append((x, y))
        # The user holds every device batch so far, yet no host slot is leased: each copy
        # finished before next() returned (NOTE [ Device copies release host slots ]).
        assert _leased(loader) == 0
    assert len(kept) == len(ref) == len(dev)
    for (x, y), (rx, ry) in zip(kept, ref):
        assert isinstance(x, torch.Tensor) and x.device.type == "cpu" and y.dtype == torch.int64
        np.testing.assert_array_equal(x.numpy(), rx)
        np.testing.assert_array_equal(y.numpy(), ry)
    # the same measure on the plain loader does see kept batches
    plain = ll.DataLoader(_arrays(), batch_size=6, num_threads=0)
    held = list(plain)
    assert _leased(plain) == len(held)


class ManualCopies:
    """A copy backend whose copies finish when the test says so (as CUDA events would)."""

    def __init__(self):
        self.started: list[_Copy] = []
        self.done: set[int] = set()

    def start(self, host):
        c = _Copy(tree_map(lambda a: a.copy() if isinstance(a, np.ndarray) else a, host), host)
        self.started.append(c)
        return c

    def ready(self, copy):
        return id(copy) in self.done

    def wait(self, copy):
        self.done.add(id(copy))

    def deliver(self, copy):
        return copy.batch

    def finish(self, k):
        self.done.add(id(self.started[k]))


def test_slot_released_when_the_copy_completes_not_when_the_batch_is_dropped():
    loader = ll.DataLoader(_arrays(), batch_size=5, num_threads=0)
    backend = ManualCopies()
    dev = DeviceLoader(loader, "manual", prefetch=1, _backend=backend)
    it = iter(dev)
    b0 = next(it)                       # batch 0 delivered, batch 1's copy started
    assert len(backend.started) == 2
    assert _leased(loader) == 2         # neither copy has finished: both host slots held
    backend.finish(0)
    b1 = next(it)                       # batch 0's copy is done: its slot goes back now...
    assert len(backend.started) == 3 and _leased(loader) == 2   # ...batches 1 and 2 in flight
    np.testing.assert_array_equal(b0[1], [0, 7, 14, 21, 28])    # ...though the user still holds batch 0
    backend.finish(1)
    backend.finish(2)
    b2 = next(it)
    assert _leased(loader) == 1         # only batch 3's copy is still reading its slot
    del b0, b1, b2
    it.close()                          # waits for the copy in flight, then releases it
    assert _leased(loader) == 0


def test_to_device_state_dict_counts_batches_the_user_got():
    def make():
        return ll.DataLoader(_arrays(), batch_size=4, shuffle=True, seed=3, num_threads=2)

    plain = make()
    plain_it = iter(plain)
    ref = [next(plain_it)[1].tolist() for _ in range(2)]
    plain_state = plain.state_dict()
    rest_ref = [y.tolist() for _, y in plain_it]

    dev = ll.to_device(make(), "cpu", prefetch=3)
    it = iter(dev)
    got = [next(it)[1].tolist() for _ in range(2)]
    assert got == ref
    state = dev.state_dict()
    assert state == plain_state          # not the loader's own state, which is 3 batches further
    assert dev.loader.state_dict() != state
    it.close()

    resumed = ll.to_device(make(), "cpu")
    resumed.load_state_dict(state)
    assert [y.tolist() for _, y in resumed] == rest_ref
    assert resumed.state_dict() == plain.state_dict()    # both between epochs now


def test_to_device_set_epoch_reshuffles():
    dev = ll.to_device(ll.DataLoader(_arrays(), batch_size=4, shuffle=True, seed=4), "cpu")
    dev.set_epoch(1)
    one = [y.tolist() for _, y in dev]
    dev.set_epoch(0)
    zero = [y.tolist() for _, y in dev]
    assert sorted(np.concatenate(one).tolist()) == sorted(np.concatenate(zero).tolist()) and one != zero


def test_to_device_bad_arguments():
    loader = ll.DataLoader(_arrays(), batch_size=4)
    with pytest.raises(ValueError, match="prefetch must be a positive integer"):
        ll.to_device(loader, "cpu", prefetch=0)
    with pytest.raises(ValueError, match="supports torch devices 'cpu' and 'cuda'"):
        ll.to_device(loader, "meta")
    with pytest.raises(ValueError, match="is not a torch device"):
        ll.to_device(loader, "no-such-device")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs torch with CUDA"):
            ll.to_device(loader, "cuda:0")


def test_to_device_jax_cpu(tmp_path):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    root = make_image_folder(tmp_path, num_classes=2, per_class=3)

    def loader(dtype):
        ds = ll.ImageFolderDataset(root).transform_first(T.Compose([
            T.Resize((12, 12)), T.Normalize(0.5, 0.25, dtype=dtype), T.ToCHW()]))
        return ll.DataLoader(ds, batch_size=3, shuffle=True, seed=6, num_threads=0)

    cpu = jax.devices("cpu")[0]
    ref = [(x.copy(), y.copy()) for x, y in loader("bfloat16")]
    host = loader("bfloat16")
    got = []
    for x, y in ll.to_device(host, cpu):
        got.append((x, y))
        assert _leased(host) == 0    # copied out of the slot (JAX may alias aligned host memory)
    assert len(got) == len(ref)
    for (x, y), (rx, ry) in zip(got, ref):
        assert x.dtype == jnp.bfloat16 and y.dtype == (jnp.int64 if jax.config.read("jax_enable_x64") else jnp.int32)
        np.testing.assert_array_equal(np.asarray(x).view(np.uint16), rx)
        np.testing.assert_array_equal(np.asarray(y), ry)
    # a loader that yields torch tensors (bfloat16 included) goes to JAX the same way
    x, y = next(iter(ll.to_device(ll.DataLoader(loader("bfloat16").dataset, batch_size=3, shuffle=True, seed=6,
                                                output="torch"), cpu)))
    assert x.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(x).view(np.uint16), ref[0][0])
    np.testing.assert_array_equal(np.asarray(y), ref[0][1])
    if not jax.config.read("jax_enable_x64"):
        big = ll.ArrayDataset(np.zeros((2, 3), np.float32), np.array([1, 2**40], np.int64))
        with pytest.raises(ValueError, match="outside the int32 range"):
            next(iter(ll.to_device(ll.DataLoader(big, batch_size=2), cpu)))
    sharding = jax.sharding.SingleDeviceSharding(cpu)
    x, _ = next(iter(ll.to_device(loader("float32"), sharding)))
    assert x.dtype == jnp.float32 and x.sharding == sharding


# -- real CUDA (LOADERLIB_REAL_CUDA=1 on a machine with a GPU; skipped elsewhere) --------------

@pytest.fixture
def gpu():
    if not real_cuda(torch):
        pytest.skip("needs a GPU: run with LOADERLIB_REAL_CUDA=1 there (make device-check)")
    return torch.device("cuda", 0)


@pytest.mark.parametrize("pin", [False, True], ids=["pageable", "pinned"])
def test_to_device_cuda_same_batches_and_every_slot_back(gpu, pin):
    ref = [(x.copy(), y.copy()) for x, y in ll.DataLoader(_arrays(), batch_size=6, shuffle=True, seed=7)]
    loader = ll.DataLoader(_arrays(), batch_size=6, shuffle=True, seed=7, num_threads=2, pin_memory=pin)
    dev = ll.to_device(loader, gpu, prefetch=2)
    it = iter(dev)
    kept = []
    for x, y in it:
        assert x.device == gpu and y.device == gpu and x.dtype == torch.float32 and y.dtype == torch.int64
        kept.append((x, y))
    torch.cuda.synchronize()
    assert _leased(loader) == 0            # every copy done: every host slot back, batches still held
    assert len(kept) == len(ref)
    for (x, y), (rx, ry) in zip(kept, ref):
        np.testing.assert_array_equal(x.cpu().numpy(), rx)
        np.testing.assert_array_equal(y.cpu().numpy(), ry)


def test_to_device_cuda_copy_overlaps_a_busy_stream(gpu):
    # The model's stream is busy; the next batch's copy runs on the side stream meanwhile,
    # and the batch the user gets is correct on the model's stream (it waits for the copy's event).
    loader = ll.DataLoader(_arrays(), batch_size=5, num_threads=0, pin_memory=True)
    a = torch.randn(2048, 2048, device=gpu)
    got = []
    for x, y in ll.to_device(loader, gpu, prefetch=1):
        for _ in range(4):
            a = torch.tanh(a @ a)        # queued work on the current stream
        got.append((x * 1).cpu().numpy())
    np.testing.assert_array_equal(np.concatenate(got), np.arange(N * 6, dtype=np.float32).reshape(N, 2, 3))


def test_to_device_jax_gpu(gpu):
    jax = pytest.importorskip("jax")
    try:
        target = jax.devices("gpu")[0]
    except RuntimeError as e:
        pytest.skip(f"JAX sees no GPU ({e})")
    loader = ll.DataLoader(_arrays(), batch_size=6, shuffle=True, seed=8, num_threads=2)
    ref = [(x.copy(), y.copy()) for x, y in ll.DataLoader(_arrays(), batch_size=6, shuffle=True, seed=8)]
    got = [(np.asarray(x), np.asarray(y)) for x, y in ll.to_device(loader, target)]
    assert _leased(loader) == 0
    for (x, y), (rx, ry) in zip(got, ref):
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)
