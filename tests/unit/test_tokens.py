"""TokenDataset: each format read equals numpy's reading of the same files, and batches equal
a plain-Python model of the three packings (tests/unit/_token_model.py) on every engine and
thread count; resume, sharding and bad input."""

from __future__ import annotations

import os
import struct
import threading

import numpy as np
import pytest

import loaderlib as ll
from loaderlib.batchify import collate_tokens
from tests.unit._token_model import model_batch, model_rows, write_datatrove, write_megatron

EOS = 1


def make_docs(seed: int, n: int, vocab: int = 500, empty: bool = True) -> list[list[int]]:
    """Documents with lengths from a heavy-tailed distribution (a few tokens to a few hundred),
    each ending in EOS, some empty."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n):
        k = int(min(400, rng.lognormal(3.0, 1.0)))
        if empty and rng.random() < 0.05:
            docs.append([])
            continue
        body = rng.integers(2, vocab, size=max(0, k - 1)).tolist()
        docs.append(body + [EOS])
    return docs


def starts_of(docs):
    out, at = [], 0
    for d in docs:
        out.append(at)
        at += len(d)
    return out


def flat(docs):
    return [t for d in docs for t in d]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The same documents in every format: two files each."""
    root = tmp_path_factory.mktemp("tokens")
    a, b = make_docs(1, 60), make_docs(2, 45)
    out = {}
    write_megatron(str(root / "meg_a"), a)
    write_megatron(str(root / "meg_b"), b)
    out["megatron"] = ([str(root / "meg_a"), str(root / "meg_b.bin")], [(flat(a), starts_of(a)), (flat(b), starts_of(b))])
    np.asarray(flat(a), np.uint16).tofile(root / "a.bin")
    np.save(root / "b.npy", np.asarray(flat(b), np.int32))
    out["flat"] = ([str(root / "a.bin"), str(root / "b.npy")], [(flat(a), None), (flat(b), None)])
    write_datatrove(str(root / "a.ds"), a)
    write_datatrove(str(root / "b.ds"), b, np.uint32)
    out["datatrove"] = ([str(root / "a.ds"), str(root / "b.ds")], [(flat(a), starts_of(a)), (flat(b), starts_of(b))])
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"input_ids": pa.array(a, pa.list_(pa.int32()))}), root / "a.parquet")
    with pa.OSFile(str(root / "b.arrow"), "wb") as sink:
        t = pa.table({"input_ids": pa.array(b, pa.list_(pa.int64()))})
        with pa.ipc.new_file(sink, t.schema) as w:
            w.write_table(t)
    out["arrow"] = ([str(root / "a.parquet"), str(root / "b.arrow")], [(flat(a), starts_of(a)), (flat(b), starts_of(b))])
    return out


FORMATS = ["megatron", "flat", "datatrove", "arrow"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_reads_what_numpy_reads(corpus, fmt):
    paths, files = corpus[fmt]
    ds = ll.TokenDataset(paths, 8, eos_id=EOS)
    assert len(ds.files) == 2
    for tf, (toks, starts) in zip(ds.files, files):
        np.testing.assert_array_equal(np.asarray(tf.tokens, np.int64), np.asarray(toks, np.int64))
        if starts is not None:
            s, n = tf.doc_spans(EOS)
            np.testing.assert_array_equal(s, starts)
            np.testing.assert_array_equal(n, np.diff(starts + [len(toks)]))


def _check_loader(ds, expected, S, batch_size, **kw):
    loader = ll.DataLoader(ds, batch_size=batch_size, **kw)
    k = 0
    for batch in loader:
        n = batch["input_ids"].shape[0]
        ids, lab, pos, cu, longest = model_batch(expected[k:k + n], S)
        np.testing.assert_array_equal(batch["input_ids"], ids)
        np.testing.assert_array_equal(batch["labels"], lab)
        np.testing.assert_array_equal(batch["position_ids"], pos)
        np.testing.assert_array_equal(batch["cu_seqlens"], cu)
        assert batch["max_seqlen"] == longest
        k += n
    assert k == len(expected)
    return loader


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("packing", ["concat", "pack", "pad"])
@pytest.mark.parametrize("threads", [1, 2])
def test_batches_equal_the_model(corpus, fmt, packing, threads):
    paths, files = corpus[fmt]
    S = 32
    ds = ll.TokenDataset(paths, S, packing=packing, eos_id=EOS, block=20)
    expected = model_rows(files, S, packing, EOS, block=20)
    assert len(ds) == len(expected)
    loader = _check_loader(ds, expected, S, 8, num_threads=threads)
    assert loader.engine == "native"
    b = next(iter(loader))
    assert b["input_ids"].dtype == np.int32 and b["labels"].dtype == np.int32
    assert b["position_ids"].dtype == np.int32 and b["cu_seqlens"].dtype == np.int32


@pytest.mark.parametrize("packing", ["concat", "pack", "pad"])
def test_options_mask_pad_ignore_and_dtypes(corpus, packing):
    paths, files = corpus["megatron"]
    S = 16
    ds = ll.TokenDataset(paths, S, packing=packing, eos_id=EOS, pad_id=0, ignore_index=-1,
                         mask_document_starts=True, ids_dtype="uint16", dtype="int64", block=7)
    expected = model_rows(files, S, packing, EOS, pad=0, ignore=-1, mask=True, block=7)
    loader = _check_loader(ds, expected, S, 5)
    b = next(iter(loader))
    assert b["input_ids"].dtype == np.uint16 and b["labels"].dtype == np.int64


@pytest.mark.parametrize("engine", ["threads", "processes"])
def test_python_engines_equal_the_model(corpus, engine):
    paths, files = corpus["datatrove"]
    S = 24
    ds = ll.TokenDataset(paths, S, packing="pack", eos_id=EOS, block=30)
    expected = model_rows(files, S, "pack", EOS, block=30)
    kw = {"num_workers": 2} if engine == "processes" else {}
    loader = _check_loader(ds.transform(lambda s: s), expected, S, 6, **kw)
    assert loader.engine == engine


def test_one_sample_from_python_equals_its_batch(corpus):
    paths, files = corpus["flat"]
    ds = ll.TokenDataset(paths, 12, packing="concat", eos_id=EOS)
    expected = model_rows(files, 12, "concat", EOS)
    s = ds[3]
    np.testing.assert_array_equal(s["input_ids"], expected[3][0])
    np.testing.assert_array_equal(s["position_ids"], expected[3][2])
    b = collate_tokens([ds[i] for i in range(5)])
    ids, lab, pos, cu, longest = model_batch(expected[:5], 12)
    np.testing.assert_array_equal(b["cu_seqlens"], cu)
    assert b["max_seqlen"] == longest
    assert "at token" in ds.source(3)


def test_without_eos_a_flat_file_is_one_document(tmp_path):
    t = np.arange(100, dtype=np.uint16)
    t.tofile(tmp_path / "train.bin")
    ds = ll.TokenDataset(str(tmp_path / "train.bin"), 10)
    s = ds[2]
    np.testing.assert_array_equal(s["input_ids"], np.arange(20, 30))
    np.testing.assert_array_equal(s["labels"], np.arange(21, 31))
    np.testing.assert_array_equal(s["position_ids"], np.arange(10))
    assert len(ds) == 9


def test_shuffled_resume_and_sharding_deliver_every_sequence_once(corpus):
    paths, files = corpus["megatron"]
    ds = ll.TokenDataset(paths, 16, packing="pack", eos_id=EOS, block=25)
    full = [b["input_ids"].copy() for b in ll.DataLoader(ds, batch_size=4, shuffle=True, seed=3)]
    loader = ll.DataLoader(ds, batch_size=4, shuffle=True, seed=3)
    it = iter(loader)
    first = [next(it)["input_ids"].copy() for _ in range(3)]
    state = loader.state_dict()
    resumed = ll.DataLoader(ds, batch_size=4, shuffle=True, seed=3)
    resumed.load_state_dict(state)
    rest = [b["input_ids"].copy() for b in resumed]
    assert len(first) + len(rest) == len(full)
    for x, y in zip(first + rest, full):
        np.testing.assert_array_equal(x, y)
    rows = []
    for rank in range(2):
        sampler = ll.ShardedSampler(2, rank, shuffle=True, seed=5)
        for b in ll.DataLoader(ds, batch_size=4, sampler=sampler):
            rows.extend(map(bytes, b["input_ids"]))
    whole = [bytes(ds[i]["input_ids"]) for i in range(len(ds))]
    assert sorted(set(rows)) == sorted(set(whole))


def test_pack_wastes_less_than_pad(corpus):
    paths, _ = corpus["megatron"]
    pack = ll.TokenDataset(paths, 64, packing="pack", eos_id=EOS)
    pad = ll.TokenDataset(paths, 64, packing="pad", eos_id=EOS)
    concat = ll.TokenDataset(paths, 64, packing="concat", eos_id=EOS)
    assert concat.padding_share == 0.0
    assert 0 < pack.padding_share < pad.padding_share
    assert len(pack) < len(pad)


def test_long_documents_are_split_and_empty_ones_skipped(tmp_path):
    docs = [[], list(range(2, 40)), [], [5, 6]]
    write_megatron(str(tmp_path / "c"), docs)
    files = [(flat(docs), starts_of(docs))]
    for packing, rows in (("pad", 5), ("pack", 4)):   # 38 tokens: pieces of 11, 11, 11 and 8
        ds = ll.TokenDataset(str(tmp_path / "c"), 10, packing=packing)
        expected = model_rows(files, 10, packing, None)
        assert len(ds) == len(expected) == rows
        _check_loader(ds, expected, 10, 2)


def test_offsets_past_2_to_the_32(tmp_path):
    """A sparse corpus of more than 2^32 tokens: rows near its end hold the tokens written there."""
    n = (1 << 32) + 5000
    last_start = ((n - 1) // 1024 - 1) * 1024
    path = tmp_path / "big.bin"
    with open(path, "wb") as f:
        f.truncate(n * 2)
        for at, val in ((1000, 7), (last_start + 3, 9), ((1 << 32) + 17, 11)):
            f.seek(at * 2)
            f.write(struct.pack("<H", val))
    ds = ll.TokenDataset(str(path), 1024)
    assert len(ds) == (n - 1) // 1024
    i = ((1 << 32) + 17) // 1024
    s = ds[i]
    j = (1 << 32) + 17 - i * 1024
    assert s["input_ids"][j] == 11 and s["labels"][j - 1] == 11
    last = ds[len(ds) - 1]
    assert (len(ds) - 1) * 1024 == last_start
    assert last["input_ids"][3] == 9 and last["input_ids"].sum() == 9


# ---------------------------------------------------------------------------- bad input

def test_bin_size_not_matching_its_idx(tmp_path):
    write_megatron(str(tmp_path / "c"), [[2, 3, 4], [5, 6]])
    with open(tmp_path / "c.bin", "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(ll.LoaderError, match=r"c\.bin: 12 bytes, but .*c\.idx says its last sequence ends at byte 10"):
        ll.TokenDataset(str(tmp_path / "c"), 2)


@pytest.mark.parametrize("offset,value,message", [
    (0, b"NOTANIDX\0", r"not a Megatron index \(magic"),
    (9, struct.pack("<Q", 2), r"Megatron index version 2"),
    (17, bytes([9]), r"unknown dtype code 9"),
    (17, bytes([6]), r"dtype code 6 \(float64\) is not a token type"),
])
def test_a_corrupt_megatron_header(tmp_path, offset, value, message):
    write_megatron(str(tmp_path / "c"), [[2, 3, 4], [5, 6]])
    with open(tmp_path / "c.idx", "r+b") as f:
        f.seek(offset)
        f.write(value)
    with pytest.raises(ll.LoaderError, match=message) as e:
        ll.TokenDataset(str(tmp_path / "c"), 2)
    assert "c.idx" in str(e.value)


def test_a_truncated_index(tmp_path):
    write_megatron(str(tmp_path / "c"), [[2, 3, 4], [5, 6]])
    with open(tmp_path / "c.idx", "r+b") as f:
        f.truncate(40)
    with pytest.raises(ll.LoaderError, match=r"c\.idx: 40 bytes, but its header describes 2 sequences"):
        ll.TokenDataset(str(tmp_path / "c"), 2)


def test_token_ids_past_the_vocabulary_name_the_file_at_open(tmp_path):
    """NOTE [ Token ids checked at open ]: a corpus small enough to read at open is."""
    write_megatron(str(tmp_path / "c"), [[2, 3, 4, 700], [5, 6]])
    with pytest.raises(ll.LoaderError, match=r"c\.bin: token 3 is id 700, out of range \(ids must be 0 <= id < 500, "
                                              r"the vocab_size\)"):
        ll.TokenDataset(str(tmp_path / "c"), 2, vocab_size=500)
    np.array([1, 2, -5, 3, 4], np.int32).tofile(tmp_path / "neg.bin")
    with pytest.raises(ll.LoaderError, match=r"neg\.bin: token 2 is id -5, out of range"):
        ll.TokenDataset(str(tmp_path / "neg.bin"), 2, token_dtype="int32")
    ll.TokenDataset(str(tmp_path / "c"), 2, vocab_size=701)   # uint16 ids below 701: nothing to find


def test_token_ids_past_the_vocabulary_name_the_file_at_read(tmp_path, monkeypatch):
    """Above OPEN_CHECK_TOKENS the corpus opens without reading; the kernel checks each id."""
    from loaderlib._datasets.tokens import dataset as token_dataset

    monkeypatch.setattr(token_dataset, "OPEN_CHECK_TOKENS", 0)
    write_megatron(str(tmp_path / "c"), [[2, 3, 4, 700], [5, 6]])
    ds = ll.TokenDataset(str(tmp_path / "c"), 2, vocab_size=500)
    ds[0]
    with pytest.raises(ll.LoaderError, match=r"sample 1: a token id at .*c\.bin at token 3 is out of range"):
        ds[1]
    with pytest.raises(ll.LoaderError, match=r"c\.bin at token 3 is out of range"):
        list(ll.DataLoader(ds, batch_size=2))


def test_empty_and_short_corpora(tmp_path):
    np.zeros(0, np.uint16).tofile(tmp_path / "empty.bin")
    with pytest.raises(ll.LoaderError, match=r"the token corpus is empty \(.*empty\.bin: no tokens\)"):
        ll.TokenDataset(str(tmp_path / "empty.bin"), 4)
    np.arange(5, dtype=np.uint16).tofile(tmp_path / "short.bin")
    with pytest.raises(ll.LoaderError, match=r"short\.bin\) has 5 tokens, fewer than one sequence of seq_len \+ 1 = 9"):
        ll.TokenDataset(str(tmp_path / "short.bin"), 8)
    write_megatron(str(tmp_path / "none"), [[], []])
    with pytest.raises(ll.LoaderError, match=r"the token corpus is empty"):
        ll.TokenDataset(str(tmp_path / "none"), 4, packing="pack")


def test_bad_arguments(tmp_path):
    np.arange(50, dtype=np.uint16).tofile(tmp_path / "t.bin")
    p = str(tmp_path / "t.bin")
    with pytest.raises(ValueError, match=r"seq_len must be at least 1, got 0"):
        ll.TokenDataset(p, 0)
    with pytest.raises(ValueError, match=r"packing must be one of"):
        ll.TokenDataset(p, 4, packing="greedy")
    with pytest.raises(ValueError, match=r"eos_id 600 is out of range \(vocab_size 500\)"):
        ll.TokenDataset(p, 4, eos_id=600, vocab_size=500)
    with pytest.raises(ValueError, match=r"eos_id 70000 is out of range \(uint16 ids\)"):
        ll.TokenDataset(p, 4, eos_id=70000, ids_dtype="uint16")
    with pytest.raises(ValueError, match=r"eos_id 70000 cannot occur in .*t\.bin: its tokens are uint16"):
        ll.TokenDataset(p, 4, eos_id=70000)
    with pytest.raises(FileNotFoundError, match=r"token source not found: .*missing"):
        ll.TokenDataset(str(tmp_path / "missing"), 4)
    (tmp_path / "odd.bin").write_bytes(b"\0\0\0")
    with pytest.raises(ll.LoaderError, match=r"odd\.bin: 3 bytes is not a whole number of uint16 tokens"):
        ll.TokenDataset(str(tmp_path / "odd.bin"), 4)
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(ll.LoaderError, match=r"x\.txt: not a token file loaderlib knows"):
        ll.TokenDataset(str(tmp_path / "x.txt"), 4)


def test_datatrove_sizes_that_disagree(tmp_path):
    write_datatrove(str(tmp_path / "a.ds"), [[2, 3], [4, 5, 6]])
    with open(tmp_path / "a.ds", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ll.LoaderError, match=r"a\.ds: 11 bytes, but .*a\.ds\.index says its last document ends at token 5"):
        ll.TokenDataset(str(tmp_path / "a.ds"), 2)


def test_a_parquet_file_without_the_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"text": ["a", "b"]}), tmp_path / "t.parquet")
    with pytest.raises(ll.LoaderError, match=r"t\.parquet: no column 'input_ids'"):
        ll.TokenDataset(str(tmp_path / "t.parquet"), 2)
    assert os.path.exists(tmp_path / "t.parquet")


# ---------------------------------------------------------------------------- mixtures

def test_a_native_mixture_of_token_datasets(corpus):
    (a, b), _ = corpus["megatron"]
    da = ll.TokenDataset(a, 16, packing="concat", eos_id=EOS)
    db = ll.TokenDataset(b, 16, packing="pack", eos_id=EOS, block=10)
    mix = ll.MixtureDataset([da, db], [0.75, 0.25], size=40, seed=4)
    loader = ll.DataLoader(mix, batch_size=8, num_threads=2)
    assert loader.engine == "native"
    sources, samples = mix.epoch_indices(0)
    got = [b for b in loader]
    k = 0
    for batch in got:
        n = batch["input_ids"].shape[0]
        want = collate_tokens([(da if s == 0 else db)[int(j)] for s, j in zip(sources[k:k + n], samples[k:k + n])])
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            np.testing.assert_array_equal(batch[key], want[key])
        assert batch["max_seqlen"] == want["max_seqlen"]
        k += n
    assert k == 40 and list(mix.counts) == [30, 10]


def test_mixture_weights_in_tokens(corpus):
    (a, b), _ = corpus["megatron"]
    da = ll.TokenDataset(a, 16, packing="concat", eos_id=EOS)
    db = ll.TokenDataset(b, 16, packing="pad", eos_id=EOS)
    mix = ll.MixtureDataset([da, db], [0.5, 0.5], size=1000, seed=1, weights_in="tokens")
    tokens = mix.counts * np.asarray([da.tokens_per_sample, db.tokens_per_sample])
    assert abs(tokens[0] / tokens.sum() - 0.5) < 0.01
    assert mix.counts[1] > mix.counts[0]   # padded samples hold fewer tokens
    with pytest.raises(ValueError, match=r"weights_in='tokens': datasets\[1\] .* does not say its tokens per sample"):
        ll.MixtureDataset([da, ll.ArrayDataset(np.zeros(4))], [0.5, 0.5], weights_in="tokens")
    with pytest.raises(ValueError, match=r"weights_in must be 'samples' or 'tokens'"):
        ll.MixtureDataset([da, db], weights_in="bytes")
    mixed = ll.TokenDataset(a, 8, eos_id=EOS)
    bad = ll.MixtureDataset([da, mixed])
    assert ll.DataLoader(bad, batch_size=4).engine != "native"
    assert "seq_len 8" in bad.python_read


def test_stats_count_tokens_and_padding(corpus):
    paths, files = corpus["megatron"]
    S = 16
    ds = ll.TokenDataset(paths, S, packing="pack", eos_id=EOS)
    loader = ll.DataLoader(ds, batch_size=4)
    loader.recorder.enabled = True
    batches = list(loader)
    stats = loader.stats
    ids = np.concatenate([b["input_ids"] for b in batches])
    expected = model_rows(files, S, "pack", EOS)
    real = sum(r[4] for r in expected)
    assert ids.shape[0] == len(expected)
    assert stats.tokens == real and stats.padding_tokens == len(expected) * S - real
    assert 0 < stats.padding_tokens
    assert stats.padding_share == pytest.approx(ds.padding_share)
    assert "tokens/s" in repr(stats) and stats.to_dict()["padding_share"] == stats.padding_share


def test_token_batches_are_driven_by_the_consumer(corpus):
    # NOTE [ Token batches driven by the consumer ]: no driver thread; next() keeps
    # ``prefetch`` batches in production on the kernel team beyond the one it returns, the
    # user's waits are what the stats count, and the batches are the model's at 1 and 2 threads.
    paths, files = corpus["megatron"]
    S = 16
    expected = model_rows(files, S, "concat", EOS)
    for threads in (1, 2):
        loader = ll.DataLoader(ll.TokenDataset(paths, S, eos_id=EOS), batch_size=4, num_threads=threads, prefetch=3)
        loader.recorder.enabled = True
        earlier = set(threading.enumerate())   # another test's loader may still be winding down
        it = iter(loader)
        got = [next(it)]
        assert not [t for t in threading.enumerate() if t not in earlier and t.name == "loaderlib-driver"]
        assert len(it._run.pending) == 3                     # prefetch batches beyond the one returned
        assert (loader.stats.queue_depth, loader.stats.queue_capacity) == (3, 3)   # what the dashboard shows
        got += list(it)
        k = 0
        for batch in got:
            n = batch["input_ids"].shape[0]
            ids, lab, pos, cu, _longest = model_batch(expected[k:k + n], S)
            for key, want in (("input_ids", ids), ("labels", lab), ("position_ids", pos), ("cu_seqlens", cu)):
                np.testing.assert_array_equal(batch[key], want)
            k += n
        assert k == len(expected)
        assert loader.stats.consumer_waits == len(got) + 1     # every next(), the last one's StopIteration too
        assert loader._knobs.depth is None
        assert "no driver thread: next() queues token batches on the kernel team" in loader.explain()
        loader.close()


def test_read_ahead_asks_for_the_pages_of_the_rows(corpus):
    paths, files = corpus["flat"]
    ds = ll.TokenDataset(paths, 16, eos_id=EOS)
    rows = np.asarray([0, 5, len(ds) - 1])
    asked = ds.read_ahead(rows)
    assert asked >= 3 * 17 * 2   # at least the rows' own bytes, page-aligned
    assert ds.read_ahead(np.zeros(0, np.int64)) == 0
    _check_loader(ds, model_rows(files, 16, "concat", EOS), 16, 4)   # the loader reads ahead as it plans


# ---------------------------------------------------------------------------- the rest of the library

def test_a_pipeline_over_tokens(corpus):
    paths, files = corpus["megatron"]
    ds = ll.TokenDataset(paths, 16, eos_id=EOS)
    expected = model_rows(files, 16, "concat", EOS)
    batches = list(ll.Pipeline.from_dataset(ds).batch(5))
    ids, lab, pos, cu, longest = model_batch(expected[:5], 16)
    np.testing.assert_array_equal(batches[0]["input_ids"], ids)
    np.testing.assert_array_equal(batches[0]["cu_seqlens"], cu)
    assert sum(b["input_ids"].shape[0] for b in batches) == len(expected)
    spec = ll.Pipeline.from_dataset(ds).element_spec
    assert spec["input_ids"].shape == (16,) and spec["labels"].dtype == np.int32
    for drop, n in ((False, None), (True, 5)):   # the batch's spec describes what batches hold
        spec = ll.Pipeline.from_dataset(ds).batch(5, drop_remainder=drop).element_spec
        assert {k: s.shape for k, s in spec.items()} == {"input_ids": (n, 16), "labels": (n, 16),
                                                         "position_ids": (n, 16), "cu_seqlens": (None,),
                                                         "max_seqlen": ()}
        for k, s in spec.items():
            v = np.asarray(batches[0][k])
            assert v.ndim == len(s.shape) and v.dtype == s.dtype, k


def test_to_device_and_the_harness_on_tokens(corpus):
    torch = pytest.importorskip("torch")
    from loaderlib import profiling

    paths, files = corpus["flat"]
    ds = ll.TokenDataset(paths, 16, eos_id=EOS)
    ref = list(ll.DataLoader(ds, batch_size=4))
    dev = ll.to_device(ll.DataLoader(ds, batch_size=4, output="torch"), "cpu")
    got = list(dev)
    assert len(got) == len(ref)
    assert got[0]["input_ids"].dtype == torch.int32 and isinstance(got[0]["max_seqlen"], int)
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g["cu_seqlens"].numpy(), r["cu_seqlens"])
    report = profiling.benchmark(ll.DataLoader(ds, batch_size=4), seconds=0.5)
    assert "tokens/s" in str(report)


@pytest.mark.frameworks   # transformers: `make test-long` installs it (NOTE [ The slowest framework runs ])
def test_the_language_model_guide_runs():
    """docs/guide/language-models.md: its Python example (a packed corpus handed to a
    Llama-style model from transformers, trained a few steps on CPU)."""
    import re

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "guide", "language-models.md"), encoding="utf-8") as f:
        snippets = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert len(snippets) == 1
    scope = {"__name__": "__doc_snippet__"}
    exec(compile(snippets[0], "language-models.md", "exec"), scope)  # noqa: S102
    assert len(scope["ds"]) > 10 and 0 < scope["ds"].padding_share < 0.5


def test_elastic_resume_on_another_number_of_ranks(corpus):
    """Two ranks stop mid-epoch; their merged state resumes on three ranks: every sequence of
    the epoch is delivered once over the two runs (padding of the shards aside)."""
    paths, _ = corpus["datatrove"]
    ds = ll.TokenDataset(paths, 16, packing="pack", eos_id=EOS, block=15)
    seen, states = [], []
    for r in range(2):
        loader = ll.DataLoader(ds, batch_size=3, sampler=ll.ShardedSampler(2, r, shuffle=True, seed=8))
        it = iter(loader)
        for _ in range(4):
            seen.extend(map(bytes, next(it)["input_ids"]))
        states.append(loader.state_dict())
    merged = ll.merge_state_dicts(states)
    for r in range(3):
        loader = ll.DataLoader(ds, batch_size=3, sampler=ll.ShardedSampler(3, r, shuffle=True, seed=8))
        loader.load_state_dict(merged)
        for b in loader:
            seen.extend(map(bytes, b["input_ids"]))
    whole = [bytes(ds[i]["input_ids"]) for i in range(len(ds))]
    assert sorted(set(seen)) == sorted(set(whole))
    assert len(seen) - len(whole) <= 3   # the three-way split's padding


# ---------------------------------------------------------------------------- shuffling in blocks

@pytest.mark.parametrize("packing", ["concat", "pack", "pad"])
@pytest.mark.parametrize("engine", ["native", "threads", "processes"])
def test_a_dataset_that_shuffles_in_blocks(corpus, packing, engine):
    paths, files = corpus["megatron"]
    S = 16
    ds = ll.TokenDataset(paths, S, packing=packing, eos_id=EOS, block=12, shuffle=True, seed=6)
    rows = model_rows(files, S, packing, EOS, block=12)
    kw = {"num_workers": 2} if engine == "processes" else {}
    loader = ll.DataLoader(ds if engine == "native" else ds.transform(lambda s: s), batch_size=4, **kw)
    assert loader.engine == engine
    for epoch in (0, 1):
        order = np.asarray(ds.epoch_rows(epoch))
        assert sorted(order.tolist()) == list(range(len(ds)))
        expected = [rows[i] for i in order]
        loader.set_epoch(epoch)
        got = list(loader)
        k = 0
        for b in got:
            n = b["input_ids"].shape[0]
            ids, lab, pos, cu, _ = model_batch(expected[k:k + n], S)
            np.testing.assert_array_equal(b["input_ids"], ids)
            np.testing.assert_array_equal(b["position_ids"], pos)
            np.testing.assert_array_equal(b["cu_seqlens"], cu)
            k += n
        assert k == len(ds)
    assert not np.array_equal(np.asarray(ds.epoch_rows(0)), np.asarray(ds.epoch_rows(1)))
    if packing != "concat":   # a block's rows stay together: the epoch reads one block after another
        blk = np.searchsorted(ds.plan.cum, np.asarray(ds.epoch_rows(0)), side="right") - 1
        assert np.count_nonzero(np.diff(blk)) == np.count_nonzero(np.diff(ds.plan.cum)) - 1


def test_a_shuffling_dataset_resumes_exactly(corpus):
    paths, _ = corpus["datatrove"]
    ds = ll.TokenDataset(paths, 16, packing="pack", eos_id=EOS, block=10, shuffle=True)
    full = [b["input_ids"].copy() for b in ll.DataLoader(ds, batch_size=4, seed=11)]
    loader = ll.DataLoader(ds, batch_size=4, seed=11)
    it = iter(loader)
    head = [next(it)["input_ids"].copy() for _ in range(3)]
    again = ll.DataLoader(ds, batch_size=4, seed=11)
    again.load_state_dict(loader.state_dict())
    rest = [b["input_ids"].copy() for b in again]
    assert len(head) + len(rest) == len(full)
    for x, y in zip(head + rest, full):
        np.testing.assert_array_equal(x, y)
    other = [b["input_ids"].copy() for b in ll.DataLoader(ds, batch_size=4, seed=12)]
    assert any(not np.array_equal(x, y) for x, y in zip(other, full))   # seed=None: the loader's seed


def test_a_loader_shuffle_over_many_blocks_says_to_shuffle_in_the_dataset(tmp_path):
    docs = make_docs(5, 400, empty=False)
    write_megatron(str(tmp_path / "c"), docs)
    ds = ll.TokenDataset(str(tmp_path / "c"), 16, packing="pack", block=10)   # 40 blocks, 16 kept
    with pytest.warns(UserWarning, match=r"jumps between blocks of documents.*TokenDataset\(\.\.\., shuffle=True\)"):
        list(ll.DataLoader(ds, batch_size=8, shuffle=True, seed=0))


def test_corrupt_indexes_give_errors_naming_the_file(tmp_path):
    """Random bytes changed in Megatron and datatrove indexes (and truncations): opening and
    reading the dataset either works or raises an error naming the file; it never crashes
    (every read of the kernel is checked against its file, NOTE [ A token row ])."""
    rng = np.random.default_rng(0)
    docs = [rng.integers(2, 300, rng.integers(0, 60)).tolist() for _ in range(50)]
    write_megatron(str(tmp_path / "c"), docs)
    write_datatrove(str(tmp_path / "t.ds"), docs)
    originals = {p: p.read_bytes() for p in (tmp_path / "c.idx", tmp_path / "t.ds.index")}
    failures = 0
    for _ in range(40):
        for path, base in originals.items():
            b = bytearray(base)
            for _ in range(int(rng.integers(1, 6))):
                b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
            if rng.random() < 0.1:
                b = b[:int(rng.integers(0, len(b)))]
            path.write_bytes(bytes(b))
        for src in (tmp_path / "c", tmp_path / "t.ds"):
            for packing in ("concat", "pack", "pad"):
                try:
                    ds = ll.TokenDataset(str(src), 8, packing=packing, block=7, vocab_size=300)
                    list(ll.DataLoader(ds, batch_size=4, num_threads=2))
                except ll.LoaderError as e:
                    failures += 1
                    assert str(src.name) in str(e)
    assert failures > 0


def test_token_batches_run_on_a_kernel_team_that_close_stops(corpus):
    from tests._threads import still_running, threads

    paths, files = corpus["megatron"]
    before = set(threads())
    loader = ll.DataLoader(ll.TokenDataset(paths, 16, packing="pack", eos_id=EOS), batch_size=4, num_threads=2)
    it = iter(loader)
    next(it)
    team = {tid: name for tid, name in threads().items() if tid not in before and name.startswith("ll-")}
    assert team, "no named kernel threads ran the batch"
    loader.close()
    assert not still_running(team), team   # every thread of the run's team is gone
    _check_loader(ll.TokenDataset(paths, 16, packing="pack", eos_id=EOS), model_rows(files, 16, "pack", EOS), 16, 4,
                  num_threads=2)


def test_a_damaged_npy_header_names_the_file(tmp_path):
    """A finding of the tokens fuzz target: numpy raised tokenize.TokenError on a header cut
    inside its dict."""
    np.save(tmp_path / "t.npy", np.arange(50, dtype=np.uint16))
    data = (tmp_path / "t.npy").read_bytes()
    (tmp_path / "t.npy").write_bytes(data[:40] + b"\n" + data[128:])
    with pytest.raises(ll.LoaderError, match=r"t\.npy: not a readable \.npy file"):
        ll.TokenDataset(str(tmp_path / "t.npy"), 4)


def test_a_npy_shorter_than_its_header_says_names_the_file(tmp_path):
    np.save(tmp_path / "t.npy", np.arange(50, dtype=np.uint16))
    data = (tmp_path / "t.npy").read_bytes()
    (tmp_path / "t.npy").write_bytes(data[:-10])
    with pytest.raises(ll.LoaderError, match=r"t\.npy: \d+ bytes, but its header describes 50 tokens"):
        ll.TokenDataset(str(tmp_path / "t.npy"), 4)


_MANY_FILES = r"""
import os, resource, sys
import numpy as np
import loaderlib as ll
from tests.unit._token_model import write_megatron, write_datatrove

root, n = sys.argv[1], int(sys.argv[2])
paths = []
for i in range(n):
    docs = [[(i * 7 + j) % 500 + 1] * (3 + (i + j) % 5) for j in range(4)]
    if i % 3 == 0:
        write_megatron(os.path.join(root, f"m{i}"), docs); paths.append(os.path.join(root, f"m{i}"))
    elif i % 3 == 1:
        write_datatrove(os.path.join(root, f"d{i}.ds"), docs); paths.append(os.path.join(root, f"d{i}.ds"))
    else:
        np.save(os.path.join(root, f"f{i}.npy"), np.array(sum(docs, []), np.uint16)); paths.append(os.path.join(root, f"f{i}.npy"))
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
before = len(os.listdir("/proc/self/fd"))
ds = ll.TokenDataset(paths, 8, packing="pack")
tokens = 0
with ll.DataLoader(ds, batch_size=16, num_threads=2) as loader:
    for b in loader:
        tokens += int((b["input_ids"] != 0).sum())
print(before, len(os.listdir("/proc/self/fd")), len(ds), tokens)
"""


def test_a_corpus_of_many_files_holds_no_descriptor_per_file(tmp_path):
    """NOTE [ One mapping, no descriptor ]: 300 files of three formats (about 900 mappings)
    open and read under a limit of 64 open files, which one descriptor per mapping exceeds."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run([sys.executable, "-c", _MANY_FILES, str(tmp_path), "300"], capture_output=True, text=True,
                       cwd=root, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    before, after, rows, tokens = map(int, p.stdout.split())
    assert after <= before + 8, (before, after)   # the loader's own (threads' eventfds and the like), not 300
    assert rows > 0 and tokens > 0
