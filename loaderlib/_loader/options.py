"""DataLoader's arguments checked once: conflicts and PyTorch aliases resolved, ``AUTOTUNE``
split off, the seed drawn; a bad argument raises here, before anything runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _threads
from .. import transforms as T
from .._autotune import AUTOTUNE
from .._checks import check_int, parse_bytes
from .._datasets.iterable import default_rank, is_iterable_dataset
from ..sampler import LAST_BATCH_MODES, draw_seed
from .analysis import _as_dataset
from .output import _output_kind, _pin_device

_MP_CONTEXTS = (None, "spawn", "forkserver")
_LOAD_BALANCE = ("round_robin", "least_loaded")


@dataclass(frozen=True)
class LoaderOptions:
    """The arguments of :class:`~loaderlib.DataLoader` after :func:`check_options`: each one
    valid, the aliases (``collate_fn``, ``drop_last``) folded into ``batchify_fn`` and
    ``last_batch``, ``AUTOTUNE`` turned into ``tune_*`` flags (its knob is then None), the
    dataset wrapped as the loader reads it and the seed drawn when none was given."""

    dataset: Any
    iterable: bool
    batch_size: int | None
    shuffle: bool
    sampler: Any
    last_batch: str | None
    batch_sampler: Any
    batchify_fn: Callable | None
    num_threads: int | None
    tune_threads: bool
    num_workers: int
    prefetch: int | None
    tune_prefetch: bool
    prefetch_factor: int | None
    pin_memory: bool
    pin_memory_device: str
    timeout: float | None
    seed: int
    seed_given: bool
    worker_init_fn: Callable | None
    on_error: str
    persistent_workers: bool
    in_order: bool
    multiprocessing_context: str | None
    load_balance: str
    max_in_flight: int | None
    rank: int | None
    world_size: int | None
    max_skipped: float | None
    profile: bool
    batch_transform: Any
    ram_budget: int | None
    output: str
    io_depth: int | None
    tune_io: bool


def _is_autotune(value: Any) -> bool:
    return value is not None and not isinstance(value, bool) and value == AUTOTUNE


def _seed_from_generator(generator: Any) -> int:
    """A 63-bit seed drawn from a ``torch.Generator`` or ``numpy.random.Generator``."""
    if isinstance(generator, np.random.Generator):
        return int(generator.integers(0, 1 << 63, dtype=np.int64))
    if type(generator).__module__.startswith("torch") and hasattr(generator, "initial_seed"):
        import torch  # optional dependency

        # What torch's RandomSampler does with a generator: draw a seed from it.
        return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item()) & ((1 << 63) - 1)
    raise ValueError(f"generator must be a torch.Generator or numpy.random.Generator, got {type(generator).__name__}")


def _mp_context_name(ctx: Any) -> str | None:
    if ctx is None or isinstance(ctx, str):
        name = ctx
    elif hasattr(ctx, "get_start_method"):
        name = ctx.get_start_method()
    else:
        raise ValueError(f"multiprocessing_context must be a start method name or a multiprocessing context, "
                         f"got {ctx!r}")
    if name not in _MP_CONTEXTS:
        raise ValueError(f"multiprocessing_context={name!r} cannot be honoured: loaderlib workers are always fresh "
                         "interpreters (like 'spawn'); 'fork' would inherit an OpenMP pool that hangs "
                         "(use 'spawn', 'forkserver' or None)")
    return name


def _check_iterable(batch_size: Any, shuffle: bool, sampler: Any, batch_sampler: Any, rank: int | None,
                    world_size: int | None) -> tuple[int, int]:
    """The (rank, world_size) an iterable dataset is sharded by, after checking the arguments
    it excludes."""
    clash = [name for name, bad in (("shuffle", bool(shuffle)), ("sampler", sampler is not None),
                                    ("batch_sampler", batch_sampler is not None)) if bad]
    if clash:
        raise ValueError(f"an iterable dataset decides its own order; it conflicts with {', '.join(clash)}")
    if batch_size is None:
        raise ValueError("batch_size is required for an iterable dataset")
    r, w = default_rank()
    world_size = check_int(w if world_size is None else world_size, "world_size", minimum=1)
    rank = check_int(r if rank is None else rank, "rank", maximum=world_size - 1)
    return rank, world_size


def check_options(dataset: Any, batch_size: int | None, shuffle: bool, sampler: Any, last_batch: str | None,
                  batch_sampler: Any, batchify_fn: Callable | None, num_threads: int | None, num_workers: int,
                  prefetch: int | None, pin_memory: bool, timeout: float | None, seed: int | None,
                  worker_init_fn: Callable | None, on_error: str, *, drop_last: bool | None,
                  collate_fn: Callable | None, persistent_workers: bool, prefetch_factor: int | None,
                  generator: Any, multiprocessing_context: Any, in_order: bool, pin_memory_device: str,
                  load_balance: str, max_in_flight: int | None, rank: int | None, world_size: int | None,
                  max_skipped: float | None, profile: bool, batch_transform: Any, ram_budget: int | str | None,
                  output: str | None, io_depth: int | None) -> LoaderOptions:
    """Check :class:`~loaderlib.DataLoader`'s arguments (its parameters, same names and
    meanings) and resolve them; raise ``ValueError`` (``TypeError`` for a wrong kind of
    object) naming the argument, or the two that conflict."""
    if batch_transform is not None and not isinstance(batch_transform, T.BatchTransform):
        raise TypeError("batch_transform must be a loaderlib.transforms MixUp, CutMix or RandomChoice of them, "
                        f"got {type(batch_transform).__name__}")
    tune_threads, tune_prefetch, tune_io = _is_autotune(num_threads), _is_autotune(prefetch), _is_autotune(io_depth)
    num_threads = None if tune_threads else num_threads
    prefetch = None if tune_prefetch else prefetch
    # AUTOTUNE's read-ahead depth is the adaptive one (NOTE [ Read-ahead depth ]).
    io_depth = None if tune_io else check_int(io_depth, "io_depth", allow_none=True)
    ram_budget = None if ram_budget is None else parse_bytes(ram_budget, "ram_budget")
    dataset = _as_dataset(dataset)
    iterable = is_iterable_dataset(dataset)
    if iterable:
        rank, world_size = _check_iterable(batch_size, shuffle, sampler, batch_sampler, rank, world_size)
    elif rank is not None or world_size is not None:
        # NOTE [ Map-style loaders shard under torch.distributed ] (_loader/sharding.py)
        if sampler is not None or batch_sampler is not None:
            raise ValueError("rank and world_size shard the loader's own order; they conflict with "
                             f"{'sampler' if sampler is not None else 'batch_sampler'} (give a ShardedSampler "
                             "or rank and world_size)")
        if rank is None or world_size is None:
            raise ValueError("give both rank and world_size, or neither (they come from torch.distributed then)")
        world_size = check_int(world_size, "world_size", minimum=1)
        rank = check_int(rank, "rank", maximum=world_size - 1)
    # -- argument conflicts, PyTorch aliases ---------------------------------------
    if collate_fn is not None:
        if batchify_fn is not None and batchify_fn is not collate_fn:
            raise ValueError("batchify_fn and collate_fn are the same argument: pass only one")
        batchify_fn = collate_fn
    if drop_last is not None:
        implied = "discard" if drop_last else "keep"
        if last_batch is not None and last_batch != implied:
            raise ValueError(f"drop_last={drop_last} conflicts with last_batch={last_batch!r}: pass only one")
        last_batch = implied
    if last_batch is not None and last_batch not in LAST_BATCH_MODES:
        raise ValueError(f"last_batch must be one of {LAST_BATCH_MODES}, got {last_batch!r}")
    if batch_sampler is not None:
        clash = [name for name, bad in (("batch_size", batch_size is not None), ("shuffle", bool(shuffle)),
                                        ("sampler", sampler is not None),
                                        ("last_batch/drop_last", last_batch is not None)) if bad]
        if clash:
            raise ValueError(f"batch_sampler gives whole batches; it conflicts with {', '.join(clash)}")
    elif batch_size is None:
        raise ValueError("batch_size is required unless batch_sampler is given")
    if sampler is not None and shuffle:
        raise ValueError("shuffle=True conflicts with sampler: the sampler decides the order")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    batch_size = check_int(batch_size, "batch_size", minimum=1, allow_none=True)
    seed = check_int(seed, "seed", allow_none=True)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or timeout < 0):
        raise ValueError(f"timeout must be a non-negative number of seconds (0 or None: wait forever), "
                         f"got {timeout!r}")
    if max_skipped is not None:
        ok = (isinstance(max_skipped, (int, np.integer)) and not isinstance(max_skipped, bool)
              and max_skipped >= 0) or (isinstance(max_skipped, float) and 0 < max_skipped < 1)
        if not ok:
            raise ValueError(f"max_skipped must be a count (int >= 0) or a fraction of the epoch (0 < float < "
                             f"1), got {max_skipped!r}")
    num_workers = check_int(num_workers, "num_workers")
    if num_threads == 0 and not isinstance(num_threads, bool):
        if num_workers > 0:
            raise ValueError(f"num_threads=0 runs everything in the calling thread; it conflicts with "
                             f"num_workers={num_workers}")
    elif num_threads is not None:
        _threads.resolve_num_threads(num_threads)  # validates
    prefetch = check_int(prefetch, "prefetch", minimum=1, allow_none=True)
    prefetch_factor = check_int(prefetch_factor, "prefetch_factor", minimum=1, allow_none=True)
    if prefetch is not None and prefetch_factor is not None:
        raise ValueError("prefetch and prefetch_factor both set the prefetch depth: pass only one")
    if batchify_fn is not None and not callable(batchify_fn):
        raise TypeError(f"batchify_fn must be callable, got {batchify_fn!r}")
    if generator is not None and seed is not None:
        raise ValueError("seed and generator both seed the loader: pass only one")
    if not isinstance(persistent_workers, bool):
        raise ValueError(f"persistent_workers must be a bool, got {persistent_workers!r}")  # noqa: TRY004
    if not isinstance(in_order, bool):
        raise ValueError(f"in_order must be a bool, got {in_order!r}")  # noqa: TRY004
    if pin_memory_device and not pin_memory:
        raise ValueError(f"pin_memory_device={pin_memory_device!r} needs pin_memory=True")
    if load_balance not in _LOAD_BALANCE:
        raise ValueError(f"load_balance must be one of {_LOAD_BALANCE}, got {load_balance!r}")
    max_in_flight = check_int(max_in_flight, "max_in_flight", minimum=1, allow_none=True)
    multiprocessing_context = _mp_context_name(multiprocessing_context)
    output = _output_kind(output, dataset)
    if pin_memory_device:
        _pin_device(pin_memory_device)   # validates the spelling before anything runs
    seed_given = seed is not None or generator is not None
    seed = _seed_from_generator(generator) if generator is not None else draw_seed() if seed is None else seed
    return LoaderOptions(
        dataset=dataset, iterable=iterable, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
        last_batch=last_batch, batch_sampler=batch_sampler, batchify_fn=batchify_fn, num_threads=num_threads,
        tune_threads=tune_threads, num_workers=num_workers, prefetch=prefetch, tune_prefetch=tune_prefetch,
        prefetch_factor=prefetch_factor, pin_memory=bool(pin_memory), pin_memory_device=pin_memory_device,
        timeout=timeout, seed=seed, seed_given=seed_given, worker_init_fn=worker_init_fn, on_error=on_error,
        persistent_workers=persistent_workers, in_order=in_order, multiprocessing_context=multiprocessing_context,
        load_balance=load_balance, max_in_flight=max_in_flight, rank=rank, world_size=world_size,
        max_skipped=max_skipped, profile=profile, batch_transform=batch_transform, ram_budget=ram_budget,
        output=output, io_depth=io_depth, tune_io=tune_io)
