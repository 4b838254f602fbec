"""Tokenize text corpora into Megatron-LM indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``):
:func:`write_tokens`, what ``python -m loaderlib tokenize`` runs.

NOTE [ Megatron indexed dataset layout ]
What Megatron-Core's ``IndexedDataset`` (``megatron/core/datasets/indexed_dataset.py``, index
version 1) reads, all little endian:

    PREFIX.idx  b"MMIDIDX\\x00\\x00"   9 bytes of magic
                uint64  version = 1
                uint8   dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
                        7 float32, 8 uint16)
                uint64  sequence count S
                uint64  document-index count D (documents + 1)
                int32   sequence_lengths[S]    tokens per sequence
                int64   sequence_pointers[S]   byte offset of each sequence in PREFIX.bin
                int64   document_indices[D]    first sequence of each document, then S
    PREFIX.bin  the tokens of every sequence, concatenated, in that dtype

A document here is one sequence, so ``document_indices`` is ``0, 1, ..., S``. The header is 34
bytes and every array's length is known from it, so the writer streams the lengths into the
index file as documents arrive (4 bytes each, never held in memory), then appends the pointers
and document indices computed from them in bounded blocks, and writes the header last.
Pointers are int64 byte offsets: a corpus past 2^31 bytes is a matter of course. A sequence
length is int32 in the format, so a single document of 2^31 tokens or more is an error.

NOTE [ Token dtype ]
The ids are ``0 .. vocab_size - 1`` (added tokens included), plus ``eos_id`` when it lies
outside the vocabulary, so uint16 holds every vocabulary of up to 65,536 entries; above that
int32, as Megatron does. (Megatron's ``DType.optimal_dtype`` switches below a cardinality of
65,500; 65,500 to 65,536 ids fit uint16 exactly, and its reader takes whatever code the header
names.)

NOTE [ Tokenize while reading ]
``encode_batch`` runs the tokenizer on all cores with the GIL released (tokenizers' Rust
thread pool), but reading and parsing the input, turning each encoding's ids into the output
dtype and writing are Python work on one core. So one worker thread does nothing but encode:
while it encodes batch k, the calling thread converts and writes batch k-1 and reads batch
k+1. The serial part hides behind the parallel one, and at most two batches (``batch_size``
documents or about 8 MiB of text each, whichever comes first) and their encodings are held
at once, whatever the corpus size. Measured on a 2-core machine shared with other work
(load average 10), three interleaved runs each over 35 MB of JSON Lines (the standard
library's sources, an 8,000-token BPE, 9.5 M tokens): write_tokens took 1.51 CPU-s per
million tokens and a bare loop of ``json.loads`` and ``encode_batch_fast`` 1.52, so reading,
converting and writing cost nothing visible beside the encoding; wall-clock medians 348 k and
376 k tokens/s, within the spread of either (303 k to 521 k). Peak memory (VmHWM) was 374,
413 and 458 MB for 12, 35 and 105 MB of that input: the resident size after each batch of the
largest run went up and down between 354 and 409 MB with no trend, so the peak is the largest
pair of batches met, not growth. Most of it is the tokenizer's encodings: 130 bytes a token
(RSS before and after ``encode_batch_fast`` of 8 MiB of that text, 2.38 M tokens).
"""

from __future__ import annotations

import io
import logging
import os
import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import LoaderError
from ..durable import fsync_dir
from .formats import MEGATRON_DTYPES, MEGATRON_MAGIC  # one definition, shared with the reader

__all__ = ["TokenWriteReport", "TokenizeError", "write_tokens"]

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("<9sQBQQ")   # magic, version, dtype code, sequences, document indices
_BLOCK = 1 << 20                     # index entries per pass when appending pointers
_CHUNK = 1 << 20                     # bytes read from an input at a time

#: Batches close at this much text even before ``batch_size`` documents (NOTE [ Tokenize while reading ]).
_BATCH_CHARS = 8 << 20

#: Tokens that end a document in the tokenizers people train with, tried in this order when
#: ``append_eos`` has no ``eos_id`` and no ``tokenizer_config.json`` names one.
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "[EOS]")

_JSONL = (".jsonl", ".ndjson", ".json")
_COMPRESSED = ("", ".gz", ".zst", ".zstd")
_TOKENS_EXTRA = 'pip install "loaderlib[tokens]"'


class TokenizeError(LoaderError, ValueError):
    """An input of :func:`write_tokens` cannot be read as text documents.

    Attributes
    ----------
    path : str
        The file at fault.
    line : int or None
        Its 1-based line (JSON Lines) or row (Parquet), when the problem has one.
    reason : str
        What is wrong.
    """

    def __init__(self, path: str, reason: str, line: int | None = None, what: str = "line"):
        self.path, self.reason, self.line, self.what = path, reason, line, what
        where = f"{path!r}" if line is None else f"{path!r} {what} {line}"
        super().__init__(f"{where}: {reason}")

    def __reduce__(self):
        return (type(self), (self.path, self.reason, self.line, self.what))


@dataclass(frozen=True)
class TokenWriteReport:
    """What :func:`write_tokens` wrote.

    Attributes
    ----------
    documents : int
        Documents written (one sequence each).
    empty_documents : int
        Documents skipped because they had no text or their text encoded to no tokens.
    tokens : int
        Tokens written, the appended EOS ids included.
    bytes_read : int
        Bytes of the input files, as stored (compressed files count compressed).
    bytes_written : int
        Bytes of ``PREFIX.bin`` and ``PREFIX.idx`` together.
    seconds : float
        Wall time of the whole call.
    tokens_per_s : float
        ``tokens / seconds``.
    dtype : str
        The token dtype of ``PREFIX.bin``: ``"uint16"`` or ``"int32"`` (NOTE [ Token dtype ]).
    vocab_size : int
        The tokenizer's vocabulary, added tokens included.
    eos_id : int or None
        The id appended to every document (``append_eos=True``), else None.
    paths : tuple of str
        ``(PREFIX.bin, PREFIX.idx)``.
    """

    documents: int
    empty_documents: int
    tokens: int
    bytes_read: int
    bytes_written: int
    seconds: float
    tokens_per_s: float
    dtype: str
    vocab_size: int
    eos_id: int | None
    paths: tuple[str, str]

    def summary(self) -> str:
        """One paragraph for people: counts, sizes, speed and the files written."""
        empty = f" ({self.empty_documents:,} empty, skipped)" if self.empty_documents else ""
        eos = f", EOS {self.eos_id} appended" if self.eos_id is not None else ""
        return (f"tokenized {self.documents:,} documents{empty}: {self.tokens:,} tokens ({self.dtype}, vocabulary "
                f"{self.vocab_size:,}{eos}) in {self.seconds:,.1f} s, {self.tokens_per_s:,.0f} tokens/s; "
                f"read {self.bytes_read / 1e6:,.1f} MB, wrote {self.bytes_written / 1e6:,.1f} MB: "
                f"{self.paths[0]}, {self.paths[1]}")

    def __str__(self) -> str:
        return self.summary()


# ---------------------------------------------------------------------------- tokenizer


def _load_tokenizer(tokenizer: Any) -> tuple[Any, str | None]:
    """The ``tokenizers.Tokenizer`` to encode with, and the file it came from (None for an object)."""
    if isinstance(tokenizer, (str, os.PathLike)):
        path = os.fspath(tokenizer)
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ImportError(f"write_tokens needs Hugging Face tokenizers: {_TOKENS_EXTRA} (or pip install "
                              f"tokenizers)") from e
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.exists(path):
            raise FileNotFoundError(f"tokenizer file {path!r} does not exist (a Hugging Face tokenizer.json)")
        try:
            return Tokenizer.from_file(path), path
        except Exception as e:   # tokenizers raises a bare Exception for a file it cannot parse
            raise LoaderError(f"{path!r} is not a Hugging Face tokenizer.json: {e}") from None
    backend = getattr(tokenizer, "backend_tokenizer", None)   # a transformers "fast" tokenizer
    if backend is not None:
        return backend, None
    if not all(hasattr(tokenizer, m) for m in ("encode_batch", "get_vocab_size", "token_to_id")):
        raise TypeError(f"tokenizer must be a path to a tokenizer.json or a tokenizers.Tokenizer, got "
                        f"{type(tokenizer).__name__}")
    return tokenizer, None


def _whole_documents(tok: Any, source: str) -> Any:
    """``tok``, or a copy without truncation and padding: a tokenizer.json saved with them
    would cut every document to its ``max_length`` or pad it, silently."""
    if getattr(tok, "truncation", None) is None and getattr(tok, "padding", None) is None:
        return tok
    logger.info("%s has truncation or padding set: documents are encoded whole, unpadded", source)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tok.to_str())   # a copy: the caller's object keeps its settings
    tok.no_truncation()
    tok.no_padding()
    return tok


def _resolve_eos(tok: Any, original: Any, path: str | None, eos_id: int | None) -> int:
    """The EOS id: ``eos_id`` if given, else the one the tokenizer's files or object name."""
    if eos_id is not None:
        if isinstance(eos_id, bool) or not isinstance(eos_id, (int, np.integer)) or not 0 <= eos_id < 2**31:
            raise ValueError(f"eos_id must be a token id from 0 to 2**31 - 1, got {eos_id!r}")
        return int(eos_id)
    own = getattr(original, "eos_token_id", None)   # a transformers tokenizer knows its own
    if isinstance(own, int):
        return own
    names = []
    if path is not None:   # Hugging Face keeps eos_token beside tokenizer.json, not in it
        cfg = os.path.join(os.path.dirname(os.path.abspath(path)), "tokenizer_config.json")
        if os.path.exists(cfg):
            import json

            try:
                with open(cfg, encoding="utf-8") as f:
                    tok_eos = json.load(f).get("eos_token")
            except (OSError, ValueError, AttributeError):
                tok_eos = None
            if isinstance(tok_eos, dict):
                tok_eos = tok_eos.get("content")
            if isinstance(tok_eos, str):
                names.append(tok_eos)
    names += EOS_CANDIDATES
    for name in names:
        i = tok.token_to_id(name)
        if i is not None:
            logger.info("appending EOS %r (id %d) to every document", name, i)
            return int(i)
    src = repr(path) if path is not None else "the tokenizer given"
    raise ValueError(f"append_eos=True but no EOS token found in {src} (looked for tokenizer_config.json's "
                     f"eos_token and the tokens {', '.join(EOS_CANDIDATES)}): pass eos_id= (--eos-id)")


def token_dtype(cardinality: int) -> np.dtype:
    """The smallest dtype of the two Megatron readers expect that holds ids ``0 .. cardinality - 1``
    (NOTE [ Token dtype ])."""
    return np.dtype(np.uint16 if cardinality <= 1 << 16 else np.int32)


# ---------------------------------------------------------------------------- inputs


def input_kind(path: str) -> tuple[str, str]:
    """``(kind, compression)`` of an input by its name: kind ``"jsonl"``, ``"text"`` or
    ``"parquet"``, compression ``""``, ``".gz"`` or ``".zst"``."""
    low = path.lower()
    if low.endswith(".parquet"):
        return "parquet", ""
    for comp in _COMPRESSED:
        stem = low[:-len(comp)] if comp else low
        if comp and not low.endswith(comp):
            continue
        if stem.endswith(_JSONL):
            return "jsonl", ".zst" if comp == ".zstd" else comp
        if stem.endswith(".txt"):
            return "text", ".zst" if comp == ".zstd" else comp
    raise TokenizeError(path, "unknown input format: expected .jsonl/.ndjson/.json (JSON Lines), .txt (one "
                              "document per file), either optionally .gz or .zst compressed, or .parquet")


def _chunks(path: str, comp: str, raw: io.BufferedReader) -> Iterator[bytes]:
    """The content of ``path``, decompressed, in pieces, read from the open file ``raw``."""
    if comp == ".gz":
        import gzip

        stream = gzip.GzipFile(fileobj=raw, mode="rb")   # EOFError on a truncated file
        while chunk := stream.read(_CHUNK):
            yield chunk
    elif comp == ".zst":
        yield from _zstd_chunks(path, raw)
    else:
        while chunk := raw.read(_CHUNK):
            yield chunk


def _zstd_chunks(path: str, raw: io.BufferedReader) -> Iterator[bytes]:
    """zstd frames one after the other (pzstd and concatenated shards write several); a last
    frame cut short is an error, where zstandard's stream reader would end quietly."""
    import zstandard  # there: _require checked it before any work

    dctx = zstandard.ZstdDecompressor()
    frame, open_frame = dctx.decompressobj(), False
    while chunk := raw.read(_CHUNK):
        while chunk:
            out = frame.decompress(chunk)
            open_frame, chunk = not frame.eof, b""
            if out:
                yield out
            if frame.eof:   # the next frame starts in what this one left over
                chunk, frame = frame.unused_data, dctx.decompressobj()
    if open_frame:
        raise TokenizeError(path, "truncated: its last zstd frame is incomplete")


def _lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Lines (without their newline) of a stream of pieces."""
    head: list[bytes] = []   # the start of a line that continues in the next piece
    for chunk in chunks:
        parts = chunk.split(b"\n")
        if len(parts) == 1:
            head.append(chunk)
            continue
        if head:
            parts[0] = b"".join(head) + parts[0]
        head = [parts.pop()]
        yield from parts
    last = b"".join(head)
    if last:
        yield last


def _read_errors(comp: str) -> tuple[type[BaseException], ...]:
    """What a damaged stream raises while it is read."""
    import zlib

    errors: list[type[BaseException]] = [OSError, EOFError, zlib.error]
    if comp == ".zst":
        import zstandard

        errors.append(zstandard.ZstdError)
    return tuple(errors)


def _require(path: str, kind: str, comp: str) -> None:
    """The optional module that reading ``path`` needs is there (checked before any work)."""
    if comp == ".zst":
        try:
            import zstandard  # noqa: F401
        except ImportError as e:
            raise ImportError(f"reading {path!r} (zstd) needs zstandard: {_TOKENS_EXTRA} (or pip install "
                              f"zstandard)") from e
    if kind == "parquet":
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError as e:
            raise ImportError(f"reading Parquet input {path!r} needs pyarrow: {_TOKENS_EXTRA} (or pip install "
                              f"pyarrow)") from e


class _Progress:
    """Bytes of input consumed, for the progress bar."""

    def __init__(self, bar: Any) -> None:
        self.bar, self.done = bar, 0

    def advance_to(self, done: int) -> None:
        if done > self.done:
            self.bar.update(done - self.done)
            self.done = done


def _jsonl_docs(path: str, comp: str, text_key: str, progress: _Progress, base: int) -> Iterator[str]:
    import json

    errors = _read_errors(comp)
    with open(path, "rb") as raw:
        try:
            for lineno, line in enumerate(_lines(_chunks(path, comp, raw)), 1):
                if lineno == 1 and line.startswith(b"\xef\xbb\xbf"):
                    line = line[3:]   # a UTF-8 byte-order mark
                if not line.strip():
                    continue   # blank lines separate nothing in JSON Lines: not documents
                try:
                    obj = json.loads(line)
                except ValueError as e:   # JSONDecodeError and UnicodeDecodeError
                    raise TokenizeError(path, f"not JSON ({e})", lineno) from None
                if not isinstance(obj, dict):
                    raise TokenizeError(path, f"expected a JSON object, got {type(obj).__name__}", lineno)
                try:
                    text = obj[text_key]
                except KeyError:
                    keys = ", ".join(repr(k) for k in list(obj)[:8]) or "none"
                    raise TokenizeError(path, f"no key {text_key!r} (keys: {keys}); pass text_key= (--text-key)",
                                        lineno) from None
                if not isinstance(text, str):
                    raise TokenizeError(path, f"{text_key!r} is {type(text).__name__}, not a string", lineno)
                if lineno % 256 == 0:
                    progress.advance_to(base + raw.tell())
                yield text
        except errors as e:
            raise TokenizeError(path, f"cannot read: {e}") from None
        progress.advance_to(base + raw.tell())


def _text_docs(path: str, comp: str, progress: _Progress, base: int) -> Iterator[str]:
    errors = _read_errors(comp)
    with open(path, "rb") as raw:
        try:
            data = b"".join(_chunks(path, comp, raw))
        except errors as e:
            raise TokenizeError(path, f"cannot read: {e}") from None
        progress.advance_to(base + raw.tell())
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TokenizeError(path, f"not UTF-8 text ({e})") from None
    yield text.removeprefix("\ufeff")


def _parquet_docs(path: str, text_key: str, batch_size: int, progress: _Progress, base: int) -> Iterator[str]:
    import pyarrow as pa  # there: _require checked it before any work
    import pyarrow.parquet as pq
    size = os.path.getsize(path)
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise TokenizeError(path, f"not a Parquet file ({e})") from None
    schema = pf.schema_arrow
    if text_key not in schema.names:
        cols = ", ".join(repr(c) for c in schema.names[:8]) or "none"
        raise TokenizeError(path, f"no column {text_key!r} (columns: {cols}); pass text_key= (--text-key)")
    kind = schema.field(text_key).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or getattr(pa.types, "is_string_view", lambda _: False)(kind)):
        raise TokenizeError(path, f"column {text_key!r} is {kind}, not a string column")
    rows, total = 0, max(pf.metadata.num_rows, 1)
    try:
        for batch in pf.iter_batches(batch_size=batch_size, columns=[text_key]):
            col = batch.column(0)
            if col.null_count:
                bad = rows + col.is_null().to_numpy(zero_copy_only=False).argmax() + 1
                raise TokenizeError(path, f"{text_key!r} is null, not a string", int(bad), what="row")
            yield from col.to_pylist()
            rows += len(col)
            progress.advance_to(base + size * rows // total)
    except (pa.ArrowException, OSError) as e:
        raise TokenizeError(path, f"cannot read after row {rows}: {e}") from None
    progress.advance_to(base + size)


def _documents(paths: Sequence[str], text_key: str, batch_size: int, progress: _Progress) -> Iterator[str]:
    base = 0
    for path in paths:
        kind, comp = input_kind(path)
        if kind == "jsonl":
            yield from _jsonl_docs(path, comp, text_key, progress, base)
        elif kind == "text":
            yield from _text_docs(path, comp, progress, base)
        else:
            yield from _parquet_docs(path, text_key, batch_size, progress, base)
        base += os.path.getsize(path)
        progress.advance_to(base)


def _batches(docs: Iterable[str], batch_size: int) -> Iterator[tuple[list[str], int]]:
    """Lists of non-empty texts (NOTE [ Tokenize while reading ]) and the empty ones skipped."""
    batch: list[str] = []
    chars = empty = 0
    for text in docs:
        if not text:
            empty += 1
            continue
        batch.append(text)
        chars += len(text)
        if len(batch) >= batch_size or chars >= _BATCH_CHARS:
            yield batch, empty
            batch, chars, empty = [], 0, 0
    if batch or empty:
        yield batch, empty


def _input_paths(inputs: Any) -> list[str]:
    given = [os.fspath(inputs)] if isinstance(inputs, (str, os.PathLike)) else [os.fspath(p) for p in inputs]
    paths: list[str] = []
    for p in given:
        if not os.path.exists(p) and any(c in p for c in "*?["):   # a glob, as the shell would expand it
            import glob

            found = sorted(glob.glob(p))
            if not found:
                raise FileNotFoundError(f"no input matches {p!r}")
            paths += found
        else:
            paths.append(p)
    if not paths:
        raise ValueError("write_tokens needs at least one input file")
    for p in paths:   # every input checked before any work: no hour of tokenizing before a typo
        if not os.path.exists(p):
            raise FileNotFoundError(f"input {p!r} does not exist")
        if os.path.isdir(p):
            raise IsADirectoryError(f"input {p!r} is a folder: name its files (a glob: {p}/*.jsonl)")
        _require(p, *input_kind(p))
    return paths


# ---------------------------------------------------------------------------- output


def output_paths(output_prefix: str | os.PathLike) -> tuple[str, str]:
    """``(PREFIX.bin, PREFIX.idx)`` of ``PREFIX``, ``PREFIX.bin`` or ``PREFIX.idx``."""
    p = os.fspath(output_prefix)
    if p.endswith((".bin", ".idx")):
        p = p[:-4]
    return p + ".bin", p + ".idx"


def _create_temp(final: str) -> tuple[str, io.BufferedWriter]:
    """A new file beside ``final`` (same filesystem, so ``os.replace`` is atomic), created with
    the umask's permissions as ``final`` itself would be."""
    folder, name = os.path.split(os.path.abspath(final))
    for _ in range(100):
        tmp = os.path.join(folder, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        return tmp, os.fdopen(fd, "w+b")
    raise FileExistsError(f"cannot create a temporary file beside {final!r}")


class _IndexedWriter:
    """``PREFIX.bin`` and ``PREFIX.idx`` being written to temporary files, published by
    :meth:`commit` (NOTE [ Megatron indexed dataset layout ])."""

    def __init__(self, bin_path: str, idx_path: str, dtype: np.dtype) -> None:
        self.bin_path, self.idx_path, self.dtype = bin_path, idx_path, dtype
        self.temps: list[str] = []
        self.files: list[io.BufferedWriter] = []
        try:
            self.tmp_bin, self.bin = self._temp(bin_path)
            self.tmp_idx, self.idx = self._temp(idx_path)
        except BaseException:
            self.discard()
            raise
        self.idx.write(bytes(_HEADER.size))   # the header is written last, once the counts are known
        self.sequences = self.tokens = 0

    def _temp(self, final: str) -> tuple[str, io.BufferedWriter]:
        tmp, f = _create_temp(final)
        self.temps.append(tmp)
        self.files.append(f)
        return tmp, f

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append documents: their tokens, concatenated, and each one's length."""
        if lengths.size and int(lengths.max()) > np.iinfo(np.int32).max:
            raise LoaderError(f"{self.bin_path!r}: a document of {int(lengths.max()):,} tokens; the Megatron "
                              f"format stores lengths as int32")
        self.bin.write(memoryview(tokens).cast("B"))
        self.idx.write(lengths.astype("<i4").tobytes())
        self.sequences += lengths.size
        self.tokens += tokens.size

    def _append_pointers(self) -> None:
        """sequence_pointers (exclusive cumulative byte offsets) from the lengths written."""
        n, start, offset = self.sequences, 0, 0
        end = _HEADER.size + 4 * n
        while start < n:
            count = min(_BLOCK, n - start)
            self.idx.seek(_HEADER.size + 4 * start)
            lengths = np.frombuffer(self.idx.read(4 * count), "<i4").astype(np.int64)
            ptr = np.empty(count, np.int64)
            ptr[0] = offset
            np.cumsum(lengths[:-1] * self.dtype.itemsize, out=ptr[1:])
            ptr[1:] += offset
            offset = int(ptr[-1]) + int(lengths[-1]) * self.dtype.itemsize
            self.idx.seek(end + 8 * start)
            self.idx.write(ptr.astype("<i8").tobytes())
            start += count
        self.idx.seek(end + 8 * n)

    def commit(self) -> int:
        """Finish both files and move them into place (``.bin`` first); returns their bytes."""
        self._append_pointers()
        for start in range(0, self.sequences + 1, _BLOCK):   # document_indices: 0 .. S
            self.idx.write(np.arange(start, min(start + _BLOCK, self.sequences + 1), dtype="<i8").tobytes())
        code = next(c for c, t in MEGATRON_DTYPES.items() if np.dtype(t) == self.dtype)
        self.idx.seek(0)
        self.idx.write(_HEADER.pack(MEGATRON_MAGIC, 1, code, self.sequences, self.sequences + 1))
        size = 0
        for f in (self.bin, self.idx):
            f.flush()
            os.fsync(f.fileno())
            size += os.fstat(f.fileno()).st_size
            f.close()
        os.replace(self.tmp_bin, self.bin_path)
        self.temps.remove(self.tmp_bin)
        try:
            os.replace(self.tmp_idx, self.idx_path)
        except BaseException:
            os.unlink(self.bin_path)   # ours, just moved: no .bin may stay beside an index not its own
            raise
        self.temps.remove(self.tmp_idx)
        fsync_dir(self.idx_path)
        return size

    def discard(self) -> None:
        """Close and remove the temporary files (any failure, Ctrl-C included)."""
        for f in self.files:
            try:
                f.close()
            except OSError:
                pass
        for t in self.temps:
            try:
                os.unlink(t)
            except FileNotFoundError:
                pass
        self.temps.clear()


# ---------------------------------------------------------------------------- the writer


def _encode(tok: Any, texts: list[str], add_special_tokens: bool) -> list:
    """Encode one batch, in the worker thread (NOTE [ Tokenize while reading ])."""
    encode = getattr(tok, "encode_batch_fast", None) or tok.encode_batch   # _fast: no offsets to track
    return encode(texts, add_special_tokens=add_special_tokens)


def _ids(encodings: list, eos_id: int | None, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """The tokens of a batch's documents in ``dtype``, concatenated, and each one's length."""
    extra = eos_id is not None
    lengths = np.fromiter((len(e) for e in encodings), np.int64, count=len(encodings))
    lengths[lengths > 0] += extra   # a document with no tokens stays empty: skipped, EOS and all
    out = np.empty(int(lengths.sum()), dtype)
    pos = 0
    for e in encodings:
        ids = e.ids
        if ids:
            out[pos:pos + len(ids)] = ids
            pos += len(ids)
            if extra:
                out[pos] = eos_id
                pos += 1
    return out, lengths


def write_tokens(inputs: str | os.PathLike | Iterable[str | os.PathLike], output_prefix: str | os.PathLike, *,
                 tokenizer: Any, text_key: str = "text", append_eos: bool = False, eos_id: int | None = None,
                 add_special_tokens: bool = True, batch_size: int = 1000,
                 progress: bool = True) -> TokenWriteReport:
    """Tokenize text files into a Megatron-LM indexed dataset, ``PREFIX.bin`` + ``PREFIX.idx``.

    Documents are read in order, file by file, encoded in batches with the tokenizer's
    ``encode_batch`` (all cores) and written as one sequence each, in the smallest dtype that
    holds the vocabulary (uint16 up to 65,536 ids, else int32). Memory stays bounded whatever
    the corpus size: two batches are in flight at a time (NOTE [ Tokenize while reading ]).
    The output appears only when everything was written: both files are built under
    temporary names in the output's folder and moved into place (``.bin``, then ``.idx``,
    replacing existing files); on an error or Ctrl-C no file of this call is left behind.

    Parameters
    ----------
    inputs : path or iterable of paths
        Text files (a glob such as ``"shards/*.jsonl.zst"`` stands for its matches, sorted), by suffix: JSON Lines (``.jsonl``, ``.ndjson``, ``.json``: one JSON object
        per line, its ``text_key`` a string; blank lines are ignored), plain text (``.txt``:
        the whole file is one document, UTF-8), either of them optionally ``.gz`` or ``.zst``
        compressed, and Parquet (``.parquet``: the ``text_key`` column, a string column;
        needs pyarrow). zstd needs zstandard: both come with ``pip install "loaderlib[tokens]"``.
    output_prefix : str or path
        ``PREFIX`` (or ``PREFIX.bin``): writes ``PREFIX.bin`` and ``PREFIX.idx``. Its folder must exist.
    tokenizer : str, path or tokenizers.Tokenizer
        A Hugging Face ``tokenizer.json`` (or a folder holding one), a ``tokenizers.Tokenizer``,
        or a ``transformers`` fast tokenizer. Truncation and padding saved with it are ignored:
        documents are encoded whole.
    text_key : str
        The JSON key or Parquet column holding the text.
    append_eos : bool
        Append an end-of-document id to every document: ``eos_id`` if given, else the
        ``eos_token`` of the ``tokenizer_config.json`` beside the tokenizer file, else the first
        of ``<|endoftext|>``, ``</s>``, ``<|end_of_text|>``, ``<eos>``, ``<|eos|>``, ``[EOS]`` that
        the vocabulary holds.
    eos_id : int, optional
        The id to append (with ``append_eos=True`` only).
    add_special_tokens : bool
        Let the tokenizer's post-processor add its special tokens (a BOS, say), as
        ``Tokenizer.encode`` does by default.
    batch_size : int
        Documents per ``encode_batch`` call (a batch also closes at about 8 MiB of text).
    progress : bool
        Show a progress bar (``tqdm.auto``) over the bytes of input.

    Returns
    -------
    TokenWriteReport
        Documents, empty documents skipped, tokens, bytes read and written, seconds, tokens/s,
        the dtype and the paths; ``str(report)`` is a one-paragraph summary.

    Raises
    ------
    FileNotFoundError
        An input, the tokenizer file or the output folder does not exist (checked before any work).
    TokenizeError
        An input that cannot be read: unknown suffix, a line that is not JSON or not an object,
        no ``text_key``, a text that is not a string, a damaged ``.gz``/``.zst``/Parquet file,
        a ``.txt`` that is not UTF-8. A :class:`~loaderlib.LoaderError` and a ``ValueError``,
        naming the file and, for JSON Lines, the line.
    LoaderError
        No documents at all in the inputs (an empty corpus is refused, as readers refuse it).
    ValueError
        ``eos_id`` without ``append_eos``, ``append_eos`` with no EOS to be found, a bad ``batch_size``.
    ImportError
        tokenizers, or pyarrow/zstandard for an input that needs them, is missing (the message
        names the extra).

    Notes
    -----
    Empty documents (no text, or text that encodes to no tokens) are skipped and counted in
    ``empty_documents``: a reader would skip them anyway, and with ``append_eos`` they would
    otherwise become documents of a lone EOS.
    """
    t0 = time.perf_counter()
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number of documents >= 1, got {batch_size!r}")
    if eos_id is not None and not append_eos:
        raise ValueError("eos_id is the id append_eos=True appends; pass append_eos=True (--append-eos) too")
    paths = _input_paths(inputs)
    bin_path, idx_path = output_paths(output_prefix)
    folder = os.path.dirname(os.path.abspath(bin_path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"output folder {folder!r} does not exist")
    original = tokenizer
    tok, tok_path = _load_tokenizer(tokenizer)
    tok = _whole_documents(tok, repr(tok_path) if tok_path else "the tokenizer given")
    eos = _resolve_eos(tok, original, tok_path, eos_id) if append_eos else None
    vocab = int(tok.get_vocab_size(with_added_tokens=True))
    if eos is not None and eos >= vocab:
        import warnings

        warnings.warn(f"eos_id {eos} is outside the tokenizer's vocabulary of {vocab} ids", stacklevel=2)
    dtype = token_dtype(max(vocab, 0 if eos is None else eos + 1))

    from concurrent.futures import ThreadPoolExecutor

    from tqdm.auto import tqdm  # here, not at import: NOTE [ What import costs ] in loaderlib/__init__.py

    total = sum(os.path.getsize(p) for p in paths)
    writer = _IndexedWriter(bin_path, idx_path, dtype)
    empty = 0
    try:   # from here on, any failure (Ctrl-C included) removes this call's temporary files
        with tqdm(total=total, desc="tokenizing", unit="B", unit_scale=True, unit_divisor=1024,
                  disable=not progress) as bar, \
                ThreadPoolExecutor(1, thread_name_prefix="loaderlib-tokenize") as pool:
            pending = None
            for texts, skipped in _batches(_documents(paths, text_key, batch_size, _Progress(bar)), batch_size):
                empty += skipped
                job = pool.submit(_encode, tok, texts, add_special_tokens)
                if pending is not None:   # while the worker encodes the batch just read
                    empty += _write_batch(writer, _ids(pending.result(), eos, dtype))
                pending = job
            if pending is not None:
                empty += _write_batch(writer, _ids(pending.result(), eos, dtype))
        if writer.sequences == 0:
            raise LoaderError(f"no documents to write: {_names(paths)} hold no text"
                              + (f" ({empty} empty documents)" if empty else ""))
        documents, tokens = writer.sequences, writer.tokens
        written = writer.commit()
    except BaseException:
        writer.discard()
        raise
    seconds = time.perf_counter() - t0
    report = TokenWriteReport(documents=documents, empty_documents=empty, tokens=tokens, bytes_read=total,
                              bytes_written=written, seconds=seconds, tokens_per_s=tokens / max(seconds, 1e-9),
                              dtype=str(dtype), vocab_size=vocab, eos_id=eos, paths=(bin_path, idx_path))
    logger.info("%s", report.summary())
    return report


def _write_batch(writer: _IndexedWriter, encoded: tuple[np.ndarray, np.ndarray]) -> int:
    """Write one encoded batch; returns how many of its documents had no tokens (skipped)."""
    tokens, lengths = encoded
    kept = lengths[lengths > 0]
    writer.add(tokens, kept)
    return int(lengths.size - kept.size)


def _names(paths: Sequence[str]) -> str:
    shown = ", ".join(repr(p) for p in paths[:3])
    return shown + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
