"""Token datasets side by side for a native ``MixtureDataset`` (NOTE [ Mixture epochs ] in
loaderlib/_datasets/mixture.py): row ``d`` of the concatenation is sample ``d - starts[k]`` of source
``k``; each source's kernel writes its own rows of the batch, and ``cu_seqlens`` is made once
over all of them (NOTE [ Token batches ] in dataset.py)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .dataset import TokenDataset

__all__ = ["TokenParts", "token_parts_of"]


def token_parts_of(datasets: Sequence[TokenDataset], starts: np.ndarray,
                   names: Sequence[str]) -> tuple[TokenParts | None, str | None]:
    """The sources as one TOKENS dataset, or None and why they cannot be (their rows differ)."""
    first = datasets[0]
    for k, d in enumerate(datasets[1:], 1):
        if (d.seq_len, d.ids_dtype, d.dtype) != (first.seq_len, first.ids_dtype, first.dtype):
            return None, (f"MixtureDataset: token source {names[k]} has seq_len {d.seq_len} and dtypes "
                          f"{d.ids_dtype}/{d.dtype}, source {names[0]} {first.seq_len} and "
                          f"{first.ids_dtype}/{first.dtype}: a batch needs one shape")
    return TokenParts(list(datasets), starts, list(names)), None


class TokenParts:
    """What the native engine asks of a TOKENS source, for several token datasets at once."""

    def __init__(self, datasets: list[TokenDataset], starts: np.ndarray, names: list[str]) -> None:
        self.datasets = datasets
        self.starts = np.asarray(starts, np.int64)
        self.names = names

    def _split(self, rows: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, rows, side="right") - 1

    def token_parts(self, batch_size: int) -> list:
        return self.datasets[0].token_parts(batch_size)

    def gather_into(self, rows: np.ndarray, views: list[np.ndarray], *, num_threads: int | None = None,
                    out_rows: np.ndarray | None = None) -> int:
        rows = np.asarray(rows, np.int64)
        out = np.arange(rows.size, dtype=np.int64) if out_rows is None else np.asarray(out_rows, np.int64)
        return self.start_gather(rows, views, num_threads=num_threads, out_rows=out).wait()

    def start_gather(self, rows: np.ndarray, views: list[np.ndarray], *, team: Any = None,
                     num_threads: int | None = None, out_rows: np.ndarray | None = None,
                     timed: bool = False, read_ahead: bool = False) -> _Gathers:
        """Each source's rows queued (or run) into their rows of the batch."""
        rows = np.asarray(rows, np.int64)
        out = np.arange(rows.size, dtype=np.int64) if out_rows is None else np.asarray(out_rows, np.int64)
        src = self._split(rows)
        parts = []
        for k in np.unique(src).tolist():
            sel = np.flatnonzero(src == k)
            parts.append(self.datasets[k].start_gather(rows[sel] - self.starts[k], views, team=team,
                                                       num_threads=num_threads, out_rows=out[sel], timed=timed,
                                                       read_ahead=read_ahead))
        return _Gathers(parts)

    def token_batch(self, views: list[np.ndarray], n: int) -> dict:
        return self.datasets[0].token_batch(views, n)

    def source(self, d: int) -> str | None:
        k = int(self._split(np.asarray([d]))[0])
        return f"{self.names[k]}: {self.datasets[k].source(int(d - self.starts[k]))}"


class _Gathers:
    """Several sources' :class:`~.dataset.Gather` of one batch, waited for together."""

    def __init__(self, parts: list) -> None:
        self.parts = parts

    def wait(self, timeout: float | None = None) -> int:
        """The parts' :meth:`~.dataset.Gather.wait`, within one ``timeout`` for them all."""
        if not timeout:
            return sum(g.wait() for g in self.parts)
        deadline = time.monotonic() + timeout
        return sum(g.wait(max(1e-3, deadline - time.monotonic())) for g in self.parts)

    def abandon(self) -> None:
        for g in self.parts:
            g.abandon()

    @property
    def thread_ns(self) -> int:
        return sum(g.thread_ns for g in self.parts)

    @property
    def read(self) -> tuple[int, int] | None:
        """The parts' fetches by range, summed (None: none fetched)."""
        reads = [g.read for g in self.parts if g.read is not None]
        if not reads:
            return None
        return sum(r[0] for r in reads), max(r[1] for r in reads)
