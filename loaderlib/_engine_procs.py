"""The processes engine: persistent worker processes writing into shared-memory slots.

NOTE [ Worker processes ]
Workers are fresh interpreters (``python -c 'from loaderlib._engine_worker import main; main()'``), started with
``subprocess`` and talking over one socket each, never forked: a fork would inherit a
libgomp thread pool that hangs in the child (NOTE [ OpenMP after fork ]), and
multiprocessing's spawn/forkserver re-import the user's ``__main__`` in every child, which
runs unguarded scripts twice and fails for notebooks. The dataset, batchify function and
init function travel serialised with cloudpickle, so lambdas, local functions and classes
defined in ``__main__`` or a notebook work ("Can't get attribute ... on __main__" cannot
happen).

Each loader owns its workers, so several loaders with different datasets run at once. The
loader creates every shared-memory block (the processes engine's arena slots) and is the
only one to unlink them; workers only map them. A killed worker therefore leaks nothing, and
if the loader's process itself dies, Python's resource tracker unlinks the blocks. A task
names its slot; the slot stays leased until that task's result has arrived (even when the
iterator that sent it was abandoned), so a late worker never writes into a slot that was
handed out again. The loader notices a dead worker while waiting for its result (the
socket closes and the process has an exit code) and raises :class:`WorkerError` naming the
worker, its exit status and the batch.
"""

from __future__ import annotations

import itertools
import os
import pickle
import signal
import subprocess
import sys
import time
import weakref
from multiprocessing import Pipe
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from ._engine_base import Produced, Producer, RunState, Task, _clock, batch_wall
from ._engine_local import _Stopped, annotate
from ._engine_worker import _Ref, _ShardsRef
from .arena import BatchArena
from .batchify import Shards
from .errors import LoaderError, LoaderTimeoutError, WorkerError

_DEFAULT_SLOT = 1 << 20
# Run by import, not with ``-m``: under ``-m`` the worker module would be ``__main__`` and
# the classes it pickles could not be found by the loader.
_WORKER_MAIN = "from loaderlib._engine_worker import main; main()"


class _ShmBlock:
    """One shared-memory slot buffer, created and unlinked by the loader's process."""

    def __init__(self, nbytes: int) -> None:
        self.shm = SharedMemory(create=True, size=max(int(nbytes), 1))
        self.name = self.shm.name
        self.buf = self.shm.buf
        self._unlinked = False

    def unlink(self) -> None:
        """Remove the name now; the memory lives on while any process still maps it."""
        if not self._unlinked and self.shm is not None:
            self._unlinked = True
            try:
                self.shm.unlink()
            except FileNotFoundError:
                pass

    def release(self) -> None:
        self.unlink()
        shm, self.shm = self.shm, None
        if shm is None:
            return
        self.buf = None
        try:
            shm.close()
        except BufferError:
            pass  # a view is still alive somewhere: the mapping goes with it

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001, S110
            pass


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
        cwd = os.getcwd()
        parent.send_bytes(pickle.dumps(("init", [cwd, *paths], wid, payload, num_workers, seed)))

    def alive(self) -> bool:
        return self.dead is None and self.proc.poll() is None


class WorkerPool:
    """A loader's persistent worker processes and their shared-memory slots."""

    def __init__(self, num_workers: int, dataset: Any, batchify_fn: Any, worker_init_fn: Any, on_error: str,
                 seed: int) -> None:
        import cloudpickle

        try:
            payload = cloudpickle.dumps((dataset, batchify_fn, worker_init_fn, on_error))
        except Exception as e:
            raise LoaderError(f"the dataset or batchify function cannot be sent to worker processes: "
                              f"{type(e).__name__}: {e}") from e
        self.workers = [_Worker(k, payload, num_workers, seed) for k in range(num_workers)]
        self._blocks: weakref.WeakSet = weakref.WeakSet()
        self.arena = BatchArena(0, allocator=self._new_block)
        self.slot_bytes = _DEFAULT_SLOT
        self.inflight: dict[int, tuple] = {}   # task id -> (lease, worker id)
        self.ready: dict[int, tuple] = {}      # task id -> (message, lease) received out of turn
        self.abandoned: set[int] = set()       # tasks whose results nobody will ask for
        self._ids = itertools.count()
        self._rr = 0
        self.closed = False

    def _new_block(self, nbytes: int) -> _ShmBlock:
        block = _ShmBlock(nbytes)
        self._blocks.add(block)
        return block

    def alive(self) -> bool:
        return not self.closed and all(w.alive() for w in self.workers)

    def submit(self, indices: np.ndarray) -> tuple[int, int]:
        w = self.workers[self._rr % len(self.workers)]
        self._rr += 1
        tid = next(self._ids)
        lease = self.arena.acquire_bytes(self.slot_bytes)
        block = lease.source
        self.inflight[tid] = (lease, w.wid)
        try:
            w.conn.send_bytes(pickle.dumps(("task", tid, indices, block.name, lease.nbytes)))
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # reported by recv with the worker's exit status
        return tid, w.wid

    def _fail(self, w: _Worker, what: str) -> WorkerError:
        try:
            code = w.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            code = None
        w.dead = _exit_status(code)
        return WorkerError(f"loaderlib worker {w.wid} (pid {w.proc.pid}) {w.dead if code is not None else 'closed its connection'} "
                           f"while loading {what}; the batch is lost. A worker dies when its process is killed "
                           "(e.g. out of memory) or crashes in native code.")

    def recv(self, wid: int, tid: int, timeout: float | None, what: str, stop: Any = None) -> tuple:
        """The result message of task ``tid`` (discarding results of abandoned tasks)."""
        w = self.workers[wid]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if tid in self.ready:
                return self.ready.pop(tid)
            if stop is not None and stop.is_set():
                raise _Stopped()
            if w.dead is not None:
                raise WorkerError(f"loaderlib worker {w.wid} (pid {w.proc.pid}) {w.dead}; cannot load {what}")
            try:
                has = w.conn.poll(0.1)
            except (EOFError, OSError):
                raise self._fail(w, what) from None
            if not has:
                if w.proc.poll() is not None:
                    raise self._fail(w, what)
                if deadline is not None and time.monotonic() > deadline:
                    raise LoaderTimeoutError(f"worker {w.wid} gave no result within timeout={timeout} s for {what}")
                continue
            try:
                msg = pickle.loads(w.conn.recv_bytes())
            except (EOFError, OSError, ConnectionResetError):
                raise self._fail(w, what) from None
            kind = msg[0]
            if kind == "ready":
                w.ready = True
                continue
            if kind == "init_error":
                _, text, tb, _payload = msg
                w.dead = "failed to start"
                err = WorkerError(f"loaderlib worker {w.wid} could not load the dataset / batchify function: "
                                  f"{text}\n{tb}")
                raise err
            mid = msg[1]
            entry = self.inflight.pop(mid, None)
            lease = entry[0] if entry else None
            if mid == tid:
                return msg, lease
            if mid in self.abandoned:
                self.abandoned.discard(mid)   # its slot is free again now
            else:
                self.ready[mid] = (msg, lease)  # a later batch's result (the skip fill path)

    def abandon(self, tid: int) -> None:
        """Nobody will ask for task ``tid``: drop its result (and free its slot) on arrival."""
        if self.ready.pop(tid, None) is None and tid in self.inflight:
            self.abandoned.add(tid)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for w in self.workers:
            try:
                w.conn.send_bytes(pickle.dumps(("stop",)))
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
        self.inflight.clear()
        self.ready.clear()
        self.arena.clear()
        # Batches the user still holds keep their memory, but no name outlives the pool.
        for block in list(self._blocks):
            block.unlink()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110
            pass


def _decode(structure: Any, whole: np.ndarray) -> Any:
    if isinstance(structure, _Ref):
        n = int(np.prod(structure.shape, dtype=np.int64)) * np.dtype(structure.dtype).itemsize
        return whole[structure.offset:structure.offset + n].view(np.dtype(structure.dtype)).reshape(structure.shape)
    if isinstance(structure, _ShardsRef):
        return Shards(_decode(structure.batch, whole), structure.num_shards)
    if isinstance(structure, tuple):
        return tuple(_decode(x, whole) for x in structure)
    if isinstance(structure, list):
        return [_decode(x, whole) for x in structure]
    if isinstance(structure, dict):
        return {k: _decode(v, whole) for k, v in structure.items()}
    return structure


def _concat(a: Any, b: Any) -> Any:
    """Join two collated batches along the sample axis (the rare on_error="skip" fill path)."""
    if isinstance(a, Shards):
        return Shards(np.concatenate([a.batch, b.batch]), len(a))
    if isinstance(a, np.ndarray):
        return np.concatenate([a, b])
    if isinstance(a, tuple):
        return tuple(_concat(x, y) for x, y in zip(a, b))
    if isinstance(a, list):
        return a + b
    if isinstance(a, dict):
        return {k: _concat(a[k], b[k]) for k in a}
    raise LoaderError(f"on_error='skip' cannot join batches of type {type(a).__name__}")


class ProcessesProducer(Producer):
    """Batches loaded by the loader's worker pool (see NOTE [ Worker processes ])."""

    def __init__(self, *, pool: WorkerPool, timeout: float | None, knobs: Any, recorder: Any, on_error: str,
                  state: RunState) -> None:
        super().__init__(state=state, recorder=recorder, on_error=on_error)
        self.pool = pool
        self.timeout = timeout
        self.knobs = knobs
        self.lookahead = max(2, 2 * len(pool.workers))
        self._stage_ns = [0, 0]
        self._last_end = 0   # when the previous batch finished (NOTE [ Batch wall time ])

    def submit(self, task: Task) -> tuple:
        tid, wid = self.pool.submit(task.indices)
        return task, tid, wid, _clock()

    def cancel(self, handle: tuple) -> None:
        self.pool.abandon(handle[1])  # the pool keeps the slot until the worker's result arrives

    def _result(self, task: Task, tid: int, wid: int) -> tuple[Any, int]:
        what = f"batch {task.number} of epoch {self.state.epoch}"
        msg, lease = self.pool.recv(wid, tid, self.timeout, what, self.state.stop)
        if msg[0] == "error":
            _, _, index, source, text, tb, payload = msg
            exc = None
            if payload is not None:
                try:
                    exc = pickle.loads(payload)
                except Exception:  # noqa: BLE001
                    exc = None
            if exc is None:
                exc = LoaderError(f"{text} (in worker {wid})")
            if index is not None:
                annotate(exc, index, source, "processes")
            try:
                exc.add_note(f"worker {wid} traceback:\n{tb}")
            except AttributeError:
                pass
            raise exc
        _, _, structure, failures, needed, python_ns, collate_ns = msg
        self._stage_ns[0] += python_ns
        self._stage_ns[1] += collate_ns
        for i, src, reason in failures:
            self.skipped(i, src, reason)
        if needed > self.pool.slot_bytes:
            # NOTE [ Arena growth ] (pyx/_arena.pyx): plan for the largest batch seen so far.
            self.pool.slot_bytes = max(needed, self.pool.slot_bytes + self.pool.slot_bytes // 2)
        if structure is None:
            return None, 0
        whole = np.frombuffer(lease, np.uint8)
        batch = _decode(structure, whole)
        return batch, len(task.indices) - len(failures)

    def finish(self, handle: tuple) -> Produced | None:
        task, tid, wid, t0 = handle
        self._stage_ns = [0, 0]
        batch, n = self._result(task, tid, wid)
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
                t2, w2 = self.pool.submit(more)
                extra, m = self._result(Task(task.number, more, more.size, start), t2, w2)
                if extra is not None:
                    batch = extra if batch is None else _concat(batch, extra)
                    n += m
        now = _clock()
        if self.rec.enabled and batch is not None:
            # Stage times are the workers' own; wall time is the loader's wait for this batch,
            # not counting what overlaps the previous batch's (NOTE [ Batch wall time ]).
            self.rec.batch_done(n, {"python": self._stage_ns[0], "collate": self._stage_ns[1]},
                                batch_wall(t0, self._last_end, now), len(self.pool.workers))
        self._last_end = now
        return None if batch is None else Produced(batch, end, n, want)

