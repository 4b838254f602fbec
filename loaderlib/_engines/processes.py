"""The processes engine: persistent worker processes writing into shared-memory slots.

NOTE [ Worker processes ]
Workers are fresh interpreters (``python -c 'from loaderlib._engines.worker import main; main()'``), started
with ``subprocess`` and talking over one socket each (one message type per message,
``messages.py``), never forked: a fork would inherit a
libgomp thread pool that hangs in the child (NOTE [ OpenMP after fork ]), and
multiprocessing's spawn/forkserver re-import the user's ``__main__`` in every child, which
runs unguarded scripts twice and fails for notebooks. The dataset, batchify function and
init function travel serialised with cloudpickle, so lambdas, local functions and classes
defined in ``__main__`` or a notebook work ("Can't get attribute ... on __main__" cannot
happen).

Each loader owns its workers, so several loaders with different datasets run at once. The
loader creates every shared-memory block (the processes engine's arena slots) and is the
only one to unlink them; workers only map them, and no process keeps a descriptor of a
block open once it is mapped. A killed worker therefore leaks nothing, and if the loader's
process itself dies, Python's resource tracker unlinks the blocks. A task names its slot;
the slot stays leased until that task's result has arrived or its worker is gone, so a late
worker never writes into a slot that was handed out again.

Several runs share the pool (two iterators of one loader, or the current epoch and the warm
next one): task ids are unique per pool and results are routed by id under the pool's lock,
so whichever run reads a worker's socket files the others' results for them. When a run
ends early its batches still at the workers are cancelled (a worker skips a cancelled task
it has not started) and drained, so every slot is back when the iterator is closed. A
worker that dies, or gives no result within ``timeout`` (it is then killed), raises
:class:`WorkerError` or :class:`LoaderTimeoutError` naming it and the batch; its slots are
reclaimed and the next run starts a fresh process in its place (same id, ``worker_init_fn``
again).
"""

from __future__ import annotations

import itertools
import mmap
import os
import pickle
import secrets
import signal
import subprocess
import sys
import threading
import time
import weakref
from multiprocessing import Pipe, resource_tracker
from multiprocessing.connection import wait as mp_wait
from typing import Any

import cloudpickle
import numpy as np

from .._datasets.iterable import IterableRunState
from .._observe.recorder import Recorder
from .._tree import tree_map
from ..arena import BatchArena, BatchLayout, HostRegistrar
from ..batchify import Shards
from ..errors import LoaderError, LoaderTimeoutError, WorkerError, _add_context
from .base import Produced, Producer, RunState, Task, _clock, _Knobs, _Stopped, annotate, batch_wall
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
from .worker import NativePrefix

_DEFAULT_SLOT = 1 << 20
_SHM_DIR = "/dev/shm/"
# Run by import, not with ``-m``: under ``-m`` the worker module would be ``__main__`` and
# the classes it pickles could not be found by the loader.
_WORKER_MAIN = "from loaderlib._engines.worker import main; main()"


def shm_prefix(pid: int | None = None) -> str:
    """The name prefix of the shared-memory blocks process ``pid`` (default: this one) creates:
    tools and tests can tell its segments from other processes' (``psm_`` is the prefix
    Python's resource tracker knows)."""
    return f"psm_ll{os.getpid() if pid is None else pid}_"


class _ShmBlock:
    """One shared-memory slot buffer, created and unlinked by the loader's process.

    The block is a file in ``/dev/shm`` that is mapped and whose descriptor is closed at
    once (``multiprocessing.shared_memory`` keeps one open per block); the resource tracker
    unlinks it if this process dies without doing so.
    """

    def __init__(self, nbytes: int, registrar: HostRegistrar | None = None) -> None:
        size = max(int(nbytes), 1)
        flags = os.O_CREAT | os.O_EXCL | os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
        while True:
            name = shm_prefix() + secrets.token_hex(8)
            try:
                fd = os.open(_SHM_DIR + name, flags, 0o600)
                break
            except FileExistsError:
                continue
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        except BaseException:
            os.unlink(_SHM_DIR + name)
            raise
        finally:
            os.close(fd)
        resource_tracker.register("/" + name, "shared_memory")
        self.name = name
        self.buf: memoryview | None = memoryview(self._map)   # None once released
        self._unlinked = False
        self._registered: tuple[HostRegistrar, int] | None = None
        if registrar is not None:
            # pin_memory: page-locked once, for the block's whole life (NOTE [ Registering
            # shared-memory slots ] in arena.py).
            address = self.address
            try:
                registrar.register(address, size)
            except BaseException:
                self.release()
                raise
            self._registered = (registrar, address)

    @property
    def address(self) -> int:
        """Where the block is mapped in this process."""
        if self.buf is None:
            raise ValueError(f"shared-memory block {self.name} was released")
        return int(np.frombuffer(self.buf, np.uint8).ctypes.data)

    def unlink(self) -> None:
        """Remove the name now; the memory lives on while any process still maps it."""
        if not self._unlinked:
            self._unlinked = True
            try:
                os.unlink(_SHM_DIR + self.name)
            except FileNotFoundError:
                pass
            resource_tracker.unregister("/" + self.name, "shared_memory")

    def release(self) -> None:
        self.unlink()
        buf, self.buf = self.buf, None
        if buf is None:
            return
        registered, self._registered = self._registered, None
        if registered is not None:
            # Before the mapping can go, even if a view keeps it a little longer: a mapping
            # must never be unmapped while registered (NOTE [ Registering shared-memory slots ]).
            registered[0].unregister(registered[1])
        try:
            buf.release()
            self._map.close()
        except BufferError:
            pass  # a view is still alive somewhere: the mapping goes with it

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001, S110
            pass


def _send(conn: Any, msg: ToWorker) -> None:
    conn.send_bytes(pickle.dumps(msg))


def _recv(conn: Any) -> FromWorker:
    return pickle.loads(conn.recv_bytes())


def _exit_status(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class _Worker:
    def __init__(self, wid: int, payload: bytes, num_workers: int, seed: int) -> None:
        parent, child = Pipe(duplex=True)
        env = dict(os.environ)
        # Python steps get the parallelism; each worker's own kernels run single-threaded.
        env["LOADERLIB_NUM_THREADS"] = "1"
        env.setdefault("OMP_NUM_THREADS", "1")
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        fd = child.fileno()
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER_MAIN, str(fd)],
                                     pass_fds=(fd,), env=env, cwd=os.getcwd())
        child.close()
        self.conn = parent
        self.wid = wid
        self.ready = False
        self.dead: str | None = None
        _send(parent, Init([os.getcwd(), *paths], wid, payload, num_workers, seed))

    def alive(self) -> bool:
        return self.dead is None and self.proc.poll() is None


class WorkerPool:
    """A loader's persistent worker processes and their shared-memory slots.

    Thread-safe: several runs submit to it and wait for results at once (NOTE [ Worker
    processes ]).
    """

    def __init__(self, num_workers: int, dataset: Any, batchify_fn: Any, worker_init_fn: Any, on_error: str,
                 seed: int, load_balance: str = "round_robin", prefix: NativePrefix | None = None,
                 registrar: HostRegistrar | None = None) -> None:
        try:
            payload = cloudpickle.dumps((dataset, batchify_fn, worker_init_fn, on_error, prefix))
        except Exception as e:
            raise LoaderError(f"the dataset or batchify function cannot be sent to worker processes: "
                              f"{type(e).__name__}: {e}") from e
        self._payload = payload
        self._seed = seed
        self.load_balance = load_balance
        self.workers = [_Worker(k, payload, num_workers, seed) for k in range(num_workers)]
        self._lock = threading.RLock()
        self._blocks: weakref.WeakSet = weakref.WeakSet()
        # pin_memory: every slot is page-locked while it exists (NOTE [ Registering
        # shared-memory slots ] in arena.py).
        self.registrar = registrar
        self.arena = BatchArena(0, allocator=self._new_block)
        self.slot_bytes = _DEFAULT_SLOT
        self.inflight: dict[int, tuple] = {}   # task id -> (lease, worker id)
        self.ready: dict[int, tuple[Done | Failed, Any]] = {}   # task id -> (message, lease) for whoever asks
        self.abandoned: set[int] = set()       # tasks whose results nobody will ask for
        self.load = [0] * num_workers          # tasks in flight per worker
        self.sent = [0] * num_workers          # tasks sent per worker, ever (load-balance checks)
        self._ids = itertools.count()
        self._rr = 0
        self.closed = False
        # When the pool's previous batch finished, whichever run made it: a warm next epoch's
        # first batch does not count the seconds the workers spent on the epoch before
        # (NOTE [ Batch wall time ]).
        self.last_end = 0

    def _new_block(self, nbytes: int) -> _ShmBlock:
        block = _ShmBlock(nbytes, self.registrar)
        self._blocks.add(block)
        return block

    def alive(self) -> bool:
        return not self.closed and all(w.alive() for w in self.workers)

    def revive(self) -> None:
        """Start a fresh process for every worker that died or was killed (same id)."""
        with self._lock:
            for k, w in enumerate(self.workers):
                if not w.alive():
                    self._reclaim(w)
                    try:
                        w.conn.close()
                    except OSError:
                        pass
                    if w.proc.poll() is None:
                        w.proc.kill()
                        w.proc.wait()
                    self.workers[k] = _Worker(k, self._payload, len(self.workers), self._seed)

    def _pick(self) -> _Worker:
        n = len(self.workers)
        if self.load_balance == "least_loaded":
            # Results that have arrived count as done even if nobody asked for them yet.
            for w in self.workers:
                try:
                    while w.alive() and w.conn.poll(0):
                        self._route(w, _recv(w.conn))
                except (EOFError, OSError, ConnectionResetError, WorkerError):
                    pass   # the run that waits for this worker reports it
            k = min(range(n), key=lambda i: (self.load[i], i))
        else:
            k = self._rr % n
            self._rr += 1
        return self.workers[k]

    def start_iterable(self, rank: int, world_size: int, pad: bool) -> None:
        """Every worker opens its share of an iterable dataset for a new epoch."""
        with self._lock:
            for w in self.workers:
                try:
                    _send(w.conn, IterStart(rank, world_size, pad))
                except (BrokenPipeError, ConnectionResetError, OSError):
                    pass  # reported by recv with the worker's exit status

    def submit(self, indices: np.ndarray | int, wid: int | None = None,
               key: tuple[int, int] = (0, 0)) -> tuple[int, int]:
        """Send a batch (sample indices, or for an iterable dataset the number of items to
        take) to worker ``wid`` (None: by the load-balance policy). ``key`` is the run's
        ``(seed, epoch)``, the key of the native prefix's randomness."""
        with self._lock:
            w = self._pick() if wid is None else self.workers[wid]
            tid = next(self._ids)
            lease = self.arena.acquire_bytes(self.slot_bytes)
            block = lease.source
            self.inflight[tid] = (lease, w.wid)
            self.load[w.wid] += 1
            self.sent[w.wid] += 1
            try:
                _send(w.conn, Work(tid, indices, block.name, lease.nbytes, *key))
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass  # reported by recv with the worker's exit status
            return tid, w.wid

    def into_slot(self, batch: Any) -> Any:
        """``batch`` with every array copied into one slot (its Python objects as they are)."""
        leaves: list[np.ndarray] = []

        def collect(x: Any) -> Any:
            a = x.batch if isinstance(x, Shards) else x
            if slot_array(a):
                leaves.append(a)
            return x

        tree_map(collect, batch)
        with self._lock:
            _lease, views = self.arena.acquire(BatchLayout.of([(a.shape, a.dtype) for a in leaves]))
        slots = iter(views)

        def place(x: Any) -> Any:
            a = x.batch if isinstance(x, Shards) else x
            if not slot_array(a):
                return x
            dst = next(slots)
            dst[...] = a
            return Shards(dst, len(x)) if isinstance(x, Shards) else dst

        return tree_map(place, batch)

    def _reclaim(self, w: _Worker) -> None:
        """Free the slots of a worker that can no longer write (dead, or killed and reaped).

        Tasks are kept by worker id, so a worker that :meth:`revive` has replaced has nothing
        left to free (its tasks went when it was replaced): a run that still waited on it and
        finds it dead only later must not take the tasks of the fresh worker with that id."""
        if self.workers[w.wid] is not w:
            return
        for tid in [t for t, (_lease, wid) in self.inflight.items() if wid == w.wid]:
            del self.inflight[tid]
            self.abandoned.discard(tid)
        self.load[w.wid] = 0

    def _fail(self, w: _Worker, what: str) -> WorkerError:
        try:
            code = w.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            code = w.proc.wait()
        w.dead = _exit_status(code)
        self._reclaim(w)
        return WorkerError(f"loaderlib worker {w.wid} (pid {w.proc.pid}) {w.dead} while loading {what}; the batch "
                           "is lost. A worker dies when its process is killed (e.g. out of memory) or crashes in "
                           "native code; the next epoch starts a fresh one.")

    def _hung(self, w: _Worker) -> None:
        """Kill a worker that gave no result in time; its slots come back once it is reaped."""
        if w.proc.poll() is None:
            w.proc.kill()
        w.proc.wait()
        w.dead = "gave no result in time and was killed"
        self._reclaim(w)

    def kill(self, wid: int) -> None:
        """Kill worker ``wid`` (stuck in user code); the next run starts a fresh one."""
        with self._lock:
            self._hung(self.workers[wid])

    def _route(self, w: _Worker, msg: FromWorker) -> None:
        if isinstance(msg, Ready):
            w.ready = True
            return
        if isinstance(msg, InitError):
            w.dead = "failed to start"
            self._reclaim(w)
            raise WorkerError(f"loaderlib worker {w.wid} could not load the dataset / batchify function: "
                              f"{msg.text}\n{msg.traceback}")
        mid = msg.task_id
        entry = self.inflight.pop(mid, None)
        if entry is not None:
            self.load[entry[1]] = max(0, self.load[entry[1]] - 1)
        lease = entry[0] if entry else None
        if mid in self.abandoned:
            self.abandoned.discard(mid)   # its slot is free again now
        elif not isinstance(msg, Cancelled):
            self.ready[mid] = (msg, lease)

    def recv(self, wid: int, tid: int, timeout: float | None, what: str,
             stop: threading.Event | None = None) -> tuple[Done | Failed, Any]:
        """The result message of task ``tid`` (routing other tasks' results on the way)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if tid in self.ready:
                    return self.ready.pop(tid)
                w = self.workers[wid]
                if tid not in self.inflight:
                    raise WorkerError(f"loaderlib worker {wid} {w.dead or 'was replaced'}; cannot load {what}")
            if stop is not None and stop.is_set():
                raise _Stopped()
            try:
                readable = bool(mp_wait([w.conn], 0.1))
            except (OSError, ValueError):
                readable = True   # closed: recv below says how
            with self._lock:
                if tid in self.ready:
                    return self.ready.pop(tid)
                if not readable:
                    if w.proc.poll() is not None:
                        raise self._fail(w, what)
                    if deadline is not None and time.monotonic() > deadline:
                        self._hung(w)
                        raise LoaderTimeoutError(f"worker {wid} gave no result within timeout={timeout} s for "
                                                 f"{what}; it was killed, and the next epoch starts a fresh one")
                    continue
                try:
                    if not w.conn.poll(0):
                        continue   # another thread took it
                    msg = _recv(w.conn)
                except (EOFError, OSError, ConnectionResetError):
                    raise self._fail(w, what) from None
                self._route(w, msg)

    def abandon(self, tid: int) -> None:
        """Nobody will ask for task ``tid``: the worker skips it if it has not started, and its
        result (and slot) is dropped on arrival."""
        with self._lock:
            if self.ready.pop(tid, None) is not None or tid not in self.inflight:
                return
            self.abandoned.add(tid)
            w = self.workers[self.inflight[tid][1]]
            try:
                _send(w.conn, Cancel(tid))
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass

    def drain(self, tids: list[int], timeout: float | None) -> None:
        """Wait until the abandoned tasks ``tids`` have come back (their slots are free then);
        a worker that holds one past ``timeout`` is killed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                left = [t for t in tids if t in self.inflight]
                if not left:
                    return
                busy = {self.inflight[t][1] for t in left}
            conns = [self.workers[k].conn for k in busy]
            try:
                mp_wait(conns, 0.1)
            except (OSError, ValueError):
                pass
            with self._lock:
                for k in busy:
                    w = self.workers[k]
                    try:
                        while w.conn.poll(0):
                            self._route(w, _recv(w.conn))
                    except (EOFError, OSError, ConnectionResetError):
                        self._fail(w, "an abandoned batch")
                    except WorkerError:
                        pass
                    if w.proc.poll() is not None and any(self.inflight.get(t, (0, -1))[1] == k for t in left):
                        self._fail(w, "an abandoned batch")
                if deadline is not None and time.monotonic() > deadline:
                    for k in busy:
                        if any(self.inflight.get(t, (0, -1))[1] == k for t in tids):
                            self._hung(self.workers[k])

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        for w in self.workers:
            try:
                _send(w.conn, Stop())
            except Exception:  # noqa: BLE001, S110
                pass
        t_end = time.monotonic() + 2.0
        for w in self.workers:
            try:
                w.proc.wait(timeout=max(0.05, t_end - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
            w.conn.close()
        # No worker can write any more: every slot may go.
        with self._lock:
            self.inflight.clear()
            self.ready.clear()
            self.abandoned.clear()
        # A slot still leased (a batch the user keeps) is freed, and unregistered with
        # pin_memory, when that batch goes, whether or not this pool object lives on.
        self.arena.close()
        # Batches the user still holds keep their memory, but no name outlives the pool.
        for block in list(self._blocks):
            block.unlink()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110
            pass


def _view(ref: ArrayRef, whole: np.ndarray) -> np.ndarray:
    n = int(np.prod(ref.shape, dtype=np.int64)) * np.dtype(ref.dtype).itemsize
    return whole[ref.offset:ref.offset + n].view(np.dtype(ref.dtype)).reshape(ref.shape)


def _decode(structure: Any, whole: np.ndarray) -> Any:
    """The batch a worker described: references into the slot become views of it."""

    # NOTE: no closure that refers to itself here: that cycle would keep ``whole`` (and so
    # the slot) alive until the garbage collector runs.
    def leaf(x: Any) -> Any:
        if isinstance(x, ArrayRef):
            return _view(x, whole)
        if isinstance(x, ShardsRef):
            return Shards(_view(x.batch, whole), x.num_shards)
        return x

    return tree_map(leaf, structure)


def _concat(a: Any, b: Any) -> Any:
    """Join two collated batches along the sample axis (the rare on_error="skip" fill path)."""

    def leaf(x: Any, y: Any) -> Any:
        if isinstance(x, Shards):
            return Shards(np.concatenate([x.batch, y.batch]), len(x))
        if isinstance(x, np.ndarray):
            return np.concatenate([x, y])
        if isinstance(x, list):
            return x + y
        raise LoaderError(f"on_error='skip' cannot join batches of type {type(x).__name__}")

    return tree_map(leaf, a, b, is_leaf=lambda x: isinstance(x, list) and not isinstance(x, tuple))


class ProcessesProducer(Producer):
    """Batches loaded by the loader's worker pool (see NOTE [ Worker processes ])."""

    def __init__(self, *, pool: WorkerPool, timeout: float | None, knobs: _Knobs, recorder: Recorder, on_error: str,
                 state: RunState, max_in_flight: int) -> None:
        super().__init__(state=state, recorder=recorder, on_error=on_error)
        self.pool = pool
        self.timeout = timeout
        self.knobs = knobs
        self.lookahead = max(1, int(max_in_flight))
        self._cancelled: list[int] = []
        self._waiting: tuple | None = None   # (task id, worker id, batch number) being waited for
        # The ring for every batch this run can hold, now: in flight at the workers, queued,
        # the one the driver is queueing, the one the user just took and the one it still
        # keeps from before. Steady state then allocates no shared memory (NOTE [ Arena growth ]).
        need = self.lookahead + knobs.prefetch + 3
        if pool.arena.num_slots < need:
            pool.arena.num_slots = need
            pool.arena.reserve(BatchLayout.of([((pool.slot_bytes,), np.uint8)]))
        self._stage_ns = [0, 0]

    def submit(self, task: Task) -> tuple:
        tid, wid = self.pool.submit(task.indices, key=(self.state.seed, self.state.epoch))
        return task, tid, wid, _clock()

    def cancel(self, handle: tuple) -> None:
        self.pool.abandon(handle[1])  # the pool keeps the slot until the worker's result arrives
        self._cancelled.append(handle[1])

    def close(self, wait: bool = True) -> None:
        # Workers persist with the loader; this run's batches still at them come back now.
        if wait and self._cancelled:
            tids, self._cancelled = self._cancelled, []
            self.pool.drain(tids, self.timeout)

    def timed_out(self) -> str | None:
        waiting = self._waiting
        if waiting is None:
            return None
        _tid, wid, number = waiting
        self.pool.kill(wid)
        return (f"worker {wid} was still on batch {number} and was killed; the next epoch starts a fresh one in "
                "its place")

    def _result(self, number: int, indices: np.ndarray | None, tid: int, wid: int) -> tuple[Any, int]:
        """Batch ``number``'s result from task ``tid`` and its sample count; ``indices`` None for an
        iterable's batch (as many items as arrived: the count is -1)."""
        what = f"batch {number} of epoch {self.state.epoch}"
        self._waiting = (tid, wid, number)
        try:
            msg, lease = self.pool.recv(wid, tid, self.timeout, what, self.state.stop)
        finally:
            self._waiting = None
        if isinstance(msg, Failed):
            exc: BaseException | None = None
            if msg.payload is not None:
                try:
                    exc = pickle.loads(msg.payload)
                except Exception:  # noqa: BLE001
                    exc = None
            if exc is None:
                exc = LoaderError(f"{msg.text} (in worker {wid})")
            if msg.sample is not None:
                annotate(exc, msg.sample, msg.source, "processes")
            raise _add_context(exc, f"worker {wid} traceback:\n{msg.traceback}")
        needed = msg.needed
        if needed > self.pool.slot_bytes:
            # NOTE [ Arena growth ] (pyx/_arena.pyx): plan for the largest batch seen so far.
            self.pool.slot_bytes = max(needed, self.pool.slot_bytes + self.pool.slot_bytes // 2)
        if indices is None:
            return (None if msg.structure is None else self._delivered(msg.structure, lease, needed)), -1
        self._stage_ns[0] += msg.python_ns
        self._stage_ns[1] += msg.collate_ns
        for i, src, reason in msg.failures:
            self.skipped(i, src, reason)
        if msg.structure is None:
            return None, 0
        return self._delivered(msg.structure, lease, needed), len(indices) - len(msg.failures)

    def _delivered(self, structure: Any, lease: Any, needed: int) -> Any:
        batch = _decode(structure, np.frombuffer(lease, np.uint8))
        if self.pool.registrar is not None and needed > lease.nbytes:
            # Part of the batch outgrew the slot and came pickled (the slots grow from the
            # next batch on): with pin_memory it is delivered from a page-locked slot too.
            batch = self.pool.into_slot(batch)
        return batch

    def finish(self, handle: tuple) -> Produced | None:
        task, tid, wid, t0 = handle
        self._stage_ns = [0, 0]
        batch, n = self._result(task.number, task.indices, tid, wid)
        want = task.target
        end = task.start + task.indices.size
        if self.on_error == "skip" and n < want:
            # The fill is the next samples of the stream (NOTE [ The epoch is one stream ]);
            # batches already sent to workers were planned with them, so they are void and
            # planned again after the fill (the driver cancels them).
            self.state.replan_from(end, task.number + 1)
            while n < want:
                more, start = self.state.take(want - n)
                if not more.size:
                    break
                end = start + more.size
                t2, w2 = self.pool.submit(more, key=(self.state.seed, self.state.epoch))
                extra, m = self._result(task.number, more, t2, w2)
                if extra is not None:
                    batch = extra if batch is None else _concat(batch, extra)
                    n += m
        now = _clock()
        if self.rec.enabled and batch is not None:
            # Stage times are the workers' own; wall time is the loader's wait for this batch,
            # not counting what overlaps the previous batch's (NOTE [ Batch wall time ]).
            self.rec.batch_done(n, {"python": self._stage_ns[0], "collate": self._stage_ns[1]},
                                batch_wall(t0, self.pool.last_end, now), len(self.pool.workers))
        self.pool.last_end = max(self.pool.last_end, now)
        return None if batch is None else Produced(batch, end, n, want)



class IterableProcessesProducer(ProcessesProducer):
    """An iterable dataset on the worker processes: each worker iterates its own share and
    makes whole batches; batch ``k`` comes from worker ``k mod num_workers``, skipping workers
    whose share has ended, so the order is deterministic (NOTE [ Iterable shards ])."""

    state: IterableRunState

    def __init__(self, *, rank: int, world_size: int, pad: bool, batch_size: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        n = len(self.pool.workers)
        self.lookahead = n          # one batch per worker in flight: the order stays fixed
        self.batch_size = batch_size
        self._ended: set[int] = set()
        self._next_worker = 0
        self.pool.start_iterable(rank, world_size, pad)

    def submit(self, task: Task) -> tuple:
        n = len(self.pool.workers)
        live = [k for k in range(n) if k not in self._ended]
        if not live:
            return task, None, None, _clock()
        while self._next_worker % n in self._ended:
            self._next_worker += 1
        wid = self._next_worker % n
        self._next_worker += 1
        tid, wid = self.pool.submit(self.batch_size, wid=wid)   # a count: the worker's next items
        return task, tid, wid, _clock()

    def finish(self, handle: tuple) -> Produced | None:
        task, tid, wid, _t0 = handle
        st = self.state
        if tid is None:
            st.ended = True
            return None
        batch, _ = self._result(task.number, None, tid, wid)
        size = _batch_len(batch) if batch is not None else 0
        if size < self.batch_size:
            self._ended.add(wid)
            if len(self._ended) == len(self.pool.workers):
                st.ended = True
        if batch is None or size == 0:
            return None
        with st.lock:
            st.cursor += size
            st.produced += 1
            end = st.cursor
        return Produced(batch, end, size, self.batch_size)


def _batch_len(batch: Any) -> int:
    first = batch
    while isinstance(first, (tuple, list)) and not isinstance(first, Shards) and first:
        first = first[0]
    return int(first.shape[0]) if hasattr(first, "shape") and first.ndim else len(first)
