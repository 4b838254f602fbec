"""Body of a loaderlib worker process (``main()`` with the socket's file descriptor as argument).

The process talks to its loader over one socket (``multiprocessing.connection`` framing),
one message type per message (``messages.py``). It receives the dataset, batchify function
and init function serialised with cloudpickle (so lambdas, local functions and classes
defined in a notebook work), then loads batches and writes them straight into the
shared-memory slot each task names. See NOTE [ Worker processes ] in ``processes.py``.
"""

from __future__ import annotations

import collections
import itertools
import mmap
import os
import pickle
import signal
import sys
import time
import traceback
import warnings
from collections import OrderedDict
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import numpy as np

from .._chain import compile_chain
from .._datasets.base import at_epoch
from .._datasets.iterable import RankStride
from .._extract.readahead import ReadAhead
from .._extract.source import NativeSource, SourceKind, native_error
from .._tree import tree_map
from .._worker_info import WorkerInfo, set_process_info, worker_seed
from ..arena import BatchLayout
from ..batchify import Shards, default_batchify_fn
from ..errors import DecodeWarning
from .collate import plan_collate
from .messages import (
    ArrayRef,
    Cancel,
    Cancelled,
    Done,
    Failed,
    FromWorker,
    Init,
    InitError,
    IterStart,
    Ready,
    ShardsRef,
    Stop,
    ToWorker,
    Work,
    slot_array,
)
from .threads import python_tail

ALIGN = 64
_MAX_MAPS = 32


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class _Maps:
    """Shared-memory blocks mapped in this process, by name (least recently used dropped)."""

    def __init__(self) -> None:
        self._maps: OrderedDict = OrderedDict()

    def get(self, name: str, size: int) -> mmap.mmap:
        m = self._maps.get(name)
        if m is not None and len(m) >= size:
            self._maps.move_to_end(name)
            return m
        fd = os.open("/dev/shm/" + name.lstrip("/"), os.O_RDWR)
        try:
            m = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._maps[name] = m
        while len(self._maps) > _MAX_MAPS:
            _, old = self._maps.popitem(last=False)
            try:
                old.close()
            except BufferError:
                pass
        return m


class _Encoder:
    """Replace arrays in a batch by references into the slot, copying those not already there."""

    def __init__(self, whole: np.ndarray, cursor: int) -> None:
        self.whole = whole
        self.base = whole.ctypes.data if whole.size else 0
        self.size = whole.size
        self.cursor = cursor
        self.needed = cursor

    def encode(self, obj: Any) -> Any:
        def leaf(x: Any) -> Any:
            if isinstance(x, Shards):
                return ShardsRef(self._array(x.batch), len(x))
            if slot_array(x):
                return self._array(x)
            return x

        return tree_map(leaf, obj)

    def _array(self, a: np.ndarray) -> Any:
        addr = a.ctypes.data
        if a.flags.c_contiguous and self.base <= addr and addr + a.nbytes <= self.base + self.size:
            return ArrayRef(addr - self.base, a.shape, a.dtype.str)
        off = _align(self.cursor)
        self.needed = max(self.needed, off + a.nbytes)
        if off + a.nbytes > self.size:
            self.cursor = off + a.nbytes
            return a  # does not fit: travels pickled; the loader grows its slots
        dst = self.whole[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
        dst[...] = a
        self.cursor = off + a.nbytes
        return ArrayRef(off, a.shape, a.dtype.str)


def _send(conn: Connection, msg: FromWorker) -> None:
    try:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001
        data = cloudpickle.dumps(msg)
    conn.send_bytes(data)


def _recv(conn: Connection) -> ToWorker:
    return pickle.loads(conn.recv_bytes())


def _exc_payload(e: BaseException) -> bytes | None:
    try:
        data = cloudpickle.dumps(e)
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001
        return None


class NativePrefix:
    """The fused native head of a chain and its Python tail, run inside a worker process.

    NOTE [ Native prefix in workers ] (``_loader/analysis.py``): a task's samples are read, decoded and
    transformed by the native prefix in one kernel call on this process's one thread, keyed by
    the run's ``(seed, epoch)`` exactly as the native engine keys them; the Python tail then
    runs per sample with the same keyed randomness the threads engine gives it. The output
    buffer is reused from task to task: the batch is collated into its shared-memory slot
    before the next task starts.
    """

    def __init__(self, *, src: NativeSource, chain: Any, suffix: Any, position: int, others: list,
                 io_depth: int | None = None, timeout: float | None = None) -> None:
        self.src = src
        self.chain = chain          # transforms.Compose of the native prefix
        self.suffix = suffix        # transforms.Compose of the Python tail, or None
        self.position = position    # transform position of the tail's first step
        self.others = others        # .transform(fn) layers on whole samples, innermost first
        self.io_depth = io_depth    # NOTE [ Read-ahead in workers ]
        self.timeout = timeout
        self._plan: Any = None
        self._buf: np.ndarray | None = None
        self._run: tuple = ()
        self._reader: ReadAhead | None = None
        self._pos = 0
        self._bound: tuple = (None, None, None)   # (epoch, seed, source) of a source that changes with the epoch

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_plan=None, _buf=None, _run=(), _reader=None, _pos=0, _bound=(None, None, None))
        return state

    def source(self, i: int) -> str | None:
        return (self._bound[2] or self.src).source(i)

    def run(self, indices: np.ndarray, seed: int, epoch: int) -> None:
        """Decode and transform ``indices`` natively; :meth:`item` then gives each sample."""
        if self._plan is None:
            self._plan = compile_chain(self.chain)
        plan, n = self._plan, indices.size
        if self._buf is None or self._buf.shape[0] < n:
            self._buf = np.empty((max(n, 1), *plan.sample_shape), plan.dtype)
        out = self._buf[:n]
        if self.src.epoch_map is not None and self._bound[:2] != (epoch, seed):
            # NOTE [ Datasets that change with the epoch ] (_datasets/mixture.py): rows of this task's epoch;
            # the read-ahead stage reads through the bound source, so it is made again.
            self._bound = (epoch, seed, self.src.at_epoch(epoch, seed))
            if self._reader is not None:
                self._reader.close()
                self._reader = None
        src = self._bound[2] if self.src.epoch_map is not None else self.src
        reader, pos = self._read_ahead(src, indices)
        st = src.run(plan, indices, out, seed=seed, epoch=epoch, num_threads=1, timings=None, positions=pos,
                     reader=reader)
        if reader is not None:
            reader.adapt(1)
        self._run = (indices, out, st, seed, epoch, src)

    def _read_ahead(self, src: NativeSource, indices: np.ndarray) -> tuple[ReadAhead | None, np.ndarray | None]:
        """The read-ahead stage of this worker and the task's positions (None, None: none).

        NOTE [ Read-ahead in workers ]
        A worker decodes its task on one thread; reading the task's samples one after the
        other on that thread would put one read in flight per worker. The worker's own
        read-ahead stage (NOTE [ Read-ahead ] in include/ll_readahead.h) queues the whole
        task's reads at once on its IO threads, ``io_depth`` in flight (adaptive by default),
        and the thread decodes them as they arrive. Positions are the worker's own count of
        samples, so they only ever increase."""
        if src.kind not in (SourceKind.FILES, SourceKind.SHARDS) or self.io_depth == 0 or not indices.size:
            return None, None
        n = indices.size
        if self._reader is None or self._reader.held < n or not self._reader.native.usable:
            self._reader = ReadAhead(src, np.zeros(0, np.int64), io_depth=self.io_depth, batch_size=n,
                                     lookahead=1, timeout=self.timeout)
        pos = np.arange(self._pos, self._pos + n, dtype=np.int64)
        self._pos += n
        self._reader.queue(pos, indices)
        return self._reader, pos

    def item(self, j: int) -> Any:
        """Sample ``j`` of the last :meth:`run`: its native output through the Python tail.
        Raises the sample's DecodeError when the native prefix failed on it."""
        indices, out, st, seed, epoch, src = self._run
        i = int(indices[j])
        if not st.ok[j]:
            raise native_error(src, st, j, indices)
        why = getattr(st, "warnings", {}).get(j)
        if why is not None:
            warnings.warn(f"sample {i} {src.source(i)!r} decoded from corrupt data ({why}); pass "
                          "Decode(strict=True) to refuse such images", DecodeWarning, stacklevel=2)
        labels = src.labels
        r = int(src.rows(indices[j:j + 1])[0]) if src.epoch_map is not None else i
        item = out[j] if labels is None else (out[j], labels[r].item() if labels.ndim == 1 else labels[r].copy())
        return python_tail(item, self.suffix, self.position, self.others, seed, epoch, i)


def _failed(task_id: int, e: BaseException, sample: int | None = None, source: str | None = None) -> Failed:
    return Failed(task_id, sample, source, f"{type(e).__name__}: {e}", "".join(traceback.format_exception(e)),
                  _exc_payload(e))


def _run(conn: Connection) -> None:
    init = _recv(conn)
    assert isinstance(init, Init)
    for p in reversed(init.paths):
        if p not in sys.path:
            sys.path.insert(0, p)
    worker_id, num_workers = init.worker_id, init.num_workers
    try:
        dataset, batchify_fn, init_fn, on_error, prefix = cloudpickle.loads(init.payload)
        # NOTE [ Worker info ]: set before worker_init_fn runs, for the whole process.
        set_process_info(WorkerInfo(worker_id, num_workers, worker_seed(init.seed, worker_id), dataset))
        if init_fn is not None:
            init_fn(worker_id)
    except BaseException as e:  # noqa: BLE001
        _send(conn, InitError(f"{type(e).__name__}: {e}", traceback.format_exc(), _exc_payload(e)))
        return
    _send(conn, Ready(os.getpid()))
    maps = _Maps()
    src_of = prefix.source if prefix is not None else getattr(dataset, "source", None)
    epochs: dict = {}

    def bound(epoch: int, seed: int) -> Any:
        """The dataset as a task of ``epoch`` reads it (NOTE [ Datasets that change with the epoch ])."""
        nonlocal src_of
        if (epoch, seed) not in epochs:
            epochs.clear()
            epochs[(epoch, seed)] = at_epoch(dataset, epoch, seed)
        ds = epochs[(epoch, seed)]
        src_of = getattr(ds, "source", None)
        return ds
    pending: collections.deque[Work | IterStart] = collections.deque()
    cancelled: set[int] = set()
    own: Any = iter(())   # this worker's items of an iterable dataset's epoch

    def take(msg: ToWorker) -> bool:
        if isinstance(msg, Stop):
            return False
        if isinstance(msg, Cancel):
            cancelled.add(msg.task_id)
        elif isinstance(msg, (Work, IterStart)):
            pending.append(msg)
        return True

    while True:
        # Read everything that has arrived before starting a task, so a task cancelled
        # while it waited in the socket is skipped (NOTE [ Worker processes ]).
        if not pending and not take(_recv(conn)):
            return
        while conn.poll(0):
            if not take(_recv(conn)):
                return
        if not pending:
            continue
        msg = pending.popleft()
        if isinstance(msg, IterStart):
            # An iterable dataset's epoch: this worker's share of this rank's share of the
            # stream (NOTE [ Iterable shards ]).
            stream = iter(RankStride(iter(dataset), msg.rank, msg.world_size, msg.pad))
            own = itertools.islice(stream, worker_id, None, num_workers)
            continue
        task_id, shm_name, shm_size = msg.task_id, msg.shm_name, msg.shm_size
        if task_id in cancelled:
            cancelled.discard(task_id)
            _send(conn, Cancelled(task_id))
            continue
        samples: list = []
        failures: list = []
        failed = None
        t0 = time.perf_counter_ns()
        if isinstance(msg.indices, int):   # a batch of the iterable: the next ``indices`` items
            try:
                samples = list(itertools.islice(own, msg.indices))
            except Exception as e:  # noqa: BLE001 - the iterator itself failed: reported, never skipped
                _send(conn, _failed(task_id, e))
                continue
            indices = np.zeros(0, np.int64)
        else:
            indices = msg.indices
        if prefix is not None and indices.size:
            try:
                prefix.run(indices, msg.seed, msg.epoch)
            except Exception as e:  # noqa: BLE001 - a failure of the whole call (not of one sample)
                _send(conn, _failed(task_id, e))
                continue
        ds = dataset if prefix is not None else bound(msg.epoch, msg.seed)
        for j, i in enumerate(indices.tolist()):
            try:
                samples.append(ds[i] if prefix is None else prefix.item(j))
            except Exception as e:  # noqa: BLE001
                src = None
                if callable(src_of):
                    try:
                        src = src_of(i)
                    except Exception:  # noqa: BLE001
                        src = None
                if on_error == "raise":
                    failed = (i, src, e)
                    break
                failures.append((i, src, f"{type(e).__name__}: {e}"))
        if failed is not None:
            i, src, err = failed
            _send(conn, _failed(task_id, err, i, src))
            continue
        t1 = time.perf_counter_ns()
        if not samples:
            _send(conn, Done(task_id, None, failures, 0, t1 - t0, 0))
            continue
        try:
            whole = np.frombuffer(maps.get(shm_name, shm_size), np.uint8, count=shm_size)
            planned = plan_collate(batchify_fn, samples)
            cursor = 0
            if planned is not None:
                parts, build = planned
                layout = BatchLayout.of(parts)
                if layout.nbytes <= shm_size:
                    batch = build(iter(layout.views(whole)))
                    cursor = layout.nbytes
                else:
                    batch = (batchify_fn or default_batchify_fn)(samples)
                    cursor = 0
            else:
                batch = (batchify_fn or default_batchify_fn)(samples)
            enc = _Encoder(whole, cursor)
            structure = enc.encode(batch)
            del whole, batch
        except Exception as e:  # noqa: BLE001
            _send(conn, _failed(task_id, e))
            continue
        _send(conn, Done(task_id, structure, failures, enc.needed, t1 - t0, time.perf_counter_ns() - t1))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    # Ctrl-C reaches the whole process group: the loader decides what happens (it stops its
    # iterator and closes the workers), so a worker must not die half-way through a batch.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(int(argv[0]))
    try:
        _run(conn)
    except (EOFError, BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        pass  # the loader went away: exit quietly
    finally:
        conn.close()

