"""Compile a transform chain into one fused native pass per sample, and run it on batches.

This module owns ``loaderlib._ext._chain``. :func:`compile_chain` turns a chain of
:mod:`loaderlib.transforms` into a :class:`NativePlan` (or None when a step is a Python
callable, or the order of the steps cannot be fused). A plan's ``run_*_into`` methods
run one parallel pass over a batch, without the GIL: per sample, read the bytes, decode
only the region the chain needs at the smallest sufficient DCT scale, resample it and
write the result straight into ``out[i]`` in its final dtype and layout (see
``pyx/include/ll_chain.h``). Per-item failures never raise: they come back in a
:class:`BatchStatus`.

What fuses: ``[Decode] (RandomResizedCrop | Resize | CenterCrop | RandomHorizontalFlip)*
(Normalize | Cast)* [ToCHW] (Normalize | Cast)*``. The geometric steps up to the first
resize (and the crops and flips after it) become one resampling of the decoded region; a
second resize starts a second stage that resamples the first one's image (per-thread
scratch). The point-wise tail becomes a per-channel 256-entry lookup table computed by
running the tail's own numpy code on all 256 values, so fused Normalize output is bitwise
equal to the step-by-step one.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _threads
from . import transforms as T
from ._datasets.images import _read_file
from ._ext import _chain
from ._ext._jpeg import Status
from .decoding import decode as _decode_image
from .decoding import mode_code, status_message, status_tables, strict_level
from .errors import DecodeError

__all__ = ["BatchStatus", "FileNames", "NativePlan", "PendingBatch", "compile_chain"]

_GEOMETRY = (T.RandomResizedCrop, T.Resize, T.CenterCrop, T.RandomHorizontalFlip)
_POINTWISE = (T.Normalize, T.Cast)


class PendingBatch:
    """A batch queued with ``run_*_into(..., wait=False)``: ``result()`` waits for it (without
    the GIL) and returns its :class:`BatchStatus`; ``done()`` asks without waiting. Dropping
    an unfinished one waits for it, so the memory the kernels write is never freed under them.
    """

    __slots__ = ("_finish", "_handle", "_result")

    def __init__(self, handle: Any, finish: Any) -> None:
        self._handle = handle
        self._finish = finish
        self._result: BatchStatus | None = None

    def done(self) -> bool:
        return self._result is not None or self._handle.done()

    def wait(self) -> None:
        """Wait for the kernels without building the result (a batch that will be dropped)."""
        self._handle.wait()

    @property
    def handle(self) -> Any:
        """The queued kernel job (``_chain.Pending``): its gate (NOTE [ Batches in memory ])."""
        return self._handle

    def gated(self) -> bool:
        """Whether the batch waits behind its closed gate."""
        return bool(self._handle.gated())

    def wait_open(self, timeout: float) -> bool:
        """Wait (without the GIL) for the gate to open, at most ``timeout`` seconds; returns
        whether it is still closed."""
        return bool(self._handle.wait_open(float(timeout)))

    def open(self) -> None:
        """Open the batch's gate (``gated=True``): its items may start."""
        self._handle.open()

    def withdraw(self) -> bool:
        """Take back a batch whose gate is still closed (nothing ran; no result follows).
        False when the gate was open: then the batch runs and ``result()`` applies."""
        return bool(self._handle.withdraw())

    def result(self) -> BatchStatus:
        if self._result is None:
            self._handle.wait()
            self._result = self._finish()
            self._finish = None
        return self._result


@dataclass
class BatchStatus:
    """Per-item outcome of a ``run_*_into`` call.

    Attributes
    ----------
    status : numpy.ndarray
        int32 per item: 0 written, 1 written after libjpeg recovered from corrupt data
        (reason in ``warnings``), negative: failed (the slot holds unspecified values).
    errors : dict
        ``{index in batch: DecodeError}`` naming the sample index, the source (path or
        key) and the reason.
    warnings : dict
        ``{index in batch: str}`` for items with status 1.
    reads : tuple or None
        The reads the kernel threads did themselves (files, records): ``(reads, bytes,
        nanoseconds, latency histogram)`` (NOTE [ Every read counts ] in
        ``pyx/include/ll_readahead.h``); None for a batch that read nothing.
    """

    status: np.ndarray
    errors: dict = field(default_factory=dict)
    warnings: dict = field(default_factory=dict)
    reads: tuple | None = None

    @property
    def ok(self) -> np.ndarray:
        """Boolean mask of the items that were written."""
        return self.status >= 0


class FileNames(Sequence):
    """A batch's file paths as the ``str`` names messages use, each made when it is asked for
    (an item failed): a batch that loads makes none (NOTE [ Paths per batch ] in
    _extract/source.py)."""

    __slots__ = ("_paths",)

    def __init__(self, paths: Sequence[Any]) -> None:
        self._paths = paths

    def __len__(self) -> int:
        return len(self._paths)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [os.fsdecode(os.fspath(p)) for p in self._paths[i]]
        return os.fsdecode(os.fspath(self._paths[i]))

    def path(self, i: int) -> Any:
        """Path ``i`` as given (``str``, bytes or path-like), for opening the file."""
        return os.fspath(self._paths[i])


def _describe_interp(t: Any) -> str:
    return t.interpolation + (" antialiased" if t.antialias else "")


class NativePlan:
    """A compiled chain: the fused per-sample executor plus its per-thread state.

    Attributes
    ----------
    sample_shape : tuple or None
        Shape of one output sample, e.g. ``(3, 224, 224)``; None when the size depends on
        the image (then the ``run_*_into`` methods cannot be used).
    dtype : numpy.dtype
        ``uint8``, ``float32``, ``float16`` or ``uint16`` (bfloat16 bits).
    transform : loaderlib.transforms.Compose
        The chain (with its Decode), used step by step for non-JPEG items.

    Notes
    -----
    Runs batches on its own team of persistent kernel threads, each with one libjpeg decoder
    and scratch buffers (NOTE [ One queue across batches ] in ``pyx/include/ll_pool.h``);
    batches from any thread queue there and run in order. The threads stop when the plan is
    collected or closed (:meth:`close`).
    """

    def __init__(self, chain: T.Compose, decode: T.Decode, ops: list, lut: np.ndarray | None,
                 dtype: np.dtype, chw: bool, spec: T.ImageSpec, steps: list[str], augs: list | None = None,
                 erases: list | None = None):
        self.transform = chain
        self.decode_spec = decode
        self.dtype = np.dtype(dtype)
        self.sample_shape = spec.shape
        self._steps = steps
        self._lock = threading.Lock()
        self._team = None
        self._chain = None
        if self.sample_shape is not None:
            max_px = 0 if decode.max_pixels is None else int(decode.max_pixels)
            self._chain = _chain.CompiledChain(
                ops, mode_code(decode.mode), decode.channels, bool(decode.dct_scaling), strict_level(decode.strict), max_px,
                _chain.DTYPE_FLOAT32 if self.dtype == np.float32 else
                _chain.DTYPE_UINT16 if self.dtype.itemsize == 2 else _chain.DTYPE_UINT8, chw, lut,
                int(spec.height), int(spec.width), augs=augs or [], erases=erases or [], fast=bool(decode.fast))

    def describe(self) -> list[str]:
        """One line per fused step (what ``loader.explain()`` shows)."""
        return list(self._steps)

    def __repr__(self) -> str:
        return f"NativePlan(sample_shape={self.sample_shape}, dtype={self.dtype.name}, steps={self._steps})"

    # ------------------------------------------------------------------ running

    def run_buffers_into(self, buffers: Sequence[Any], out: np.ndarray, indices: Any, *, seed: int, epoch: int,
                         num_threads: int | None, timings: np.ndarray | None = None,
                         sources: Sequence[str] | None = None, wait: bool = True,
                         gated: bool = False) -> BatchStatus | PendingBatch:
        """Run the chain on encoded images held in memory.

        Parameters
        ----------
        buffers : sequence of bytes-like
            One encoded image per sample (bytes, memoryview, mmap slice, uint8 array; not
            copied).
        out : numpy.ndarray
            C-contiguous ``(N, *sample_shape)`` array of ``dtype``; sample i goes to
            ``out[i]``.
        indices : array of int64
            Dataset sample indices: the randomness of sample i is a function of
            ``(seed, epoch, indices[i], transform position)`` only.
        seed, epoch : int
        num_threads : int or None
            Threads for this pass (see ``loaderlib._threads.resolve_num_threads``); the
            output does not depend on it.
        timings : numpy.ndarray, optional
            ``(N, 3)`` int64, filled with per-sample nanoseconds of (read, decode,
            transform) from a monotonic clock; None reads no clock.
        sources : sequence of str, optional
            Names for error messages.
        wait : bool
            False: queue the batch on the plan's kernel threads and return a
            :class:`PendingBatch` at once; its ``result()`` waits and returns the
            :class:`BatchStatus`. Batches queued one after another run in order, with no
            pause between them (NOTE [ One queue across batches ] in include/ll_pool.h).
            ``out``, ``timings`` and the inputs belong to the kernels until then.
        gated : bool
            With ``wait=False``: queued behind a closed gate; no item starts before
            ``PendingBatch.open()`` or the slot release its gate is set on (NOTE [ Batches in
            memory ] in _engines/depth.py).
        """
        bufs = list(buffers)
        return self._run(_chain.SOURCE_BUFFERS, bufs, -1, None, out, indices, seed, epoch, num_threads, timings,
                         sources, lambda i: bufs[i], wait=wait, gated=gated)

    def run_files_into(self, paths: Sequence[Any], out: np.ndarray, indices: Any, *, seed: int, epoch: int,
                       num_threads: int | None, timings: np.ndarray | None = None, wait: bool = True,
                       positions: np.ndarray | None = None, reader: Any = None,
                       gated: bool = False) -> BatchStatus | PendingBatch:
        """Like :meth:`run_buffers_into`, reading each file (POSIX open/read) inside the
        parallel pass into per-thread scratch. A missing or unreadable file fails its
        item with the system's reason and the path.

        With ``reader`` (a :class:`~loaderlib._extract.readahead.ReadAhead`) and ``positions`` (the
        samples' stream positions), files the read-ahead stage queued are taken from it as
        their bytes arrive (NOTE [ Read-ahead ] in include/ll_readahead.h); the output is the
        same."""
        names = [os.fspath(p) for p in paths]
        return self.run_encoded_files_into([os.fsencode(p) for p in names], names, out, indices, seed=seed,
                                           epoch=epoch, num_threads=num_threads, timings=timings, wait=wait,
                                           positions=positions, reader=reader, gated=gated)

    def run_encoded_files_into(self, encoded: list[bytes], paths: Sequence[Any], out: np.ndarray, indices: Any, *,
                               seed: int, epoch: int, num_threads: int | None, timings: np.ndarray | None = None,
                               wait: bool = True, positions: np.ndarray | None = None,
                               reader: Any = None, gated: bool = False) -> BatchStatus | PendingBatch:
        """:meth:`run_files_into` with the file names already encoded (``os.fsencode`` of each
        of ``paths``, as the native engine's driver makes them for a whole batch at once: NOTE
        [ Paths per batch ] in _extract/source.py). ``paths`` name the files in messages; a
        name is made from them only when its item fails."""
        names = FileNames(paths)
        return self._run(_chain.SOURCE_FILES, encoded, -1, None, out, indices, seed, epoch, num_threads, timings,
                         names, lambda i: _read_file(names.path(i)), wait=wait, positions=positions, reader=reader,
                         gated=gated)

    def run_records_into(self, fd: Any, offsets: Any, sizes: Any, out: np.ndarray, indices: Any, *, seed: int,
                         epoch: int, num_threads: int | None, timings: np.ndarray | None = None,
                         sources: Sequence[str] | None = None, wait: bool = True,
                         positions: np.ndarray | None = None, reader: Any = None,
                         gated: bool = False) -> BatchStatus | PendingBatch:
        """Like :meth:`run_buffers_into`, reading record i as ``sizes[i]`` bytes at
        ``offsets[i]`` of the open file ``fd`` (an int, an object with ``fileno()``, or an
        int array with one descriptor per record: several shard files in one pass) with
        ``pread`` inside the parallel pass; ``reader`` and ``positions`` as for
        :meth:`run_files_into`."""
        offs = np.ascontiguousarray(offsets, dtype=np.int64)
        szs = [int(s) for s in np.asarray(sizes).reshape(-1)]
        if offs.ndim != 1 or len(offs) != len(szs):
            raise ValueError(f"offsets ({offs.shape}) and sizes ({len(szs)}) must be 1-d of the same length")
        if isinstance(fd, np.ndarray):
            fds = np.ascontiguousarray(fd, dtype=np.int32)
            if fds.shape != (len(szs),):
                raise ValueError(f"{fds.shape[0] if fds.ndim else 0} descriptors for {len(szs)} records")
            return self._run(_chain.SOURCE_RECORDS, szs, -1, offs, out, indices, seed, epoch, num_threads, timings,
                             sources, lambda i: os.pread(int(fds[i]), szs[i], int(offs[i])), fds=fds, wait=wait,
                             positions=positions, reader=reader, gated=gated)
        fdn = fd if isinstance(fd, int) else fd.fileno()
        return self._run(_chain.SOURCE_RECORDS, szs, fdn, offs, out, indices, seed, epoch, num_threads, timings,
                         sources, lambda i: os.pread(fdn, szs[i], int(offs[i])), wait=wait, positions=positions,
                         reader=reader, gated=gated)

    def run_pixels_into(self, images: Sequence[np.ndarray], out: np.ndarray, indices: Any, *, seed: int,
                        epoch: int, num_threads: int | None, timings: np.ndarray | None = None,
                        sources: Sequence[str] | None = None, wait: bool = True,
                        gated: bool = False) -> BatchStatus | PendingBatch:
        """Like :meth:`run_buffers_into` for images already decoded (HWC uint8 arrays with the
        chain's channel count, e.g. a Pipeline's cache): the chain's geometric and point-wise
        steps run fused on the pixels (no decode, no DCT scaling), with the same keyed
        randomness. An image of the wrong dtype or channel count fails its item."""
        imgs = []
        dims = np.zeros(len(images), np.int64)
        channels = self._chain.channels if self._chain is not None else 0
        wrong = {}
        for i, img in enumerate(images):
            a = np.asarray(img)
            if a.ndim != 3 or a.dtype != np.uint8 or a.shape[2] != channels:
                wrong[i] = f"a decoded image must be HWC uint8 with {channels} channels, got {a.shape} {a.dtype}"
                a = np.zeros((1, 1, 1), np.uint8)   # the kernel fails the item (no 0x0 image)
            else:
                dims[i] = (int(a.shape[0]) << 32) | int(a.shape[1])
            imgs.append(np.ascontiguousarray(a))
        idx = np.asarray(indices)

        def name_wrong(res: BatchStatus) -> BatchStatus:
            for i, why in wrong.items():
                src = None if sources is None else str(sources[i])
                res.errors[i] = DecodeError.from_status(int(res.status[i]), why, int(idx[i]), src)
            return res

        return self._run(_chain.SOURCE_PIXELS, imgs, -1, dims, out, indices, seed, epoch, num_threads, timings,
                         sources, lambda i: imgs[i], wait=wait, after=name_wrong, gated=gated)

    def close(self) -> None:
        """Stop the plan's kernel threads now rather than when the plan is collected. Batches
        still queued finish first (each holds its threads); a later run starts new ones.
        Takes no lock: it may run while the interpreter exits, when a thread that held one
        can no longer release it (NOTE [ Threads at interpreter exit ] in _engines/base.py)."""
        team, self._team = self._team, None
        del team   # the threads are joined here, outside any lock

    def share_team(self, other: NativePlan) -> bool:
        """Run this plan's batches on ``other``'s kernel threads, their decoders and scratch
        included, when ``other`` has threads and this plan none yet (NOTE [ One team across
        epochs ] in _engines/native.py). Returns whether it did."""
        team = other._team
        if team is None or not team.usable or self._team is not None:
            return False
        with self._lock:
            if self._team is not None:
                return False
            self._team = team
        return True

    def _check_out(self, out: Any, n: int) -> None:
        if self.sample_shape is None:
            raise ValueError("this chain's output size depends on the image (no fixed sample_shape); "
                             "add a crop or a fixed-size Resize to run it into a batch")
        if not isinstance(out, np.ndarray):
            raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
        want = (n, *self.sample_shape)
        if out.shape != want or out.dtype != self.dtype:
            raise ValueError(f"out must be {want} {self.dtype.name}, got {out.shape} {out.dtype}")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("out must be C-contiguous and writeable")

    def _run(self, kind: int, items: list, fd: int, offsets: np.ndarray | None, out: np.ndarray, indices: Any,
             seed: int, epoch: int, num_threads: int | None, timings: np.ndarray | None,
             sources: Sequence[str] | None, fetch, fds: np.ndarray | None = None, wait: bool = True,
             after: Any = None, positions: np.ndarray | None = None, reader: Any = None,
             gated: bool = False) -> BatchStatus | PendingBatch:
        n = len(items)
        self._check_out(out, n)
        idx = np.ascontiguousarray(indices, dtype=np.int64)
        if idx.shape != (n,):
            raise ValueError(f"indices must have shape ({n},), got {idx.shape}")
        if sources is not None and len(sources) != n:
            raise ValueError(f"sources has {len(sources)} entries for {n} items")
        if timings is not None and (not isinstance(timings, np.ndarray) or timings.shape != (n, 3)
                                    or timings.dtype != np.int64 or not timings.flags.c_contiguous):
            raise ValueError(f"timings must be a C-contiguous ({n}, 3) int64 array")
        if not isinstance(seed, (int, np.integer)) or not isinstance(epoch, (int, np.integer)):
            raise TypeError(f"seed and epoch must be integers, got {seed!r} and {epoch!r}")
        seed_u = int(seed) & ((1 << 64) - 1)
        epoch_u = int(epoch) & ((1 << 64) - 1)
        nthreads = min(_threads.resolve_num_threads(num_threads), max(n, 1))
        status, msgs = status_tables(n)
        native_reader, pos, timeout = None, None, 0.0
        if reader is not None and positions is not None and n:
            native_reader, timeout = reader.native, reader.timeout
            pos = np.ascontiguousarray(positions, dtype=np.int64)
            if pos.shape != (n,):
                raise ValueError(f"positions must have shape ({n},), got {pos.shape}")
        handle = _chain.start_into(self._chain, self._team_for(nthreads), kind, items, fd, offsets, out, idx,
                                      seed_u, epoch_u, nthreads, timings, status, msgs, fds, native_reader, pos,
                                      timeout, gated and not wait)

        def finish() -> BatchStatus:
            result = BatchStatus(status=status)
            if kind in (_chain.SOURCE_FILES, _chain.SOURCE_RECORDS):
                result.reads = handle.inline_reads()
            for i in np.flatnonzero(status != Status.OK):
                i = int(i)
                reason = status_message(msgs, i)
                if status[i] == Status.WARNED:
                    result.warnings[i] = reason
                    continue
                if status[i] == Status.ERR_NOT_JPEG:
                    status[i], reason = self._fallback(i, fetch, out, idx, seed_u, epoch_u, timings, sources)
                if status[i] != Status.OK:
                    src = None if sources is None else str(sources[i])
                    result.errors[i] = DecodeError.from_status(int(status[i]), reason, int(idx[i]), src)
            return after(result) if after is not None else result

        pending = PendingBatch(handle, finish)
        return pending if not wait else pending.result()

    def _team_for(self, nthreads: int) -> Any:
        """The plan's kernel threads, at least ``nthreads`` of them (NOTE [ One queue across
        batches ] in include/ll_pool.h). A larger request starts a larger team; batches still
        queued on the old one finish there (each holds its team)."""
        def fits(team: Any) -> bool:
            return team is not None and team.size >= nthreads and team.usable

        team = self._team
        if fits(team):
            return team
        # Started and freed outside the lock: both release the GIL, and a daemon thread that
        # cannot take it back at interpreter exit would keep the lock for good (NOTE [ Threads
        # at interpreter exit ] in _engines/base.py).
        new = _chain.Team(nthreads)
        with self._lock:
            old = self._team
            if fits(old):
                team, old = old, new          # another thread started one meanwhile: use it
            else:
                team = self._team = new
        del old   # a replaced team's threads are joined here, outside the lock
        return team

    def _fallback(self, i: int, fetch, out: np.ndarray, idx: np.ndarray, seed: int, epoch: int,
                  timings: np.ndarray | None, sources: Sequence[str] | None) -> tuple[int, str]:
        """A non-JPEG item: OpenCV decode, then the chain step by step with the same key.
        Returns the item's status code and, when it failed, the reason."""
        t0 = time.perf_counter_ns()
        try:
            data = fetch(i)
            t1 = time.perf_counter_ns()
            d = self.decode_spec
            img = _decode_image(data, mode=d.mode, max_pixels=d.max_pixels, strict=d.strict, fast=d.fast)
            t2 = time.perf_counter_ns()
            res = np.asarray(self.transform(img, seed=seed, epoch=epoch, index=int(idx[i])))
            if res.shape != out.shape[1:]:
                return Status.ERR_SHAPE, (f"the chain gave shape {res.shape} for this image, the batch needs "
                                          f"{out.shape[1:]}")
            out[i] = res
            t3 = time.perf_counter_ns()
        except DecodeError as e:
            return Status.ERR_DECODE, e.reason
        except OSError as e:
            return Status.ERR_READ, f"read failed: {e.strerror or e}"
        except Exception as e:  # noqa: BLE001 - a per-item failure must never abort the batch
            return Status.ERR_DECODE, f"the transform chain failed on this image: {type(e).__name__}: {e}"
        if timings is not None:
            timings[i] = (t1 - t0, t2 - t1, t3 - t2)
        return Status.OK, ""


def _flatten(transform: Any) -> list:
    if transform is None:
        return [T.Decode()]
    if isinstance(transform, T.Compose):
        return list(transform.steps)
    return [transform]


def compile_chain(transform: Any) -> NativePlan | None:
    """Compile a transform chain into a :class:`NativePlan`.

    Parameters
    ----------
    transform : loaderlib.transforms.Transform, Compose or None
        The per-sample chain. A leading :class:`~loaderlib.transforms.Decode` gives the
        decode options; without one, a default ``Decode()`` is implied (the engine feeds
        encoded bytes). None means Decode only.

    Returns
    -------
    NativePlan or None
        None when some step is a Python callable or the order of the steps cannot be
        fused (a geometric step after Normalize/Cast/ToCHW, Decode not first, a Cast to
        a dtype the kernel does not write): the caller runs the chain in Python.
    """
    steps = _flatten(transform)
    if any(not isinstance(t, T.Transform) or isinstance(t, T.Compose) for t in steps):
        return None
    decode = T.Decode()
    if steps and isinstance(steps[0], T.Decode):
        decode, steps = steps[0], steps[1:]
    chain = T.Compose([decode, *steps])
    ops: list = []
    tail: list = []
    chw = False
    desc: list[str] = []
    stage = 0  # resampling stages so far (a second resize starts a new one)
    augs: list = []    # augmentations after the geometry (NOTE [ Augmentations in the chain ])
    erases: list = []  # RandomErasing on the finished output
    erase_desc: list[str] = []
    for pos, t in enumerate(steps):
        if isinstance(t, T.Decode):
            return None
        if isinstance(t, T.RandomErasing):
            erases.append(t._op(pos))
            erase_desc.append(t.describe())
            continue
        if isinstance(t, T._Augment):
            if tail or chw or erases:
                return None
            augs.append(t._op(pos))
            desc.append(t.describe())
            continue
        if erases and isinstance(t, _POINTWISE):
            return None  # erasing must see the final values
        if isinstance(t, _GEOMETRY):
            if tail or chw or augs:
                return None
            if isinstance(t, T.RandomResizedCrop):
                h, w = t.hw
                ops.append((_chain.OP_RRC, pos, h, w, T._interp(t.interpolation), int(t.antialias),
                            float(t.scale[0]), float(t.scale[1]), float(t.ratio[0]), float(t.ratio[1]), 0.0))
                stage += 1
                where = ("box drawn from the JPEG header, only that region decoded" if stage == 1 else
                         f"stage {stage}: box drawn on the previous stage's image, which it resamples")
                desc.append(f"random resized crop to {h}x{w} (scale={tuple(t.scale)}, ratio=({t.ratio[0]:.3g}, "
                            f"{t.ratio[1]:.3g}), {_describe_interp(t)}): {where}")
            elif isinstance(t, T.Resize):
                if isinstance(t.size, (int, np.integer)):
                    h, w = -1, int(t.size)
                    what = f"shorter side to {w}"
                else:
                    h, w = T._pair(t.size, "size")
                    what = f"{h}x{w}"
                ops.append((_chain.OP_RESIZE, pos, h, w, T._interp(t.interpolation), int(t.antialias),
                            0.0, 0.0, 0.0, 0.0, 0.0))
                stage += 1
                desc.append(f"resize {what} ({_describe_interp(t)})" +
                            ("" if stage == 1 else f": stage {stage}, resamples the previous stage's image"))
            elif isinstance(t, T.CenterCrop):
                h, w = T._pair(t.size, "size")
                ops.append((_chain.OP_CENTER_CROP, pos, h, w, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0))
                desc.append(f"center crop {h}x{w}")
            else:
                ops.append((_chain.OP_HFLIP, pos, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, float(t.p)))
                desc.append(f"random horizontal flip (p={t.p:g}), folded into the resampling taps")
        elif isinstance(t, _POINTWISE):
            tail.append(t)
        elif isinstance(t, T.ToCHW):
            if chw:
                return None
            chw = True
        else:  # pragma: no cover - every Transform subclass is handled above
            return None
    if len(ops) > _chain.MAX_OPS:
        return None
    try:
        spec = chain.plan(T.ImageSpec(encoded=True))
    except ValueError:
        return None
    C = decode.channels
    # The point-wise tail as a lookup table: run its own numpy code on all 256 values.
    lut = None
    dtype = np.dtype(np.uint8)
    if tail:
        ramp = np.repeat(np.arange(256, dtype=np.uint8)[None, :, None], C, axis=2)
        val: Any = ramp
        try:
            for t in tail:
                val = t._apply(val, None)
        except ValueError:
            return None
        dtype = np.dtype(val.dtype)
        if dtype == np.float32:
            lut = np.ascontiguousarray(val[0].T, dtype=np.float32)
        elif dtype in (np.float16, np.uint16):
            # float16 values or bfloat16 bits (NOTE [ Half-precision output ] in ll_chain.h).
            lut = np.ascontiguousarray(val[0].T).view(np.uint16)
        elif dtype == np.uint8:
            lut = np.ascontiguousarray(val[0].T, dtype=np.uint8)
            if np.array_equal(lut, np.repeat(np.arange(256, dtype=np.uint8)[None], C, 0)):
                lut = None
        else:
            return None
        names = " then ".join(type(t).__name__ + (f"(mean={t.mean}, std={t.std}, dtype={t.dtype})"
                                                    if isinstance(t, T.Normalize) else f"({t.dtype})") for t in tail)
        out_name = "bfloat16 bits (uint16)" if dtype == np.uint16 else dtype.name
        desc.append(f"{names} as a per-channel lookup table -> {out_name}")
    if spec.dtype != dtype:  # the plan and the table must agree
        return None
    if erases and dtype not in (np.float32, np.uint8):
        return None
    resamples = any(o[0] in (_chain.OP_RRC, _chain.OP_RESIZE) for o in ops)
    idct = "IFAST, merged upsampling (fast=True)" if decode.fast else "ISLOW"
    first = (f"decode JPEG (libjpeg-turbo, {idct}): only the source region the output needs"
             + (", at the smallest DCT scale 1/2, 1/4 or 1/8 that keeps the output resolution"
                if decode.dct_scaling and resamples else ", full resolution")
             + "; other formats via OpenCV then the same steps in Python")
    desc.insert(0, first)
    desc.append(f"write {'CHW' if chw else 'HWC'} {dtype.name} straight into the batch slot, one row at a time")
    desc.extend(erase_desc)
    return NativePlan(chain, decode, ops, lut, dtype, chw, spec, desc, augs=augs, erases=erases)
