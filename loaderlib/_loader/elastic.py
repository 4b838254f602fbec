"""Elastic resume: the states of every rank merged into one global state
(:func:`merge_state_dicts`), and a merged state turned into one rank's state of any layout.

NOTE [ Elastic resume ]
A loader sharded by ``ShardedSampler(num_shards, shard_id)`` walks one *global order* per
epoch, a pure function of ``(sampler seed, shuffle, epoch)`` that does not depend on the
layout; shard ``k`` takes positions ``k, k + num_shards, ...`` of it, padded by wrapping
around (or cut, ``drop_last``) so that every shard has the same length. Each rank's state
records its layout (NOTE [ Iterator state ] holds the rest), so a state loaded into another
layout is refused instead of repeating or losing samples. :func:`merge_state_dicts` turns the
states of all ranks into one: the epoch, the global order's key, and the *global positions*
delivered (a rank's ``position`` consumed samples ``k, k + num_shards, ...`` of its shard), as
compact ranges or a compressed bitmap (``_layout.positions_to_json``). The positions not
delivered (and not cut by ``drop_last``) are what is left of the epoch. Loaded into a loader of
the same layout, a merged state gives each rank back its own position, so the resume is
bitwise the one of its own state. Into another layout, what is left is split again: the rest
of the epoch becomes a *segment* (the samples carried in by ``last_batch="rollover"``, then the
global order at the positions left), which the new ranks shard as they would a fresh epoch
(same padding and ``drop_last`` rules), so every rank runs the same number of batches and no
sample is delivered twice beyond the padding. The segment travels in the epoch's order key
(``{"segment": ...}``), so the new ranks' own states, merged again, resume again; the next
epoch has no segment and equals a fresh run of the new layout (with rollover, but for the
samples carried into it).

NOTE [ One state for every rank ]
Lightning (2.2 on), Accelerate's ``register_for_checkpointing`` and Composer save the loader
state of global rank 0 only and load that one state on every rank. Synchronous data
parallelism is what makes that enough: every rank delivered the same number of batches. A
loader whose position is a function of that count alone (``on_error="raise"``: no rank can
have replaced a failed sample with a later one; nothing carried in by ``last_batch=
"rollover"``, whose samples are each rank's own) records ``"lockstep": true`` in its state,
and such a state locates every rank: rank ``r`` of the saved layout stands where the saving
rank stands in its own shard. :func:`spread` writes that down as the merged state of the whole
run (the saving rank's state repeated for each rank), which :func:`localize` applies as it
applies any merged state: on the saved layout each rank continues its own shard bitwise, on
another the rest of the epoch is split again. The loader's ``explain()`` then says that the
state was applied this way. A state without the mark (``on_error="skip"``, a state of an
older loaderlib) or with a rollover carry cannot locate the other ranks: loaded into another
rank it raises :class:`~loaderlib.StateError` saying to merge, and ``merge_state_dicts`` of
every rank's state stays the exact path when ranks stopped at different steps.

An iterable sharded by the loader's ``rank``/``world_size`` (NOTE [ Iterable shards ]) is read
by every rank in full, and rank ``r`` keeps item ``r`` of each round of ``world_size``. Its
position is the iterable's own state; it can be split again only where every rank stopped
after the same round (then the iterable's state is the same on every rank and the next round
starts there); otherwise merging raises :class:`~loaderlib.StateError` saying why.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import numpy as np

from .._layout import positions_from_json, positions_to_json
from ..errors import StateError
from ..sampler import ShardedSampler

__all__ = ["STATE_VERSION", "describe_layout", "localize", "merge_state_dicts", "spread"]

#: Version of the dict ``DataLoader.state_dict()`` returns; bumped when its meaning changes.
STATE_VERSION = 1

#: Fields every rank of one run shares (the run's identity) and what a message calls them.
_RUN = (("dataset_length", "dataset length"), ("batch_size", "batch size"), ("last_batch", "last_batch mode"),
        ("sampler", "sampler"), ("order", "global order"), ("layout_size", "layout"))


def describe_layout(layout: dict | None, sampler: str) -> str:
    """A layout in words, for messages."""
    if not layout:
        return f"{sampler} (no shard layout recorded)"
    if "world_size" in layout:
        return f"rank {layout['rank']} of world_size {layout['world_size']}"
    return (f"shard {layout['shard_id']} of ShardedSampler(num_shards={layout['num_shards']}, "
            f"drop_last={layout['drop_last']})")


# The most ranks a state may name: the work of a merge grows with the world size, which a
# hostile state sets (NOTE [ Hostile states ]); a million ranks is far beyond any job.
MAX_WORLD = 1 << 20


def _check_world(world: int) -> None:
    if not 0 < world <= MAX_WORLD:
        raise StateError(f"the state names a world of {world} ranks (1 to {MAX_WORLD})")


def _rank_of(state: dict) -> int:
    lay = state.get("layout") or {}
    return int(lay["shard_id"] if "shard_id" in lay else lay.get("rank", 0))


def _run_fields(state: dict) -> dict:
    lay = state.get("layout") or {}
    size = {k: lay[k] for k in ("num_shards", "drop_last", "world_size") if k in lay}
    return {"dataset_length": state.get("dataset_length"), "batch_size": state.get("batch_size"),
            "last_batch": state.get("last_batch"), "sampler": state.get("sampler"), "order": state.get("order"),
            "layout_size": size}


def merge_state_dicts(states: Iterable[dict]) -> dict:
    """Merge the loader states of every rank of a run into one global state.

    The merged state resumes on any number of ranks, threads, workers and any engine: load it
    with ``loader.load_state_dict(merged)`` on every rank of the new job. The rest of the
    epoch is split evenly over the new ranks (every rank runs the same number of batches; the
    sampler's padding and ``drop_last`` rules apply, nothing else is repeated or lost), and
    the epochs after it equal a fresh run of the new layout. On the layout the states were
    saved under, the resume is bitwise the one of each rank's own state (NOTE [ Elastic
    resume ]).

    Parameters
    ----------
    states : iterable of dict
        ``loader.state_dict()`` of every rank, in any order: loaders sharded by
        :class:`~loaderlib.ShardedSampler`, or iterable datasets sharded by the loader's own
        ``rank``/``world_size``.

    Returns
    -------
    dict
        Plain JSON: ``epoch``, the global order's key (``seed``, ``order``, ``order_key``),
        the layout it was saved under, the global positions ``delivered`` and ``remaining``
        (ranges or a compressed bitmap), samples carried in and not yet delivered
        (``pending``), and each rank's own position (``ranks``).

    Raises
    ------
    StateError
        A rank is missing or given twice, the states come from different runs (dataset
        length, batch size, sampler, layout), epochs or seeds, a state is not a loader state,
        or an iterable's states cannot be split again; the message says which.
    """
    try:
        return _merge(list(states))
    except StateError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as e:
        # NOTE [ Hostile states ]: a state comes from a file; one this loaderlib did not write
        # (damaged, edited, another program's) is a StateError naming what failed, never
        # another exception (fuzz/fuzz_parsers.py, target "state").
        raise StateError(f"not a loader state this loaderlib can merge ({type(e).__name__}: {str(e)[:80]})") from None


def _merge(states: list) -> dict:
    if not states:
        raise StateError("merge_state_dicts got no states: pass the state_dict() of every rank")
    for i, st in enumerate(states):
        if not isinstance(st, dict):
            raise StateError(f"state {i} is a {type(st).__name__}, not a loader state (a dict)")
        if st.get("kind") == "merged":
            raise StateError(f"state {i} is already merged: merge the states of the ranks of one run")
        if st.get("version") != STATE_VERSION:
            raise StateError(f"state {i} has version {st.get('version')!r}, this loaderlib reads {STATE_VERSION}")
        if not st.get("layout"):
            raise StateError(f"state {i} records no shard layout (sampler {st.get('sampler')!r}): merging needs the "
                             "states of loaders sharded by ShardedSampler, or of an iterable dataset sharded by "
                             "the loader's rank and world_size")
        if "stream" in st:
            raise StateError(f"state {i} holds an explicit stream (a sampler that is not a loaderlib Sampler): "
                             "it cannot be merged")
    by_rank = _check_run(states)
    if states[0].get("sampler") == "iterable":
        return _merge_iterable(by_rank)
    return _merge_sharded(by_rank)


def _check_run(states: list[dict]) -> list[dict]:
    """The states ordered by rank, after checking that they are every rank of one run, once."""
    first = states[0]
    r0 = _rank_of(first)
    for st in states[1:]:
        r = _rank_of(st)
        a, b = _run_fields(first), _run_fields(st)
        for key, what in _RUN:
            if a[key] != b[key]:
                raise StateError(f"states of different runs: rank {r0} has {what} {a[key]!r}, rank {r} has "
                                 f"{b[key]!r}")
        if st.get("seed") != first.get("seed") and (st.get("seed_given") is not False
                                                     or first.get("seed_given") is not False):
            raise StateError(f"states of different seeds: rank {r0} has seed {first.get('seed')!r}, rank {r} has "
                             f"{st.get('seed')!r}: build every rank's loader with the same seed=, or without one "
                             "on every rank (a drawn seed only keys augmentation; the order comes from the "
                             "sampler's seed)")
        if st.get("epoch") != first.get("epoch"):
            raise StateError(f"states of different epochs: rank {r0} is in epoch {first.get('epoch')!r}, rank {r} "
                             f"in epoch {st.get('epoch')!r}; merge states saved at the same step")
        if st.get("order_key") != first.get("order_key"):
            raise StateError(f"states of different runs: ranks {r0} and {r} run epoch {first.get('epoch')} with "
                             "different order keys (resumed from different merged states)")
    lay = first["layout"]
    world = int(lay["num_shards"] if "num_shards" in lay else lay["world_size"])
    seen: dict[int, dict] = {}
    for st in states:
        r = _rank_of(st)
        if r in seen:
            raise StateError(f"rank {r} appears twice among the {len(states)} states (world size {world})")
        seen[r] = st
    _check_world(world)
    missing = sorted(set(range(world)) - set(seen))
    if missing:
        raise StateError(f"the states of ranks {missing} are missing: {len(states)} states for world size {world}; "
                         "pass the state of every rank")
    return [seen[r] for r in range(world)]


def spread(state: dict, mine: dict) -> dict:
    """The merged state of a run whose ranks ran in step, from the state of one of its ranks
    (NOTE [ One state for every rank ]), for the loader with header ``mine``.

    Raises
    ------
    StateError
        The state cannot locate the other ranks (not saved in lockstep, or carrying rollover
        samples); the message says why and to merge.
    """
    saved, sampler = state.get("layout") or {}, str(state.get("sampler"))

    def refuse(why: str) -> StateError:
        return StateError(f"this state was saved by {describe_layout(saved, sampler)}, but this loader is "
                          f"{describe_layout(mine.get('layout'), sampler)}, and {why}. Gather the states of every "
                          "rank and load ll.merge_state_dicts(states), which resumes on any number of ranks")

    if state.get("lockstep") is False:
        raise refuse("it was saved with on_error='skip', so ranks that delivered as many batches may stand at "
                     "different samples: one rank's state cannot locate the others")
    if not state.get("lockstep"):
        raise refuse("it does not record that ranks ran in step (a state of an older loaderlib): one rank's "
                     "state resumes only the layout it was saved under")
    if state.get("carry"):
        raise refuse(f"it carries {len(state['carry'])} samples of its own shard into the epoch "
                     "(last_batch='rollover'), which differ from rank to rank")
    key = "shard_id" if "shard_id" in saved else "rank"
    world = int(saved["num_shards"] if key == "shard_id" else saved["world_size"])
    _check_world(world)
    states = []
    for r in range(world):
        st = dict(state, layout={**saved, key: r})
        if key == "rank":
            st["rank"] = r
        states.append(st)
    return _merge_iterable(states) if sampler == "iterable" else _merge_sharded(states)


def _merge_sharded(ranks: list[dict]) -> dict:
    first = ranks[0]
    n = int(first["dataset_length"])
    lay = first["layout"]
    k, drop = int(lay["num_shards"]), bool(lay["drop_last"])
    seg = (first.get("order_key") or {}).get("segment")
    if seg is not None:
        extra = [int(v) for v in seg.get("extra", [])]
        spos = np.flatnonzero(positions_from_json(seg["positions"], n))
    else:
        extra, spos = [], np.arange(n, dtype=np.int64)
    x = len(extra)
    size = x + spos.size                            # the epoch's items: extra, then positions spos
    per = size // k if drop else -(-size // k)      # shard r takes items r, r + k, ... (mod size) of per * k
    done = np.zeros(size, bool)
    carried: list[int] = []
    for r, st in enumerate(ranks):
        carry = [int(v) for v in st.get("carry", [])]
        q = int(st["position"])
        if not 0 <= q <= len(carry) + per:
            raise StateError(f"rank {r}'s position {q} is outside its shard ({len(carry)} carried + {per} samples)")
        carried += carry[q:]
        j = max(0, q - len(carry))
        if j and size:
            done[np.arange(r, r + j * k, k) % size] = True
    untouched = seg is None and not any(int(st["position"]) for st in ranks)
    owed = np.ones(size, bool) if untouched else np.zeros(size, bool)
    owed[:per * k] = True                           # all of them, or what drop_last keeps
    left = owed & ~done
    if seg is None:
        delivered, remaining = done, left
    else:
        delivered, remaining = np.zeros(n, bool), np.zeros(n, bool)
        delivered[spos[np.flatnonzero(done[x:])]] = True
        remaining[spos[np.flatnonzero(left[x:])]] = True
    pending = [extra[i] for i in np.flatnonzero(left[:x]).tolist()] + carried
    head = {key: first.get(key) for key in ("version", "dataset_length", "seed", "seed_given", "batch_size",
                                            "last_batch", "sampler", "order")}
    return {**head, "kind": "merged", "epoch": int(first["epoch"]), "layout": {"num_shards": k, "drop_last": drop},
            "order_key": first.get("order_key") or {}, "delivered": positions_to_json(delivered),
            "remaining": positions_to_json(remaining), "pending": pending,
            "ranks": [{"delivered": int(st["delivered"]), "position": int(st["position"]),
                       "carry": [int(v) for v in st.get("carry", [])]} for st in ranks]}


def _merge_iterable(ranks: list[dict]) -> dict:
    world = len(ranks)
    pos = [int(st["position"]) for st in ranks]
    if len(set(pos)) > 1:
        raise StateError(f"cannot split this iterable again: its ranks stopped at different points of its stream "
                         f"(items taken per rank: {pos}); every rank reads the whole stream and keeps one item "
                         f"of each round of {world}, so a new layout can start only after a round all ranks "
                         "finished: save the states of every rank at the same step")
    snaps = [json.dumps(st.get("source_state"), sort_keys=True) for st in ranks]
    if len(set(snaps)) > 1:
        raise StateError("cannot split this iterable again: its ranks report different states of the iterable "
                         "after the same items (is it the same stream on every rank, in the same order?)")
    first = ranks[0]
    head = {key: first.get(key) for key in ("version", "dataset_length", "seed", "seed_given", "batch_size",
                                            "last_batch", "sampler")}
    return {**head, "kind": "merged", "epoch": int(first["epoch"]), "layout": {"world_size": world},
            "items": pos[0] * world, "source_state": first.get("source_state"),
            "ranks": [{"delivered": int(st["delivered"]), "position": int(st["position"])} for st in ranks]}


def localize(mine: dict, sampler: Any, merged: dict) -> dict:
    """The state of this loader (header ``mine``, sampler ``sampler``) that continues
    ``merged`` (NOTE [ Elastic resume ]); raises StateError where it cannot."""
    if merged.get("version") != STATE_VERSION:
        raise StateError(f"state version {merged.get('version')!r} is not {STATE_VERSION} (this loaderlib)")
    iterable = merged.get("sampler") == "iterable"
    for key in ("epoch", "layout", "ranks") + (() if iterable else ("dataset_length", "remaining")):
        if key not in merged:
            raise StateError(f"the merged state has no {key!r} entry")
    saved, lay = merged["layout"], mine.get("layout")
    world = saved.get("world_size", saved.get("num_shards")) if isinstance(saved, dict) else None
    if not isinstance(merged["ranks"], list) or len(merged["ranks"]) != world:
        raise StateError(f"the merged state's layout has {world!r} ranks, but it lists the positions of "
                         f"{len(merged['ranks']) if isinstance(merged['ranks'], list) else 'no'} ranks")
    head = {key: merged.get(key) for key in ("version", "dataset_length", "seed", "seed_given", "batch_size",
                                             "last_batch", "sampler", "order")}
    e = int(merged["epoch"])
    if iterable:
        if mine.get("sampler") != "iterable":
            raise StateError(f"the merged state is of an iterable dataset, this loader has sampler {mine['sampler']!r}")
        assert lay is not None   # an iterable loader's header has its layout
        same = lay["world_size"] == saved["world_size"]
        own = merged["ranks"][lay["rank"]] if same else {"delivered": 0, "position": 0}
        return {**head, "layout": lay, "rank": lay["rank"], "world_size": lay["world_size"], "epoch": e,
                "delivered": own["delivered"], "position": own["position"], "carry": [], "order_key": {},
                "source_state": merged.get("source_state")}
    if not isinstance(sampler, ShardedSampler) or lay is None:
        raise StateError(f"a merged state resumes a loader sharded by ShardedSampler; this loader's sampler is "
                         f"{mine.get('sampler')!r}: pass sampler=ShardedSampler(world_size, rank, ...) with the "
                         "saved run's shuffle and seed")
    n = int(merged["dataset_length"])
    if mine.get("dataset_length") != n:
        raise StateError(f"the state is for dataset length {n}, this loader has {mine.get('dataset_length')!r}")
    base = {**head, "layout": lay, "epoch": e, "sampler_state": {"epoch": e, "key": {}}}
    if saved.get("num_shards") == lay["num_shards"] and saved.get("drop_last") == lay["drop_last"]:
        own = merged["ranks"][lay["shard_id"]]   # the same layout: this rank's own position (bitwise)
        return {**base, "delivered": int(own["delivered"]), "position": int(own["position"]),
                "carry": list(own.get("carry", [])), "order_key": merged.get("order_key") or {}}
    remaining = positions_from_json(merged["remaining"], n)
    pending = [int(v) for v in merged.get("pending", [])]
    order_key: dict = {}
    if pending or not remaining.all():
        order_key = {"segment": {"extra": pending, "positions": merged["remaining"]}}
    return {**base, "delivered": 0, "position": 0, "carry": [], "order_key": order_key}
