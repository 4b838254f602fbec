"""Shard layouts: which positions of an epoch's global order each shard takes, and sets of
positions as compact JSON (NOTE [ Elastic resume ] in ``_loader/elastic.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import StateError

__all__ = ["LAZY_MIN", "LazyBlockShuffle", "LazyOrder", "LazyPermutation", "LazyRange", "LazyShard", "positions_from_json",
           "positions_to_json", "segment_items", "shard_of", "shard_positions"]


def shard_of(items: np.ndarray, num_shards: int, shard_id: int, drop_last: bool) -> Any:
    """Shard ``shard_id`` of ``items``: padded by wrapping around (or cut, ``drop_last``) to a
    multiple of ``num_shards``, then every ``num_shards``-th item from ``shard_id`` (a
    :class:`LazyShard` of a :class:`LazyOrder`)."""
    if isinstance(items, LazyOrder):
        return LazyShard(items, num_shards, shard_id, drop_last)
    return items[shard_positions(items.size, num_shards, drop_last)[shard_id::num_shards]]


def shard_positions(size: int, num_shards: int, drop_last: bool) -> np.ndarray:
    """The positions of ``size`` items that the shards of a layout take, in order: the padded
    (wrapped-around) or cut sequence that shard ``k`` takes every ``num_shards``-th item of."""
    per = size // num_shards if drop_last else -(-size // num_shards)
    total = per * num_shards
    return np.arange(total, dtype=np.int64) % size if size else np.zeros(0, np.int64)


def segment_items(full: np.ndarray, segment: dict) -> np.ndarray:
    """The items of what was left of an epoch (NOTE [ Elastic resume ]): the samples carried
    in (``extra``), then the full order at the ``positions`` not yet delivered."""
    extra = np.asarray(segment.get("extra", []), np.int64).reshape(-1)
    left = full[np.flatnonzero(positions_from_json(segment["positions"], full.size))]
    return np.concatenate([extra, left.astype(np.int64, copy=False)])


#: Up to this many runs a position set is written as ranges; past it, also as a compressed
#: bitmap, and the shorter one is kept.
_MAX_RANGES = 512


def positions_to_json(mask: np.ndarray) -> dict:
    """A set of positions, given as a boolean mask, as compact JSON: ``{"ranges": [start0,
    stop0, start1, stop1, ...]}`` or, when that is longer, ``{"bitmap": base64 of the zlib'd
    bits, "length": n}``."""
    m = np.asarray(mask, bool).reshape(-1)
    padded = np.zeros(m.size + 2, np.int8)
    padded[1:-1] = m
    edges = np.diff(padded)
    starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    ranges = {"ranges": np.stack([starts, stops], 1).reshape(-1).tolist()}
    if starts.size <= _MAX_RANGES:
        return ranges
    import base64  # noqa: PLC0415 - only elastic states need it (NOTE [ What import costs ])
    import zlib  # noqa: PLC0415

    bitmap: dict[str, Any] = {"bitmap": base64.b64encode(zlib.compress(np.packbits(m).tobytes(), 6)).decode("ascii"),
              "length": int(m.size)}
    digits = len(str(max(m.size, 1))) + 2
    return bitmap if len(bitmap["bitmap"]) < 2 * starts.size * digits else ranges


def positions_from_json(d: Any, length: int) -> np.ndarray:
    """The boolean mask over ``range(length)`` of :func:`positions_to_json`'s ``d``."""
    if isinstance(d, dict) and "ranges" in d:
        try:
            r = np.asarray(d["ranges"], np.int64).reshape(-1)
        except (TypeError, ValueError):
            raise StateError(f"the state's position ranges are not integers: {d['ranges']!r:.80}") from None
        if r.size % 2 or (r.size and (r[0] < 0 or r[-1] > length or np.any(np.diff(r) < 0))):
            raise StateError(f"the state's position ranges are not sorted pairs within [0, {length}]")
        delta = np.zeros(length + 1, np.int64)
        np.add.at(delta, r[0::2], 1)
        np.add.at(delta, r[1::2], -1)
        return np.cumsum(delta[:length]) > 0
    if isinstance(d, dict) and "bitmap" in d:
        import base64  # noqa: PLC0415
        import zlib  # noqa: PLC0415

        if int(d.get("length", -1)) != length:
            raise StateError(f"the state's position bitmap covers {d.get('length')!r} positions, not {length}")
        try:
            bits = np.frombuffer(zlib.decompress(base64.b64decode(d["bitmap"])), np.uint8)
        except (ValueError, zlib.error) as e:
            raise StateError(f"the state's position bitmap is corrupt: {e}") from None
        if bits.size * 8 < length:
            raise StateError(f"the state's position bitmap is too short for {length} positions")
        return np.unpackbits(bits, count=length).astype(bool)
    raise StateError(f"a position set is {{'ranges': [...]}} or {{'bitmap': ..., 'length': n}}, got {d!r:.80}")


# NOTE [ Orders too large to hold ]
# An epoch's order is an int64 array of every sample index: 8 bytes a sample, so a token corpus
# of 10^12 tokens in sequences of 2,048 (4.9 * 10^8 samples) needs 3.9 GB and seconds of
# numpy.random.permutation before its first batch, and a shard of it as much again. From
# LAZY_MIN samples on, the samplers give a LazyOrder instead: a sequence whose item at any
# position is computed when a batch asks for it, from O(1) state, so opening such a dataset
# and taking its first batch costs the same whatever its size. A shuffled order is a
# bijection of [0, n) (a 4-round Feistel network on the smallest power of 4 that holds n,
# walked until it lands below n: each walk is a step of the network's own permutation of
# that domain, so the result is a permutation of [0, n), and at most 4 steps are expected);
# its keys come from SeedSequence([seed, epoch, 7]), so the order is a pure function of
# (seed, epoch) like every sampler's (NOTE [ Sampler order is a pure function ] in
# ``sampler.py``). Below LAZY_MIN the orders stay numpy's permutations, as before. Slicing a
# LazyOrder gives a numpy array; ``numpy.asarray`` of one materialises it (the rollover carry
# and an elastic resume's leftover positions do: both are rare on such corpora).
LAZY_MIN = 1 << 24

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, on uint64 arrays (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _half_bits(n: int) -> int:
    """The half width ``h`` of the Feistel domain for ``n`` items: the smallest ``4**h >= n``."""
    h = 1
    while (1 << (2 * h)) < max(n, 2):
        h += 1
    return h


def _feistel(x: np.ndarray, half: Any, mask: Any, keys: Any) -> np.ndarray:
    """One pass of the network over ``x`` (uint64): a bijection of ``[0, 4**half)``; ``half``,
    ``mask`` and each key are scalars or arrays shaped as ``x``."""
    left, right = x >> half, x & mask
    for k in keys:
        left, right = right, left ^ (_mix(right ^ k) & mask)
    return (left << half) | right


def _walk(x: np.ndarray, n: Any, step: Any) -> np.ndarray:
    """Cycle walking: ``step(values, where)`` again on the items of ``x`` at or past ``n`` until
    every item is below it (``where``: the boolean mask of those items in ``x``)."""
    out = x >= n
    while out.any():
        x[out] = step(x[out], out)
        out = x >= n
    return x


class LazyOrder:
    """A sequence of ``size`` int64 sample indices computed on demand (NOTE [ Orders too large
    to hold ]): slices and integer arrays of positions give numpy arrays."""

    ndim = 1

    def __init__(self, size: int) -> None:
        self.size = int(size)

    @property
    def shape(self) -> tuple[int]:
        return (self.size,)

    def __len__(self) -> int:
        return self.size

    def _at(self, pos: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            start, stop, step = key.indices(self.size)
            return self._at(np.arange(start, stop, step, dtype=np.int64))
        if isinstance(key, (int, np.integer)):
            i = int(key) + (self.size if key < 0 else 0)
            if not 0 <= i < self.size:
                raise IndexError(f"position {key} out of range for an order of {self.size}")
            return int(self._at(np.asarray([i], np.int64))[0])
        pos = np.asarray(key, np.int64)
        if pos.size and (pos.min() < 0 or pos.max() >= self.size):
            raise IndexError(f"positions out of range for an order of {self.size}")
        return self._at(pos)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.empty(self.size, np.int64)
        step = 1 << 22
        for lo in range(0, self.size, step):
            out[lo:lo + step] = self._at(np.arange(lo, min(lo + step, self.size), dtype=np.int64))
        return out if dtype is None else out.astype(dtype)

    def __iter__(self) -> Any:
        step = 1 << 16
        for lo in range(0, self.size, step):
            yield from self[lo:lo + step].tolist()

    def tolist(self) -> list:
        return np.asarray(self).tolist()

    def head(self, n: int) -> LazyOrder:
        """The first ``n`` items (a view)."""
        return _Head(self, min(int(n), self.size))

    def astype(self, dtype: Any, copy: bool = True) -> Any:
        return self if np.dtype(dtype) == np.int64 and not copy else np.asarray(self).astype(dtype)


class _Head(LazyOrder):
    def __init__(self, base: LazyOrder, n: int) -> None:
        super().__init__(n)
        self.base = base

    def _at(self, pos: np.ndarray) -> np.ndarray:
        return self.base._at(pos)


class LazyRange(LazyOrder):
    """``start, start + 1, ...``: a sequential order of ``size`` items."""

    def __init__(self, size: int, start: int = 0) -> None:
        super().__init__(size)
        self.start = int(start)

    def _at(self, pos: np.ndarray) -> np.ndarray:
        return pos + self.start


class LazyPermutation(LazyOrder):
    """A seeded permutation of ``range(size)`` (NOTE [ Orders too large to hold ])."""

    ROUNDS = 4

    def __init__(self, size: int, seed: int, epoch: int) -> None:
        super().__init__(size)
        half = _half_bits(self.size)
        self._half = np.uint64(half)
        self._mask = np.uint64((1 << half) - 1)
        ss = np.random.SeedSequence([int(seed) & ((1 << 64) - 1), int(epoch), 7])
        self._keys = ss.generate_state(self.ROUNDS, np.uint64)

    def _at(self, pos: np.ndarray) -> np.ndarray:
        x = _feistel(pos.astype(np.uint64), self._half, self._mask, self._keys)
        return _walk(x, np.uint64(self.size), lambda v, _where: _feistel(v, self._half, self._mask,
                                                                         self._keys)).astype(np.int64)


class LazyShard(LazyOrder):
    """Shard ``shard_id`` of ``base`` as :func:`shard_of` takes it, without holding either."""

    def __init__(self, base: LazyOrder, num_shards: int, shard_id: int, drop_last: bool) -> None:
        n = base.size
        per = n // num_shards if drop_last else -(-n // num_shards)
        super().__init__(per if n else 0)
        self.base, self.num_shards, self.shard_id, self.n = base, int(num_shards), int(shard_id), n

    def _at(self, pos: np.ndarray) -> np.ndarray:
        return self.base._at((self.shard_id + pos * self.num_shards) % self.n)


class LazyBlockShuffle(LazyOrder):
    """The rows of consecutive blocks (``counts[b]`` rows each, in order) visited block after
    block in a seeded order of the blocks, each block's rows in a seeded order of their own:
    a shuffle that reads one block at a time (NOTE [ Shuffling in blocks ] in
    loaderlib/_datasets/tokens/dataset.py). A pure function of (seed, epoch)."""

    def __init__(self, counts: np.ndarray, seed: int, epoch: int) -> None:
        counts = np.asarray(counts, np.int64)
        super().__init__(int(counts.sum()))
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        ss = np.random.SeedSequence([int(seed) & ((1 << 64) - 1), int(epoch), 8])
        self._perm = np.random.Generator(np.random.PCG64(ss)).permutation(counts.size)
        self._counts = counts[self._perm]
        self._starts = starts[self._perm]                     # block starts, in visiting order
        self._cum = np.concatenate([[0], np.cumsum(self._counts)]).astype(np.int64)
        self._key = np.uint64(ss.generate_state(1, np.uint64)[0])
        self._half = np.array([_half_bits(n) for n in self._counts.tolist()], np.uint64)

    def _at(self, pos: np.ndarray) -> np.ndarray:
        j = np.searchsorted(self._cum, pos, side="right") - 1
        local = (pos - self._cum[j]).astype(np.uint64)
        n = self._counts[j].astype(np.uint64)
        half = self._half[j]
        mask = (np.uint64(1) << half) - np.uint64(1)
        keys = [_mix(self._key ^ (j.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ np.uint64(r))
                for r in range(LazyPermutation.ROUNDS)]
        x = _walk(_feistel(local, half, mask, keys), n,
                  lambda v, where: _feistel(v, half[where], mask[where], [k[where] for k in keys]))
        return self._starts[j] + x.astype(np.int64)
