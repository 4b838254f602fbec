"""``TokenDataset``: training sequences from a token corpus, gathered by a nogil kernel.

The owner of ``loaderlib._ext._tokens``: it validates what the kernel is given, resolves the
thread count, owns the corpus description the kernel reads and turns row status codes into
errors that name the file and the token at fault.

NOTE [ Token batches ]
A batch is a dict: ``input_ids``, ``labels``, ``position_ids`` (``(B, S)``; int32 unless asked,
``input_ids`` may be uint16), ``cu_seqlens`` (int32, the start of every segment of the
flattened ``B * S`` tokens and ``B * S`` last: a segment is a document, or a row's padding)
and ``max_seqlen`` (an int), as flash-attention's varlen functions and Hugging Face's
padding-free collation take them. On the native engine the rows are written straight into an
arena slot (``token_parts``) and ``cu_seqlens`` is made from the rows' segment starts; a
sample read from Python (``dataset[i]``) is the same dict for one row, and
``batchify.collate_tokens`` makes the batch of such samples, equal to the native one.
"""

from __future__ import annotations

import threading
import time

try:
    import resource
except ImportError:   # Windows: no getrusage, every batch is advised
    resource = None  # type: ignore[assignment]
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ... import _threads
from ..._ext import _tokens
from ..._extract.source import NativeSource, SourceKind
from ..._layout import LazyBlockShuffle, LazyPermutation
from ..._tensor_spec import TensorSpec
from ...batchify import TokenSample
from ...errors import LoaderError, LoaderTimeoutError
from ..base import Dataset, _check_index
from .formats import TokenFile, TokenFormatError, _map, open_sources
from .packing import BlockPlan, ConcatPlan, Spans
from .ranges import Fetch, TokenRanges
from .remote import open_ranges, open_remote

__all__ = ["TokenDataset"]

PACKINGS = ("concat", "pack", "pad")
REMOTE_READS = ("ranges", "files")
OPEN_CHECK_TOKENS = 1 << 28   # NOTE [ Token ids checked at open ]
_INT_MAX = {"uint16": 1 << 16, "int32": 1 << 31, "int64": 1 << 62}


def _int(value: Any, name: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


class TokenDataset(Dataset):
    """Training sequences of ``seq_len`` tokens from a token corpus (NOTE [ Token batches ]).

    Parameters
    ----------
    sources : str, path or list of them
        Megatron-LM ``.bin``/``.idx`` pairs (a prefix, or either file), flat token files
        (``.bin`` of ``token_dtype``, ``.npy``), datatrove ``.ds`` files (with ``.ds.index``),
        Arrow or Parquet files with a ``column`` of token lists; folders and globs too. The
        files are concatenated in order (NOTE [ Opening a token corpus ]).
    seq_len : int
        Tokens a model reads per sequence; each sample is ``seq_len + 1`` tokens of the corpus
        (``labels`` are ``input_ids`` shifted by one).
    packing : {"concat", "pack", "pad"}
        ``concat``: the corpus as one stream cut into windows (nothing wasted, documents may
        be cut); ``pack``: whole documents placed into sequences, best fit (longer ones
        split), the rest padding; ``pad``: one document (piece) per sequence
        (NOTE [ Packing in blocks ]).
    eos_id : int, optional
        The id that ends a document in flat files (``.bin``/``.npy``: no index); also the
        default ``pad_id``.
    vocab_size : int, optional
        When given, every token id is checked to be below it (an error names the file): at
        open for a corpus of at most 2^28 tokens, else as batches read them (NOTE [ Token ids
        checked at open ]).
    pad_id : int, optional
        ``input_ids`` of padding (default ``eos_id``, else 0).
    ignore_index : int
        ``labels`` where nothing is to be predicted (padding; document starts with
        ``mask_document_starts``). Default -100, as PyTorch's cross entropy.
    mask_document_starts : bool
        Put ``ignore_index`` where the next token starts another document.
    dtype : {"int32", "int64"}
        Type of ``labels`` and ``position_ids`` (and of ``input_ids`` unless ``ids_dtype``).
    ids_dtype : {"uint16", "int32", "int64"}, optional
        Type of ``input_ids`` (uint16 needs every id below 65536).
    token_dtype : numpy dtype, optional
        Type of the tokens in raw ``.bin`` files without an index (default uint16) and in
        datatrove files (default: from the files' sizes).
    column : str
        The column of token lists in Arrow and Parquet files.
    block : int
        Documents per placement block in ``pack`` and ``pad`` modes.
    shuffle : bool
        Shuffle the samples every epoch here, in the dataset, in blocks (NOTE [ Shuffling in
        blocks ]): the way to shuffle ``pack`` and ``pad`` datasets of many documents, with a
        loader that does not shuffle (``DataLoader(shuffle=False)``, or a ``ShardedSampler``
        without ``shuffle``). ``concat`` samples are shuffled across the whole corpus.
    seed : int, optional
        The dataset's shuffle seed; None takes the seed of the loader reading it.
    storage_options, cache_dir, cache_limit
        For sources behind URLs (``s3://``, ``gs://``, ``http(s)://``, brace ranges, globs
        and prefixes in object stores): the store's options (boto3's names) and the local
        cache (``cache_dir`` is needed; ``cache_limit`` bounds it).
    remote_reads : {"ranges", "files"}
        How token files behind URLs are read. ``"ranges"`` (default): a batch fetches only the
        64 KiB chunks its rows touch, by byte range, before its rows are gathered, into local
        sparse files of which ``cache_limit`` bounds the chunks held (those not used lately
        freed first): the first batch of a shuffled corpus of any size waits for its own bytes
        only, and the cache may be far smaller than the corpus (NOTE [ Token files read by
        range ]). ``"files"``: every token file is downloaded whole into the shard cache, in
        file order in the background, and a batch waits for the files its rows lie in; the
        cache must hold every file a run reads (NOTE [ Token files behind URLs ]). Files are
        better for a corpus read in order or read many times from a cache that holds it
        (fewer, larger requests). Indexes (``.idx``, ``.ds.index``), ``.npy``, Arrow and
        Parquet files, and in ``pack``/``pad`` mode flat files without an index (scanned for
        ``eos_id`` at open) are downloaded whole either way.
    """

    def __init__(self, sources: Any, seq_len: int, *, packing: str = "concat", eos_id: int | None = None,
                 vocab_size: int | None = None, pad_id: int | None = None, ignore_index: int = -100,
                 mask_document_starts: bool = False, dtype: str = "int32", ids_dtype: str | None = None,
                 token_dtype: Any = None, column: str = "input_ids", block: int = 16384,
                 storage_options: Mapping[str, Any] | None = None, cache_dir: Any = None,
                 cache_limit: Any = None, shuffle: bool = False, seed: int | None = None,
                 remote_reads: str = "ranges") -> None:
        self._args = (sources, seq_len, {
            "packing": packing, "eos_id": eos_id, "vocab_size": vocab_size, "pad_id": pad_id,
            "ignore_index": ignore_index, "mask_document_starts": mask_document_starts, "dtype": dtype,
            "ids_dtype": ids_dtype, "token_dtype": token_dtype, "column": column, "block": block,
            "storage_options": storage_options, "cache_dir": cache_dir, "cache_limit": cache_limit,
            "shuffle": shuffle, "seed": seed, "remote_reads": remote_reads})
        if remote_reads not in REMOTE_READS:
            raise ValueError(f"remote_reads must be one of {REMOTE_READS}, got {remote_reads!r}")
        self.shuffle = bool(shuffle)
        self.seed = None if seed is None else _int(seed, "seed", 0)
        self.seq_len = _int(seq_len, "seq_len", 1)
        if packing not in PACKINGS:
            raise ValueError(f"packing must be one of {PACKINGS}, got {packing!r}")
        self.packing = packing
        if str(dtype) not in ("int32", "int64"):
            raise ValueError(f"dtype must be 'int32' or 'int64', got {dtype!r}")
        self.dtype = np.dtype(str(dtype))
        ids = str(dtype) if ids_dtype is None else str(np.dtype(ids_dtype))
        if ids not in _INT_MAX:
            raise ValueError(f"ids_dtype must be 'uint16', 'int32' or 'int64', got {ids_dtype!r}")
        self.ids_dtype = np.dtype(ids)
        self._out_types = (_tokens.OUTPUT_TYPES[self.ids_dtype.name], _tokens.OUTPUT_TYPES[self.dtype.name])
        self.vocab_size = None if vocab_size is None else _int(vocab_size, "vocab_size", 1)
        self.ignore_index = _int(ignore_index, "ignore_index")
        if abs(self.ignore_index) >= _INT_MAX[self.dtype.name]:
            raise ValueError(f"ignore_index {ignore_index} does not fit labels of {self.dtype}")
        self.mask_document_starts = bool(mask_document_starts)
        self.block = _int(block, "block", 1)
        remote = open_remote(sources, storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit,
                             dtype=token_dtype, column=column)
        self._remote = remote[1] if remote is not None else None
        self._ranges: TokenRanges | None = None
        self._parts_of: dict[int, list] = {}
        self._first_rows: dict[int, np.ndarray] = {}
        self._ra = [-1, 0, 64]   # major faults seen, batches planned, advise up to this batch
        self._ensure_lock = threading.Lock()
        self.files: list[TokenFile] = (remote[0] if remote is not None
                                       else open_sources(sources, dtype=token_dtype, column=column))
        self._sources = sources
        limit = _INT_MAX[self.ids_dtype.name]
        if self.vocab_size is not None:
            if self.vocab_size > limit:
                raise ValueError(f"vocab_size {self.vocab_size} does not fit input_ids of {self.ids_dtype}")
            limit = self.vocab_size
        self.limit = min(limit, _INT_MAX[self.dtype.name])
        if eos_id is not None:
            eos_id = _int(eos_id, "eos_id", 0)
            if eos_id >= self.limit:
                what = f"vocab_size {self.vocab_size}" if self.vocab_size is not None else f"{self.ids_dtype} ids"
                raise ValueError(f"eos_id {eos_id} is out of range ({what})")
            for tf in self.files:
                top = np.iinfo(tf.token_dtype).max
                if eos_id > top:
                    raise ValueError(f"eos_id {eos_id} cannot occur in {tf.path}: its tokens are {tf.token_dtype} "
                                     f"(at most {top})")
        self.eos_id = eos_id
        self.pad_id = (eos_id if eos_id is not None else 0) if pad_id is None else _int(pad_id, "pad_id", 0)
        if self.pad_id >= self.limit:
            raise ValueError(f"pad_id {self.pad_id} is out of range (ids below {self.limit})")
        self._check_ids_at_open()
        self._corpus = _tokens.Corpus(
            [tf.tokens for tf in self.files],
            [tf.num_tokens for tf in self.files],
            [_tokens.SOURCE_TYPES[tf.token_dtype.name] for tf in self.files],
            [None if tf.bounds is None else np.ascontiguousarray(tf.bounds, np.int64) for tf in self.files],
            [int(tf.divisor) for tf in self.files],
            [bool(tf.eos_split) for tf in self.files])
        self.file_start = np.asarray(self._corpus.file_start, np.int64)
        if self._remote is not None:
            self._ranges = open_ranges(self._remote, self.files, self.file_start, self._corpus, packing, remote_reads)
        total = int(self.file_start[-1])
        names = ", ".join(tf.path for tf in self.files[:3]) + (", ..." if len(self.files) > 3 else "")
        if total == 0:
            raise LoaderError(f"the token corpus is empty ({names}: no tokens)")
        if packing == "concat":
            self.plan: ConcatPlan | BlockPlan = ConcatPlan(total, self.seq_len)
            if len(self.plan) == 0:
                raise LoaderError(f"the token corpus ({names}) has {total} tokens, fewer than one sequence of "
                                  f"seq_len + 1 = {self.seq_len + 1}")
        else:
            # documents delimited by EOS are found by reading the file (NOTE [ Packing in blocks ])
            self._ensure([f for f, tf in enumerate(self.files) if tf.bounds is None and tf.tokens is None])
            self.plan = BlockPlan(self.files, self.file_start, self.seq_len, packing, eos_id, self.block)
            if len(self.plan) == 0:
                raise LoaderError(f"the token corpus ({names}) has no non-empty document")
        self.num_tokens = total

    def _ensure(self, files: Any) -> None:
        """Map the token files ``files`` (indices) that are behind URLs and not mapped yet,
        waiting for their download (NOTE [ Token files behind URLs ])."""
        ranged = self._ranges.ranged if self._ranges is not None else None
        want = [int(f) for f in files if self.files[int(f)].tokens is None and not (ranged is not None and ranged[f])]
        if not want or self._remote is None:
            return
        with self._ensure_lock:
            want = [f for f in want if self.files[f].tokens is None]
            if not want:
                return
            paths = self._remote.local([self.files[f].url for f in want])
            for f, local in zip(want, paths):
                tf = self.files[f]
                arr = _map(local, tf.token_dtype, random=True)
                if arr.size != tf.num_tokens:
                    raise LoaderError(f"{tf.path}: the downloaded copy holds {arr.size} tokens, the store said "
                                      f"{tf.num_tokens}")
                self._corpus.set_tokens(f, arr)
                self.files[f] = replace(tf, tokens=arr)

    def _spans_files(self, sp: Spans) -> np.ndarray:
        """The files the spans ``sp`` read."""
        if sp.g.size == 0:
            return np.zeros(0, np.int64)
        fs = self.file_start
        first = np.searchsorted(fs, sp.g, side="right") - 1
        last = np.searchsorted(fs, np.maximum(sp.g + sp.n - 1, sp.g), side="right") - 1
        if (last == first).all():
            return np.unique(first)
        return np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first.tolist(), last.tolist())]))

    def close(self) -> None:
        """Let go of the shard cache's copies this dataset holds and of its chunks of token files
        read by range (datasets behind URLs): their fetch threads end and their files go."""
        ranges = getattr(self, "_ranges", None)
        if ranges is not None:
            ranges.close()
        if getattr(self, "_remote", None) is not None:
            self._remote.close()

    # -- pickling: the files are opened again where the dataset lands (worker processes) --

    def __getstate__(self) -> dict:
        return {"args": self._args}

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass

    def __setstate__(self, state: dict) -> None:
        sources, seq_len, kw = state["args"]
        self.__init__(sources, seq_len, **kw)   # type: ignore[misc]

    # -- the dataset protocol ----------------------------------------------------------

    def __len__(self) -> int:
        return len(self.plan)

    @property
    def tokens_per_sample(self) -> float:
        """Input positions holding a token (not padding) per sample, over one pass of the corpus."""
        return self.plan.real_tokens / len(self.plan)

    @property
    def padding_share(self) -> float:
        """The share of input positions that are padding over one pass of the corpus."""
        return 1.0 - self.plan.real_tokens / (len(self.plan) * self.seq_len)

    def __getitem__(self, idx: int) -> TokenSample:
        i = _check_index(idx, len(self))
        views = [np.empty(shape, dt) for shape, dt in self.token_parts(1)]
        self.gather_into(np.asarray([i], np.int64), views, num_threads=1)
        out = self.token_batch(views, 1)
        return TokenSample({k: (v[0] if k in ("input_ids", "labels", "position_ids") else v) for k, v in out.items()})

    def source(self, idx: int) -> str | None:
        """The file (and token offset) sample ``idx`` starts in."""
        i = _check_index(idx, len(self))
        sp = self.plan.spans(np.asarray([i], np.int64))
        return self._where(int(sp.g[0])) if sp.g.size else None

    def _where(self, g: int) -> str:
        f = int(np.searchsorted(self.file_start, g, side="right")) - 1
        f = min(max(f, 0), len(self.files) - 1)
        return f"{self.files[f].path} at token {g - int(self.file_start[f])}"

    def native_source(self) -> NativeSource:
        """TOKENS: rows gathered by the token kernel (NOTE [ Token batches ])."""
        src = NativeSource(SourceKind.TOKENS, stage=self._stage(), dataset=self, description=repr(self))
        if self.shuffle:
            src.epoch_map = self.epoch_rows
        return src

    def epoch_rows(self, epoch: int, seed: int | None = None) -> Any:
        """Which sample each index of ``epoch`` reads when the dataset shuffles (``shuffle=True``).

        NOTE [ Shuffling in blocks ]
        ``pack`` and ``pad`` samples are planned a block of documents at a time (NOTE [ Packing
        in blocks ] in packing.py). A loader's global shuffle sends every sample of a batch to
        another block, so each row pays for planning its block (a few milliseconds for
        16,384 documents) unless that block is among the few kept. Shuffled here, an epoch
        visits the blocks in a seeded order and each block's samples in a seeded order of
        their own (``LazyBlockShuffle``): a block is planned once per epoch, and the samples
        a batch holds come from one block, or two. The order is a pure function of
        ``(seed, epoch)``, so resume and elastic resume stay exact; ``seed=None`` takes the
        loader's (as a mixture does). ``concat`` samples need no plan: shuffled here they are
        a permutation of the whole corpus.
        """
        s = self.seed if self.seed is not None else (0 if seed is None else int(seed))
        n = len(self)
        if isinstance(self.plan, ConcatPlan):
            return LazyPermutation(n, s, epoch)
        return LazyBlockShuffle(np.diff(self.plan.cum), s, epoch)

    def at_epoch(self, epoch: int, seed: int) -> Dataset:
        """This dataset fixed to ``epoch`` when it shuffles (NOTE [ Datasets that change with the
        epoch ] in loaderlib/_datasets/mixture.py); itself otherwise."""
        return _TokenEpoch(self, self.epoch_rows(epoch, seed)) if self.shuffle else self

    def _check_ids_at_open(self) -> None:
        """Raise :class:`TokenFormatError` for an id out of range, where a corpus is small enough.

        NOTE [ Token ids checked at open ]
        An id at or past the limit (``vocab_size``, else what ``input_ids`` hold) or below 0
        can only be found by reading every token, and opening a corpus costs O(files) (NOTE
        [ Opening a token corpus ]). So a corpus of at most ``OPEN_CHECK_TOKENS`` (2^28) local
        tokens is read once at open, a file whose token type cannot hold a bad id skipped, and
        the first bad id raises :class:`TokenFormatError` naming the file and the token's
        offset: at numpy's max over a mapping, 2^28 uint16 tokens take about 0.1-0.3 s here,
        a price users of a small corpus do not notice. Larger corpora (and files behind URLs
        not downloaded yet) open without reading, and the row kernel checks each id it
        gathers: an error then names the sample, the file and the token.
        """
        if sum(tf.num_tokens for tf in self.files) > OPEN_CHECK_TOKENS:
            return
        step = 1 << 24
        for tf in self.files:
            a = tf.tokens
            if a is None or a.size == 0:
                continue
            info = np.iinfo(a.dtype)
            if info.max < self.limit and info.min >= 0:
                continue
            for lo in range(0, a.size, step):
                chunk = a[lo:lo + step]
                if chunk.max() >= self.limit or (info.min < 0 and chunk.min() < 0):
                    k = lo + int(np.flatnonzero((chunk >= self.limit) | (chunk < 0))[0])
                    raise TokenFormatError(
                        f"{tf.path}: token {k} is id {int(a[k])}, out of range (ids must be 0 <= id < {self.limit}"
                        + (", the vocab_size" if self.vocab_size is not None else "") + ")")

    def _stage(self) -> str:
        kinds = sorted({tf.kind for tf in self.files})
        return (f"TokenDataset of {len(self.files)} {'/'.join(kinds)} file(s), {self.num_tokens} tokens: "
                f"{self.packing} rows of {self.seq_len} + 1 tokens gathered by a nogil kernel")

    def element_spec(self) -> Any:
        s = (self.seq_len,)
        return {"input_ids": TensorSpec(s, self.ids_dtype), "labels": TensorSpec(s, self.dtype),
                "position_ids": TensorSpec(s, self.dtype), "cu_seqlens": TensorSpec((None,), np.dtype(np.int32)),
                "max_seqlen": TensorSpec((), np.dtype(np.int64))}

    def __repr__(self) -> str:
        src = self._sources if isinstance(self._sources, str) else f"{len(self.files)} files"
        return f"TokenDataset({src!r}, seq_len={self.seq_len}, packing={self.packing!r})"

    # -- what the native engine calls ----------------------------------------------------

    def token_parts(self, batch_size: int) -> list[tuple[tuple, np.dtype]]:
        """The arena parts of a batch of ``batch_size`` rows: ids, labels, positions,
        cu_seqlens (room for every segment), each row's segment starts and their counts."""
        b, s = int(batch_size), self.seq_len
        if b * s >= 1 << 31:
            raise ValueError(f"a batch of {b} x {s} tokens does not fit int32 cu_seqlens")
        return [((b, s), self.ids_dtype), ((b, s), self.dtype), ((b, s), self.dtype),
                ((b * s + 1,), np.dtype(np.int32)), ((b, s + 2), np.dtype(np.int32)), ((b,), np.dtype(np.int64))]

    def spans(self, rows: np.ndarray) -> Spans:
        return self.plan.spans(np.asarray(rows, np.int64))

    def read_ahead(self, rows: np.ndarray) -> int:
        """Ask the OS to read the tokens of samples ``rows`` in the background; the bytes asked.

        NOTE [ Token read-ahead ]
        The token files are mapped MADV_RANDOM (NOTE [ Token files are read at random ] in
        formats.py), so nothing is read before a row faults its pages in. The native engine
        calls this when it plans a batch, one or two batches before the kernel gathers it
        (``NativeProducer.submit``): MADV_WILLNEED on exactly the pages of the batch's spans
        starts their reads in the background, as the Extract stage's read-ahead does for
        files, so a cold corpus is read while the batches before are gathered and consumed.
        Files behind URLs not downloaded yet are skipped (their download is ahead already); for
        files read by range this starts the fetch of the rows' chunks in the background instead
        (not pinned: NOTE [ Token files read by range ] in ranges.py), and a batch planned with
        ``start_gather`` is gathered only once its chunks are here.
        On a 1.2 GB uint16 file evicted from the page cache (posix_fadvise DONTNEED), shuffled
        concat rows of 2,048, batches of 64, 2 threads, prefetch 4: 14.5-18.6 M tokens/s
        without it and 49.3-67.9 M with it (two rounds, local virtio disk). On a corpus in the
        page cache the advice reads nothing and costs a system call a row (about a fifth of
        the loader's CPU per batch in a py-spy profile), so it is given only while the
        process takes major page faults, and for 64 batches after the last one seen
        (``_reading_ahead``; one ``getrusage`` every 8 batches).
        """
        sp = self.spans(np.asarray(rows, np.int64))
        if self._ranges is not None:   # their chunks are fetched in the background (NOTE [ Token files read by range ])
            fetch = self._ranges.start(sp, pin=False)
            return self._ranges.bytes_of(fetch.gids)
        return int(_tokens.will_need(self._corpus, sp.g, sp.n))

    def _reading_ahead(self) -> bool:
        """Whether a batch's pages are worth advising now: while the process takes major page
        faults (reads from storage), and for the next 64 batches after one; never for a corpus
        that stays in the page cache (NOTE [ Token read-ahead ])."""
        ra = self._ra
        ra[1] += 1
        if ra[1] % 8 == 1:   # one getrusage every 8 batches
            major = resource.getrusage(resource.RUSAGE_SELF).ru_majflt if resource is not None else 1
            if major != ra[0]:
                ra[0], ra[2] = major, ra[1] + 64
        return ra[1] <= ra[2]

    def gather_into(self, rows: np.ndarray, views: list[np.ndarray], *, num_threads: int | None = None,
                    out_rows: np.ndarray | None = None) -> int:
        """Write samples ``rows`` into rows ``out_rows`` (default ``0..``) of ``views`` (the parts of
        :meth:`token_parts`); returns the input positions that hold a token (the rest is padding).
        Raises :class:`LoaderError` naming the file and token of a bad row."""
        return self.start_gather(rows, views, num_threads=num_threads, out_rows=out_rows).wait()

    def start_gather(self, rows: np.ndarray, views: list[np.ndarray], *, team: Any = None,
                     num_threads: int | None = None, out_rows: np.ndarray | None = None,
                     timed: bool = False, read_ahead: bool = False) -> Gather:
        """:meth:`gather_into`, queued on ``team`` (a ``TokenTeam``) when one is given, else run
        here; the rows are written once the returned :class:`Gather` is waited for.

        NOTE [ Token rows on the kernel team ]
        The native engine keeps a team of kernel threads per run (include/ll_pool.h, NOTE [ One
        queue across batches ]) and queues each token batch on it when it plans the batch: a
        batch is one job whose items are its rows, claimed one at a time by whichever thread
        is free. The driver computes the next batch's spans and hands over the one before
        while the team writes, and the team goes from one batch to the next without a
        barrier, as it does for images. Called without a team (``dataset[i]``, a Python
        engine) the rows are one ``prange`` here.
        """
        rows = np.ascontiguousarray(rows, np.int64)
        if out_rows is None:
            out = self._first_rows.get(rows.size)
            if out is None:   # read-only: shared by every batch of this size
                out = self._first_rows[rows.size] = np.arange(rows.size, dtype=np.int64)
                out.flags.writeable = False
        else:
            out = np.ascontiguousarray(out_rows, np.int64)
        self._check_views(views)
        sp = self.spans(rows)
        if self._remote is not None:
            self._ensure(self._spans_files(sp))
        if read_ahead and self._ranges is None and self._reading_ahead():   # NOTE [ Token read-ahead ]
            _tokens.will_need(self._corpus, sp.g, sp.n)
        n = rows.size
        status = np.zeros(n, np.int32)
        where = np.zeros(n, np.int64)
        threads = 1 if not num_threads else _threads.resolve_num_threads(num_threads)
        ids, lab, pos, _cu, starts, counts = views
        args = (self._corpus, sp.g, sp.n, sp.ptr, out, sp.detect, self.seq_len,
                -1 if self.eos_id is None else self.eos_id, self.limit, self.pad_id, self.ignore_index,
                self.mask_document_starts, *self._out_types)
        item_ns = np.zeros(n, np.int64) if timed else None

        def run() -> Any:
            if team is not None and n:
                return _tokens.start_rows_into(team, *args, ids, lab, pos, starts, counts, status, where,
                                               max(1, min(threads, n)), item_ns)
            t0 = time.perf_counter_ns()
            _tokens.rows_into(*args, ids.ctypes.data, lab.ctypes.data, pos.ctypes.data, ids.strides[0],
                              lab.strides[0], starts, counts, status, where, max(1, min(threads, n)))
            if item_ns is not None and n:
                item_ns[:] = (time.perf_counter_ns() - t0) * min(threads, n) // n
            return None

        if self._ranges is not None and n:
            # the rows are gathered once their chunks are here (NOTE [ Token files read by range ])
            fetch = self._ranges.start(sp, then=run)
            return Gather(self, rows, sp, status, where, None, item_ns, fetch)
        return Gather(self, rows, sp, status, where, run(), item_ns)

    def _raise(self, row: int, status: int, where: int) -> None:
        at = self._where(where) if where >= 0 else "an unknown position"
        if status == _tokens.RANGE:
            raise LoaderError(f"sample {row}: a token id at {at} is out of range (ids must be 0 <= id < {self.limit}"
                              + (", the vocab_size" if self.vocab_size is not None else "") + ")")
        raise LoaderError(f"sample {row}: its tokens at {at} lie outside the corpus (a corrupt index)")

    def _check_views(self, views: list[np.ndarray]) -> None:
        if len(views) != 6:
            raise ValueError(f"gather_into needs the 6 parts of token_parts, got {len(views)}")
        b = views[0].shape[0]
        parts = self._parts_of.get(b)
        if parts is None:
            parts = self._parts_of[b] = self.token_parts(b)
        for v, (shape, dt) in zip(views, parts):
            if (v.dtype != dt or v.shape != shape or not v.flags.c_contiguous or not v.flags.writeable):
                raise ValueError(f"gather_into: a part of shape {v.shape} {v.dtype}, expected {shape} {dt}, "
                                 "C-contiguous and writeable")

    def token_batch(self, views: list[np.ndarray], n: int) -> dict:
        """The batch dict of the first ``n`` rows written into ``views`` (NOTE [ Token batches ])."""
        ids, lab, pos, cu, starts, counts = views
        m, longest = _tokens.cu_seqlens_into(starts, counts, int(n), self.seq_len, cu)
        return {"input_ids": ids[:n], "labels": lab[:n], "position_ids": pos[:n], "cu_seqlens": cu[:m],
                "max_seqlen": int(longest)}


class Gather:
    """Token rows being written (NOTE [ Token rows on the kernel team ]): :meth:`wait` returns
    the input positions holding a token once they are, or raises the error of the first bad
    row, naming its file and token."""

    def __init__(self, dataset: TokenDataset, rows: np.ndarray, sp: Spans, status: np.ndarray, where: np.ndarray,
                 pending: Any, item_ns: np.ndarray | None, fetch: Fetch | None = None) -> None:
        self.dataset, self.rows, self.sp = dataset, rows, sp
        self.status, self.where, self.pending, self.item_ns = status, where, pending, item_ns
        self.fetch = fetch
        self.fetch_read: tuple[int, int] | None = None

    def wait(self, timeout: float | None = None) -> int:
        """The input positions holding a token, once the rows are written. ``timeout``: seconds
        to wait for the chunks of a batch read by range; past it, if the rows were not queued
        yet, they never will be (the batch is given up) and ``LoaderTimeoutError`` is raised. The
        rows themselves are memory work and always waited for."""
        fetch = self.fetch
        try:
            if fetch is not None:   # the chunks first, then the rows queued once they came
                try:
                    self.pending = fetch.wait(timeout or None)
                except TimeoutError:
                    if fetch.done():
                        raise             # the fetch's own error, not the wait's
                    if self._give_up():
                        raise LoaderTimeoutError(f"the token chunks of {self.rows.size} rows did not come within "
                                                 f"{timeout} s") from None
                    self.pending = fetch.wait()   # the chunks came just now: the rows are queued
                self.fetch_read = fetch.read
                self.fetch = None
            if self.pending is not None:
                self.pending.wait()
                self.pending = None
        finally:
            if fetch is not None:
                fetch.release()   # the rows are written (or failed): the chunks may go
        if self.status.any():   # OK is 0 (include/ll_tokens.h): one pass when no row failed
            bad = np.flatnonzero(self.status != _tokens.OK)
            if bad.size:
                j = int(bad[0])
                self.dataset._raise(int(self.rows[j]), int(self.status[j]), int(self.where[j]))
        n, sp, seq_len = self.rows.size, self.sp, self.dataset.seq_len
        if sp.detect:
            return n * seq_len
        filled = np.zeros(n, np.int64)
        np.add.at(filled, np.repeat(np.arange(n), np.diff(sp.ptr)), sp.n)
        return int(np.minimum(filled, seq_len).sum())

    def _give_up(self) -> bool:
        """Stop the rows from being queued when their chunks come (True), unless they already
        are (False: then they are waited for)."""
        if self.fetch is None or not self.fetch.give_up():
            return False
        self.fetch = None
        return True

    def abandon(self) -> None:
        """Let the batch go without waiting for the store: rows not queued yet never will be
        (their slot may be reused at once), rows already queued are waited for."""
        fetch = self.fetch
        if fetch is not None and self._give_up():
            fetch.release()
            return
        try:
            self.wait()
        except LoaderError:
            pass

    @property
    def read(self) -> tuple[int, int] | None:
        """``(bytes, nanoseconds)`` this batch fetched from the store by range once waited for
        (NOTE [ Token files read by range ]), None when it fetched nothing."""
        return self.fetch_read

    @property
    def thread_ns(self) -> int:
        """The rows' time on their threads (when timed)."""
        return int(self.item_ns.sum()) if self.item_ns is not None else 0


class _TokenEpoch(Dataset):
    """A shuffling :class:`TokenDataset` fixed to one epoch's order (read from Python)."""

    def __init__(self, dataset: TokenDataset, rows: Any) -> None:
        self.dataset = dataset
        self.rows = rows

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, idx: int) -> TokenSample:
        return self.dataset[int(self.rows[_check_index(idx, len(self.dataset))])]

    def source(self, idx: int) -> str | None:
        return self.dataset.source(int(self.rows[_check_index(idx, len(self.dataset))]))

    def __repr__(self) -> str:
        return f"{self.dataset!r} (one epoch's order)"
