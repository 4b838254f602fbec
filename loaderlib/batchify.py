"""Batchify functions: turn a list of samples into a batch (Gluon semantics).

A batchify function is any callable ``fn(samples) -> batch``. The classes here are
recognised by the DataLoader, which can run them natively (into a pre-planned arena slot)
instead of calling them; a user's own function moves collation to the Python engines.

Every class also has ``collate_into(samples, out)`` / ``plan(samples)`` used by the
engines to write straight into caller-owned (arena) memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._checks import check_int

__all__ = ["Pad", "Shards", "Stack", "Tuple", "default_batchify_fn"]


def _as_array(x: Any) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else np.asarray(x)


def _arrays(samples: Sequence[Any], verb: str) -> list[np.ndarray]:
    """The samples of a batch as arrays; ValueError for an empty batch."""
    arrs = [_as_array(s) for s in samples]
    if not arrs:
        raise ValueError(f"cannot {verb} an empty batch")
    return arrs


def _shared(arrs: list[np.ndarray], attr: str, who: str, hint: str = "") -> Any:
    """The ``attr`` ("shape" or "ndim") every sample shares with sample 0 (ValueError naming
    the first one that differs)."""
    ref = getattr(arrs[0], attr)
    for i, a in enumerate(arrs):
        if getattr(a, attr) != ref:
            raise ValueError(f"{who}: sample {i} has {attr} {getattr(a, attr)} but sample 0 has {attr} {ref}{hint}")
    return ref


def _fields(samples: Sequence[Any], n: int, who: str) -> list[list]:
    """The ``n`` fields of tuple samples, one list per field (ValueError naming the first
    sample that is not an ``n``-tuple)."""
    for i, s in enumerate(samples):
        if not isinstance(s, (tuple, list)) or len(s) != n:
            raise ValueError(f"{who}: sample {i} is not a {n}-tuple like sample 0")
    return [[s[k] for s in samples] for k in range(n)]


def _check_shards(num_shards: Any) -> int | None:
    return check_int(num_shards, "num_shards", minimum=1, allow_none=True)


class Shards(list):
    """The per-device shards of one batch: a list of views of one contiguous array.

    ``shards.batch`` is that array; shard ``k`` is ``batch[starts[k]:starts[k+1]]`` (no copy;
    each shard is itself C-contiguous, so it can be handed to a device copy directly).
    Shard sizes differ by at most one.
    """

    def __init__(self, batch: np.ndarray, num_shards: int):
        n = batch.shape[0]
        bounds = [n * k // num_shards for k in range(num_shards + 1)]
        super().__init__(batch[bounds[k]:bounds[k + 1]] for k in range(num_shards))
        self.batch = batch
        self.starts = bounds


def _shard(batch: np.ndarray, num_shards: int | None) -> Any:
    return batch if num_shards is None else Shards(batch, num_shards)


def finish_native(out: np.ndarray, part: Any) -> Any:
    """One output part of a natively collated batch: ``part`` is the part's ``num_shards``
    (Stack; None for a plain array) or its :class:`Pad` (NOTE [ Native Pad ])."""
    return part.from_stacked(out) if isinstance(part, Pad) else _shard(out, part)


class Stack:
    """Stack samples along a new first axis: ``(N, *sample_shape)``.

    Parameters
    ----------
    dtype : numpy dtype, optional
        Output dtype (default: the samples' common dtype; Python ints become int64).
    num_shards : int, optional
        Return a :class:`Shards` list of ``num_shards`` per-device views of the one stacked
        batch instead of the batch itself (split-aware collation: no second copy).
    """

    def __init__(self, dtype: Any = None, num_shards: int | None = None) -> None:
        self.dtype = None if dtype is None else np.dtype(dtype)
        self.num_shards = _check_shards(num_shards)

    def plan(self, samples: Sequence[Any]) -> tuple[tuple, np.dtype]:
        """Shape and dtype of the batch of ``samples``; ValueError if shapes differ."""
        arrs = _arrays(samples, "stack")
        shape = _shared(arrs, "shape", "Stack", "; use Pad for variable shapes")
        dtype = self.dtype or np.result_type(*arrs)
        return (len(arrs), *shape), dtype

    def collate_into(self, samples: Sequence[Any], out: np.ndarray) -> Any:
        """Write the stacked samples into ``out`` (shape from :meth:`plan`); return the batch."""
        for i, s in enumerate(samples):
            out[i] = s
        return _shard(out, self.num_shards)

    def __call__(self, samples: Sequence[Any]) -> Any:
        shape, dtype = self.plan(samples)
        out = np.empty(shape, dtype)
        return self.collate_into(samples, out)

    def __repr__(self) -> str:
        return f"Stack(dtype={self.dtype}, num_shards={self.num_shards})"


class Pad:
    """Pad samples to the largest shape in the batch, then stack.

    Parameters
    ----------
    axis : int or tuple of int, optional
        Axes to pad (default: every axis that differs).
    val : scalar
        Fill value of the padding.
    dtype : numpy dtype, optional
        Output dtype.
    ret_length : bool
        Also return the int64 array of each sample's original size along the first
        padded axis (as Gluon's ``Pad(ret_length=True)``).
    num_shards : int, optional
        As in :class:`Stack`.
    """

    def __init__(self, axis: Any = None, val: Any = 0, dtype: Any = None, ret_length: bool = False,
                 num_shards: int | None = None, pad_val: Any = None) -> None:
        self.axis = axis
        self.val = val if pad_val is None else pad_val
        self.dtype = None if dtype is None else np.dtype(dtype)
        self.ret_length = bool(ret_length)
        self.num_shards = _check_shards(num_shards)

    def plan(self, samples: Sequence[Any]) -> tuple[tuple, np.dtype]:
        arrs = _arrays(samples, "pad")
        ndim = _shared(arrs, "ndim", "Pad")
        shape = tuple(max(a.shape[d] for a in arrs) for d in range(ndim))
        if self.axis is not None:
            axes = {self.axis % ndim} if isinstance(self.axis, int) else {a % ndim for a in self.axis}
            for d in range(ndim):
                if d not in axes and any(a.shape[d] != shape[d] for a in arrs):
                    raise ValueError(f"Pad: samples differ along axis {d}, which is not padded")
        dtype = self.dtype or np.result_type(*arrs)
        return (len(arrs), *shape), dtype

    def _lengths(self, samples: Sequence[Any]) -> np.ndarray:
        ax = 0 if self.axis is None else (self.axis if isinstance(self.axis, int) else self.axis[0])
        return np.array([_as_array(s).shape[ax] if _as_array(s).ndim else 1 for s in samples], np.int64)

    def collate_into(self, samples: Sequence[Any], out: np.ndarray) -> Any:
        out[...] = self.val
        for i, s in enumerate(samples):
            a = _as_array(s)
            out[(i,) + tuple(slice(0, n) for n in a.shape)] = a
        batch = _shard(out, self.num_shards)
        return (batch, self._lengths(samples)) if self.ret_length else batch

    def __call__(self, samples: Sequence[Any]) -> Any:
        shape, dtype = self.plan(samples)
        return self.collate_into(samples, np.empty(shape, dtype))

    def from_stacked(self, out: np.ndarray) -> Any:
        """What :meth:`collate_into` returns for samples that all have ``out``'s sample shape and
        were already written into ``out`` (the native engine's arena slot).

        NOTE [ Native Pad ]
        On the native engine every sample of a field has the shape planned before the epoch
        (a fused chain's fixed output, an array's row), so padding to the largest sample pads
        nothing: the kernels write the samples into the slot exactly as for Stack, the pad
        value never appears, and the lengths (``ret_length``) are the planned size along the
        padded axis. Variable-size samples come from Python code, which collates in Python.
        """
        batch = _shard(out, self.num_shards)
        if not self.ret_length:
            return batch
        sample = out.shape[1:]
        ax = 0 if self.axis is None else (self.axis if isinstance(self.axis, int) else self.axis[0])
        return batch, np.full(out.shape[0], sample[ax] if sample else 1, np.int64)

    def __repr__(self) -> str:
        return f"Pad(axis={self.axis}, val={self.val!r}, ret_length={self.ret_length})"


class Tuple:
    """Apply one batchify function per field of tuple samples.

    ``Tuple(Stack(), Pad(val=-1))`` collates ``[(img, seq), ...]`` into
    ``(stacked images, padded sequences)``. Accepts the functions as separate arguments or
    as one list.
    """

    def __init__(self, fn: Any, *args: Any) -> None:
        fns = list(fn) if isinstance(fn, (list, tuple)) and not args else [fn, *args]
        for f in fns:
            if not callable(f):
                raise TypeError(f"Tuple: every field needs a callable batchify function, got {f!r}")
        self.fns = fns

    def __call__(self, samples: Sequence[Any]) -> tuple:
        if not samples:
            raise ValueError("cannot batchify an empty batch")
        fields = _fields(samples, len(self.fns), f"Tuple with {len(self.fns)} functions")
        return tuple(f(field) for f, field in zip(self.fns, fields))

    def __repr__(self) -> str:
        return f"Tuple({', '.join(map(repr, self.fns))})"


_STACK = Stack()


TOKEN_KEYS = ("input_ids", "labels", "position_ids", "cu_seqlens", "max_seqlen")
"""The keys of a token sample and of a token batch, in this order (NOTE [ Token batches ])."""


class TokenSample(dict):
    """One training sequence of a :class:`~loaderlib.TokenDataset` read from Python: ``input_ids``,
    ``labels`` and ``position_ids`` (1-D), with its ``cu_seqlens`` and ``max_seqlen``. The
    default batchify function collates such samples with :func:`collate_tokens`."""


def collate_tokens(samples: Sequence[Any]) -> dict:
    """The batch of token samples, equal to the native engine's (NOTE [ Token batches ] in
    loaderlib/_datasets/tokens/dataset.py): the rows stacked, and ``cu_seqlens`` over the
    flattened batch from where ``position_ids`` restart at 0 (a segment's first token)."""
    ids = _STACK([s["input_ids"] for s in samples])
    lab = _STACK([s["labels"] for s in samples])
    pos = _STACK([s["position_ids"] for s in samples])
    flat = pos.reshape(-1)
    cu = np.append(np.flatnonzero(flat == 0), flat.size).astype(np.int32)
    return {"input_ids": ids, "labels": lab, "position_ids": pos, "cu_seqlens": cu,
            "max_seqlen": int(np.diff(cu).max()) if cu.size > 1 else 0}


def default_batchify_fn(samples: Sequence[Any]) -> Any:
    """Gluon's default: stack arrays and numbers; collate tuples field by field.

    Python ints become int64, floats float64; strings and other objects are returned as a list;
    token samples (:class:`TokenSample`) are collated by :func:`collate_tokens`.
    """
    if not samples:
        raise ValueError("cannot batchify an empty batch")
    first = samples[0]
    if isinstance(first, TokenSample):
        return collate_tokens(samples)
    if isinstance(first, (tuple, list)):
        return tuple(default_batchify_fn(field) for field in _fields(samples, len(first), "default_batchify_fn"))
    if isinstance(first, dict):
        return {k: default_batchify_fn([s[k] for s in samples]) for k in first}
    if isinstance(first, (str, bytes)):
        return list(samples)
    return _STACK(samples)
