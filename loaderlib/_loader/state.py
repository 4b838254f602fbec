"""Saving and restoring a loader's position: the state dict (NOTE [ Iterator state ]) and the
epoch order a fresh or resumed epoch runs."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from .._datasets.iterable import cannot_resume, is_stateful
from .._engines.base import RunState
from ..errors import StateError
from ..sampler import BatchSampler, EpochOrder, ShardedSampler
from .elastic import STATE_VERSION, describe_layout, localize, spread


class LoaderView(Protocol):
    """What a state is read from and checked against: the DataLoader's fields used here
    (``loader.py`` imports this module: a Protocol here instead of an import back)."""

    dataset: Any
    seed: int
    rank: int
    world_size: int
    num_workers: int
    on_error: str
    _iterable: bool
    _batch_size: Any
    _last_batch: str
    _batch_sampler: Any
    _epoch: int
    _seed_given: bool

    @property
    def sampler(self) -> Any: ...

    @property
    def epoch(self) -> int: ...

    def _pure_sampler(self) -> Any: ...


def header(ld: LoaderView) -> dict:
    """What a state must match to be loaded: version, dataset length, seed, batch size,
    last_batch mode, sampler, and the shard layout with the global order's key (a
    ShardedSampler's; the rank and world size of an iterable): NOTE [ Elastic resume ]. Also
    whether the seed was given and whether the position follows from the batch count alone
    (``lockstep``: NOTE [ One state for every rank ])."""
    s = ld.sampler
    common = {"version": STATE_VERSION, "seed": int(ld.seed), "seed_given": bool(ld._seed_given),
              "lockstep": ld.on_error == "raise", "batch_size": ld._batch_size, "last_batch": ld._last_batch}
    if ld._iterable:
        return {**common, "dataset_length": None, "sampler": "iterable", "rank": ld.rank,
                "world_size": ld.world_size, "layout": {"world_size": ld.world_size, "rank": ld.rank}}
    d = {**common, "dataset_length": len(ld.dataset),
         "sampler": type(s).__name__ if s is not None else type(ld._batch_sampler).__name__}
    if isinstance(s, ShardedSampler):
        d["layout"], d["order"] = s.layout(), s.global_order()
    return d


def state_of(ld: LoaderView, state: RunState) -> dict:
    """The loader state that continues after the last batch ``state`` (a RunState) delivered."""
    if ld._iterable and (ld.num_workers > 0 or not is_stateful(ld.dataset)):
        raise cannot_resume(ld.dataset, ld.num_workers)
    run = state.state_dict()
    if ld._iterable:
        if run.pop("finished"):
            return state_between(ld, state.epoch + 1)
        return {**header(ld), **run}
    s = ld._pure_sampler()
    if run.pop("finished"):
        return state_between(ld, state.epoch + 1, state.order.carry_out)
    d = {**header(ld), **run}
    if s is not None:
        d["sampler_state"] = s.state_dict()
    else:
        # Not a pure function of the epoch: the rest of the epoch travels explicitly.
        order = state.order
        d["stream"] = order.stream[state.position:].tolist()
        d["targets"] = list(order.targets[state.delivered:])
    return d


def state_between(ld: LoaderView, epoch: int | None = None, carry: np.ndarray | None = None) -> dict:
    """The loader state at the start of ``epoch`` (default: the next one)."""
    if ld._iterable:
        if ld.num_workers > 0 or not is_stateful(ld.dataset):
            raise cannot_resume(ld.dataset, ld.num_workers)
        return {**header(ld), "epoch": int(ld._epoch if epoch is None else epoch), "delivered": 0,
                "position": 0, "carry": [], "order_key": {}, "source_state": ld.dataset.state_dict()}
    s = ld._pure_sampler()
    bsamp = ld._batch_sampler
    if carry is None:
        carry = bsamp._carry if isinstance(bsamp, BatchSampler) else np.zeros(0, np.int64)
    d_epoch = int(ld.epoch if epoch is None else epoch)
    d = {**header(ld), "epoch": d_epoch, "delivered": 0, "position": 0,
         "carry": np.asarray(carry, np.int64).tolist(), "order_key": s.key_for(d_epoch) if s is not None else {}}
    if s is not None:
        d["sampler_state"] = s.state_dict()
        d["sampler_state"]["epoch"] = d["epoch"]
    return d


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def check_state(ld: LoaderView, state: Any) -> tuple[dict, str | None]:
    """The state that continues loader ``ld`` from ``state`` (a merged one becomes this rank's:
    NOTE [ Elastic resume ]; another rank's, saved in lockstep, too: NOTE [ One state for every
    rank ]), and how it was applied when not as this rank's own (for ``explain()``); raise
    StateError unless it can continue (NOTE [ Iterator state ]), also for a state this
    loaderlib did not write (NOTE [ Hostile states ] in elastic.py)."""
    try:
        return _check_state(ld, state)
    except StateError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as e:
        raise StateError(f"not a loader state this loaderlib can load ({type(e).__name__}: {str(e)[:80]})") from None


def _check_state(ld: LoaderView, state: Any) -> tuple[dict, str | None]:
    if not isinstance(state, dict):
        raise StateError(f"a loader state is a dict, got {type(state).__name__}")
    mine = header(ld)
    applied = None
    if state.get("kind") == "merged":
        state = localize(mine, ld._pure_sampler(), state)
    if state.get("version") != STATE_VERSION:
        raise StateError(f"state version {state.get('version')!r} is not {STATE_VERSION} (this loaderlib)")
    for key, what in (("dataset_length", "dataset length"), ("seed", "seed"), ("batch_size", "batch size"),
                      ("last_batch", "last_batch mode"), ("sampler", "sampler"), ("order", "global order")):
        if key == "seed" and state.get(key) != mine[key] and not ld._seed_given and state.get(key) is not None:
            continue   # this loader drew its seed: it takes the saved run's (adopted below)
        if key == "order" and "order" not in state:
            continue   # a state of a loaderlib that recorded no layout yet
        if key in mine and state.get(key) != mine[key]:
            raise StateError(f"the state is for {what} {state.get(key)!r}, this loader has {mine[key]!r}")
    saved = state.get("layout")
    if saved is None and ld._iterable:   # a state of a loaderlib that recorded no layout yet
        saved = {"world_size": state.get("world_size"), "rank": state.get("rank")}
    if "layout" in mine and saved is not None and saved != mine["layout"]:
        applied = (f"the state of {describe_layout(saved, mine['sampler'])} applied to "
                   f"{describe_layout(mine['layout'], mine['sampler'])} as ranks in step: every rank continues "
                   "where the ranks of that layout stood after as many batches")
        state = localize(mine, ld._pure_sampler(), spread(state, mine))
    for key in ("epoch", "delivered", "position", "carry"):
        if key not in state:
            raise StateError(f"the state has no {key!r} entry")
    # Checked here, not when the next epoch starts (NOTE [ Lazy iter ]): a state that loads resumes.
    for key in ("epoch", "delivered", "position"):
        if not _is_int(state[key]) or state[key] < 0:
            raise StateError(f"the state's {key!r} is {state[key]!r}, not a count")
    for key in ("carry", "stream", "targets"):
        if key in state and (not isinstance(state[key], (list, tuple, np.ndarray))
                             or not all(_is_int(v) for v in state[key])):
            raise StateError(f"the state's {key!r} is not a list of integers")
    if not isinstance(state.get("order_key") or {}, dict):
        raise StateError(f"the state's 'order_key' is {state['order_key']!r}, not a mapping")
    ss = state.get("sampler_state", {})
    if (not isinstance(ss, dict) or ("epoch" in ss and not _is_int(ss["epoch"]))
            or not isinstance(ss.get("key") or {}, dict)):
        raise StateError("the state's 'sampler_state' is not a sampler's state (an epoch and a key)")
    s = ld._pure_sampler()
    if ld._iterable:
        if state.get("source_state") is not None and not is_stateful(ld.dataset):
            raise StateError(f"the state holds an iterable's position, but {type(ld.dataset).__name__} "
                             "has no load_state_dict()")
    elif s is None and "stream" not in state and (state["delivered"] or state["position"]):
        raise StateError("a mid-epoch state of a sampler that is not a loaderlib Sampler needs its 'stream'")
    return state, applied


def next_order(bsamp: Any, pure: bool, epoch: int) -> tuple[EpochOrder, int]:
    """The next epoch's order from batch sampler ``bsamp``, and the loader's epoch counter
    after it (``epoch`` counts the epochs of a sampler that is not ``pure``, a loaderlib
    Sampler that knows its epoch); moves the sampler (and the rollover carry) on."""
    if isinstance(bsamp, BatchSampler):
        if pure:
            return bsamp.next_epoch(), epoch
        return bsamp.next_epoch(epoch), epoch + 1
    if hasattr(bsamp, "set_epoch"):
        bsamp.set_epoch(epoch)
    batches = [np.asarray(list(b), dtype=np.int64).reshape(-1) for b in bsamp]
    stream = np.concatenate(batches) if batches else np.zeros(0, np.int64)
    empty = np.zeros(0, np.int64)
    return EpochOrder(epoch, stream, [b.size for b in batches], False, empty, empty, {}), epoch + 1


def resumed_order(bsamp: Any, d: dict, drop_short: bool) -> tuple[EpochOrder, int, int, int | None]:
    """The order, delivered batches and position a loaded state ``d`` continues with, and the
    loader's epoch counter after it (None: unchanged); StateError for what ``check_state`` let
    through but the sampler refuses (NOTE [ Hostile states ] in elastic.py)."""
    try:
        return _resumed_order(bsamp, d, drop_short)
    except StateError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as e:
        raise StateError(f"the loaded state cannot resume ({type(e).__name__}: {str(e)[:80]})") from None


def _resumed_order(bsamp: Any, d: dict, drop_short: bool) -> tuple[EpochOrder, int, int, int | None]:
    epoch = int(d["epoch"])
    if "stream" in d:
        empty = np.zeros(0, np.int64)
        order = EpochOrder(epoch, np.asarray(d["stream"], np.int64), [int(t) for t in d["targets"]],
                           drop_short, empty, empty, {})
        return order, 0, 0, epoch + 1
    bsamp.sampler.use_key(epoch, d.get("order_key") or {})   # flush() and the warm epoch plan with it too
    order = bsamp.plan_epoch(epoch, key=d.get("order_key") or None, carry=np.asarray(d["carry"], np.int64))
    bsamp._carry = order.carry_out
    bsamp.sampler.set_epoch(epoch + 1)
    return order, int(d["delivered"]), int(d["position"]), None
