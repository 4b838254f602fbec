"""A plain Python thread-pool loader: the baseline loaderlib is compared against.

This is the loader most projects write by hand: per sample, read the file, decode it with
OpenCV and apply numpy/OpenCV transforms on a ``concurrent.futures`` thread pool, then
``np.stack`` the batch. It speaks the same interface as ``loaderlib.DataLoader`` (iteration,
``stats``, ``recorder``, settable ``num_threads``/``prefetch``, ``close()``), and it times
each of its steps with a :class:`~loaderlib.profiling.recorder.StageRecorder`, so the
harness and the dashboard can measure it the same way, and each step can be given as any
Python callable (which is how the profiling tests inject slow reads or slow Python code).
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import StageRecorder
from ..stats import STAGES
from ..transforms import random_resized_crop_box

__all__ = [
    "PythonThreadLoader",
    "ResNetTrainTransform",
    "TorchImageDataset",
    "decode_opencv",
    "python_thread_loader",
    "read_file",
]

_STAGE_INDEX = {name: i for i, name in enumerate(STAGES)}
_END = object()


def read_file(item: Any) -> bytes:
    """Read step for ``(path, label)`` items (or bare paths): the file's bytes."""
    path = item[0] if isinstance(item, tuple) else item
    with open(path, "rb") as f:
        return f.read()


def decode_opencv(data: bytes) -> np.ndarray:
    """Decode step: ``cv2.imdecode`` to an HWC uint8 RGB array (EXIF orientation ignored)."""
    from .._opencv import cv2

    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    if img is None:
        raise ValueError("cv2.imdecode could not decode the image")
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


class ResNetTrainTransform:
    """The ResNet-50 training augmentation written the usual way, with numpy and OpenCV.

    RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3)) with bilinear resize, a
    random horizontal flip, ``(x/255 - mean)/std`` as float32 and HWC -> CHW. Randomness
    comes from a generator keyed by the sample index, so runs are repeatable.
    """

    def __init__(self, size: int = 224, seed: int = 0,
                 mean: Sequence[float] = (0.485, 0.456, 0.406), std: Sequence[float] = (0.229, 0.224, 0.225)):
        self.size = int(size)
        self.seed = int(seed)
        self.mean = np.asarray(mean, np.float32) * 255.0
        self.inv_std = 1.0 / (np.asarray(std, np.float32) * 255.0)

    def __call__(self, img: np.ndarray, index: int = 0) -> np.ndarray:
        from .._opencv import cv2

        rng = np.random.default_rng((self.seed, index))
        h, w = img.shape[:2]
        y, x, ch, cw = random_resized_crop_box(w, h, rng=rng)   # torchvision's get_params
        out = cv2.resize(img[y:y + ch, x:x + cw], (self.size, self.size), interpolation=cv2.INTER_LINEAR)
        if rng.random() < 0.5:
            out = out[:, ::-1]
        out = (out.astype(np.float32) - self.mean) * self.inv_std
        return np.ascontiguousarray(out.transpose(2, 0, 1))


class PythonThreadLoader:
    """Batches from per-sample Python steps run on a thread pool, with per-stage timing.

    Parameters
    ----------
    items : sequence
        What the steps work on, e.g. ``(path, label)`` pairs. Labels are taken from
        ``item[1]`` when items are tuples, else ``-1``.
    steps : sequence of (stage, callable)
        The per-sample chain, in order. Stage is one of :data:`STAGES` (except
        ``"collate"``); it says which stage the step's time is recorded under. The first
        step receives the item, each later one the previous output; a step whose callable
        accepts an ``index`` keyword receives the sample index too.
    batch_size, num_threads, prefetch : int
        Samples per batch, pool threads, ready batches kept ahead of the consumer.
    shuffle, seed : bool, int
        Sample order: shuffled per epoch by ``(seed, epoch)`` when ``shuffle``.
    collate : callable, optional
        ``list of outputs -> batch array``; ``np.stack`` by default (timed as ``collate``).
    record : bool
        Whether the recorder starts enabled.
    """

    engine = "python-threads"

    def __init__(
        self,
        items: Sequence[Any],
        steps: Sequence[tuple[str, Callable[..., Any]]],
        *,
        batch_size: int = 32,
        num_threads: int = 2,
        prefetch: int = 2,
        shuffle: bool = False,
        seed: int = 0,
        collate: Callable[[list], Any] | None = None,
        record: bool = True,
    ) -> None:
        for stage, fn in steps:
            if stage not in _STAGE_INDEX or stage == "collate":
                raise ValueError(f"step stage must be one of {STAGES[:-1]}, got {stage!r}")
            if not callable(fn):
                raise TypeError(f"step {stage!r} is not callable: {fn!r}")
        if batch_size < 1 or num_threads < 1 or prefetch < 1:
            raise ValueError("batch_size, num_threads and prefetch must be >= 1")
        self.items = items
        self.steps = [(stage, fn, _takes_index(fn)) for stage, fn in steps]
        self.batch_size = int(batch_size)
        self._num_threads = int(num_threads)
        self._prefetch = int(prefetch)
        self.shuffle = shuffle
        self.seed = seed
        self.collate = collate or np.stack
        self.recorder = StageRecorder(enabled=record)
        self._epoch = 0
        self._iterators: list[_Iter] = []
        self._closed = False

    # -- the DataLoader interface ----------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return (len(self.items) + self.batch_size - 1) // self.batch_size

    def __iter__(self) -> _Iter:
        if self._closed:
            raise RuntimeError("the loader is closed")
        order = np.arange(len(self.items))
        if self.shuffle:
            order = np.random.default_rng((self.seed, self._epoch)).permutation(len(self.items))
        self._epoch += 1
        it = _Iter(self, order)
        self._iterators = [i for i in self._iterators if not i.finished] + [it]
        return it

    @property
    def stats(self) -> Any:
        """Per-stage timings of the current or last epoch (a ``Stats`` snapshot)."""
        return self.recorder.snapshot()

    @property
    def num_threads(self) -> int:
        """Pool threads; settable while running, takes effect from the next batch."""
        return self._num_threads

    @num_threads.setter
    def num_threads(self, n: int) -> None:
        if int(n) < 1:
            raise ValueError("num_threads must be >= 1")
        self._num_threads = int(n)

    @property
    def prefetch(self) -> int:
        """Ready batches kept ahead; settable while running, takes effect at once."""
        return self._prefetch

    @prefetch.setter
    def prefetch(self, n: int) -> None:
        if int(n) < 1:
            raise ValueError("prefetch must be >= 1")
        self._prefetch = int(n)
        for it in self._iterators:
            it.resize_queue(self._prefetch)

    def explain(self) -> str:
        chain = " -> ".join(f"{stage}:{getattr(fn, '__name__', type(fn).__name__)}" for stage, fn, _ in self.steps)
        return (f"engine 'python-threads': every step is Python, run per sample on {self._num_threads} "
                f"pool threads; chain {chain} -> collate:{getattr(self.collate, '__name__', 'collate')}")

    def close(self) -> None:
        """Stop every running iterator's threads (idempotent)."""
        self._closed = True
        for it in self._iterators:
            it.close()
        self._iterators = []

    def __del__(self) -> None:
        if getattr(self, "_iterators", None):
            self.close()


def _takes_index(fn: Callable[..., Any]) -> bool:
    import inspect

    try:
        return "index" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class _Iter:
    """One epoch: a driver thread fills a bounded queue with collated batches."""

    def __init__(self, loader: PythonThreadLoader, order: np.ndarray) -> None:
        self.loader = loader
        self.order = order
        self.rec = loader.recorder
        self.q: queue.Queue = queue.Queue(maxsize=loader.prefetch)
        self.stop = threading.Event()
        self.finished = False
        self.rec.epoch_started(loader.num_threads, loader.batch_size)
        self.driver = threading.Thread(target=self._drive, name="python-thread-loader", daemon=True)
        self.driver.start()

    def resize_queue(self, n: int) -> None:
        with self.q.mutex:
            self.q.maxsize = n
            self.q.not_full.notify_all()

    def _sample(self, i: int) -> tuple[Any, int, list[int]]:
        item = self.loader.items[i]
        out = item
        ns = [0] * len(STAGES)
        for stage, fn, takes_index in self.loader.steps:
            t = time.perf_counter_ns()
            out = fn(out, index=i) if takes_index else fn(out)
            ns[_STAGE_INDEX[stage]] += time.perf_counter_ns() - t
        label = item[1] if isinstance(item, tuple) and len(item) > 1 else -1
        return out, label, ns

    def _drive(self) -> None:
        # NOTE [ Baseline pipelining ]: the next batch's samples are submitted to the pool
        # before the current batch is collated and queued, so the pool never idles while the
        # driver collates (the usual hand-written loader keeps one batch in flight like this).
        # Each batch's recorded wall time runs from when its predecessor was handed over (or
        # its own submission, if later) to its own completion, so batch walls never overlap
        # and threads x wall is the pool time the batch really had. The driver collates
        # alongside the pool: what does not fit in the pool's threads is reported apart by the
        # recorder (NOTE [ Stage time and busy fraction ]), never as a pool above 100% busy.
        loader = self.loader
        pool = None
        pool_threads = 0
        pending = None
        self._t_prev = 0
        try:
            bs = loader.batch_size
            starts = list(range(0, len(self.order), bs))
            for start in [*starts, None]:
                if self.stop.is_set():
                    return
                nxt = None
                if start is not None:
                    threads = loader.num_threads
                    if threads != pool_threads:  # a new thread count takes effect from this batch
                        if pending is not None and not self._finish(pending):
                            return
                        pending = None
                        if pool is not None:
                            pool.shutdown(wait=True)
                        pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="python-loader")
                        pool_threads = threads
                    idx = self.order[start:start + bs]
                    t_submit = time.perf_counter_ns()
                    nxt = ([pool.submit(self._sample, int(i)) for i in idx], t_submit, threads)
                if pending is not None and not self._finish(pending):
                    return
                pending = nxt
            self._put(_END)
        except BaseException as e:  # noqa: BLE001 -- handed to the consumer, which raises it
            self._put(e)
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def _finish(self, pending: tuple) -> bool:
        futures, t_submit, threads = pending
        rec = self.rec
        results = [f.result() for f in futures]
        tc = time.perf_counter_ns()
        batch = self.loader.collate([r[0] for r in results])
        labels = np.asarray([r[1] for r in results], dtype=np.int64)
        t1 = time.perf_counter_ns()
        if rec.enabled:
            per = np.asarray([r[2] for r in results], dtype=np.int64)
            per[:, _STAGE_INDEX["collate"]] = (t1 - tc) // len(results)
            stage = dict(zip(STAGES, (int(v) for v in per.sum(0))))
            stage["collate"] = t1 - tc
            wall = t1 - max(t_submit, self._t_prev)
            rec.batch_done(len(results), stage, wall, threads, per)
        ok = self._put((batch, labels))
        self._t_prev = time.perf_counter_ns()
        return ok

    def _put(self, x: Any) -> bool:
        t = time.perf_counter_ns()
        while not self.stop.is_set():
            try:
                self.q.put(x, timeout=0.05)
            except queue.Full:
                continue
            waited = time.perf_counter_ns() - t
            if waited > 50_000:  # a put that had to wait for room
                self.rec.producer_blocked(waited)
            self.rec.queue_depth(self.q.qsize(), self.q.maxsize)
            return True
        return False

    def __iter__(self) -> _Iter:
        return self

    def __next__(self) -> Any:
        if self.finished:
            raise StopIteration
        t = time.perf_counter_ns()
        x = self.q.get()
        self.rec.consumer_waited(time.perf_counter_ns() - t)
        if x is _END:
            self.finished = True
            self.driver.join()
            raise StopIteration
        if isinstance(x, BaseException):
            self.finished = True
            self.driver.join()
            raise x
        return x

    def close(self) -> None:
        """Stop the driver thread and its pool (idempotent)."""
        self.finished = True
        self.stop.set()
        if self.driver.is_alive() and self.driver is not threading.current_thread():
            self.driver.join()


def python_thread_loader(
    paths_and_labels: Sequence[tuple[str, int]],
    *,
    batch_size: int = 64,
    num_threads: int = 2,
    size: int = 224,
    shuffle: bool = True,
    seed: int = 0,
    prefetch: int = 2,
) -> PythonThreadLoader:
    """The usual hand-written ResNet-50 training loader on a Python thread pool.

    Reads each file, decodes it with OpenCV and applies :class:`ResNetTrainTransform`
    (RandomResizedCrop, flip, normalize, CHW float32) per sample, then stacks.

    Parameters
    ----------
    paths_and_labels : sequence of (str, int)
        Image files and their labels (e.g. ``ImageFolderDataset(root).items``).
    batch_size, num_threads, size, shuffle, seed, prefetch
        As for ``loaderlib.DataLoader``; ``size`` is the crop size.

    Returns
    -------
    PythonThreadLoader
    """
    steps = [("read", read_file), ("decode", decode_opencv), ("transform", ResNetTrainTransform(size, seed))]
    return PythonThreadLoader(list(paths_and_labels), steps, batch_size=batch_size, num_threads=num_threads,
                              prefetch=prefetch, shuffle=shuffle, seed=seed)


class TorchImageDataset:
    """Map-style dataset for PyTorch's DataLoader: the same per-sample Python code as the baseline.

    Item ``i`` is ``(CHW float32 image, label)`` from :func:`read_file`,
    :func:`decode_opencv` and :class:`ResNetTrainTransform`. Plain class (no torch import),
    picklable, so worker processes can receive it.
    """

    def __init__(self, items: Sequence[tuple[str, int]], size: int = 224, seed: int = 0) -> None:
        self.items = list(items)
        self.transform = ResNetTrainTransform(size, seed)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        item = self.items[i]
        return self.transform(decode_opencv(read_file(item)), index=i), int(item[1])
