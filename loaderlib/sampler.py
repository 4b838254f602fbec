"""Samplers: which sample indices an epoch visits, and in which order (Gluon semantics).

NOTE [ Sampler order is a pure function ]
Every sampler's order for an epoch is computed from ``(seed, epoch)`` alone (plus, for
``BatchSampler(last_batch="rollover")``, the carried-over tail of the previous epoch, which
is itself part of the sampler's small, serialisable state). Nothing depends on how far
earlier epochs were iterated, on thread timing or on global RNG state, so an interrupted
epoch can be resumed exactly by recomputing its order and skipping the batches already
delivered. ``order(epoch)`` gives the order without iterating; ``set_epoch`` chooses the
epoch the next ``iter()`` uses (the DataLoader calls it); without ``set_epoch`` every
``iter()`` moves on to the next epoch, so plain iteration reshuffles as users expect.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from . import _layout
from ._checks import check_int
from ._layout import LazyOrder, LazyPermutation, LazyRange, segment_items, shard_of

__all__ = [
    "LAST_BATCH_MODES",
    "BatchSampler",
    "EpochOrder",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "ShardShuffleSampler",
    "ShardedSampler",
    "WeightedRandomSampler",
]

LAST_BATCH_MODES = ("keep", "discard", "rollover")


def _check_length(length: Any, what: str = "length") -> int:
    return check_int(length, what)


def draw_seed() -> int:
    """A fresh 63-bit seed from the OS entropy pool (used when the caller gives none)."""
    return int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> np.uint64(1))


def _rng(seed: int, epoch: int, stream: int = 0) -> np.random.Generator:
    # SeedSequence mixes the words, so (seed, epoch) and (seed, epoch + 1) are independent.
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), int(epoch), stream])))


class Sampler:
    """Base class: an iterable of sample indices whose order depends only on (seed, epoch).

    Subclasses implement :meth:`order`. See NOTE [ Sampler order is a pure function ].
    """

    def __init__(self) -> None:
        self._next_epoch = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        d = self.__dict__.copy()
        d.pop("_lock", None)
        return d

    def __setstate__(self, d: dict) -> None:
        self.__dict__.update(d)
        self._lock = threading.Lock()

    def order(self, epoch: int, key: dict | None = None) -> np.ndarray:
        """The int64 indices visited in ``epoch``, in order.

        ``key`` is an :meth:`order_key` taken earlier (None: the current one); the order is a
        pure function of ``(seed, epoch, key)``.
        """
        raise NotImplementedError

    def order_key(self) -> dict:
        """What the order depends on besides ``(seed, epoch)``, as plain JSON (usually empty).

        A loader stores it with the epoch it drew, so a resumed epoch draws the same order
        even if the sampler changed since (see :meth:`WeightedRandomSampler.set_weights`).
        """
        return {}

    def key_for(self, epoch: int) -> dict:
        """The order key of ``epoch`` (:meth:`order_key`, unless an elastic resume gave that
        epoch its own part of the order: NOTE [ Elastic resume ] in ``_loader/elastic.py``)."""
        return self.order_key()

    def use_key(self, epoch: int, key: dict) -> None:
        """A resumed ``epoch`` runs with order key ``key`` (taken from a saved state)."""

    def state_dict(self) -> dict:
        """JSON-serialisable state: the next epoch and the order key."""
        return {"epoch": self._next_epoch, "key": self.order_key()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self._next_epoch = int(state.get("epoch", self._next_epoch))

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next ``iter()`` uses."""
        self._next_epoch = int(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` will use."""
        return self._next_epoch

    def _take_epoch(self) -> int:
        with self._lock:
            e = self._next_epoch
            self._next_epoch = e + 1
        return e

    def __iter__(self) -> Iterator[int]:
        order = self.order(self._take_epoch())
        return iter(order) if isinstance(order, LazyOrder) else iter(order.tolist())

    def __len__(self) -> int:
        raise NotImplementedError


class SequentialSampler(Sampler):
    """Visit ``0, 1, ..., length - 1`` (or ``start, ..., start + length - 1``) in order.

    Parameters
    ----------
    length : int
        Number of samples.
    start : int
        First index.
    """

    def __init__(self, length: int, start: int = 0) -> None:
        super().__init__()
        self._length = _check_length(length)
        self._start = int(start)

    def order(self, epoch: int, key: dict | None = None) -> Any:
        if self._length >= _layout.LAZY_MIN:   # NOTE [ Orders too large to hold ] in _layout.py
            return LazyRange(self._length, self._start)
        return np.arange(self._start, self._start + self._length, dtype=np.int64)

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return f"SequentialSampler({self._length})"


class RandomSampler(Sampler):
    """Visit every index in ``range(length)`` exactly once per epoch, in a random order.

    Parameters
    ----------
    length : int
        Number of samples.
    seed : int, optional
        The order of epoch ``e`` is a pure function of ``(seed, e)``; each epoch differs.
        None draws a seed once, at construction.
    """

    def __init__(self, length: int, seed: int | None = None) -> None:
        super().__init__()
        self._length = _check_length(length)
        self.seed = draw_seed() if seed is None else int(seed)

    def order(self, epoch: int, key: dict | None = None) -> Any:
        if self._length >= _layout.LAZY_MIN:   # NOTE [ Orders too large to hold ] in _layout.py
            return LazyPermutation(self._length, self.seed, epoch)
        return _rng(self.seed, epoch).permutation(self._length).astype(np.int64, copy=False)

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return f"RandomSampler({self._length}, seed={self.seed})"


class WeightedRandomSampler(Sampler):
    """Draw ``num_samples`` indices with probability proportional to ``weights``.

    Parameters
    ----------
    weights : sequence of float
        Non-negative weight per sample (need not sum to 1).
    num_samples : int, optional
        Indices per epoch (default: ``len(weights)``).
    replacement : bool
        Draw with replacement (default) or without.
    seed : int, optional
        As in :class:`RandomSampler`.

    Notes
    -----
    :meth:`set_weights` may be called at any time. A loader draws an epoch's order when the
    epoch starts, so new weights apply from the next epoch, or from the next batch drawn after
    ``loader.flush()``. The order is a pure function of ``(seed, epoch, weights, number of
    weight updates)``; :meth:`order_key` holds the last two, so a saved loader state resumes
    with the weights its epoch was drawn with.
    """

    def __init__(self, weights: Sequence[float], num_samples: int | None = None,
                 replacement: bool = True, seed: int | None = None) -> None:
        super().__init__()
        self.seed = draw_seed() if seed is None else int(seed)
        self.replacement = bool(replacement)
        self._weights = self._check_weights(weights)
        self._num = len(self._weights) if num_samples is None else _check_length(num_samples, "num_samples")
        if not self.replacement and self._num > np.count_nonzero(self._weights):
            raise ValueError("num_samples exceeds the number of non-zero weights (replacement=False)")
        self._version = 0

    @staticmethod
    def _check_weights(weights: Sequence[float]) -> np.ndarray:
        w = np.asarray(weights, dtype=np.float64).reshape(-1)
        if w.size == 0 or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise ValueError("weights must be finite, non-negative, not all zero")
        return w

    def set_weights(self, weights: Sequence[float]) -> None:
        """Replace the weights (same length); takes effect for indices not yet drawn."""
        w = self._check_weights(weights)
        if w.shape != self._weights.shape:
            raise ValueError(f"expected {self._weights.size} weights, got {w.size}")
        self._weights = w
        self._version += 1

    @property
    def weights(self) -> np.ndarray:
        return self._weights.copy()

    def order_key(self) -> dict:
        return {"version": self._version, "weights": self._weights.tolist()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        key = state.get("key") or {}
        if "weights" in key:
            w = self._check_weights(key["weights"])
            if w.shape != self._weights.shape:
                raise ValueError(f"saved state has {w.size} weights, this sampler {self._weights.size}")
            self._weights = w
            self._version = int(key.get("version", 0))

    def order(self, epoch: int, key: dict | None = None) -> np.ndarray:
        if key is None:
            version, weights = self._version, self._weights
        else:
            version, weights = int(key["version"]), self._check_weights(key["weights"])
        rng = _rng(self.seed, epoch, version)
        p = weights / weights.sum()
        return rng.choice(weights.size, size=self._num, replace=self.replacement, p=p).astype(np.int64)

    def __len__(self) -> int:
        return self._num


class ShardShuffleSampler(Sampler):
    """A shuffle for streaming reads of shards: shard order, then a bounded shuffle buffer.

    Each epoch the shards' order is shuffled, their samples are streamed shard by shard, and
    a buffer of ``buffer_size`` samples mixes them as ``tf.data``'s ``shuffle(buffer_size)``
    does (each output is a random element of the buffer, replaced by the next sample). Reads
    stay close to sequential (at most a few shards are open at a time) while batches still
    mix shards. The order is a pure function of ``(seed, epoch)``, so resume is exact.

    Parameters
    ----------
    shard_sizes : sequence of int
        Samples per shard, in dataset order (``RecordFileDataset.shard_sizes``,
        ``WebDataset.shard_sizes``).
    buffer_size : int
        Samples in the shuffle buffer (1: shard order only).
    seed : int, optional
        As in :class:`RandomSampler`.
    """

    def __init__(self, shard_sizes: Sequence[int], buffer_size: int = 1024, seed: int | None = None) -> None:
        super().__init__()
        self.shard_sizes = [_check_length(n, "a shard size") for n in shard_sizes]
        self.buffer_size = check_int(buffer_size, "buffer_size", minimum=1)
        self.seed = draw_seed() if seed is None else int(seed)
        self._starts = np.concatenate([[0], np.cumsum(self.shard_sizes)]).astype(np.int64)

    def order(self, epoch: int, key: dict | None = None) -> np.ndarray:
        rng = _rng(self.seed, epoch)
        perm = rng.permutation(len(self.shard_sizes))
        stream = np.concatenate([np.arange(self._starts[k], self._starts[k + 1], dtype=np.int64) for k in perm]
                                or [np.zeros(0, np.int64)])
        n, b = stream.size, min(self.buffer_size, stream.size)
        if b <= 1:
            return stream
        out = np.empty(n, np.int64)
        buf = stream[:b].copy()
        picks = rng.integers(0, b, size=n - b)
        for j in range(n - b):
            k = picks[j]
            out[j] = buf[k]
            buf[k] = stream[b + j]
        out[n - b:] = buf[rng.permutation(b)]
        return out

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __repr__(self) -> str:
        return f"ShardShuffleSampler({len(self.shard_sizes)} shards, buffer_size={self.buffer_size}, seed={self.seed})"


class ShardedSampler(Sampler):
    """One shard of an epoch's order, for one of ``num_shards`` ranks or devices.

    Every shard gets the same number of indices, so every rank runs the same number of
    batches (a rank that runs out first would deadlock a collective): with
    ``drop_last=False`` the order is padded by wrapping around to a multiple of
    ``num_shards``; with ``drop_last=True`` the tail is dropped instead. Shard ``k`` takes
    positions ``k, k + num_shards, ...`` of the (shuffled) order, so shards are disjoint
    apart from the padding.

    The full order is the same for every layout, so the states of all ranks, merged with
    :func:`loaderlib.merge_state_dicts`, resume on any number of shards: the rest of the epoch
    is split again (NOTE [ Elastic resume ] in ``_loader/elastic.py``).

    Parameters
    ----------
    num_shards, shard_id : int
        Number of shards and this one's position, ``0 <= shard_id < num_shards``.
    length : int, optional
        Dataset length. When omitted, the DataLoader binds it to ``len(dataset)``.
    shuffle : bool
        Shuffle the full order with ``(seed, epoch)`` before sharding (every rank must use
        the same seed).
    seed : int, optional
        Shared seed; None uses 0 so that ranks agree without coordination.
    drop_last : bool
        Drop the tail instead of padding.
    """

    def __init__(self, num_shards: int, shard_id: int, length: int | None = None, *,
                 shuffle: bool = False, seed: int | None = None, drop_last: bool = False) -> None:
        super().__init__()
        self.num_shards = check_int(num_shards, "num_shards", minimum=1)
        self.shard_id = check_int(shard_id, "shard_id", maximum=self.num_shards - 1)
        self.shuffle = bool(shuffle)
        self.seed = 0 if seed is None else int(seed)
        self.drop_last = bool(drop_last)
        self._length = None if length is None else _check_length(length)
        self._segment: tuple[int, dict] | None = None   # (epoch, what is left of it) after an elastic resume

    def bind(self, length: int) -> ShardedSampler:
        """A copy of this sampler for a dataset of ``length`` samples (used by DataLoader)."""
        s = ShardedSampler(self.num_shards, self.shard_id, length, shuffle=self.shuffle,
                           seed=self.seed, drop_last=self.drop_last)
        s._next_epoch = self._next_epoch
        s._segment = self._segment
        return s

    def layout(self) -> dict:
        """Where this shard sits: ``num_shards``, ``shard_id``, ``drop_last`` (plain JSON)."""
        return {"num_shards": self.num_shards, "shard_id": self.shard_id, "drop_last": self.drop_last}

    def global_order(self) -> dict:
        """What the full order (before sharding) is a function of, besides the epoch."""
        return {"shuffle": self.shuffle, "seed": self.seed}

    def key_for(self, epoch: int) -> dict:
        seg = self._segment
        return {"segment": seg[1]} if seg is not None and seg[0] == int(epoch) else {}

    def use_key(self, epoch: int, key: dict) -> None:
        self._segment = (int(epoch), key["segment"]) if key and "segment" in key else None

    def _need_length(self) -> int:
        if self._length is None:
            raise TypeError("ShardedSampler has no length: pass length=..., or give it to a DataLoader")
        return self._length

    def __len__(self) -> int:
        n, k = self._need_length(), self.num_shards
        return n // k if self.drop_last else -(-n // k)

    def full_order(self, epoch: int) -> Any:
        """The epoch's order before sharding: the same for every layout (a LazyOrder from
        LAZY_MIN samples on, NOTE [ Orders too large to hold ] in _layout.py)."""
        n = self._need_length()
        if n >= _layout.LAZY_MIN:
            return LazyPermutation(n, self.seed, epoch) if self.shuffle else LazyRange(n)
        return _rng(self.seed, epoch).permutation(n) if self.shuffle else np.arange(n, dtype=np.int64)

    def order(self, epoch: int, key: dict | None = None) -> Any:
        full = self.full_order(epoch)
        seg = (self.key_for(epoch) if key is None else key).get("segment")
        if seg is not None:   # an elastic resume: what was left of the epoch
            full = segment_items(full, seg)
        return shard_of(full, self.num_shards, self.shard_id, self.drop_last).astype(np.int64, copy=False)

    def __repr__(self) -> str:
        return f"ShardedSampler({self.num_shards}, {self.shard_id}, length={self._length})"


class EpochOrder:
    """One epoch as a stream of sample indices and the sizes of its batches.

    NOTE [ The epoch is one stream ]
    An epoch is the sampler's order (after the rollover carry of the previous epoch, if any)
    cut into batches of ``targets[k]`` samples. Batch ``k`` takes the next ``targets[k]``
    samples of the stream that load; with ``on_error="skip"`` a failed sample is replaced by
    the next one in the stream, so batch sizes hold and only the end of the epoch comes out
    shorter. A short last batch is delivered, except with ``last_batch="discard"``
    (``drop_short``), which never delivers a batch smaller than ``batch_size``: there the
    stream also holds the tail that ends no full batch, so skipped samples are replaced from
    it first. How far the stream has been consumed by delivered batches is the one number a
    resume needs (with the epoch, its carry and its order key).
    """

    __slots__ = ("carry_in", "carry_out", "drop_short", "epoch", "key", "stream", "targets")

    def __init__(self, epoch: int, stream: Any, targets: Any, drop_short: bool,
                 carry_in: np.ndarray, carry_out: np.ndarray, key: dict) -> None:
        self.epoch = epoch
        self.stream = stream
        self.targets = targets
        self.drop_short = drop_short
        self.carry_in = carry_in
        self.carry_out = carry_out
        self.key = key

    def batches(self) -> list[np.ndarray]:
        """The batches when every sample loads."""
        out, pos = [], 0
        for t in self.targets:
            out.append(self.stream[pos:pos + t])
            pos += t
        return out


class BatchSizes:
    """``[size] * full`` then ``tail`` (if not 0) as a sequence that holds three numbers: the
    batch sizes of an epoch too large to list (NOTE [ Orders too large to hold ] in _layout.py)."""

    __slots__ = ("full", "size", "tail")

    def __init__(self, full: int, size: int, tail: int) -> None:
        self.full, self.size, self.tail = int(full), int(size), int(tail)

    def __len__(self) -> int:
        return self.full + (1 if self.tail else 0)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        k = int(k) + (len(self) if k < 0 else 0)
        if not 0 <= k < len(self):
            raise IndexError(f"batch {k} out of range for an epoch of {len(self)} batches")
        return self.size if k < self.full else self.tail

    def __iter__(self) -> Iterator[int]:
        return (self[k] for k in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BatchSizes):
            return (self.full, self.size, self.tail) == (other.full, other.size, other.tail)
        return isinstance(other, list) and other == list(self)

    def __hash__(self) -> int:
        return hash((self.full, self.size, self.tail))


class BatchSampler:
    """Group a sampler's indices into batches (Gluon's ``last_batch`` semantics).

    Parameters
    ----------
    sampler : Sampler or iterable of int
        Source of indices. A :class:`Sampler` keeps the pure-function order (see
        NOTE [ Sampler order is a pure function ]).
    batch_size : int
        Samples per batch.
    last_batch : {"keep", "discard", "rollover"}
        What to do with a final batch smaller than ``batch_size``: yield it, drop it, or
        carry its samples over to the start of the next epoch.
    """

    def __init__(self, sampler: Any, batch_size: int, last_batch: str = "keep") -> None:
        check_int(batch_size, "batch_size", minimum=1)
        if last_batch not in LAST_BATCH_MODES:
            raise ValueError(f"last_batch must be one of {LAST_BATCH_MODES}, got {last_batch!r}")
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.last_batch = last_batch
        self._carry = np.zeros(0, np.int64)   # rollover samples waiting for the next epoch

    # -- state -----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """JSON-serialisable state (the rollover carry and the sampler's next epoch)."""
        d: dict = {"carry": self._carry.tolist()}
        if isinstance(self.sampler, Sampler):
            d["epoch"] = self.sampler.epoch
            d["sampler"] = self.sampler.state_dict()
        return d

    def load_state_dict(self, state: dict) -> None:
        self._carry = np.asarray(state.get("carry", []), np.int64)
        if isinstance(self.sampler, Sampler):
            if "sampler" in state:
                self.sampler.load_state_dict(state["sampler"])
            if "epoch" in state:
                self.sampler.set_epoch(state["epoch"])

    def set_epoch(self, epoch: int) -> None:
        if isinstance(self.sampler, Sampler):
            self.sampler.set_epoch(epoch)

    # -- batches ---------------------------------------------------------------------

    def plan_epoch(self, epoch: int, key: dict | None = None, carry: np.ndarray | None = None) -> EpochOrder:
        """The epoch's sample stream and batch sizes, without changing any state.

        ``key`` and ``carry`` default to the sampler's current order key and this batch
        sampler's rollover carry. See NOTE [ The epoch is one stream ].
        """
        if not isinstance(self.sampler, Sampler):
            raise TypeError("plan_epoch needs a loaderlib Sampler (its order is a pure function of the epoch)")
        key = self.sampler.key_for(int(epoch)) if key is None else key
        carry = self._carry if carry is None else np.asarray(carry, np.int64)
        return self._plan(self.sampler.order(int(epoch), key), epoch, key, carry)

    def _plan(self, order: Any, epoch: int, key: dict, carry: np.ndarray) -> EpochOrder:
        if isinstance(order, LazyOrder) and not (self.last_batch == "rollover" and carry.size):
            return self._plan_lazy(order, epoch, key)
        order = np.asarray(order, np.int64).reshape(-1)
        if order.size and int(order.min()) < 0:
            raise ValueError(f"the sampler gave a negative index ({int(order.min())}) in epoch {epoch}: indices "
                             "must be 0 <= i < len(dataset)")
        if self.last_batch == "rollover" and carry.size:
            stream = np.concatenate([carry, order])
        else:
            stream = order
            carry = np.zeros(0, np.int64)
        bs = self.batch_size
        nfull = stream.size // bs
        targets = [bs] * nfull
        carry_out = np.zeros(0, np.int64)
        if self.last_batch == "keep":
            if stream.size % bs:
                targets.append(stream.size % bs)
        elif self.last_batch == "rollover":
            carry_out = stream[nfull * bs:].copy()
            stream = stream[:nfull * bs]
        return EpochOrder(int(epoch), stream, targets, self.last_batch == "discard", carry, carry_out, key)

    def _plan_lazy(self, order: LazyOrder, epoch: int, key: dict) -> EpochOrder:
        """:meth:`_plan` of an order too large to hold (NOTE [ Orders too large to hold ] in
        _layout.py): the stream stays lazy and the batch sizes are a rule, not a list."""
        bs = self.batch_size
        nfull = order.size // bs
        tail = order.size % bs
        stream: Any = order
        carry_out = np.zeros(0, np.int64)
        if self.last_batch == "rollover":
            carry_out = order[nfull * bs:]
            stream = order.head(nfull * bs)
        targets = BatchSizes(nfull, bs, tail if self.last_batch == "keep" else 0)
        return EpochOrder(int(epoch), stream, targets, self.last_batch == "discard", np.zeros(0, np.int64),
                          carry_out, key)

    def next_epoch(self, epoch: int | None = None) -> EpochOrder:
        """Plan the next epoch (``epoch`` None: the sampler's next one) and move the sampler
        and the rollover carry on."""
        if isinstance(self.sampler, Sampler):
            e = self.sampler._take_epoch() if epoch is None else int(epoch)
            if epoch is not None:
                self.sampler.set_epoch(e + 1)
            plan = self.plan_epoch(e)
        else:
            order = np.fromiter((int(i) for i in self.sampler), dtype=np.int64)
            plan = self._plan(order, -1 if epoch is None else epoch, {}, self._carry)
        self._carry = plan.carry_out
        return plan

    def epoch_batches(self, epoch: int | None = None) -> list[np.ndarray]:
        """All batches of one epoch as int64 arrays; advances the rollover carry.

        ``epoch`` None takes the sampler's next epoch (and moves it on).
        """
        return self.next_epoch(epoch).batches()

    def __iter__(self) -> Iterator[list[int]]:
        for b in self.epoch_batches():
            yield b.tolist()

    def __len__(self) -> int:
        n = len(self.sampler)
        if self.last_batch == "keep":
            return (n + self.batch_size - 1) // self.batch_size
        if self.last_batch == "discard":
            return n // self.batch_size
        return int((n + self._carry.size) // self.batch_size)

    def __repr__(self) -> str:
        return f"BatchSampler({self.sampler!r}, {self.batch_size}, last_batch={self.last_batch!r})"
