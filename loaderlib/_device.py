"""Batches on the accelerator ahead of the model: :func:`to_device`.

The loader fills host arena slots; :func:`to_device` copies each batch to the device while
the model still computes on the previous one, and gives the host slot back to the loader as
soon as its copy has finished, not when the user drops the device batch.

NOTE [ Device copies release host slots ]
A host batch is a view of an arena slot; the slot is reused once every view is gone (NOTE
[ Slot leases ] in ``pyx/_arena.pyx``). The device iterator holds the host batch only while
its copy is in flight: with CUDA, the copy runs on a side stream and an event recorded after
it says when the host memory has been read (``event.query()``, checked on every ``next()``
and waited for at the end of the epoch); on the CPU, and for JAX on the CPU, the copy is
synchronous and the host batch is dropped at once. So the device batch the user keeps never
pins a host slot, and the loader's ring needs no extra slots for the model's working set.
The consumer's stream waits for the copy's event (no host synchronisation), and the device
tensors are recorded on it (``record_stream``) so torch's caching allocator does not hand
their memory to the next copy while the model may still read them.

NOTE [ Device iterator state ]
``to_device`` pulls up to ``prefetch`` batches ahead of the user, so the loader's own
``state_dict()`` counts batches the user has not seen. Each pulled batch carries the
host iterator's state taken right after it was pulled; when a batch is handed to the user,
that state becomes the device loader's state. Saving and loading it resumes exactly where
the user was, as with the plain loader.
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np

from ._checks import check_int
from ._tree import tree_map

__all__ = ["DeviceLoader", "to_device"]


def to_device(loader: Any, device: Any, prefetch: int = 2) -> DeviceLoader:
    """Iterate ``loader``'s batches on ``device``, copied ahead of the model.

    Parameters
    ----------
    loader : DataLoader or iterable of batches
        Batches are nested tuples, lists and dicts of numpy arrays (or torch tensors).
    device : str, torch.device, jax.Device or jax.sharding.Sharding
        A torch device (``"cuda"``, ``"cuda:1"``, ``"cpu"``) or a JAX device or sharding
        (``jax.device_put``'s second argument).
    prefetch : int
        Batches copied ahead of the one the user holds (default 2).

    Returns
    -------
    DeviceLoader
        Iterable like the loader; ``len``, ``set_epoch``, ``state_dict`` and
        ``load_state_dict`` pass through (the state counts batches delivered to the user).

    Notes
    -----
    torch: on CUDA the copy of batch ``k+1`` runs on a side stream while the model runs
    batch ``k``; pinned slots (``pin_memory=True``) make it asynchronous. ``"cpu"`` copies
    into fresh tensors, so the host slot is free at once. JAX: images and float arrays keep
    their dtype; int64 labels become int32 unless ``jax_enable_x64`` is on (JAX would
    truncate them anyway; values outside int32 raise). bfloat16 images (uint16 bits, NOTE
    [ bfloat16 as uint16 bits ]) arrive as real bfloat16 arrays in both frameworks.
    """
    return DeviceLoader(loader, device, prefetch)


def _is_jax(device: Any) -> bool:
    mod = type(device).__module__ or ""
    return mod.startswith(("jax", "jaxlib"))


def _bfloat16_first(loader: Any) -> bool:
    probe = getattr(loader, "_bfloat16_first", None)
    return bool(probe()) if callable(probe) else False


class _Copy:
    """One batch on its way: the device batch, the host batch while the copy reads it."""

    __slots__ = ("batch", "event", "host", "state")

    def __init__(self, batch: Any, host: Any, event: Any = None) -> None:
        self.batch = batch
        self.host = host
        self.event = event
        self.state: Any = None


class _TorchBackend:
    """Copies with torch: a side CUDA stream, or a plain clone on the CPU."""

    def __init__(self, device: Any, bfloat16: bool) -> None:
        import torch

        self.torch = torch
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"to_device: {device!r} is not a torch device ({e})") from None
        self.bfloat16 = bfloat16
        self.stream = None
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"to_device({str(self.device)!r}) needs torch with CUDA, which is not available "
                                 "here: pass device='cpu'")
            if self.device.index is not None and self.device.index >= torch.cuda.device_count():
                raise ValueError(f"to_device: {self.device} does not exist ({torch.cuda.device_count()} CUDA "
                                 "devices)")
            self.stream = torch.cuda.Stream(device=self.device)
        elif self.device.type != "cpu":
            raise ValueError(f"to_device supports torch devices 'cpu' and 'cuda', got {str(self.device)!r}")

    def _tensor(self, x: Any, first: bool) -> Any:
        torch = self.torch
        if isinstance(x, np.ndarray):
            if any(s < 0 for s in x.strides):
                x = np.ascontiguousarray(x)   # torch rejects negative strides
            t = torch.from_numpy(x)
            if first and self.bfloat16 and x.dtype == np.uint16:
                t = t.view(torch.bfloat16)
            return t
        return x

    def _move(self, batch: Any, fn: Any) -> Any:
        torch = self.torch

        def leaf(x: Any, first: bool) -> Any:
            t = self._tensor(x, first)
            return fn(t) if isinstance(t, torch.Tensor) else t

        if isinstance(batch, (tuple, list)) and batch:
            return type(batch)([tree_map(lambda x, k=k: leaf(x, k == 0), b) for k, b in enumerate(batch)])
        return tree_map(lambda x: leaf(x, True), batch)

    def start(self, host: Any) -> _Copy:
        torch = self.torch
        if self.stream is None:
            # A real copy (never a view of the slot): the slot is free as soon as this returns.
            return _Copy(self._move(host, lambda t: t.clone()), None)
        with torch.cuda.stream(self.stream):
            batch = self._move(host, lambda t: t.to(self.device, non_blocking=True))
            event = torch.cuda.Event()
            event.record(self.stream)
        return _Copy(batch, host, event)

    def ready(self, copy: _Copy) -> bool:
        return copy.event is None or bool(copy.event.query())

    def wait(self, copy: _Copy) -> None:
        if copy.event is not None:
            copy.event.synchronize()

    def deliver(self, copy: _Copy) -> Any:
        if copy.event is None:
            return copy.batch
        torch = self.torch
        current = torch.cuda.current_stream(self.device)
        current.wait_event(copy.event)

        def keep(t: Any) -> Any:
            if isinstance(t, torch.Tensor) and t.is_cuda:
                t.record_stream(current)
            return t

        tree_map(keep, copy.batch)
        return copy.batch


class _JaxBackend:
    """Copies with ``jax.device_put`` to a device or sharding."""

    def __init__(self, target: Any, bfloat16: bool) -> None:
        import jax

        self.jax = jax
        self.target = target
        self.bfloat16 = bfloat16
        devices = getattr(target, "device_set", None) or {target}
        self.on_cpu = all(getattr(d, "platform", "") == "cpu" for d in devices)
        self.x64 = bool(jax.config.read("jax_enable_x64"))

    def _host(self, x: Any, first: bool) -> Any:
        bf16 = first and self.bfloat16
        if type(x).__module__.startswith("torch") and hasattr(x, "numpy"):
            # A torch tensor (output="torch"): its numpy view (zero-copy on the CPU).
            import torch

            if x.dtype == torch.bfloat16:
                x, bf16 = x.detach().cpu().view(torch.int16).numpy().view(np.uint16), True
            else:
                x = x.detach().cpu().numpy()
        if not isinstance(x, np.ndarray):
            return x
        if x.dtype == np.int64 and not self.x64:
            # JAX keeps int64 only with jax_enable_x64; say so instead of truncating.
            if x.size and (x.min() < np.iinfo(np.int32).min or x.max() > np.iinfo(np.int32).max):
                raise ValueError("to_device: int64 values outside the int32 range, which JAX without "
                                 "jax_enable_x64 cannot hold: enable it (jax.config.update('jax_enable_x64', True))")
            return x.astype(np.int32)   # a new array: nothing of the slot is kept
        if self.on_cpu:
            # JAX may alias a 64-byte aligned host buffer on the CPU: the slot would then be
            # overwritten under the user's array. Copy it out of the slot first.
            x = np.array(x, copy=True)
        if bf16 and x.dtype == np.uint16:
            import ml_dtypes  # a JAX dependency

            x = x.view(ml_dtypes.bfloat16)
        return x

    def start(self, host: Any) -> _Copy:
        if isinstance(host, (tuple, list)) and host:
            staged = type(host)([tree_map(lambda x, k=k: self._host(x, k == 0), b) for k, b in enumerate(host)])
        else:
            staged = tree_map(lambda x: self._host(x, True), host)
        batch = tree_map(lambda x: self.jax.device_put(x, self.target) if isinstance(x, np.ndarray) else x, staged)
        return _Copy(batch, None if self.on_cpu else host)

    def ready(self, copy: _Copy) -> bool:
        done = True

        def check(a: Any) -> None:
            nonlocal done
            is_ready = getattr(a, "is_ready", None)
            if is_ready is not None and not is_ready():
                done = False

        tree_map(check, copy.batch)
        return done

    def wait(self, copy: _Copy) -> None:
        tree_map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready") else a, copy.batch)

    def deliver(self, copy: _Copy) -> Any:
        return copy.batch


class DeviceIterator:
    """One epoch of a :class:`DeviceLoader` (see NOTE [ Device copies release host slots ])."""

    def __init__(self, owner: DeviceLoader, host_it: Iterator) -> None:
        self._owner = owner
        self._backend = owner._backend
        self._host_it = host_it
        self._ahead: collections.deque[_Copy] = collections.deque()
        self._inflight: list[_Copy] = []   # delivered, copy maybe not finished: host still held
        self._host_done = False
        self.finished = False
        self._state = self._host_state()

    def __iter__(self) -> DeviceIterator:
        return self

    def _host_state(self) -> Any:
        fn = getattr(self._host_it, "state_dict", None)
        if fn is None:
            return None
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - raised again if the user asks for the state
            return e

    def _release(self) -> None:
        """Drop the host batches whose copies have finished (their slots go back to the loader)."""
        b = self._backend
        for c in self._ahead:
            if c.host is not None and b.ready(c):
                c.host = None
        keep = []
        for c in self._inflight:
            if b.ready(c):
                c.host = None
            else:
                keep.append(c)
        self._inflight = keep

    def _fill(self) -> None:
        while not self._host_done and len(self._ahead) < self._owner.prefetch:
            try:
                host = next(self._host_it)
            except StopIteration:
                self._host_done = True
                break
            copy = self._backend.start(host)
            host = None
            copy.state = self._host_state()
            self._ahead.append(copy)

    def __next__(self) -> Any:
        if self.finished:
            raise StopIteration
        try:
            self._fill()
            if not self._ahead:
                self.close()
                raise StopIteration
            copy = self._ahead.popleft()
            batch = self._backend.deliver(copy)
            self._state = copy.state
            if copy.host is not None:
                self._inflight.append(copy)
            copy.batch = None
            # Batch k+1's copy starts before the model sees batch k.
            self._fill()
            self._release()
        except StopIteration:
            raise
        except BaseException:
            self.close()
            raise
        return batch

    def state_dict(self) -> dict:
        """The host loader's state after the last batch this iterator returned."""
        s = self._state
        if isinstance(s, Exception):
            raise s
        if s is None:
            raise TypeError(f"{type(self._owner.loader).__name__} has no state_dict()")
        return s

    def close(self) -> None:
        """Wait for copies in flight, release their host slots and stop the host iterator."""
        if self.finished:
            return
        self.finished = True
        for c in [*self._inflight, *self._ahead]:
            if c.host is not None:
                self._backend.wait(c)
                c.host = None
        self._inflight = []
        self._ahead.clear()
        close = getattr(self._host_it, "close", None)
        if close is not None:
            close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass


class DeviceLoader:
    """A loader whose batches arrive on a device (made by :func:`to_device`)."""

    def __init__(self, loader: Any, device: Any, prefetch: int = 2, *, _backend: Any = None) -> None:
        check_int(prefetch, "prefetch", minimum=1)
        self.loader = loader
        self.device = device
        self.prefetch = int(prefetch)
        bf16 = _bfloat16_first(loader)
        if _backend is not None:
            self._backend = _backend
        elif _is_jax(device):
            self._backend = _JaxBackend(device, bf16)
        else:
            try:
                import torch  # noqa: F401
            except ImportError:
                raise ValueError(f"to_device({device!r}): a device string needs torch (pip install torch), or "
                                 "pass a jax.Device or jax.sharding.Sharding") from None
            self._backend = _TorchBackend(device, bf16)
        self._current: Any = None

    def __iter__(self) -> DeviceIterator:
        it = DeviceIterator(self, iter(self.loader))
        self._current = weakref.ref(it)
        return it

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        """Pass ``epoch`` on to the loader (``DataLoader.set_epoch``)."""
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict:
        """The position after the last batch delivered to the user (NOTE [ Device iterator state ])."""
        it = self._current() if self._current is not None else None
        if it is not None and not it.finished:
            return it.state_dict()
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` at the next ``iter()`` (``DataLoader.load_state_dict``)."""
        self.loader.load_state_dict(state)

    def __repr__(self) -> str:
        return f"DeviceLoader({self.loader!r}, device={self.device!r}, prefetch={self.prefetch})"
