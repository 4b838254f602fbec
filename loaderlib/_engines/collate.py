"""Python samples collated into arena memory: the threads engine, worker processes and
iterable datasets all collate this way.

A batchify function of ours (``Stack``, ``Pad``, ``Tuple`` or the default) is planned first:
the batch's arrays become parts of one arena layout and the samples are written straight
into them; any other function is called as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .._observe.recorder import Recorder
from ..arena import BatchArena, BatchLayout
from ..batchify import Pad, Stack, Tuple, default_batchify_fn
from .base import _clock

# A planned collation: the batch's arrays as (shape, dtype) parts, and the function that
# writes the samples into views of them and returns the batch.
Plan = tuple[list, Callable[[Iterator[np.ndarray]], Any]]


def plan_collate(fn: Any, samples: Sequence[Any]) -> Plan | None:
    """Plan collating ``samples`` with ``fn`` into arena memory.

    Returns ``(parts, build)``: the batch's arrays as ``(shape, dtype)`` parts, and
    ``build(views)`` that writes the samples into views of those parts (an iterator, consumed
    in order) and returns the batch. None when ``fn`` is a user function or the samples
    hold something that is not an array; the caller then calls ``fn`` itself.
    """
    if fn is None or fn is default_batchify_fn:
        first = samples[0]
        if isinstance(first, (tuple, list)):
            return _plan_columns([None] * len(first), samples)
        if isinstance(first, (np.ndarray, np.generic, int, float)) and not isinstance(first, bool):
            fn = Stack()
        else:
            return None
    if isinstance(fn, (Stack, Pad)):
        try:
            shape, dtype = fn.plan(samples)
        except (ValueError, TypeError):
            return None  # let fn itself raise its error
        if dtype == object:
            return None
        return [(shape, dtype)], lambda views: fn.collate_into(samples, next(views))
    if isinstance(fn, Tuple):
        return _plan_columns(fn.fns, samples)
    return None


def _plan_columns(fns: Sequence[Any], samples: Sequence[Any]) -> Plan | None:
    """Plan a batch of tuples column by column, column ``k`` with ``fns[k]`` (None: the default)."""
    n = len(fns)
    if any(not isinstance(s, (tuple, list)) or len(s) != n for s in samples):
        return None
    subs: list[Plan] = []
    for k, f in enumerate(fns):
        sub = plan_collate(f, [s[k] for s in samples])
        if sub is None:
            return None
        subs.append(sub)
    return [part for p in subs for part in p[0]], lambda views: tuple(p[1](views) for p in subs)


def collate(fn: Any, samples: list, arena: BatchArena | None) -> Any:
    """``fn(samples)``, written into an arena slot when :func:`plan_collate` can plan it."""
    planned = plan_collate(fn, samples) if arena is not None else None
    if planned is None or arena is None:
        return (fn or default_batchify_fn)(samples)
    parts, build = planned
    _lease, views = arena.acquire(BatchLayout.of(parts))
    return build(iter(views))


def collate_recorded(fn: Any, samples: list, arena: BatchArena | None, rec: Recorder, stage_ns: dict, t0: int,
                     threads: int) -> Any:
    """Collate a Python engine's samples and record the batch's stages (None when empty).

    ``t0`` is when the batch's work started, never before the previous batch's end
    (NOTE [ Batch wall time ]).
    """
    if not samples:
        return None
    t_col = _clock()
    batch = collate(fn, samples, arena)
    if rec.enabled:
        now = _clock()
        rec.batch_done(len(samples), {**stage_ns, "collate": now - t_col}, now - t0, threads)
    return batch

