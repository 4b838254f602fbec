"""``ll.write_tokens`` and ``python -m loaderlib tokenize``: text files to Megatron ``.bin/.idx``.

The index is parsed here with numpy from the format's description (NOTE [ Megatron indexed
dataset layout ] in loaderlib/_datasets/tokens/write.py), not with loaderlib's code; the tokens
are compared with the tokenizer's own encoding of each document, and Megatron-Core's
``IndexedDataset`` reads the output where megatron-core is installed.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

pytest.importorskip("tokenizers")
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

import loaderlib as ll  # noqa: E402
from loaderlib._datasets.tokens import write as tw  # noqa: E402

EOS = "<|endoftext|>"
HEADER = np.dtype([("magic", "S9"), ("version", "<u8"), ("code", "u1"), ("sequences", "<u8"), ("documents", "<u8")])
CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}


def _stdlib_texts() -> list[str]:
    """Real text where the tokenizer matters: the Python standard library's own sources."""
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:40]
    assert len(files) >= 20
    out = []
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            out.append(fh.read())
    return out


@pytest.fixture(scope="module")
def corpus():
    """Documents of many lengths (a line to a few KB), some non-ASCII, one empty."""
    texts = _stdlib_texts()
    rng = np.random.default_rng(0)
    docs = []
    for t in texts[:30]:
        start = int(rng.integers(0, max(len(t) - 10, 1)))
        docs.append(t[start:start + int(rng.integers(1, 3000))])
    docs[3] = "Grüße, naïve café: ελληνικά, 日本語 and emoji 🙂\n" * 3
    docs[7] = " "
    return docs


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory):
    """A byte-level BPE trained on a few KB of stdlib source (no hub access here)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([t[:4000] for t in _stdlib_texts()[:10]], trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def tok(tok_path):
    return Tokenizer.from_file(tok_path)


def read_indexed(prefix: str) -> dict:
    """Parse PREFIX.idx/.bin with numpy from the format's description alone."""
    raw = open(prefix + ".idx", "rb").read()
    h = np.frombuffer(raw, HEADER, count=1)[0]
    assert h["magic"] == b"MMIDIDX" and raw[:9] == b"MMIDIDX\x00\x00"
    assert int(h["version"]) == 1
    s, d = int(h["sequences"]), int(h["documents"])
    off = HEADER.itemsize
    lengths = np.frombuffer(raw, "<i4", s, off)
    pointers = np.frombuffer(raw, "<i8", s, off + 4 * s)
    doc_idx = np.frombuffer(raw, "<i8", d, off + 12 * s)
    assert len(raw) == off + 12 * s + 8 * d   # nothing after the document indices
    dtype = np.dtype(CODES[int(h["code"])]).newbyteorder("<")
    data = np.fromfile(prefix + ".bin", dtype)
    docs = [data[p // dtype.itemsize:p // dtype.itemsize + n].tolist() for p, n in zip(pointers, lengths)]
    return {"code": int(h["code"]), "dtype": np.dtype(CODES[int(h["code"])]), "lengths": lengths,
            "pointers": pointers, "doc_idx": doc_idx, "docs": docs, "bin_size": os.path.getsize(prefix + ".bin")}


def write_jsonl(path, docs, key="text", opener=open):
    with opener(path, "wt", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"id": 1, key: d}) + "\n")
    return str(path)


def leftovers(folder) -> list[str]:
    return sorted(p for p in os.listdir(folder) if p.endswith((".tmp", ".bin", ".idx")))


def test_round_trip_equals_the_tokenizers_own_encoding(tmp_path, corpus, tok, tok_path):
    src = write_jsonl(tmp_path / "c.jsonl", corpus)
    report = ll.write_tokens(src, tmp_path / "out", tokenizer=tok_path, progress=False)
    got = read_indexed(str(tmp_path / "out"))
    want = [tok.encode(d).ids for d in corpus]
    assert all(want)   # every document encodes to something, so none is skipped
    assert got["docs"] == want
    assert [tok.decode(ids) for ids in got["docs"]] == corpus   # byte-level BPE decodes losslessly
    assert got["code"] == 8 and got["dtype"] == np.uint16
    n = len(corpus)
    assert got["lengths"].tolist() == [len(w) for w in want]
    assert got["pointers"].tolist() == (2 * np.concatenate([[0], np.cumsum(got["lengths"])[:-1]])).tolist()
    assert got["doc_idx"].tolist() == list(range(n + 1))
    assert got["bin_size"] == 2 * sum(map(len, want))
    assert isinstance(report, ll.TokenWriteReport)
    assert (report.documents, report.empty_documents, report.tokens) == (n, 0, sum(map(len, want)))
    assert report.dtype == "uint16" and report.vocab_size == tok.get_vocab_size() and report.eos_id is None
    assert report.paths == (str(tmp_path / "out.bin"), str(tmp_path / "out.idx"))
    assert report.bytes_written == os.path.getsize(report.paths[0]) + os.path.getsize(report.paths[1])
    assert report.bytes_read == os.path.getsize(src)
    assert report.tokens_per_s == pytest.approx(report.tokens / report.seconds)
    assert str(report).startswith(f"tokenized {n} documents: {report.tokens:,} tokens (uint16, vocabulary")
    with pytest.raises(AttributeError, match="cannot assign"):
        report.tokens = 0   # a frozen record of what was written
    assert leftovers(tmp_path) == ["out.bin", "out.idx"]


def _parquet(path, docs, key="text"):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"id": list(range(len(docs))), key: docs}), str(path), row_group_size=7)
    return str(path)


def _zst(path, docs):
    zstandard = pytest.importorskip("zstandard")
    data = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    half = len(data) // 2   # two frames, as pzstd and concatenated shards write them
    c = zstandard.ZstdCompressor()
    with open(path, "wb") as f:
        f.write(c.compress(data[:half]) + c.compress(data[half:]))
    return str(path)


@pytest.mark.parametrize("kind", ["jsonl.gz", "jsonl.zst", "ndjson", "json", "parquet"])
def test_every_input_format_writes_the_same_corpus(tmp_path, corpus, tok_path, kind):
    ref = write_jsonl(tmp_path / "ref.jsonl", corpus)
    ll.write_tokens(ref, tmp_path / "ref", tokenizer=tok_path, progress=False)
    path = tmp_path / f"c.{kind}"
    if kind == "jsonl.gz":
        src = write_jsonl(path, corpus, opener=gzip.open)
    elif kind == "jsonl.zst":
        src = _zst(path, corpus)
    elif kind == "parquet":
        src = _parquet(path, corpus)
    else:
        src = write_jsonl(path, corpus)
    report = ll.write_tokens(src, tmp_path / "out", tokenizer=tok_path, batch_size=5, progress=False)
    assert report.documents == len(corpus)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"out{ext}").read_bytes() == (tmp_path / f"ref{ext}").read_bytes()


def test_a_text_file_is_one_document_and_inputs_keep_their_order(tmp_path, corpus, tok, tok_path):
    (tmp_path / "a.txt").write_text(corpus[0], encoding="utf-8")
    with gzip.open(tmp_path / "b.txt.gz", "wt", encoding="utf-8") as f:
        f.write(corpus[1])
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbf" + corpus[2].encode())
    j = write_jsonl(tmp_path / "c.jsonl", corpus[3:6])
    inputs = [tmp_path / "a.txt", str(tmp_path / "b.txt.gz"), j, tmp_path / "bom.txt"]
    report = ll.write_tokens(inputs, str(tmp_path / "out.bin"), tokenizer=tok_path, progress=False)
    got = read_indexed(str(tmp_path / "out"))
    order = [corpus[0], corpus[1], *corpus[3:6], corpus[2]]
    assert got["docs"] == [tok.encode(d).ids for d in order]
    assert report.documents == 6


def test_a_glob_stands_for_its_matches_in_order(tmp_path, corpus, tok, tok_path):
    for i in (2, 0, 1):
        write_jsonl(tmp_path / f"shard-{i}.jsonl", corpus[3 * i:3 * i + 3])
    r = ll.write_tokens([str(tmp_path / "shard-*.jsonl"), tmp_path / "shard-0.jsonl"], tmp_path / "o",
                        tokenizer=tok_path, progress=False)
    assert read_indexed(str(tmp_path / "o"))["docs"] == [tok.encode(d).ids for d in corpus[:9] + corpus[:3]]
    assert r.documents == 12


def test_batch_size_does_not_change_the_output(tmp_path, corpus, tok_path, monkeypatch):
    src = write_jsonl(tmp_path / "c.jsonl", corpus)
    ll.write_tokens(src, tmp_path / "a", tokenizer=tok_path, batch_size=1000, progress=False)
    monkeypatch.setattr(tw, "_BLOCK", 3)          # pointers and document indices in blocks of 3
    monkeypatch.setattr(tw, "_BATCH_CHARS", 500)   # batches closed by their text size
    ll.write_tokens(src, tmp_path / "b", tokenizer=tok_path, batch_size=4, progress=False)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"a{ext}").read_bytes() == (tmp_path / f"b{ext}").read_bytes()


def test_append_eos_from_the_vocabulary_the_config_or_the_caller(tmp_path, corpus, tok, tok_path):
    src = write_jsonl(tmp_path / "c.jsonl", corpus[:5])
    eos = tok.token_to_id(EOS)
    want = [tok.encode(d).ids for d in corpus[:5]]
    r = ll.write_tokens(src, tmp_path / "a", tokenizer=tok_path, append_eos=True, progress=False)
    assert read_indexed(str(tmp_path / "a"))["docs"] == [w + [eos] for w in want]
    assert r.eos_id == eos and r.tokens == sum(map(len, want)) + 5 and "EOS 0 appended" in str(r)
    r = ll.write_tokens(src, tmp_path / "b", tokenizer=tok, append_eos=True, eos_id=77, progress=False)
    assert read_indexed(str(tmp_path / "b"))["docs"] == [w + [77] for w in want] and r.eos_id == 77
    # tokenizer_config.json beside tokenizer.json names the EOS, as Hugging Face saves it
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(open(tok_path).read())
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "Ġthe"}}))
    the = tok.token_to_id("Ġthe")
    assert the is not None and the != eos
    r = ll.write_tokens(src, tmp_path / "c", tokenizer=folder, append_eos=True, progress=False)
    assert r.eos_id == the and read_indexed(str(tmp_path / "c"))["docs"][0][-1] == the


def test_append_eos_without_one_to_find_names_what_is_missing(tmp_path, corpus, tok):
    bare = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    bare.pre_tokenizer = pre_tokenizers.Whitespace()
    src = write_jsonl(tmp_path / "c.jsonl", ["a a"])
    with pytest.raises(ValueError, match=r"append_eos=True but no EOS token found in the tokenizer given .*"
                                         r"<\|endoftext\|>, </s>.*pass eos_id= \(--eos-id\)"):
        ll.write_tokens(src, tmp_path / "o", tokenizer=bare, append_eos=True, progress=False)
    with pytest.raises(ValueError, match=r"eos_id is the id append_eos=True appends"):
        ll.write_tokens(src, tmp_path / "o", tokenizer=tok, eos_id=3, progress=False)
    with pytest.raises(ValueError, match=r"eos_id must be a token id from 0 to 2\*\*31 - 1, got -1"):
        ll.write_tokens(src, tmp_path / "o", tokenizer=tok, append_eos=True, eos_id=-1, progress=False)
    with pytest.warns(UserWarning, match="eos_id 5 is outside the tokenizer's vocabulary of 2 ids"):
        r = ll.write_tokens(src, tmp_path / "o", tokenizer=bare, append_eos=True, eos_id=5, progress=False)
    assert read_indexed(str(tmp_path / "o"))["docs"] == [[1, 1, 5]] and r.dtype == "uint16"
    assert leftovers(tmp_path) == ["o.bin", "o.idx"]


def _word_level(n: int) -> Tokenizer:
    """A vocabulary of ``n`` words ``w0 .. w{n-1}`` built directly: the cheap way past 65,536 ids."""
    t = Tokenizer(models.WordLevel({f"w{i}": i for i in range(n)}, unk_token="w0"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return t


@pytest.mark.parametrize(("vocab", "dtype", "code"), [(65536, np.uint16, 8), (65537, np.int32, 4),
                                                      (70000, np.int32, 4)])
def test_the_smallest_dtype_that_holds_the_vocabulary(tmp_path, vocab, dtype, code):
    t = _word_level(vocab)
    docs = [f"w{vocab - 1} w3 w65535", "w0", f"w{vocab - 2} w{vocab - 1}"]
    src = write_jsonl(tmp_path / "c.jsonl", docs)
    r = ll.write_tokens(src, tmp_path / "o", tokenizer=t, progress=False)
    got = read_indexed(str(tmp_path / "o"))
    assert got["code"] == code and r.dtype == np.dtype(dtype).name
    assert got["docs"] == [[vocab - 1, 3, 65535], [0], [vocab - 2, vocab - 1]]
    assert got["pointers"].tolist() == [0, 3 * np.dtype(dtype).itemsize, 4 * np.dtype(dtype).itemsize]


def test_an_eos_id_past_uint16_widens_the_dtype(tmp_path):
    t = _word_level(10)
    src = write_jsonl(tmp_path / "c.jsonl", ["w1 w2"])
    with pytest.warns(UserWarning, match="outside the tokenizer's vocabulary"):
        r = ll.write_tokens(src, tmp_path / "o", tokenizer=t, append_eos=True, eos_id=65536, progress=False)
    assert r.dtype == "int32" and read_indexed(str(tmp_path / "o"))["docs"] == [[1, 2, 65536]]


def test_offsets_past_4_gib_are_64_bit(tmp_path):
    # The index alone: three documents of 2^30 tokens (2 GiB each in uint16) and a short one.
    w = tw._IndexedWriter(str(tmp_path / "big.bin"), str(tmp_path / "big.idx"), np.dtype(np.uint16))
    w.idx.write(np.array([2**30, 2**30, 2**30, 5], "<i4").tobytes())
    w.sequences = 4
    w.commit()
    got = np.frombuffer((tmp_path / "big.idx").read_bytes(), "<i8", 4, HEADER.itemsize + 16)
    assert got.tolist() == [0, 2**31, 2**32, 3 * 2**31]
    # a sequence length is int32 in the format: one document of 2^31 tokens cannot be written
    w = tw._IndexedWriter(str(tmp_path / "huge.bin"), str(tmp_path / "huge.idx"), np.dtype(np.uint16))
    with pytest.raises(ll.LoaderError, match=r"huge.bin': a document of 2,147,483,648 tokens; the Megatron format "
                                             r"stores lengths as int32"):
        w.add(np.zeros(0, np.uint16), np.array([2**31], np.int64))
    w.discard()
    assert sorted(os.listdir(tmp_path)) == ["big.bin", "big.idx"]


def test_empty_documents_are_skipped_and_counted(tmp_path, tok, tok_path):
    docs = ["", "def f(): pass", "", "x = 1", ""]
    src = write_jsonl(tmp_path / "c.jsonl", docs)
    r = ll.write_tokens(src, tmp_path / "o", tokenizer=tok_path, append_eos=True, progress=False)
    got = read_indexed(str(tmp_path / "o"))
    eos = tok.token_to_id(EOS)
    assert got["docs"] == [tok.encode(docs[1]).ids + [eos], tok.encode(docs[3]).ids + [eos]]
    assert (r.documents, r.empty_documents) == (2, 3)
    assert "(3 empty, skipped)" in str(r)
    # text that encodes to no tokens at all is an empty document too
    t = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    r = ll.write_tokens(write_jsonl(tmp_path / "d.jsonl", ["   ", "a"]), tmp_path / "p", tokenizer=t, progress=False)
    assert (r.documents, r.empty_documents) == (1, 1) and read_indexed(str(tmp_path / "p"))["docs"] == [[1]]


def test_an_empty_corpus_is_an_error_and_writes_nothing(tmp_path, tok_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "blank.jsonl").write_bytes(b"\n\n")
    src = write_jsonl(tmp_path / "e.jsonl", ["", ""])
    with pytest.raises(ll.LoaderError, match=r"no documents to write: .*empty.jsonl', .*blank.jsonl', .*e.jsonl' "
                                             r"hold no text \(2 empty documents\)"):
        ll.write_tokens([tmp_path / "empty.jsonl", tmp_path / "blank.jsonl", src], tmp_path / "o",
                        tokenizer=tok_path, progress=False)
    assert leftovers(tmp_path) == []


BAD_JSONL = [
    (b'{"text": "a"}\n{"text": "b"}\n{"text": "c"\n', r"'{path}' line 3: not JSON \(Expecting"),
    (b'{"text": "a"}\n\n{"body": "b", "n": 1}\n', r"'{path}' line 3: no key 'text' \(keys: 'body', 'n'\); pass "
                                                  r"text_key= \(--text-key\)"),
    (b'{"text": "a"}\n{"text": 7}\n', r"'{path}' line 2: 'text' is int, not a string"),
    (b'{"text": null}\n', r"'{path}' line 1: 'text' is NoneType, not a string"),
    (b'["text"]\n', r"'{path}' line 1: expected a JSON object, got list"),
    (b'{"text": "\xff\xfe"}\n', r"'{path}' line 1: not JSON \('utf-8' codec can't decode"),
]


@pytest.mark.parametrize(("content", "message"), BAD_JSONL)
def test_a_bad_json_line_is_named_and_nothing_is_written(tmp_path, tok_path, content, message):
    good = write_jsonl(tmp_path / "good.jsonl", ["x = 1"] * 50)
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(tw.TokenizeError, match=message.format(path=path)) as e:
        ll.write_tokens([good, path], tmp_path / "o", tokenizer=tok_path, batch_size=4, progress=False)
    assert isinstance(e.value, ll.LoaderError) and isinstance(e.value, ValueError)
    assert e.value.path == str(path)
    assert leftovers(tmp_path) == []


def test_damaged_compressed_and_parquet_inputs_name_the_file(tmp_path, tok_path):
    zstandard = pytest.importorskip("zstandard")
    data = "".join(json.dumps({"text": f"x = {i}"}) + "\n" for i in range(2000)).encode()
    cases = []
    gz = tmp_path / "cut.jsonl.gz"
    gz.write_bytes(gzip.compress(data)[:-40])   # truncated
    cases.append((gz, r"'{p}': cannot read: Compressed file ended"))
    notgz = tmp_path / "plain.jsonl.gz"
    notgz.write_bytes(data)
    cases.append((notgz, r"'{p}': cannot read: Not a gzipped file"))
    frame = zstandard.ZstdCompressor().compress(data)
    cut = tmp_path / "cut.jsonl.zst"
    cut.write_bytes(frame + frame[:-10])   # a whole frame, then one cut short
    cases.append((cut, r"'{p}': truncated: its last zstd frame is incomplete"))
    junk = tmp_path / "junk.jsonl.zst"
    junk.write_bytes(b"not zstd at all" * 10)
    cases.append((junk, r"'{p}': cannot read: zstd decompress(or)? error: Unknown frame descriptor"))
    txt = tmp_path / "latin1.txt"
    txt.write_bytes("café".encode("latin-1"))
    cases.append((txt, r"'{p}': not UTF-8 text"))
    pq = tmp_path / "junk.parquet"
    pq.write_bytes(b"PAR1 not really")
    pytest.importorskip("pyarrow")
    cases.append((pq, r"'{p}': not a Parquet file"))
    for path, message in cases:
        with pytest.raises(tw.TokenizeError, match=message.format(p=path)):
            ll.write_tokens(path, tmp_path / "o", tokenizer=tok_path, progress=False)
        assert leftovers(tmp_path) == [], path


def test_parquet_column_problems_name_the_file(tmp_path, tok_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = _parquet(tmp_path / "a.parquet", ["x", "y"], key="body")
    with pytest.raises(tw.TokenizeError, match=rf"'{p}': no column 'text' \(columns: 'id', 'body'\)"):
        ll.write_tokens(p, tmp_path / "o", tokenizer=tok_path, progress=False)
    ints = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"text": [1, 2]}), str(ints))
    with pytest.raises(tw.TokenizeError, match=rf"'{ints}': column 'text' is int64, not a string column"):
        ll.write_tokens(ints, tmp_path / "o", tokenizer=tok_path, progress=False)
    nulls = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"text": ["a", "b", None, "d"]}), str(nulls), row_group_size=2)
    with pytest.raises(tw.TokenizeError, match=rf"'{nulls}' row 3: 'text' is null, not a string"):
        ll.write_tokens(nulls, tmp_path / "o", tokenizer=tok_path, progress=False)
    big = tmp_path / "big.parquet"
    pq.write_table(pa.table({"text": pa.array(["a b", "c"], pa.large_string())}), str(big))
    r = ll.write_tokens(big, tmp_path / "o", tokenizer=tok_path, progress=False)
    assert r.documents == 2
    assert leftovers(tmp_path) == ["o.bin", "o.idx"]


def test_missing_and_unknown_inputs_are_refused_before_any_work(tmp_path, tok_path):
    good = write_jsonl(tmp_path / "good.jsonl", ["a"])
    with pytest.raises(FileNotFoundError, match=r"input '.*nope.jsonl' does not exist"):
        ll.write_tokens([good, tmp_path / "nope.jsonl"], tmp_path / "o", tokenizer=tok_path, progress=False)
    (tmp_path / "data.csv").write_text("text\na\n")
    with pytest.raises(tw.TokenizeError, match=r"data.csv': unknown input format: expected .jsonl"):
        ll.write_tokens(tmp_path / "data.csv", tmp_path / "o", tokenizer=tok_path, progress=False)
    with pytest.raises(FileNotFoundError, match=r"no input matches '.*shard-\*.jsonl'"):
        ll.write_tokens(tmp_path / "shard-*.jsonl", tmp_path / "o", tokenizer=tok_path, progress=False)
    with pytest.raises(IsADirectoryError, match=r"is a folder: name its files"):
        ll.write_tokens(tmp_path, tmp_path / "o", tokenizer=tok_path, progress=False)
    with pytest.raises(ValueError, match="at least one input file"):
        ll.write_tokens([], tmp_path / "o", tokenizer=tok_path, progress=False)
    with pytest.raises(FileNotFoundError, match=r"output folder '.*missing' does not exist"):
        ll.write_tokens(good, tmp_path / "missing" / "o", tokenizer=tok_path, progress=False)
    with pytest.raises(FileNotFoundError, match=r"tokenizer file '.*tok.json' does not exist"):
        ll.write_tokens(good, tmp_path / "o", tokenizer=tmp_path / "tok.json", progress=False)
    (tmp_path / "junk.json").write_text("{not a tokenizer")
    with pytest.raises(ll.LoaderError, match=r"junk.json' is not a Hugging Face tokenizer.json"):
        ll.write_tokens(good, tmp_path / "o", tokenizer=tmp_path / "junk.json", progress=False)
    with pytest.raises(TypeError, match="tokenizer must be a path to a tokenizer.json or a tokenizers.Tokenizer"):
        ll.write_tokens(good, tmp_path / "o", tokenizer=42, progress=False)
    with pytest.raises(ValueError, match="batch_size must be a whole number of documents >= 1, got 0"):
        ll.write_tokens(good, tmp_path / "o", tokenizer=tok_path, batch_size=0, progress=False)
    assert leftovers(tmp_path) == []


class _Interrupting:
    """A tokenizer whose second batch is interrupted, as by Ctrl-C."""

    def __init__(self, tok):
        self.tok, self.calls = tok, 0

    def get_vocab_size(self, with_added_tokens=True):
        return self.tok.get_vocab_size(with_added_tokens)

    def token_to_id(self, t):
        return self.tok.token_to_id(t)

    def encode_batch(self, texts, add_special_tokens=True):
        self.calls += 1
        if self.calls == 2:
            raise KeyboardInterrupt
        return self.tok.encode_batch(texts, add_special_tokens=add_special_tokens)


def test_interrupted_or_failed_runs_leave_the_previous_output_alone(tmp_path, corpus, tok, tok_path):
    src = write_jsonl(tmp_path / "c.jsonl", corpus)
    ll.write_tokens(src, tmp_path / "o", tokenizer=tok_path, progress=False)
    before = {e: (tmp_path / f"o{e}").read_bytes() for e in (".bin", ".idx")}
    with pytest.raises(KeyboardInterrupt, match="^$"):
        ll.write_tokens(src, tmp_path / "o", tokenizer=_Interrupting(tok), batch_size=3, progress=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "a"}\n' * 20 + b"{oops\n")
    with pytest.raises(tw.TokenizeError, match=r"bad.jsonl' line 21: not JSON"):
        ll.write_tokens([src, bad], tmp_path / "o", tokenizer=tok_path, batch_size=3, progress=False)
    assert leftovers(tmp_path) == ["o.bin", "o.idx"]
    assert {e: (tmp_path / f"o{e}").read_bytes() for e in (".bin", ".idx")} == before


def test_truncation_and_padding_saved_with_a_tokenizer_are_ignored(tmp_path, corpus, tok_path):
    t = Tokenizer.from_file(tok_path)
    t.enable_truncation(max_length=4)
    t.enable_padding(length=16)
    saved = tmp_path / "trunc.json"
    t.save(str(saved))
    src = write_jsonl(tmp_path / "c.jsonl", corpus[:4])
    ll.write_tokens(src, tmp_path / "o", tokenizer=saved, progress=False)
    ll.write_tokens(src, tmp_path / "p", tokenizer=t, progress=False)
    ref = Tokenizer.from_file(tok_path)
    want = [ref.encode(d).ids for d in corpus[:4]]
    assert max(map(len, want)) > 16
    assert read_indexed(str(tmp_path / "o"))["docs"] == want == read_indexed(str(tmp_path / "p"))["docs"]
    assert t.truncation["max_length"] == 4   # the caller's object keeps its settings


def test_special_tokens_of_the_post_processor_and_a_transformers_tokenizer(tmp_path, corpus, tok_path):
    from tokenizers import processors

    t = Tokenizer.from_file(tok_path)
    t.add_special_tokens(["<s>"])
    bos = t.token_to_id("<s>")
    t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    src = write_jsonl(tmp_path / "c.jsonl", corpus[:3])
    plain = [Tokenizer.from_file(tok_path).encode(d).ids for d in corpus[:3]]
    ll.write_tokens(src, tmp_path / "a", tokenizer=t, progress=False)
    assert read_indexed(str(tmp_path / "a"))["docs"] == [[bos] + p for p in plain]   # as t.encode(d) gives
    ll.write_tokens(src, tmp_path / "b", tokenizer=t, add_special_tokens=False, progress=False)
    assert read_indexed(str(tmp_path / "b"))["docs"] == plain

    class FastTokenizer:   # what a transformers PreTrainedTokenizerFast offers
        backend_tokenizer = t
        eos_token_id = 42

    r = ll.write_tokens(src, tmp_path / "c", tokenizer=FastTokenizer(), append_eos=True, progress=False)
    assert r.eos_id == 42 and read_indexed(str(tmp_path / "c"))["docs"] == [[bos] + p + [42] for p in plain]


def test_the_progress_bar_can_be_turned_off(tmp_path, tok_path, capsys):
    src = write_jsonl(tmp_path / "c.jsonl", ["a b c"] * 10)
    ll.write_tokens(src, tmp_path / "o", tokenizer=tok_path, progress=False)
    assert capsys.readouterr() == ("", "")
    ll.write_tokens(src, tmp_path / "o", tokenizer=tok_path, progress=True)
    out, err = capsys.readouterr()
    assert out == "" and "tokenizing: 100%" in err


@pytest.mark.parametrize(("module", "src"), [("pyarrow", "a.parquet"), ("zstandard", "a.jsonl.zst"),
                                             ("tokenizers", "a.jsonl")])
def test_a_missing_extra_is_named(tmp_path, tok_path, monkeypatch, module, src):
    (tmp_path / src).write_bytes(b"")
    monkeypatch.setitem(sys.modules, module, None)   # as if it were not installed
    if module == "pyarrow":
        monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match=rf'needs .*{module}.*: pip install "loaderlib\[tokens\]"'):
        ll.write_tokens(tmp_path / src, tmp_path / "o", tokenizer=tok_path, progress=False)
    assert leftovers(tmp_path) == []


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "loaderlib", "tokenize", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def test_the_command_line_end_to_end(tmp_path, corpus, tok, tok_path):
    a = write_jsonl(tmp_path / "a.jsonl", corpus[:10])
    (tmp_path / "b.txt").write_text(corpus[10], encoding="utf-8")
    res = _cli(a, tmp_path / "b.txt", tmp_path / "out", "--tokenizer", tok_path, "--append-eos", "--no-progress")
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    assert res.stdout.startswith("tokenized 11 documents: ") and "tokens/s" in res.stdout
    eos = tok.token_to_id(EOS)
    got = read_indexed(str(tmp_path / "out"))
    assert got["docs"] == [tok.encode(d).ids + [eos] for d in corpus[:11]]
    # --text-key and --eos-id
    b = write_jsonl(tmp_path / "k.jsonl", corpus[:2], key="body")
    res = _cli(b, tmp_path / "k", "--tokenizer", tok_path, "--text-key", "body", "--append-eos", "--eos-id", "5",
               "--no-progress")
    assert res.returncode == 0, res.stderr
    assert read_indexed(str(tmp_path / "k"))["docs"] == [tok.encode(d).ids + [5] for d in corpus[:2]]
    # a failure: status 1, one line naming the file and line, nothing written
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"txt": "b"}\n')
    res = _cli(bad, tmp_path / "bad", "--tokenizer", tok_path, "--no-progress")
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.splitlines() == [f"error: '{bad}' line 2: no key 'text' (keys: 'txt'); pass text_key= "
                                       f"(--text-key)"]
    assert not os.path.exists(tmp_path / "bad.bin") and not os.path.exists(tmp_path / "bad.idx")
    res = _cli(a, tmp_path / "x", "--no-progress")
    assert res.returncode == 2 and "the following arguments are required: --tokenizer" in res.stderr


def test_token_dataset_reads_what_was_written(tmp_path, corpus, tok, tok_path):
    from loaderlib.datasets import TokenDataset

    src = write_jsonl(tmp_path / "c.jsonl", corpus)
    ll.write_tokens(src, tmp_path / "o", tokenizer=tok_path, append_eos=True, progress=False)
    eos = tok.token_to_id(EOS)
    stream = [t for d in corpus for t in tok.encode(d).ids + [eos]]
    ds = TokenDataset(str(tmp_path / "o"), 32)   # concat: the corpus as one stream in windows of 33
    assert len(ds) == (len(stream) - 1) // 32
    rows = [ds[i] for i in range(len(ds))]
    assert np.concatenate([r["input_ids"] for r in rows]).tolist() == stream[:32 * len(ds)]
    assert np.concatenate([r["labels"] for r in rows]).tolist() == stream[1:32 * len(ds) + 1]


MEGATRON = """
import json, sys, warnings
warnings.simplefilter("ignore")
from megatron.core.datasets.indexed_dataset import IndexedDataset
out = []
for prefix in sys.argv[1:]:
    ds = IndexedDataset(prefix)
    out.append({"n": len(ds), "dtype": str(ds[0].dtype), "docs": [ds[i].tolist() for i in range(len(ds))],
                "document_indices": ds.document_indices.tolist(), "lengths": ds.sequence_lengths.tolist()})
print(json.dumps(out))
"""


@pytest.mark.long   # among the slowest tests: `make test` leaves it to `make test-long` (.ci/run runs both)
def test_megatron_core_reads_the_output_identically(tmp_path, corpus, tok_path):
    import importlib.util

    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        pytest.skip("megatron-core is not installed (make test installs it after torch)")
    src = write_jsonl(tmp_path / "c.jsonl", corpus)
    ll.write_tokens(src, tmp_path / "u16", tokenizer=tok_path, append_eos=True, progress=False)
    ll.write_tokens(write_jsonl(tmp_path / "w.jsonl", ["w70000 w1", "w2 w69999 w3"]), tmp_path / "i32",
                    tokenizer=_word_level(70001), progress=False)
    res = subprocess.run([sys.executable, "-c", MEGATRON, str(tmp_path / "u16"), str(tmp_path / "i32")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    read = json.loads(res.stdout.strip().splitlines()[-1])
    for (prefix, dtype), meg in zip((("u16", "uint16"), ("i32", "int32")), read):
        ours = read_indexed(str(tmp_path / prefix))
        assert meg["dtype"] == dtype
        assert meg["docs"] == ours["docs"] and meg["n"] == len(ours["docs"])
        assert meg["lengths"] == ours["lengths"].tolist()
        assert meg["document_indices"] == ours["doc_idx"].tolist()


def test_the_guide_snippet_runs():
    """docs/guide/tokenize.md: its Python example (a tokenizer trained on the spot, a JSONL
    file, the index read back with numpy)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "guide", "tokenize.md"), encoding="utf-8") as f:
        snippets = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert len(snippets) == 1
    scope = {"__name__": "__doc_snippet__"}
    exec(compile(snippets[0], "tokenize.md", "exec"), scope)  # noqa: S102
    assert len(scope["ds"]) >= 1 and scope["report"].tokens > 10
