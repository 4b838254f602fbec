"""Which spans of a token corpus make each training row: the three packings.

NOTE [ Packing in blocks ]
``concat`` needs no plan: row i is the window of S + 1 tokens from global token i * S
(NOTE [ A token row ] in pyx/include/ll_tokens.h), so opening costs O(files). ``pad`` and
``pack`` place whole documents, so they read the documents' lengths. A document of n >= 1
tokens is cut into pieces as a concat window cuts the corpus (piece k is tokens
``[k * S, k * S + S + 1)`` of it, so every token but the first is predicted once); ``pad``
makes each piece a row of its own, ``pack`` places the pieces of a block of documents into
rows of S + 1 tokens, best fit, longest first (``ll_tok_best_fit``). Empty documents are
skipped. The documents are taken in blocks of ``block`` documents of one file: opening counts
the rows of every block (one pass over the index, O(documents) time, O(blocks) memory), and
a block's placement is computed again, identically, when a batch first needs it (a few
blocks are kept), so no plan of the whole corpus is ever held. The rows of the corpus are
the blocks' rows in file order; a global shuffle is the sampler's, over row ids.
"""

from __future__ import annotations

import collections
import threading
import warnings

import numpy as np

from ..._ext import _tokens
from ...errors import LoaderError
from .formats import TokenFile

__all__ = ["BlockPlan", "ConcatPlan", "Spans"]


class Spans:
    """The spans of some rows: row i is ``g[ptr[i]:ptr[i+1]]`` / ``n[...]`` (global token start,
    length), with ``detect`` when the rows are concat windows."""

    __slots__ = ("detect", "g", "n", "ptr")

    def __init__(self, g: np.ndarray, n: np.ndarray, ptr: np.ndarray, detect: bool) -> None:
        self.g, self.n, self.ptr, self.detect = g, n, ptr, detect


class ConcatPlan:
    """``concat``: the corpus as one stream of ``total`` tokens, row i from token ``i * S``."""

    def __init__(self, total: int, seq_len: int) -> None:
        self.seq_len = seq_len
        self.rows = max(0, (total - 1) // seq_len)
        self.real_tokens = self.rows * seq_len   # input positions, none of them padding
        self._fixed: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def __len__(self) -> int:
        return self.rows

    def spans(self, rows: np.ndarray) -> Spans:
        k = rows.size
        fixed = self._fixed.get(k)
        if fixed is None:   # the lengths and row pointers of every batch of k rows: made once, read-only
            fixed = (np.full(k, self.seq_len + 1, np.int64), np.arange(k + 1, dtype=np.int64))
            for a in fixed:
                a.flags.writeable = False
            self._fixed[k] = fixed
        return Spans(rows * self.seq_len, fixed[0], fixed[1], True)


def _pieces(starts: np.ndarray, lens: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The pieces of documents (starts, lengths), in document order (NOTE [ Packing in blocks ])."""
    keep = lens > 0
    starts, lens = starts[keep], lens[keep]
    count = np.maximum(1, -(-(lens - 1) // seq_len))
    doc = np.repeat(np.arange(lens.size), count)
    first = np.cumsum(count) - count
    k = np.arange(doc.size, dtype=np.int64) - np.repeat(first, count)
    g = starts[doc] + k * seq_len
    n = np.minimum(seq_len + 1, lens[doc] - k * seq_len)
    return g, n


class BlockPlan:
    """``pad`` or ``pack`` over the documents of ``files`` in blocks (NOTE [ Packing in blocks ])."""

    CACHED = 16   # block placements kept

    def __init__(self, files: list[TokenFile], file_start: np.ndarray, seq_len: int, mode: str, eos_id: int | None,
                 block: int) -> None:
        self.files = files
        self.file_start = file_start
        self.seq_len = seq_len
        self.mode = mode
        self.eos_id = eos_id
        self.block = block
        self._flat_docs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        blocks: list[tuple[int, int, int]] = []   # (file, first document, documents)
        counts: list[int] = []
        real = 0
        for f, tf in enumerate(files):
            ndocs = self._num_docs(f)
            for d0 in range(0, ndocs, block):
                nd = min(block, ndocs - d0)
                g, n = self._block_pieces(f, d0, nd)
                if not g.size:
                    continue
                placed, ptr, rows = self._place(g, n)
                blocks.append((f, d0, nd))
                counts.append(rows)
                # Input positions that hold a token (the rest is padding): a row of ``fill``
                # tokens fills min(fill, S) of them (its last token is only a label).
                fill = np.add.reduceat(n[placed], ptr[:-1]) if rows else np.zeros(0, np.int64)
                real += int(np.minimum(fill, seq_len).sum())
        self.blocks = blocks
        self.cum = np.concatenate([[0], np.cumsum(np.asarray(counts, np.int64))]).astype(np.int64)
        self.rows = int(self.cum[-1])
        self.real_tokens = real
        self._cache: collections.OrderedDict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = \
            collections.OrderedDict()
        self._lock = threading.Lock()
        self._replans = 0      # placements computed again after leaving the cache
        self._warned = False

    def __len__(self) -> int:
        return self.rows

    def _docs(self, f: int) -> tuple[np.ndarray, np.ndarray] | None:
        tf = self.files[f]
        if tf.bounds is not None:
            return None
        got = self._flat_docs.get(f)
        if got is None:
            got = self._flat_docs[f] = tf.doc_spans(self.eos_id)
        return got

    def _num_docs(self, f: int) -> int:
        tf = self.files[f]
        if tf.bounds is None:
            docs = self._docs(f)
            assert docs is not None
            return int(docs[0].size)
        return int(tf.bounds.size)

    def _block_pieces(self, f: int, d0: int, nd: int) -> tuple[np.ndarray, np.ndarray]:
        tf = self.files[f]
        docs = self._docs(f)
        if docs is not None:
            starts, lens = docs[0][d0:d0 + nd], docs[1][d0:d0 + nd]
        elif tf.kind == "datatrove":
            ends = np.asarray(tf.bounds[max(0, d0 - 1):d0 + nd], np.int64)
            starts = np.concatenate([[0], ends[:-1]]) if d0 == 0 else ends[:-1]
            ends = ends if d0 == 0 else ends[1:]
            lens = ends - starts
        else:
            starts = np.asarray(tf.bounds[d0:d0 + nd], np.int64) // tf.divisor
            if tf.lengths is not None:
                lens = np.asarray(tf.lengths[d0:d0 + nd], np.int64)
            else:
                nxt = np.asarray(tf.bounds[d0 + 1:d0 + nd + 1], np.int64) // tf.divisor
                lens = np.append(nxt, tf.num_tokens)[:nd] - starts
        bad = (starts < 0) | (lens < 0) | (starts + lens > tf.num_tokens)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise LoaderError(f"{tf.path}: document {d0 + j} spans tokens {int(starts[j])}.."
                              f"{int(starts[j] + lens[j])}, outside the file's {tf.num_tokens} tokens "
                              "(a corrupt index)")
        g, n = _pieces(starts, lens, self.seq_len)
        return g + int(self.file_start[f]), n

    def _place(self, g: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """Per row, the pieces in placement order: (order, row_ptr, rows)."""
        if self.mode == "pad":
            return np.arange(g.size, dtype=np.int64), np.arange(g.size + 1, dtype=np.int64), int(g.size)
        row_of, order, rows = _tokens.best_fit(np.ascontiguousarray(n, np.int64), self.seq_len + 1)
        placed = order[np.argsort(row_of[order], kind="stable")]
        ptr = np.zeros(rows + 1, np.int64)
        np.cumsum(np.bincount(row_of, minlength=rows), out=ptr[1:])
        return placed, ptr, rows

    def _plan(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        with self._lock:
            got = self._cache.get(b)
            if got is not None:
                self._cache.move_to_end(b)
                return got
        f, d0, nd = self.blocks[b]
        self._replans += 1
        if (not self._warned and self._replans > 4 * len(self.blocks) and self._replans > 64
                and len(self.blocks) > self.CACHED):
            self._warned = True
            warnings.warn(f"{self.mode} sequences read in an order that jumps between blocks of documents: each "
                          f"block has been planned {self._replans / len(self.blocks):.0f} times so far. Shuffle "
                          f"in the dataset, TokenDataset(..., shuffle=True), with a loader that does not shuffle "
                          "(NOTE [ Shuffling in blocks ])", stacklevel=2)
        g, n = self._block_pieces(f, d0, nd)
        placed, ptr, _rows = self._place(g, n)
        got = (g[placed], n[placed], ptr)
        with self._lock:
            self._cache[b] = got
            while len(self._cache) > self.CACHED:
                self._cache.popitem(last=False)
        return got

    def spans(self, rows: np.ndarray) -> Spans:
        """The spans of ``rows``: grouped by block, one vectorised gather per block touched."""
        k = rows.size
        blk = np.searchsorted(self.cum, rows, side="right") - 1
        local = rows - self.cum[blk]
        count = np.zeros(k, np.int64)
        lo = np.zeros(k, np.int64)
        groups = []
        for b in np.unique(blk).tolist():
            sel = np.flatnonzero(blk == b)
            plan = self._plan(int(b))
            ptr = plan[2]
            lo[sel] = ptr[local[sel]]
            count[sel] = ptr[local[sel] + 1] - lo[sel]
            groups.append((sel, plan))
        ptr_out = np.zeros(k + 1, np.int64)
        np.cumsum(count, out=ptr_out[1:])
        total = int(ptr_out[-1])
        out_g = np.empty(total, np.int64)
        out_n = np.empty(total, np.int64)
        for sel, (g, n, _ptr) in groups:
            c = count[sel]
            within = np.arange(int(c.sum()), dtype=np.int64) - np.repeat(np.cumsum(c) - c, c)
            dst = np.repeat(ptr_out[sel], c) + within
            src = np.repeat(lo[sel], c) + within
            out_g[dst] = g[src]
            out_n[dst] = n[src]
        return Spans(out_g, out_n, ptr_out, False)
