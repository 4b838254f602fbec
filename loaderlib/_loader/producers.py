"""The producer (NOTE [ Engine stages ] in ``_engines/base.py``) that runs one epoch of a
DataLoader, chosen by the loader's analysis: native, hybrid, threads or processes."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._chain import compile_chain
from .._datasets.iterable import IterableProducer, IterableRunState
from .._engines.base import Producer, RunState
from .._engines.native import NativeProducer
from .._engines.threads import HybridProducer, ThreadsProducer
from .._observe.recorder import Recorder

__all__ = ["make_producer"]


def make_producer(ld: Any, state: RunState, recorder: Recorder) -> Producer:
    """The producer of DataLoader ``ld``'s run over ``state``, recording into ``recorder``
    (the processes engine's worker pool is made once and kept on the loader)."""
    a = ld._analysis
    src = a.native_source
    if ld.max_skipped is not None:
        n = state.order.stream.size if not ld._iterable else 0
        state.max_skipped = (int(ld.max_skipped) if isinstance(ld.max_skipped, (int, np.integer))
                             else max(1, int(ld.max_skipped * n)) if n else None)
    on_error = ld.on_error
    if ld._iterable and ld.num_workers == 0:
        assert isinstance(state, IterableRunState)   # _iterable_run made it
        return IterableProducer(dataset=ld.dataset, rank=ld.rank, world_size=ld.world_size,
                                pad=ld._last_batch != "discard", batchify_fn=ld.batchify_fn,
                                arena=ld._arena(), state=state, recorder=recorder, on_error=on_error)
    if a.engine == "native":
        assert src is not None and a.shards is not None   # _analyze chose "native" for a native source
        plan = None if src.gathered else compile_chain(a.chain)
        if recorder.enabled:
            recorder.python_gil("python", False)
        return NativeProducer(src=src, plan=plan, shards=a.shards, arena=ld._arena(),
                              knobs=ld._knobs, batch_size=ld._batch_size, timeout=ld.timeout,
                              read_budget=ld._read_budget(), state=state, recorder=recorder,
                              on_error=on_error)
    if recorder.enabled:
        recorder.python_gil("python", True)
    if a.engine == "threads" and a.hybrid is not None:
        assert src is not None   # a native prefix reads a native source
        native = NativeProducer(src=src, plan=compile_chain(a.chain), shards=(None, None),
                                arena=ld._arena(), knobs=ld._knobs, batch_size=ld._batch_size,
                                timeout=ld.timeout, read_budget=ld._read_budget(), state=state,
                                recorder=recorder, on_error=on_error)
        return HybridProducer(native=native, suffix=a.hybrid["suffix"], suffix_position=a.hybrid["position"],
                              others=a.hybrid["others"], batchify_fn=ld.batchify_fn, arena=ld._arena(),
                              pool=ld._python_pool(), state=state, recorder=recorder, on_error=on_error)
    if a.engine == "threads":
        return ThreadsProducer(dataset=ld.dataset, batchify_fn=ld.batchify_fn, arena=ld._arena(),
                               pool=ld._python_pool(), io_depth=ld._knobs.io_depth,
                               batch_size=ld._batch_size, timeout=ld.timeout,
                               read_budget=ld._read_budget(), read_hint=ld._knobs.read_hint, state=state,
                               recorder=recorder, on_error=on_error)
    from .._engines.processes import NativePrefix, ProcessesProducer, WorkerPool  # lazy: cloudpickle

    if ld._workers is None or ld._workers.closed:
        prefix = None
        if a.hybrid is not None:
            assert src is not None   # a native prefix reads a native source
            prefix = NativePrefix(src=src, chain=a.chain, suffix=a.hybrid["suffix"],
                                  position=a.hybrid["position"], others=a.hybrid["others"],
                                  io_depth=ld._knobs.io_depth, timeout=ld.timeout)
        ld._workers = WorkerPool(ld.num_workers, ld.dataset, ld.batchify_fn, ld.worker_init_fn,
                                   ld.on_error, ld.seed, load_balance=ld.load_balance, prefix=prefix,
                                   registrar=ld._host_registrar())
    else:
        ld._workers.revive()   # a worker that died or timed out gets a fresh process
    if ld._iterable:
        from .._engines.processes import IterableProcessesProducer

        return IterableProcessesProducer(pool=ld._workers, timeout=ld.timeout, knobs=ld._knobs,
                                         max_in_flight=ld.max_in_flight, rank=ld.rank,
                                         world_size=ld.world_size, pad=ld._last_batch != "discard",
                                         batch_size=ld._batch_size, state=state, recorder=recorder,
                                         on_error=on_error)
    return ProcessesProducer(pool=ld._workers, timeout=ld.timeout, knobs=ld._knobs,
                             max_in_flight=ld.max_in_flight, state=state, recorder=recorder, on_error=on_error)
