"""Coverage-guided fuzzing of the parsers of untrusted bytes written in Python (``make fuzz``).

One target per parser; every input is one file of the format (or one JSON document), and
the only acceptable outcome of a hostile input is the documented error
(:class:`loaderlib.LoaderError` and its subclasses; ``StateError`` for states), never another
exception, a hang or unbounded memory (libFuzzer's ``-timeout`` and ``-rss_limit_mb``):

==============  ==============================================================================
``records``     a record shard's ``.llidx`` (an ``.npz``) beside a valid ``.llrec``, then the
                ``.llrec`` beside its valid index (byte 0 of the input picks), opened by
                ``RecordFileDataset`` and every record read
``wds``         a WebDataset tar shard opened by ``WebDataset`` (tar headers, member names,
                ``.cls``/``.json`` labels), every image read; and the same bytes as the
                sidecar ``.idx`` text (``parse_index``)
``recordio``    an MXNet ``.rec`` (scanned frame by frame) and the same bytes as the ``.idx``
                beside a valid ``.rec``, opened by ``ImageRecordDataset``, every record read
``shardcache``  a shard cache's sidecar ``<key>.json`` beside its data, read by
                ``ShardCache.cached`` and ``used`` (a damaged entry is a cache miss, never an
                exception)
``state``       a JSON document loaded by ``DataLoader.load_state_dict`` (then one batch
                drawn) and merged by ``merge_state_dicts`` (alone and beside a real state)
``tokens``      a token corpus's index beside valid tokens (byte 0 picks: a Megatron ``.idx``
                beside its ``.bin``, a datatrove ``.ds.index`` beside its ``.ds``, or a whole
                ``.npy``), opened by ``TokenDataset`` with each packing, samples and one batch
                read
==============  ==============================================================================

Usage::

    python fuzz/fuzz_parsers.py TARGET [libFuzzer options] CORPUS_DIR...   # needs atheris
    python fuzz/fuzz_parsers.py TARGET --replay FILE_OR_DIR...           # no atheris
    python fuzz/fuzz_parsers.py --seeds fuzz/corpus                      # (re)write the seeds

The seed corpora are ``fuzz/corpus/<target>/``, written by ``--seeds``;
findings are added there and replayed by ``tests/unit/test_fuzz_corpora.py``.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
import warnings

import numpy as np

import loaderlib as ll
from loaderlib._extract.remote.shard_cache import ShardCache
from loaderlib._extract.remote.store import ObjectInfo
from loaderlib._extract.wds_index import parse_index

warnings.simplefilter("ignore")
_TMP = tempfile.mkdtemp(prefix="llfuzz-")
_LIMIT_ITEMS = 16   # records read per input (a hostile index may declare millions)


def _write(name: str, data: bytes) -> str:
    path = os.path.join(_TMP, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _remove(*names: str) -> None:
    for n in names:
        try:
            os.unlink(os.path.join(_TMP, n))
        except FileNotFoundError:
            pass


def _read_some(ds) -> None:
    for i in range(min(len(ds), _LIMIT_ITEMS)):
        ds.read(i)
        ds.source(i)


# -- seeds shared by the targets ---------------------------------------------------------------
_JPEG: bytes | None = None


def tiny_jpeg() -> bytes:
    """A 8x8 JPEG made by the library's own encoder path (pack), so no OpenCV is needed."""
    global _JPEG
    if _JPEG is None:
        here = os.path.dirname(os.path.abspath(__file__))
        with open(os.path.join(here, "corpus", "sub_444.jpg"), "rb") as f:
            _JPEG = f.read()
    return _JPEG


_GOOD: dict[str, bytes] = {}


def _good_records() -> tuple[bytes, bytes]:
    if "llrec" not in _GOOD:
        base = os.path.join(_TMP, "good")
        ll.write_records(base, [tiny_jpeg(), tiny_jpeg()[:200]], labels=[3, 4], overwrite=True)
        for ext in ("llrec", "llidx"):
            with open(f"{base}.{ext}", "rb") as f:
                _GOOD[ext] = f.read()
    return _GOOD["llrec"], _GOOD["llidx"]


def _good_rec() -> bytes:
    if "rec" not in _GOOD:
        import struct

        out = io.BytesIO()
        for k, img in enumerate((tiny_jpeg(), tiny_jpeg()[:100])):
            payload = struct.pack("<IfQQ", 0, float(k), k, 0) + img
            out.write(struct.pack("<II", 0xCED7230A, len(payload)) + payload + b"\0" * (-len(payload) % 4))
        _GOOD["rec"] = out.getvalue()
    return _GOOD["rec"]


# -- targets -----------------------------------------------------------------------------------
def target_records(data: bytes) -> None:
    rec, idx = _good_records()
    mode, body = (data[0] & 1, data[1:]) if data else (0, b"")
    _remove("t.llrec", "t.llidx")
    _write("t.llrec", rec if mode == 0 else body)
    _write("t.llidx", body if mode == 0 else idx)
    try:
        ds = ll.RecordFileDataset(os.path.join(_TMP, "t.llrec"))
        _read_some(ds)
    except ll.LoaderError:
        pass


def target_wds(data: bytes) -> None:
    _remove("w.tar")
    path = _write("w.tar", data)
    try:
        ds = ll.WebDataset(path)
        _read_some(ds)
    except ll.LoaderError:
        pass
    try:
        parse_index(data.decode("utf-8", "replace"), "w.idx", len(data))
    except ll.LoaderError:
        pass


def target_recordio(data: bytes) -> None:
    _remove("r.rec", "r.idx")
    path = _write("r.rec", data)
    try:
        ds = ll.ImageRecordDataset(path)
        _read_some(ds)
    except ll.LoaderError:
        pass
    _write("r.rec", _good_rec())
    _write("r.idx", data)
    try:
        ds = ll.ImageRecordDataset(path)
        _read_some(ds)
    except ll.LoaderError:
        pass


_CACHE: ShardCache | None = None
_URL = "http://127.0.0.1:1/shard-000.tar"


def target_shardcache(data: bytes) -> None:
    global _CACHE
    if _CACHE is None:
        _CACHE = ShardCache(os.path.join(_TMP, "cache"))
        _CACHE.know(ObjectInfo(_URL, 5, '"e1"'))
    key = _CACHE.key(_URL)
    with open(_CACHE._p(key), "wb") as f:
        f.write(b"12345")
    with open(_CACHE._p(key, ".json"), "wb") as f:
        f.write(data)
    _CACHE.cached(_URL)
    _CACHE.used()


_LOADER = None
_STATE: dict | None = None


def _loader():
    global _LOADER, _STATE
    if _LOADER is None:
        ds = ll.ArrayDataset(np.arange(24, dtype=np.int64))
        sampler = ll.ShardedSampler(2, 0, shuffle=True, seed=5)
        _LOADER = ll.DataLoader(ds, batch_size=4, sampler=sampler, num_threads=1, seed=5)
        it = iter(_LOADER)
        next(it)
        _STATE = _LOADER.state_dict()
        del it
    return _LOADER


def target_state(data: bytes) -> None:
    loader = _loader()
    try:
        obj = json.loads(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return   # not JSON: json's parser, not ours
    if not isinstance(obj, dict):
        obj = {"v": obj}
    try:
        loader.load_state_dict(obj)
        it = iter(loader)
        next(it, None)
        del it
    except ll.LoaderError:
        pass
    for states in ([obj], [obj, _STATE]):
        try:
            ll.merge_state_dicts(states)
        except ll.LoaderError:
            pass
    loader.load_state_dict(_STATE)


_TOKEN_DOCS = [[5, 6, 7, 1], [], [8, 9, 1], list(range(10, 40)) + [1], [2, 1]]


def _good_tokens() -> tuple[bytes, bytes, bytes, bytes]:
    """A Megatron ``.idx`` and ``.bin``, a datatrove ``.ds.index`` and ``.ds`` of _TOKEN_DOCS."""
    import struct

    lens = [len(d) for d in _TOKEN_DOCS]
    toks = np.asarray([t for d in _TOKEN_DOCS for t in d], np.uint16).tobytes()
    ptrs = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64) * 2
    idx = (b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + bytes([8]) + struct.pack("<QQ", len(lens), len(lens) + 1)
           + np.asarray(lens, np.int32).tobytes() + ptrs.tobytes() + np.arange(len(lens) + 1, dtype=np.int64).tobytes())
    ends = np.cumsum(lens).astype("<u8").tobytes()
    return idx, toks, ends, toks


def target_tokens(data: bytes) -> None:
    if not data:
        return
    mode, body = data[0] % 3, data[1:]
    idx, binp, ends, ds_tokens = _good_tokens()
    if mode == 0:
        _write("tok.bin", binp)
        _write("tok.idx", body)
        src = os.path.join(_TMP, "tok")
    elif mode == 1:
        _write("tok.ds", ds_tokens)
        _write("tok.ds.index", body)
        src = os.path.join(_TMP, "tok.ds")
    else:
        _write("tok.npy", body)
        src = os.path.join(_TMP, "tok.npy")
    for packing in ("concat", "pack", "pad"):
        try:
            ds = ll.TokenDataset(src, 4, packing=packing, eos_id=1, vocab_size=64, block=3)
            for i in range(min(len(ds), _LIMIT_ITEMS)):
                ds[i]
            next(iter(ll.DataLoader(ds, batch_size=4, num_threads=2)), None)
        except ll.LoaderError:
            pass


TARGETS = {"records": target_records, "wds": target_wds, "recordio": target_recordio,
           "shardcache": target_shardcache, "state": target_state, "tokens": target_tokens}


def write_seeds(root: str) -> None:
    """Write each target's seed corpus under ``root/<target>/`` (fuzz/corpus in the repository)."""
    import tarfile

    def put(target: str, name: str, data: bytes) -> None:
        os.makedirs(os.path.join(root, target), exist_ok=True)
        with open(os.path.join(root, target, name), "wb") as f:
            f.write(data)

    rec, idx = _good_records()
    put("records", "index.bin", b"\0" + idx)
    put("records", "data.bin", b"\1" + rec)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, body in (("a/0001.jpg", tiny_jpeg()), ("a/0001.cls", b"7"), ("a/0002.jpg", tiny_jpeg()[:300]),
                           ("a/0002.json", b'{"label": 2}'), ("a/0003.txt", b"no image")):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    tar = buf.getvalue()
    put("wds", "shard.tar", tar[:-1024] if tar.endswith(b"\0" * 1024) else tar)
    from loaderlib._extract.wds_index import format_index, tar_members

    members = tar_members(_write("seed.tar", tar))
    put("wds", "sidecar.idx", format_index(members or []).encode())
    put("recordio", "good.rec", _good_rec())
    put("recordio", "good.idx", b"0\t0\n1\t%d\n" % (8 + 24 + len(tiny_jpeg()) + (-(24 + len(tiny_jpeg())) % 4)))
    put("shardcache", "good.json", json.dumps({"url": _URL, "size": 5, "etag": '"e1"'}).encode())
    put("shardcache", "wrong_size.json", json.dumps({"url": _URL, "size": 6, "etag": None}).encode())
    _loader()
    put("state", "state.json", json.dumps(_STATE).encode())
    other = ll.DataLoader(ll.ArrayDataset(np.arange(24, dtype=np.int64)), batch_size=4,
                          sampler=ll.ShardedSampler(2, 1, shuffle=True, seed=5), num_threads=1, seed=5)
    it = iter(other)
    next(it)
    st1 = other.state_dict()
    del it
    other.close()
    put("state", "merged.json", json.dumps(ll.merge_state_dicts([_STATE, st1])).encode())
    idx, _bin, ends, _ds = _good_tokens()
    put("tokens", "megatron.idx", b"\0" + idx)
    put("tokens", "datatrove.index", b"\1" + ends)
    npy = io.BytesIO()
    np.save(npy, np.asarray([t for d in _TOKEN_DOCS for t in d], np.uint16))
    put("tokens", "flat.npy", b"\2" + npy.getvalue())


def corpus_files(paths: list[str]) -> list[str]:
    out = []
    for p in paths:
        out += [os.path.join(p, n) for n in sorted(os.listdir(p))] if os.path.isdir(p) else [p]
    return out


def replay(target: str, paths: list[str]) -> int:
    """Run every file of ``paths`` through ``target``; returns how many ran."""
    fn = TARGETS[target]
    files = corpus_files(paths)
    for name in files:
        with open(name, "rb") as f:
            data = f.read()
        try:
            fn(data)
        except BaseException as e:
            raise AssertionError(f"fuzz target {target!r} on {name}: {type(e).__name__}: {e}") from e
    return len(files)


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in (*TARGETS, "--seeds"):
        sys.exit(f"usage: {argv[0]} {{{','.join(TARGETS)}}} [--replay PATH... | libFuzzer options CORPUS...]")
    target = argv[1]
    if target == "--seeds":
        write_seeds(argv[2])
        return
    if len(argv) > 2 and argv[2] == "--replay":
        n = replay(target, argv[3:])
        print(f"{target}: {n} inputs replayed, 0 findings")
        return
    import atheris

    fn = TARGETS[target]
    fn(b"")   # builds the target's fixtures before the coverage is taken
    atheris.instrument_all()   # loaderlib and the stdlib parsers it calls (tarfile, json, zipfile)
    atheris.Setup([argv[0], *argv[2:]], fn)
    atheris.Fuzz()


if __name__ == "__main__":
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        main(sys.argv)
