"""Token corpora in the formats users have, opened as read-only mappings.

NOTE [ Opening a token corpus ]
Every format is opened in O(1) per file, whatever its number of documents: the tokens are a
mapping of the file (NOTE [ One mapping, no descriptor ]), and the document starts are the index's own array,
mapped too, never copied or scanned:
- Megatron-LM / NeMo indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``, the ``MMIDIDX``
  header): the sequence pointers, in bytes, are the document starts (``divisor`` = the
  token size); an index whose documents group several sequences gets its starts gathered
  once (``sequence_pointers[document_indices[:-1]]``);
- datatrove's ``.ds`` with ``.ds.index`` (uint64 document ends, in tokens): the ends are the
  next documents' starts;
- flat token files (``.bin`` of a given dtype, ``.npy``): no index; documents end at the EOS
  id the user names, found while a row is assembled (NOTE [ A token row ] in
  pyx/include/ll_tokens.h);
- Arrow / Parquet columns of token lists (``input_ids`` as Hugging Face ``datasets`` saves
  them): Arrow IPC files are mapped and their list offsets are the starts; Parquet is
  compressed, so its column is decoded into memory once when the dataset opens (say so in
  the docs: convert large Parquet corpora with ``write_tokens`` first).
What can be checked up front is checked here and named with the file: magic, version, dtype
code, that the ``.bin`` holds what the ``.idx`` points to, that the sizes agree. Reads never
trust the index: every span the kernels read is checked against its file.
"""

from __future__ import annotations

import glob
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..._ext import _tokens
from ...errors import LoaderError

__all__ = ["TokenFile", "TokenFormatError", "open_sources"]

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
#: Megatron-LM's dtype codes (``DType`` of megatron/core/datasets/indexed_dataset.py).
MEGATRON_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
                   8: np.uint16}
#: Token types the kernels read.
TOKEN_DTYPES = ("uint8", "uint16", "int16", "uint32", "int32", "int64")


class TokenFormatError(LoaderError, ValueError):
    """A token file that cannot be read as what it claims to be; the message names the file."""


@dataclass(frozen=True)
class TokenFile:
    """One file of a token corpus.

    ``tokens`` is a 1-D array of token ids (a read-only mapping, or in memory for Parquet),
    or None for a file behind a URL not downloaded yet (``url``; its ``ntok`` tokens of
    ``dtype``: NOTE [ Token files behind URLs ] in remote.py); ``bounds`` the sorted document
    starts in units of ``1 / divisor`` tokens (None: no index; with ``eos_split`` the documents
    end at the EOS id); ``kind`` names the format; ``path`` is what messages name.
    """

    path: str
    kind: str
    tokens: np.ndarray | None
    bounds: np.ndarray | None
    divisor: int
    eos_split: bool
    lengths: np.ndarray | None = None   # Megatron: tokens per document (with ``bounds``)
    url: str | None = None
    ntok: int = -1
    dtype: Any = None

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.size) if self.tokens is not None else int(self.ntok)

    @property
    def token_dtype(self) -> np.dtype:
        return self.tokens.dtype if self.tokens is not None else np.dtype(self.dtype)

    def doc_spans(self, eos_id: int | None) -> tuple[np.ndarray, np.ndarray]:
        """Start and length (tokens, int64) of every document of the file, in file order.

        Index formats read their index (O(documents), vectorised); a flat file delimited by
        ``eos_id`` is scanned for it in chunks (O(tokens); NOTE [ Packing in blocks ]);
        without one the file is one document.
        """
        n = self.num_tokens
        if self.bounds is not None and self.kind == "datatrove":   # the bounds are document ends
            ends = np.asarray(self.bounds, np.int64)
            starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
            return starts, ends - starts
        if self.bounds is not None:
            starts = np.asarray(self.bounds, np.int64) // self.divisor
            if self.lengths is not None:
                lens = np.asarray(self.lengths, np.int64)
            else:
                ends = np.append(starts[1:], n)
                lens = ends - starts
            return starts, lens
        if self.eos_split and eos_id is not None:
            if self.tokens is None:
                raise RuntimeError(f"{self.path}: not downloaded yet")
            ends = [np.zeros(0, np.int64)]
            step = 1 << 24
            for lo in range(0, n, step):
                ends.append(np.flatnonzero(self.tokens[lo:lo + step] == eos_id).astype(np.int64) + lo + 1)
            e = np.concatenate(ends)
            if e.size == 0 or e[-1] != n:
                e = np.append(e, n)
            starts = np.concatenate([[0], e[:-1]]).astype(np.int64)
            return starts, e - starts
        return np.zeros(1 if n else 0, np.int64), np.full(1 if n else 0, n, np.int64)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        raise FileNotFoundError(f"token file not found: {path}") from None


def _npy_header(path: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """The shape, dtype and data offset of a ``.npy`` file, read from its header alone."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dt = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dt = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"format version {version[0]}.{version[1]} (1.0 and 2.0 are read)")
            return tuple(shape), np.dtype(dt), f.tell()
    except FileNotFoundError:
        raise FileNotFoundError(f"token file not found: {path}") from None
    except Exception as e:   # numpy raises many types on a damaged header (ValueError, TokenError, ...)
        raise TokenFormatError(f"{path}: not a readable .npy file ({type(e).__name__}: {e})") from None


def _map(path: str, dtype: Any, count: int | None = None, offset: int = 0, random: bool = False) -> np.ndarray:
    """``count`` items of ``dtype`` from byte ``offset`` of ``path``, mapped read-only.

    NOTE [ Token files are read at random ]
    A shuffled epoch reads windows of a few KB at random places of the corpus. With the
    kernel's default advice every page fault in a mapping also reads the next 128 KB or more
    ahead, most of it never used: 64 windows of 2,049 tokens from 200 files took 214-266 ms
    here, against 1.2-5.4 ms with MADV_RANDOM (sparse files; on real data the waste is I/O).
    So the token arrays are advised MADV_RANDOM (``random=True``); an index, read from start
    to end, keeps the default.
    """
    dt = np.dtype(dtype)
    n = (_size(path) - offset) // dt.itemsize if count is None else count
    if n == 0:
        return np.zeros(0, dt)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise FileNotFoundError(f"token file not found: {path}") from None
    try:   # NOTE [ One mapping, no descriptor ] in pyx/_tokens.pyx
        return np.frombuffer(_tokens.FileMap(fd, offset, n * dt.itemsize, random), dt, n)
    finally:
        os.close(fd)


def open_megatron(prefix: str, *, local_idx: str | None = None,
                  remote_bin: tuple[str, int] | None = None) -> TokenFile:
    """``PREFIX.bin`` + ``PREFIX.idx`` of Megatron-LM / NeMo (NOTE [ Opening a token corpus ]).
    Behind URLs (``prefix`` one): ``local_idx`` is the index's local copy and ``remote_bin``
    ``(url, size)`` of the ``.bin``, mapped once downloaded; messages name the URLs."""
    idx, binp = prefix + ".idx", prefix + ".bin"
    if remote_bin is not None:
        binp = remote_bin[0]
    src = idx if local_idx is None else local_idx
    size = _size(src)
    with open(src, "rb") as f:
        head = f.read(34)
    if len(head) < 34:
        raise TokenFormatError(f"{idx}: {len(head)} bytes, too short for a Megatron index header (34 bytes)")
    if head[:9] != MEGATRON_MAGIC:
        raise TokenFormatError(f"{idx}: not a Megatron index (magic {head[:9]!r}, expected {MEGATRON_MAGIC!r})")
    (version,) = struct.unpack("<Q", head[9:17])
    if version != 1:
        raise TokenFormatError(f"{idx}: Megatron index version {version}, only version 1 is known")
    code = head[17]
    if code not in MEGATRON_DTYPES:
        raise TokenFormatError(f"{idx}: unknown dtype code {code} (Megatron's codes are 1-8)")
    dtype = np.dtype(MEGATRON_DTYPES[code])
    if dtype.name not in TOKEN_DTYPES:
        raise TokenFormatError(f"{idx}: dtype code {code} ({dtype.name}) is not a token type "
                               f"(one of {', '.join(TOKEN_DTYPES)})")
    nseq, ndoc = struct.unpack("<QQ", head[18:34])
    need = 34 + nseq * 4 + nseq * 8 + ndoc * 8
    if size < need:
        raise TokenFormatError(f"{idx}: {size} bytes, but its header describes {nseq} sequences and {ndoc} "
                               f"document indices ({need} bytes)")
    lengths = _map(src, np.int32, nseq, 34)
    pointers = _map(src, np.int64, nseq, 34 + nseq * 4)
    docs = _map(src, np.int64, ndoc, 34 + nseq * 12)
    bsize = remote_bin[1] if remote_bin is not None else _size(binp)
    expect = int(pointers[-1]) + int(lengths[-1]) * dtype.itemsize if nseq else 0
    if bsize != expect:
        raise TokenFormatError(f"{binp}: {bsize} bytes, but {idx} says its last sequence ends at byte {expect}")
    if bsize % dtype.itemsize:
        raise TokenFormatError(f"{binp}: {bsize} bytes is not a whole number of {dtype.name} tokens")
    if ndoc and (int(docs[0]) != 0 or int(docs[-1]) != nseq):
        raise TokenFormatError(f"{idx}: document indices run from {int(docs[0])} to {int(docs[-1])}, "
                               f"expected 0 to {nseq}")
    tokens = _map(binp, dtype, random=True) if remote_bin is None else None
    more: dict[str, Any] = {} if remote_bin is None else {"url": binp, "ntok": bsize // dtype.itemsize, "dtype": dtype}
    if ndoc == 0 or ndoc == nseq + 1:
        # One sequence per document (what GPT-style preprocessing writes): the pointers are the
        # starts as they are; a corrupt index gives wrong positions, never a read outside the file.
        return TokenFile(binp, "megatron", tokens, pointers, dtype.itemsize, False, lengths, **more)
    first = np.asarray(docs[:-1], np.int64)
    last = np.asarray(docs[1:], np.int64) - 1
    if first.size and (first.min() < 0 or last.max() >= nseq or (last < first).any()):
        raise TokenFormatError(f"{idx}: document indices outside its {nseq} sequences")
    starts = np.asarray(pointers[first], np.int64)
    ends = np.asarray(pointers[last], np.int64) + np.asarray(lengths[last], np.int64) * dtype.itemsize
    return TokenFile(binp, "megatron", tokens, starts, dtype.itemsize, False, (ends - starts) // dtype.itemsize,
                     **more)


def open_flat(path: str, dtype: Any = None, *, remote_size: int | None = None) -> TokenFile:
    """A flat token file: ``.npy`` (its own dtype) or raw ``.bin`` of ``dtype`` (default uint16,
    as nanoGPT writes ``train.bin``); documents end at the EOS id (NOTE [ Opening a token corpus ])."""
    if path.endswith(".npy"):
        shape, npdt, offset = _npy_header(path)
        if len(shape) != 1:
            raise TokenFormatError(f"{path}: a token file holds a 1-D array, this one has shape {shape}")
        if npdt.name not in TOKEN_DTYPES:
            raise TokenFormatError(f"{path}: dtype {npdt} is not a token type (one of {', '.join(TOKEN_DTYPES)})")
        if not npdt.isnative:
            raise TokenFormatError(f"{path}: byte order {npdt.byteorder!r} is not this machine's")
        size = _size(path)
        if size < offset + shape[0] * npdt.itemsize:
            raise TokenFormatError(f"{path}: {size} bytes, but its header describes {shape[0]} tokens of {npdt} "
                                   f"from byte {offset} ({offset + shape[0] * npdt.itemsize} bytes)")
        return TokenFile(path, "flat", _map(path, npdt, shape[0], offset, random=True), None, 1, True)
    dt = np.dtype("uint16" if dtype is None else dtype)
    if dt.name not in TOKEN_DTYPES:
        raise ValueError(f"dtype {dt} is not a token type (one of {', '.join(TOKEN_DTYPES)})")
    size = _size(path) if remote_size is None else remote_size
    if size % dt.itemsize:
        raise TokenFormatError(f"{path}: {size} bytes is not a whole number of {dt.name} tokens")
    if remote_size is not None:
        return TokenFile(path, "flat", None, None, 1, True, url=path, ntok=size // dt.itemsize, dtype=dt)
    return TokenFile(path, "flat", _map(path, dt, random=True), None, 1, True)


def open_datatrove(path: str, dtype: Any = None, *, index: str | None = None,
                   remote_size: int | None = None) -> TokenFile:
    """datatrove's ``NAME.ds`` and ``NAME.ds.index`` (uint64 document ends, in tokens); the token
    size is 2 or 4 bytes, taken from ``dtype`` or from the two files' sizes. ``remote_size``:
    ``path`` is a URL of that many bytes, mapped once downloaded (``index``: its local index)."""
    index = path + ".index" if index is None else index
    isize = _size(index)
    if isize % 8:
        raise TokenFormatError(f"{index}: {isize} bytes is not a whole number of uint64 document ends")
    ends = _map(index, "<u8")
    size = _size(path) if remote_size is None else remote_size
    last = int(ends[-1]) if ends.size else 0
    if dtype is not None:
        dt = np.dtype(dtype)
    elif last and size == last * 2:
        dt = np.dtype(np.uint16)
    elif last and size == last * 4:
        dt = np.dtype(np.uint32)
    else:
        dt = np.dtype(np.uint16)
    if size != last * dt.itemsize:
        raise TokenFormatError(f"{path}: {size} bytes, but {index} says its last document ends at token {last} "
                               f"({last * dt.itemsize} bytes of {dt.name})")
    bounds = ends.view(np.int64) if ends.size else None
    if remote_size is not None:
        return TokenFile(path, "datatrove", None, bounds, 1, False, url=path, ntok=last, dtype=dt)
    return TokenFile(path, "datatrove", _map(path, dt, random=True), bounds, 1, False)


def open_arrow(path: str, column: str = "input_ids") -> TokenFile:
    """A column of token lists from an Arrow IPC file (mapped, zero copy) or a Parquet file (decoded once)."""
    try:
        import pyarrow as pa
    except ImportError:
        raise ImportError(f"reading {path} needs pyarrow: pip install 'loaderlib[tokens]' (or pyarrow)") from None
    _size(path)
    try:
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq
            names = pq.read_schema(path).names
            if column not in names:
                raise TokenFormatError(f"{path}: no column {column!r} (columns: {', '.join(names)})")
            table = pq.read_table(path, columns=[column])
        else:
            data = pa.py_buffer(_map(path, np.uint8))   # NOTE [ One mapping, no descriptor ]
            try:
                table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
            except pa.ArrowInvalid:
                table = pa.ipc.open_stream(pa.BufferReader(data)).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise TokenFormatError(f"{path}: not a readable {'Parquet' if path.endswith('.parquet') else 'Arrow'} "
                               f"file ({e})") from None
    except KeyError:
        raise TokenFormatError(f"{path}: no column {column!r}") from None
    if column not in table.column_names:
        raise TokenFormatError(f"{path}: no column {column!r} (columns: {', '.join(table.column_names)})")
    col = table.column(column).combine_chunks()
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)) or not pa.types.is_integer(
            col.type.value_type):
        raise TokenFormatError(f"{path}: column {column!r} is {col.type}, not a list of integer token ids")
    if col.null_count:
        raise TokenFormatError(f"{path}: column {column!r} has {col.null_count} null rows")
    offsets = np.asarray(col.offsets, np.int64)
    values = col.values
    tokens = np.asarray(values)
    if offsets.size and (offsets[0] != 0 or offsets[-1] != tokens.size):
        # a sliced column: take exactly the tokens its rows cover
        tokens = tokens[offsets[0]:offsets[-1]]
        offsets = offsets - offsets[0]
    if tokens.dtype.name not in TOKEN_DTYPES:
        if tokens.dtype.kind in "iu" and (tokens.size == 0 or (int(tokens.min()) >= 0 and int(tokens.max()) < 2**31)):
            tokens = tokens.astype(np.int32)
        else:
            raise TokenFormatError(f"{path}: column {column!r} holds {tokens.dtype} values, not token ids")
    return TokenFile(path, "arrow", tokens, offsets[:-1].copy() if offsets.size > 1 else None, 1, False)


_EXTENSIONS = (".idx", ".bin", ".npy", ".ds", ".parquet", ".arrow")


def _expand(source: str) -> list[str]:
    if any(c in source for c in "*?["):
        found = sorted(glob.glob(source))
        if not found:
            raise FileNotFoundError(f"no token files match {source!r}")
        return found
    if os.path.isdir(source):
        found = sorted(os.path.join(source, f) for f in os.listdir(source) if f.endswith(_EXTENSIONS))
        if not found:
            raise FileNotFoundError(f"no token files in {source} (looked for {', '.join(_EXTENSIONS)})")
        return found
    return [source]


def _kind_of(path: str) -> tuple[str, str]:
    """(format, the path to open) of one source path."""
    if path.endswith(".idx") and os.path.exists(path[:-4] + ".bin"):
        return "megatron", path[:-4]
    if path.endswith(".bin"):
        return ("megatron", path[:-4]) if os.path.exists(path[:-4] + ".idx") else ("flat", path)
    if os.path.exists(path + ".idx") and os.path.exists(path + ".bin"):
        return "megatron", path
    if path.endswith(".npy"):
        return "flat", path
    if path.endswith(".ds"):
        return "datatrove", path
    if path.endswith(".ds.index"):
        return "datatrove", path[:-6]
    if path.endswith((".parquet", ".arrow")):
        return "arrow", path
    if not os.path.exists(path):
        raise FileNotFoundError(f"token source not found: {path} (nor {path}.bin + {path}.idx)")
    raise TokenFormatError(f"{path}: not a token file loaderlib knows (Megatron .bin/.idx, .bin, .npy, datatrove "
                           ".ds, .parquet, .arrow)")


def open_sources(sources: Any, *, dtype: Any = None, column: str = "input_ids") -> list[TokenFile]:
    """Every file of ``sources`` (a path, a Megatron prefix, a folder, a glob, or a list of
    them), in order; each Megatron pair, datatrove pair or Parquet file once."""
    items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    if not items:
        raise ValueError("TokenDataset needs at least one source")
    out: list[TokenFile] = []
    seen: set[tuple[str, str]] = set()
    for src in items:
        for path in _expand(os.fspath(src)):
            kind, target = _kind_of(path)
            if (kind, target) in seen:
                continue
            seen.add((kind, target))
            if kind == "megatron":
                out.append(open_megatron(target))
            elif kind == "flat":
                out.append(open_flat(target, dtype))
            elif kind == "datatrove":
                out.append(open_datatrove(target, dtype))
            else:
                out.append(open_arrow(target, column))
    return out
