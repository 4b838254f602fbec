"""Shard layouts: which positions of an epoch's global order each shard takes, and sets of
positions as compact JSON (NOTE [ Elastic resume ] in ``_loader/elastic.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import StateError

__all__ = ["positions_from_json", "positions_to_json", "segment_items", "shard_of", "shard_positions"]


def shard_of(items: np.ndarray, num_shards: int, shard_id: int, drop_last: bool) -> np.ndarray:
    """Shard ``shard_id`` of ``items``: padded by wrapping around (or cut, ``drop_last``) to a
    multiple of ``num_shards``, then every ``num_shards``-th item from ``shard_id``."""
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
