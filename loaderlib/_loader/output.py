"""What a delivered batch becomes: the loader's post-steps (its ``batch_transform``, then
torch tensors for ``output="torch"``) and the checks behind ``output`` and ``pin_memory``."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import transforms as T
from .._engines.base import RunState
from .._tree import tree_map
from .analysis import _steps, _unwrap

# NOTE [ Batch output ]
# output="torch" converts at the last moment, in the consumer's thread: every numpy leaf of
# the batch becomes ``torch.from_numpy(leaf)``, which shares the slot's memory and keeps the
# numpy view (and so the slot's lease, NOTE [ Slot leases ]) alive for as long as the tensor
# lives. Nothing is copied and the engines stay framework-free. A torch Dataset gets tensors
# back without asking: its samples were tensors, and PyTorch code expects tensors.


def _output_kind(output: str | None, dataset: Any) -> str:
    if output is None:
        base = _unwrap(dataset)[0]
        base = getattr(base, "_data", base)   # SimpleDataset wraps plain sequences
        torch_ds = any(c.__name__ in ("Dataset", "IterableDataset") and c.__module__.startswith("torch")
                       for c in type(base).__mro__)
        return "torch" if torch_ds else "numpy"
    if output not in ("numpy", "torch"):
        raise ValueError(f"output must be 'numpy' or 'torch', got {output!r}")
    if output == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ValueError("output='torch' needs PyTorch (pip install torch)") from None
    return output


def _pin_device(spelling: str) -> Any:
    """``pin_memory_device`` as a torch.device; only CUDA devices can be pinned for."""
    try:
        import torch

        dev = torch.device(spelling)
    except ImportError:
        return None  # nothing to pin for without torch: _check_pin warns and loads unpinned
    except (RuntimeError, TypeError):
        raise ValueError(f"pin_memory_device={spelling!r} is not a device (e.g. 'cuda' or 'cuda:1')") from None
    if dev.type != "cuda":
        raise ValueError(f"pin_memory_device={spelling!r}: slots can be pinned for CUDA devices only ('cuda', "
                         "'cuda:N')")
    return dev


def _torch_leaf(x: Any, bf16: bool) -> Any:
    import torch

    if not isinstance(x, np.ndarray):
        return x
    if any(s < 0 for s in x.strides):
        x = np.ascontiguousarray(x)   # torch rejects negative strides (a user batchify's view)
    t = torch.from_numpy(x)
    return t.view(torch.bfloat16) if bf16 and x.dtype == np.uint16 else t


def to_torch(batch: Any, bfloat16_first: bool = False) -> Any:
    """A batch's numpy leaves as torch tensors sharing their memory (NOTE [ Batch output ])."""
    if isinstance(batch, (tuple, list)) and batch and type(batch) in (tuple, list):
        return type(batch)(tree_map(lambda x, k=k: _torch_leaf(x, bfloat16_first and k == 0), b)
                           for k, b in enumerate(batch))
    return tree_map(lambda x: _torch_leaf(x, bfloat16_first), batch)


def bfloat16_first(dataset: Any) -> bool:
    """Whether the batch's first field holds bfloat16 bits (NOTE [ bfloat16 as uint16 bits ])."""
    _, layers = _unwrap(dataset)
    name = None
    for first, fn in layers:
        if not first and not isinstance(fn, T.Transform):
            continue
        for t in _steps([fn]):
            if isinstance(t, (T.Normalize, T.Cast)):
                name = t.dtype
    return name == "bfloat16"


def _pin_usable(pin_memory_device: str) -> bool:
    """Whether ``pin_memory=True`` can be honoured here; False after a warning when there is
    no CUDA (the loader then loads unpinned)."""
    # NOTE [ pin_memory without CUDA ]: pinned memory only speeds up copies to a GPU, so on a
    # machine without one there is nothing to honour: like PyTorch's DataLoader, warn (once per
    # loader, naming the keyword) and load into ordinary memory, so a script written for GPU
    # nodes runs unchanged on a CPU laptop or CI. What cannot be honoured where CUDA exists (a
    # device index it does not have, a device that is not CUDA) still raises.
    try:
        import torch  # optional dependency

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if not cuda:
        keyword = "pin_memory=True" + (f", pin_memory_device={pin_memory_device!r}" if pin_memory_device else "")
        warnings.warn(f"{keyword}: no CUDA device (or no torch with CUDA) here, so batches are loaded into "
                      "ordinary, unpinned memory (pinned memory only speeds up copies to a GPU)",
                      UserWarning, stacklevel=3)
        return False
    if pin_memory_device:
        dev = _pin_device(pin_memory_device)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"pin_memory_device={pin_memory_device!r}: this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s)")
    return True


@dataclass(frozen=True)
class BatchTransformStep:
    """The loader's ``batch_transform`` on each delivered batch, keyed by (seed, epoch, index
    of the batch in the epoch): a post-step of :class:`~loaderlib.loader.LoaderIterator`."""

    op: T.BatchTransform

    def __call__(self, batch: Any, state: RunState) -> Any:
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise TypeError(f"batch_transform {type(self.op).__name__} needs (images, labels) batches, got "
                            f"{type(batch).__name__}")
        images, soft = self.op(batch[0], batch[1], seed=state.seed, epoch=state.epoch,
                               batch_index=state.delivered - 1)
        if isinstance(batch, tuple):
            kind: type = type(batch)   # a tuple subclass stays one
            return kind((images, soft))
        return [images, soft]


@dataclass(frozen=True)
class TorchStep:
    """Each batch as torch tensors sharing its memory (``output="torch"``; NOTE [ Batch
    output ]): a post-step of :class:`~loaderlib.loader.LoaderIterator`."""

    bfloat16_first: bool = False

    def __call__(self, batch: Any, state: RunState) -> Any:
        return to_torch(batch, self.bfloat16_first)
