"""``MixtureDataset``: several datasets mixed with set weights, each epoch a fixed composition.

NOTE [ Mixture epochs ]
An epoch of ``MixtureDataset(datasets, weights, size=size, seed=seed)`` holds ``size``
samples, ``c_k`` of them from source ``k``:

- Counts. With the weights normalised to sum to 1 (default: proportional to the sources'
  lengths), ``c_k`` is ``w_k * size`` rounded by the largest-remainder rule: every source gets
  ``floor(w_k * size)``, and the samples still missing to make ``size`` go one each to the
  sources with the largest fractional parts (ties: the lower source number; a source of
  weight 0 gets none). So the counts always sum to ``size``, and equal ``round(w_k * size)``
  (halves rounded up) whenever those sum to ``size``.
- Which samples. With ``n_k = len(source k)``, ``c_k = q * n_k + r`` (``0 <= r < n_k``):
  every sample of the source appears ``q`` times (a source smaller than its share repeats,
  as Streaming's ``repeat``), plus ``r`` samples walked without replacement across
  consecutive epochs (as Streaming's ``choose``, but walked instead of drawn afresh):
  epoch ``e`` takes positions ``[e * r, (e + 1) * r)`` of the source's walk, a sequence of
  passes, each pass a permutation of the source. Pass ``p``'s permutation is
  ``numpy.random.default_rng([seed, 1, k, p]).permutation(n_k)``, except where an epoch
  straddles passes ``p - 1`` and ``p``: its first ``h`` samples from pass ``p`` are the first
  ``h`` of that permutation that the epoch has not already taken from the end of pass
  ``p - 1``; the ones passed over come right after them, in their order. So no epoch
  holds a walked sample twice, and every pass still visits each sample once.
- Order. The epoch's list (source 0's samples, then source 1's, ...; each source's repeats
  in index order, then its walked samples in walk order) is permuted by
  ``numpy.random.default_rng([seed, 2, e]).permutation(size)``: mixture index ``i`` of
  epoch ``e`` is element ``perm[i]`` of that list, so one batch mixes sources.

Index ``i`` of epoch ``e`` is therefore a pure function of ``(seed, e, i)``: any thread or
worker count, engine, and a resumed or elastically re-split epoch read the same samples.
``seed=None`` takes the seed of the loader reading the mixture (saved in its state, so a
resume with a drawn seed stays exact); indexing from Python uses 0 then.

NOTE [ Datasets that change with the epoch ]
A dataset whose item ``i`` depends on the epoch answers ``at_epoch(epoch, seed)`` with a
dataset fixed to that epoch. The engines ask for it once per run (the native engine binds
the dataset's :class:`NativeSource` with ``NativeSource.at_epoch``, the threads engine its
dataset with :func:`at_epoch`, a worker process per task), so a warm next epoch running
beside the last batches of this one never sees the other epoch's samples, and no
mutable "current epoch" is shared between runs. The native source of such a dataset maps
stream indices to the rows of its concatenated sources with an epoch's ``remap``
(``NativeSource.data_index``); an unbound one refuses to read.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._extract.source import NativeSource, SourceKind, native_source_of
from ..errors import _add_context
from .base import Dataset, _check_index, _source_of, _TransformDataset
from .tokens.mixture import token_parts_of

__all__ = ["MixtureDataset", "largest_remainder", "source_counts"]

_WALK = 1    # rng key tags (NOTE [ Mixture epochs ])
_ORDER = 2
_MEMO = 8    # passes and epochs kept per mixture


def largest_remainder(weights: np.ndarray, size: int) -> np.ndarray:
    """``weights * size`` (weights summing to 1) rounded to integers that sum to ``size``
    (NOTE [ Mixture epochs ]: floors, then one more each for the largest fractional parts,
    ties to the lower index; a zero weight gets nothing)."""
    exact = np.asarray(weights, np.float64) * int(size)
    counts = np.floor(exact).astype(np.int64)
    frac = np.where(np.asarray(weights) > 0, exact - counts, -1.0)
    rest = int(size) - int(counts.sum())
    if rest > 0:
        order = np.lexsort((np.arange(frac.size), -frac))
        counts[order[:rest]] += 1
    return counts


def check_weights(weights: Any, k: int, default: Any = None, *, what: str = "datasets",
                  one: str = "source") -> np.ndarray:
    """``weights`` for ``k`` sources (``what``: "datasets" or "pipelines"), normalised; ``default``
    (uniform when None) stands for None. ValueError naming ``weights`` when they are negative, not
    finite, all zero or of the wrong length. One check for MixtureDataset and the Pipeline's
    ``sample_from_datasets``."""
    if weights is None:
        w = np.ones(k) if default is None else np.asarray(default, np.float64)
    else:
        try:
            w = np.asarray(weights, np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise ValueError(f"weights must be {k} numbers, got {weights!r}") from None
        if w.size != k:
            raise ValueError(f"weights has {w.size} entries for {k} {what}")
        if not np.all(np.isfinite(w)):
            raise ValueError(f"weights must be finite numbers, got {w.tolist()}")
        if np.any(w < 0):
            raise ValueError(f"weights must not be negative, got {w.tolist()}")
    total = float(w.sum())
    if not total > 0:
        raise ValueError(f"weights are all zero ({w.tolist()}): at least one {one} must have a positive weight")
    return w / total


class _Parts:
    """The sources of a native mixture side by side: row ``d`` of the concatenation is sample
    ``d - start[k]`` of source ``k``. Answers what a SHARDS read needs (``shard_of``,
    ``offsets``, ``sizes``, ``fileno``) and ``source(d)`` for messages."""

    def __init__(self, mixture: MixtureDataset, srcs: list[NativeSource]) -> None:
        self.names = mixture.source_names
        self.starts = mixture.starts
        self.srcs = srcs
        self.shard_of = self.offsets = self.sizes = None
        self._shard_base: np.ndarray | None = None
        if srcs[0].kind is SourceKind.SHARDS:
            bases, shard, offs, sizes, total = [], [], [], [], 0
            for s in srcs:
                ds = s.dataset
                bases.append(total)
                shard.append(np.asarray(ds.shard_of, np.int64) + total)
                offs.append(np.asarray(ds.offsets, np.int64))
                sizes.append(np.asarray(ds.sizes, np.int64))
                total += int(np.max(ds.shard_of)) + 1 if len(ds.shard_of) else 0
            self._shard_base = np.asarray(bases, np.int64)
            self.shard_of = np.concatenate(shard)
            self.offsets = np.concatenate(offs)
            self.sizes = np.concatenate(sizes)

    def split(self, d: int) -> tuple[int, int]:
        k = int(np.searchsorted(self.starts, d, side="right")) - 1
        return k, int(d) - int(self.starts[k])

    def fileno(self, shard: int) -> int:
        assert self._shard_base is not None   # a SHARDS mixture
        k = int(np.searchsorted(self._shard_base, shard, side="right")) - 1
        return self.srcs[k].dataset.fileno(int(shard) - int(self._shard_base[k]))

    def source(self, d: int) -> str:
        k, j = self.split(d)
        src = self.srcs[k]
        where = src.paths[j] if src.kind is SourceKind.FILES and src.paths is not None else src.source(j)
        return f"source {k} {self.names[k]} sample {j}" + (f": {where}" if where else "")


def _native_of(mixture: MixtureDataset) -> tuple[NativeSource | None, str | None]:
    """The mixture's (unbound) native source, or None and why its samples are read from Python."""
    srcs = []
    for k, d in enumerate(mixture.datasets):
        if isinstance(d, _TransformDataset):
            return None, (f"MixtureDataset: source {k} ({mixture.source_names[k]}) has its own transforms; the native "
                          "engine runs one chain for the whole mixture: give it to the mixture "
                          "(MixtureDataset([a, b]).transform_first(chain)) instead")
        s = native_source_of(d)
        if s is None:
            return None, f"MixtureDataset: source {k} ({mixture.source_names[k]}) is read from Python"
        srcs.append(s)
    kinds = {s.kind for s in srcs}
    if len(kinds) > 1:
        return None, ("MixtureDataset: the sources are read in different ways ("
                      + ", ".join(f"{k}: {s.kind.name.lower()}" for k, s in enumerate(srcs))
                      + "); the native engine reads a mixture of one kind")
    kind = srcs[0].kind
    if kind is SourceKind.TOKENS and not any(s.wrap for s in srcs):
        parts, why = token_parts_of([s.dataset for s in srcs], mixture.starts, mixture.source_names)
        if parts is None:
            return None, why
        stage = (f"MixtureDataset of {len(srcs)} token sources, " + " + ".join(str(c) for c in mixture.counts.tolist())
                 + " sequences per epoch: " + "; ".join(f"{mixture.source_names[k]}: {s.stage}"
                                                        for k, s in enumerate(srcs)))
        out = NativeSource(kind, stage=stage, dataset=parts, description=repr(mixture))
        out.epoch_map = mixture.rows
        return out, None
    if kind not in (SourceKind.FILES, SourceKind.SHARDS, SourceKind.ARRAYS) or any(s.wrap for s in srcs):
        return None, (f"MixtureDataset: {kind.name.lower()} sources (objects in a store, cached pixels) are read "
                      "from Python in a mixture")
    labelled = {s.labels is not None for s in srcs}
    if len(labelled) > 1 or (True in labelled and len({s.labels.shape[1:] for s in srcs}) > 1):
        return None, "MixtureDataset: the sources' labels differ in kind or shape"
    labels = np.concatenate([s.labels for s in srcs]) if True in labelled else None
    arrays = None
    if kind is SourceKind.ARRAYS:
        cols = {len(s.arrays or ()) for s in srcs}
        if len(cols) > 1 or any(len({(s.arrays[c].shape[1:], s.arrays[c].dtype) for s in srcs}) > 1
                                for c in range(cols.pop())):
            return None, "MixtureDataset: the sources' arrays differ in count, shape or dtype"
        # Copied once, side by side: a batch is then one take per column.
        arrays = [np.concatenate([s.arrays[c] for s in srcs]) for c in range(len(srcs[0].arrays))]
    parts = _Parts(mixture, srcs)
    stage = (f"MixtureDataset of {len(srcs)} sources, " + " + ".join(str(c) for c in mixture.counts.tolist())
             + " samples per epoch: " + "; ".join(f"{mixture.source_names[k]}: {s.stage}"
                                                   for k, s in enumerate(srcs)))
    paths = [p for s in srcs for p in s.paths] if kind is SourceKind.FILES else None
    out = NativeSource(kind, stage=stage, paths=paths, dataset=parts, labels=labels, arrays=arrays,
                       description=repr(mixture))
    out.epoch_map = mixture.rows
    return out, None


class MixtureDataset(Dataset):
    """Several datasets mixed with set weights: each epoch takes ``round(w_k * size)`` samples
    from source ``k``.

    A source larger than its share is walked without replacement across consecutive epochs
    (each epoch takes the next samples of a per-source permutation, a new one when it is used
    up); a smaller one repeats. The samples of an epoch are interleaved at random, and index
    ``i`` of epoch ``e`` is a pure function of ``(seed, e, i)``, so resume is exact on any
    engine, thread and worker count (NOTE [ Mixture epochs ] in ``loaderlib/_datasets/mixture.py``
    gives the exact rule). When every source is read natively (image folders or lists,
    record shards, WebDataset tars, numpy arrays; of one kind, without their own transforms)
    the mixture is too: a batch may hold samples of several sources and the loader stays
    ``engine == "native"``. Give transforms to the mixture
    (``MixtureDataset([a, b]).transform_first(chain)``).

    Parameters
    ----------
    datasets : sequence of datasets
        The sources (objects with ``__len__`` and ``__getitem__``), none empty.
    weights : sequence of float, optional
        Each source's share of an epoch, normalised to sum to 1 (non-negative, finite, not
        all zero). Default: proportional to the sources' lengths.
    size : int, optional
        Samples per epoch (default: the sum of the sources' lengths); ``len(mixture)``.
    weights_in : {"samples", "tokens"}
        What ``weights`` are shares of: samples, or (token datasets) tokens, turned into shares
        of samples by each source's ``tokens_per_sample`` (NOTE [ Mixture weights in tokens ]).
    seed : int, optional
        Keys the walk and the interleaving. None: the seed of the loader reading the mixture
        (0 when it is indexed from Python).

    Attributes
    ----------
    counts : numpy.ndarray
        Samples of each source in every epoch (``round(w_k * size)``, largest-remainder
        rounding, summing to ``size``).
    weights : numpy.ndarray
        The normalised weights.
    epoch : int
        The epoch ``mixture[i]`` reads when indexed from Python (:meth:`set_epoch`); loaders
        pass their own epoch.

    Raises
    ------
    ValueError
        ``weights`` negative, NaN, all zero or of the wrong length, an empty source, or
        ``size`` < 1; the message names the argument.
    """

    def __init__(self, datasets: Sequence[Any], weights: Sequence[float] | None = None, *, size: int | None = None,
                 seed: int | None = None, weights_in: str = "samples") -> None:
        if isinstance(datasets, (str, bytes)) or not hasattr(datasets, "__iter__"):
            raise TypeError(f"datasets must be a sequence of datasets, got {type(datasets).__name__}")
        dsets = list(datasets)
        if not dsets:
            raise ValueError("datasets is empty: a mixture needs at least one source")
        lengths = []
        for k, d in enumerate(dsets):
            if not (hasattr(d, "__len__") and hasattr(d, "__getitem__")):
                raise TypeError(f"datasets[{k}] ({type(d).__name__}) has no __len__ and __getitem__")
            n = len(d)
            if n < 1:
                raise ValueError(f"datasets[{k}] ({_short(d)}) is empty: every source needs a sample")
            lengths.append(n)
        self.datasets = dsets
        if weights_in not in ("samples", "tokens"):
            raise ValueError(f"weights_in must be 'samples' or 'tokens', got {weights_in!r}")
        self.weights = check_weights(weights, len(dsets), lengths)
        if weights_in == "tokens" and weights is not None:
            # NOTE [ Mixture weights in tokens ]: a source's share of tokens w_k is a share of
            # samples proportional to w_k / t_k, t_k its tokens per sample (not padding): for
            # concat sources every sample holds seq_len tokens and nothing changes; for packed
            # or padded ones, t_k is the source's mean over one pass, so the token shares hold
            # over an epoch on average, and the counts per epoch stay exact and resumable.
            per = []
            for k, d in enumerate(dsets):
                t = getattr(d, "tokens_per_sample", None)
                if t is None:
                    raise ValueError(f"weights_in='tokens': datasets[{k}] ({_short(d)}) does not say its tokens per "
                                     "sample (TokenDataset.tokens_per_sample)")
                per.append(float(t))
            w = self.weights / np.asarray(per, np.float64)
            self.weights = w / w.sum()
        if size is None:
            size = sum(lengths)
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
            raise TypeError(f"size must be an integer, got {size!r}")
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
            raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
        self.size = int(size)
        self.seed = None if seed is None else int(seed)
        self.lengths = np.asarray(lengths, np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self.counts = largest_remainder(self.weights, self.size)
        self.epoch = 0
        self._init_memo()

    def _init_memo(self) -> None:
        self._lock = threading.Lock()
        self._passes: collections.OrderedDict = collections.OrderedDict()
        self._epochs: collections.OrderedDict = collections.OrderedDict()
        self._native: tuple | None = None

    def __getstate__(self) -> dict:
        d = self.__dict__.copy()
        for k in ("_lock", "_passes", "_epochs", "_native"):
            d.pop(k, None)
        return d

    def __setstate__(self, d: dict) -> None:
        self.__dict__.update(d)
        self._init_memo()

    # -- the composition (NOTE [ Mixture epochs ]) ------------------------------------
    @property
    def source_names(self) -> list[str]:
        """``[k] repr`` of each source, shortened, as ``explain()`` and ``stats.sources`` name them."""
        return [f"[{k}] {_short(d)}" for k, d in enumerate(self.datasets)]

    def _seed(self, seed: int | None) -> int:
        return self.seed if self.seed is not None else (0 if seed is None else int(seed))

    def _pass(self, seed: int, k: int, p: int) -> np.ndarray:
        """Pass ``p`` of source ``k``'s walk: its permutation, its head adjusted so the epoch
        that straddles passes ``p - 1`` and ``p`` takes no sample twice."""
        n = int(self.lengths[k])
        r = int(self.counts[k]) % n
        chain = [p]
        # Pass q's head depends on pass q - 1's tail, which differs from the raw permutation
        # only when q - 1's own adjusted head reaches into it (a pass shorter than 2 epochs).
        while chain[-1] > 0 and r and (chain[-1] * n) % r and n - (chain[-1] * n) % r < r:
            if (seed, k, chain[-1] - 1) in self._passes:
                break
            chain.append(chain[-1] - 1)
        prev = None
        for q in reversed(chain):
            got = self._passes.get((seed, k, q))
            if got is None:
                got = self._adjusted(seed, k, q, n, r, prev)
                self._passes[(seed, k, q)] = got
                while len(self._passes) > _MEMO * len(self.datasets):
                    self._passes.popitem(last=False)
            prev = got
        assert prev is not None
        return prev

    def _adjusted(self, seed: int, k: int, q: int, n: int, r: int, prev: np.ndarray | None) -> np.ndarray:
        perm = np.random.default_rng([seed, _WALK, k, q]).permutation(n).astype(np.int64)
        t = (q * n) % r if r else 0
        if q == 0 or t == 0:
            return perm
        if prev is None:
            prev = self._passes.get((seed, k, q - 1))
        if prev is None:   # its tail is its raw permutation's (see _pass)
            prev = np.random.default_rng([seed, _WALK, k, q - 1]).permutation(n).astype(np.int64)
        taken = np.isin(perm, prev[n - t:])
        h = r - t
        cut = int(np.flatnonzero(~taken)[h - 1]) + 1
        head = perm[:cut]
        return np.concatenate([head[~taken[:cut]], head[taken[:cut]], perm[cut:]])

    def _walked(self, seed: int, k: int, epoch: int) -> np.ndarray:
        n = int(self.lengths[k])
        r = int(self.counts[k]) % n
        if r == 0:
            return np.zeros(0, np.int64)
        p, o = divmod(epoch * r, n)
        first = self._pass(seed, k, p)
        if o + r <= n:
            return first[o:o + r]
        return np.concatenate([first[o:], self._pass(seed, k, p + 1)[:r - (n - o)]])

    def _epoch(self, epoch: int, seed: int | None) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, sources)`` of ``epoch``: per mixture index, its row of the sources side by
        side (``starts[k] + j``) and its source ``k``."""
        s = self._seed(seed)
        key = (s, int(epoch))
        with self._lock:
            hit = self._epochs.get(key)
            if hit is not None:
                return hit
            rows = []
            for k in range(len(self.datasets)):
                n, c = int(self.lengths[k]), int(self.counts[k])
                local = np.concatenate([np.tile(np.arange(n, dtype=np.int64), c // n), self._walked(s, k, int(epoch))])
                rows.append(local + self.starts[k])
            order = np.random.default_rng([s, _ORDER, int(epoch)]).permutation(self.size)
            table = np.concatenate(rows)[order]
            which = np.repeat(np.arange(len(self.datasets), dtype=np.int32), self.counts)[order]
            table.setflags(write=False)
            which.setflags(write=False)
            self._epochs[key] = (table, which)
            while len(self._epochs) > _MEMO:
                self._epochs.popitem(last=False)
            return table, which

    def rows(self, epoch: int, seed: int | None = None) -> np.ndarray:
        """Per mixture index of ``epoch``, its row among the sources side by side (``starts[k] + j``
        for sample ``j`` of source ``k``): the native source's ``remap``."""
        return self._epoch(epoch, seed)[0]

    def epoch_indices(self, epoch: int, seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """What each index of ``epoch`` reads: ``(sources, samples)``, so ``mixture[i]`` in
        that epoch is ``datasets[sources[i]][samples[i]]``. ``seed`` stands for the loader's
        seed when the mixture has none (NOTE [ Mixture epochs ])."""
        table, which = self._epoch(epoch, seed)
        return which.astype(np.int64), table - self.starts[which]

    # -- reading ----------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """The epoch ``mixture[i]`` reads when indexed from Python (loaders pass their own)."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        self.epoch = int(epoch)

    def at_epoch(self, epoch: int, seed: int | None = None) -> _MixtureEpoch:
        """This mixture fixed to ``epoch`` (NOTE [ Datasets that change with the epoch ])."""
        return _MixtureEpoch(self, int(epoch), seed)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> Any:
        return self.at_epoch(self.epoch)[idx]

    def source(self, idx: int) -> str | None:
        return self.at_epoch(self.epoch).source(idx)

    def native_source(self) -> NativeSource | None:
        """The sources' reads side by side, mapped per epoch (None when a source is read from
        Python, the sources differ in kind, or a source has its own transforms: :attr:`python_read` says)."""
        with self._lock:
            if self._native is None:
                self._native = _native_of(self)
        return self._native[0]

    @property
    def python_read(self) -> str | None:
        """Why the samples are read from Python (None: the kernels read them)."""
        self.native_source()
        assert self._native is not None
        return self._native[1]

    def __repr__(self) -> str:
        parts = ", ".join(f"{_short(d)} x{c}" for d, c in zip(self.datasets, self.counts.tolist()))
        return f"MixtureDataset({parts}; {self.size} per epoch)"


class _MixtureEpoch(Dataset):
    """A :class:`MixtureDataset` fixed to one epoch (NOTE [ Datasets that change with the epoch ])."""

    def __init__(self, mixture: MixtureDataset, epoch: int, seed: int | None) -> None:
        self.mixture = mixture
        self.epoch = epoch
        self.seed = seed

    def __len__(self) -> int:
        return self.mixture.size

    def _where(self, idx: Any) -> tuple[int, int, int]:
        i = _check_index(idx, self.mixture.size)
        table, which = self.mixture._epoch(self.epoch, self.seed)
        k = int(which[i])
        return i, k, int(table[i]) - int(self.mixture.starts[k])

    def __getitem__(self, idx: int) -> Any:
        i, k, j = self._where(idx)
        try:
            return self.mixture.datasets[k][j]
        except Exception as e:
            names = self.mixture.source_names
            raise _add_context(e, f"loaderlib: sample {i} of the mixture (epoch {self.epoch}) is sample {j} of "
                                  f"source {k} {names[k]}")

    def source(self, idx: int) -> str | None:
        _i, k, j = self._where(idx)
        where = _source_of(self.mixture.datasets[k], j)
        return f"source {k} {self.mixture.source_names[k]} sample {j}" + (f": {where}" if where else "")

    def native_source(self) -> NativeSource | None:
        src = self.mixture.native_source()
        return None if src is None else src.at_epoch(self.epoch, self.mixture._seed(self.seed))

    @property
    def python_read(self) -> str | None:
        return self.mixture.python_read

    def __repr__(self) -> str:
        return f"{self.mixture!r} at epoch {self.epoch}"


def _short(d: Any) -> str:
    r = repr(d)
    if " object at 0x" in r:   # no repr of its own: its class and length
        r = f"{type(d).__name__}({len(d)} samples)"
    return r if len(r) <= 60 else r[:40] + "..." + r[-16:]


def source_counts(dataset: Any, state: Any) -> dict[str, int]:
    """Samples of each source a run delivered (``loader.stats.sources``): empty unless the
    dataset is a :class:`MixtureDataset` (under transform layers too) and a run has started.

    Counted from the run's position in its epoch (NOTE [ Mixture epochs ]), never per sample
    on the hot path; samples skipped with ``on_error="skip"`` are not counted."""
    base = dataset.unwrap()[0] if isinstance(dataset, _TransformDataset) else dataset
    if not isinstance(base, MixtureDataset) or state is None or getattr(state, "order", None) is None:
        return {}
    delivered = np.asarray(state.order.stream[:state.position], np.int64)
    which = base._epoch(state.epoch, state.seed)[1]
    counts = np.bincount(which[delivered], minlength=len(base.datasets))
    for f in list(getattr(state, "skipped", ())):
        if 0 <= int(f.index) < base.size:
            counts[which[int(f.index)]] -= 1
    return {name: int(c) for name, c in zip(base.source_names, counts.tolist())}
