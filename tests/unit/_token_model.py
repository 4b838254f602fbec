"""A plain-Python model of TokenDataset's rows (NOTE [ A token row ] in pyx/include/ll_tokens.h,
NOTE [ Packing in blocks ] in loaderlib/_datasets/tokens/packing.py) and numpy writers of the
token formats, independent of loaderlib's readers and kernels."""

from __future__ import annotations

import struct

import numpy as np

MEGATRON_CODES = {np.dtype(np.uint8): 1, np.dtype(np.int16): 3, np.dtype(np.int32): 4, np.dtype(np.int64): 5,
                  np.dtype(np.uint16): 8}


def write_megatron(prefix: str, docs: list[list[int]], dtype=np.uint16) -> None:
    dt = np.dtype(dtype)
    lens = [len(d) for d in docs]
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(np.asarray(d, dt).tobytes())
    ptrs = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64) * dt.itemsize if docs else np.zeros(0, np.int64)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", MEGATRON_CODES[dt]))
        f.write(struct.pack("<Q", len(docs)))
        f.write(struct.pack("<Q", len(docs) + 1))
        f.write(np.asarray(lens, np.int32).tobytes())
        f.write(np.asarray(ptrs, np.int64).tobytes())
        f.write(np.arange(len(docs) + 1, dtype=np.int64).tobytes())


def write_datatrove(path: str, docs: list[list[int]], dtype=np.uint16) -> None:
    with open(path, "wb") as f:
        for d in docs:
            f.write(np.asarray(d, dtype).tobytes())
    with open(path + ".index", "wb") as f:
        f.write(np.cumsum([len(d) for d in docs]).astype("<u8").tobytes())


def corpus_of(files: list[tuple[list[int], list[int] | None]], eos: int | None):
    """The global stream and its document starts: ``files`` is a list of (tokens, doc starts
    within the file, or None for a flat file delimited by ``eos``)."""
    stream: list[int] = []
    starts: set[int] = set()
    docs: list[list[tuple[int, int]]] = []   # per file: (global start, length), empty ones included
    for toks, doc_starts in files:
        docs.append([])
        base = len(stream)
        n = len(toks)
        if doc_starts is None:
            ds = [0]
            if eos is not None:
                ds += [j + 1 for j, t in enumerate(toks) if t == eos and j + 1 < n]
        else:
            ds = list(doc_starts)
        bounds = ds + [n]
        for a, b in zip(bounds[:-1], bounds[1:]):
            docs[-1].append((base + a, b - a))
        for a in ds:
            if a < n:
                starts.add(base + a)
        stream.extend(toks)
    return stream, starts, docs


def row_outputs(row: list[int], doc_starts: set[int], S: int, pad: int, ignore: int, mask: bool):
    fill = len(row)
    real = min(fill, S)
    ids = [row[j] if j < real else pad for j in range(S)]
    labels = []
    for j in range(S):
        if j + 1 < fill and not (mask and (j + 1) in doc_starts):
            labels.append(row[j + 1])
        else:
            labels.append(ignore)
    segs = sorted({0} | {p for p in doc_starts if 0 < p < real} | ({real} if real < S else set()))
    pos = []
    for j in range(S):
        s = max(x for x in segs if x <= j)
        pos.append(j - s)
    return ids, labels, pos, segs, real


def pieces_of(docs, S):
    out = []
    for g, n in docs:
        if n <= 0:
            continue
        count = max(1, -(-(n - 1) // S))
        for k in range(count):
            out.append((g + k * S, min(S + 1, n - k * S)))
    return out


def best_fit(lengths: list[int], cap: int) -> list[list[int]]:
    """Rows of piece indices: longest first (ties: lower index), each into the row with the
    least room that holds it (ties: the row that reached that room last), else a new row."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rooms: list[int] = []
    changed: list[int] = []
    rows: list[list[int]] = []
    for step, i in enumerate(order):
        n = lengths[i]
        fits = [r for r in range(len(rows)) if 0 < rooms[r] and rooms[r] >= n]
        if fits:
            r = min(fits, key=lambda r: (rooms[r], -changed[r]))
        else:
            r = len(rows)
            rows.append([])
            rooms.append(cap)
            changed.append(-1)
        rows[r].append(i)
        rooms[r] -= n
        changed[r] = step
    return rows


def model_rows(files, S: int, packing: str, eos: int | None, *, pad: int | None = None, ignore: int = -100,
               mask: bool = False, block: int = 16384):
    """Every row of the dataset as (ids, labels, positions, segment starts)."""
    pad = (eos if eos is not None else 0) if pad is None else pad
    stream, starts, docs = corpus_of(files, eos)
    rows = []
    if packing == "concat":
        for i in range((len(stream) - 1) // S):
            a = i * S
            row = stream[a:a + S + 1]
            ds = {p for p in range(1, S + 1) if a + p in starts}
            rows.append(row_outputs(row, ds, S, pad, ignore, mask))
        return rows
    # documents per file, in blocks of `block` documents of one file
    for mine in docs:
        for b0 in range(0, len(mine), block):
            blk = mine[b0:b0 + block]
            pcs = pieces_of(blk, S)
            if packing == "pad":
                groups = [[i] for i in range(len(pcs))]
            else:
                groups = best_fit([n for _, n in pcs], S + 1)
            for grp in groups:
                row: list[int] = []
                ds: set[int] = set()
                for i in grp:
                    g, n = pcs[i]
                    if row:
                        ds.add(len(row))
                    row.extend(stream[g:g + n])
                rows.append(row_outputs(row, ds, S, pad, ignore, mask))
    return rows


def model_batch(rows, S):
    ids = np.asarray([r[0] for r in rows])
    lab = np.asarray([r[1] for r in rows])
    pos = np.asarray([r[2] for r in rows])
    cu = [i * S + s for i, r in enumerate(rows) for s in r[3]] + [len(rows) * S]
    return ids, lab, pos, np.asarray(cu), int(np.diff(cu).max())
