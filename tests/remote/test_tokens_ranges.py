"""Token files behind URLs read by byte range (NOTE [ Token files read by range ]): batches equal
those of the same files read locally and a numpy reference, only the chunks a batch's rows
touch are fetched, ``cache_limit`` bounds the chunks on disk, a failed range names its URL,
and ``close()`` leaves no thread, descriptor or file behind."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import loaderlib as ll
from loaderlib._datasets.tokens.ranges import CHUNK
from tests.remote.conftest import BUCKET, FAST
from tests.unit._token_model import write_megatron

EOS = 1
S = 64          # seq_len
B = 4           # rows per batch
NFILES = 4


def _docs(seed: int, ntok: int) -> list[list[int]]:
    """Documents of 1-600 tokens, each ending in EOS, about ``ntok`` tokens in all."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 600, size=2 * ntok // 300 + 10)
    lens = lens[:int(np.searchsorted(np.cumsum(lens), ntok)) + 1]
    toks = rng.integers(2, 30000, size=int(lens.sum())).astype(np.int64)
    ends = np.cumsum(lens)
    toks[ends - 1] = EOS
    return [d.tolist() for d in np.split(toks, ends[:-1])]


@pytest.fixture(scope="session")
def big_root(served, moto):
    """NFILES Megatron pairs of about 600 K uint16 tokens (19 chunks each) and a flat .bin of
    the same tokens: a corpus of ~76 chunks, of which a batch of B rows reads at most 2 * B."""
    root = os.path.join(served, "tokr")
    os.makedirs(root)
    for k in range(NFILES):
        docs = _docs(100 + k, 600_000)
        write_megatron(os.path.join(root, f"m-{k}"), docs)
    tokens = np.concatenate([np.fromfile(os.path.join(root, f"m-{k}.bin"), np.uint16) for k in range(NFILES)])
    tokens.tofile(os.path.join(root, "all.bin"))
    moto.upload_folder(BUCKET, root, prefix="tokr/")
    return root


def _base(server, nginx, moto, proxy=None):
    if server == "proxy":
        return f"{proxy.url}/tokr", dict(FAST)
    if server == "http":
        return f"{nginx.url}/tokr", dict(FAST)
    return f"s3://{BUCKET}/tokr", {**moto.storage_options, **FAST}


def _remote(base, so, cache, **kw):
    """The NFILES Megatron pairs of ``big_root`` behind ``base``, read into the cache folder ``cache``."""
    return ll.TokenDataset(f"{base}/m-{{0..{NFILES - 1}}}.bin", S, eos_id=EOS, storage_options=so, cache_dir=str(cache),
                           **kw)


def _local_tokens(root: str) -> np.ndarray:
    return np.fromfile(os.path.join(root, "all.bin"), np.uint16)


def _order(n: int, seed: int = 5) -> list[list[int]]:
    perm = np.random.default_rng(seed).permutation(n)
    return [perm[i:i + B].tolist() for i in range(0, n - n % B, B)]


def _run(ds, batches, threads):
    return list(ll.DataLoader(ds, batch_sampler=batches, num_threads=threads))


def _same(xs, ys):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            np.testing.assert_array_equal(x[key], y[key])
        assert x["max_seqlen"] == y["max_seqlen"]


def _chunks_of_rows(root: str, rows, seq_len: int) -> set[tuple[int, int]]:
    """(file, chunk) pairs the concat windows ``rows`` read, from the local files' sizes."""
    sizes = [os.path.getsize(os.path.join(root, f"m-{k}.bin")) // 2 for k in range(NFILES)]
    start = np.concatenate([[0], np.cumsum(sizes)])
    out = set()
    for r in rows:
        lo, hi = r * seq_len, r * seq_len + seq_len + 1
        for f in range(NFILES):
            a, b = max(lo, start[f]), min(hi, start[f + 1])
            if a < b:
                for c in range((a - start[f]) * 2 // CHUNK, ((b - start[f]) * 2 - 1) // CHUNK + 1):
                    out.add((f, c))
    return out


@pytest.mark.parametrize("server", ["http", "s3"])
@pytest.mark.parametrize("packing", ["concat", "pack"])
@pytest.mark.parametrize("threads", [1, 2])
def test_ranged_batches_equal_local(big_root, nginx, moto, tmp_path, server, packing, threads):
    base, so = _base(server, nginx, moto)
    local = ll.TokenDataset([os.path.join(big_root, f"m-{k}") for k in range(NFILES)], S, packing=packing, eos_id=EOS)
    remote = _remote(base, so, tmp_path / "cache", packing=packing)
    try:
        assert remote._ranges is not None and len(remote._ranges.which) == NFILES
        batches = _order(len(local))[:40]
        got = _run(remote, batches, threads)
        _same(_run(local, batches, threads), got)
        if packing == "concat":   # numpy over the same local files
            tokens = _local_tokens(big_root)
            for rows, y in zip(batches, got):
                windows = np.stack([tokens[r * S:r * S + S + 1] for r in rows]).astype(np.int64)
                np.testing.assert_array_equal(y["input_ids"], windows[:, :-1])
                np.testing.assert_array_equal(y["labels"], windows[:, 1:])
        # only chunks were fetched, far from the whole corpus
        total = sum(os.path.getsize(os.path.join(big_root, f"m-{k}.bin")) for k in range(NFILES))
        assert 0 < remote._ranges.fetched_bytes < total
    finally:
        remote.close()


def test_a_first_batch_fetches_only_the_chunks_its_rows_touch(big_root, nginx, proxy, tmp_path):
    base, so = _base("proxy", nginx, None, proxy)
    ds = _remote(base, so, tmp_path / "cache")
    try:
        proxy.reset()
        rows = np.asarray(_order(len(ds), seed=11)[0], np.int64)
        views = [np.empty(shape, dt) for shape, dt in ds.token_parts(rows.size)]
        ds.gather_into(rows, views, num_threads=2)
        want = _chunks_of_rows(big_root, rows.tolist(), S)
        with proxy.lock:
            seen = list(proxy.requests)
        bins = [(p, r) for m, p, r in seen if m == "GET" and p.endswith(".bin")]
        assert bins and all(r is not None for _, r in bins), "a token file was read whole"
        asked = 0
        for _p, r in bins:
            a, b = r[len("bytes="):].split("-")
            asked += int(b) - int(a) + 1
        # Requests for chunks one chunk apart may share a request that reads the one between
        # (NOTE [ Ranges that share a request ]): nothing else beyond the rows' chunks.
        between = sum(1 for f, c in want if (f, c + 2) in want and (f, c + 1) not in want)
        assert asked <= (len(want) + between) * CHUNK
        assert asked < NFILES * CHUNK * 8    # far less than the corpus (NFILES x ~19 chunks)
        assert ds._ranges.fetched_chunks == len(want)
        tokens = _local_tokens(big_root)
        windows = np.stack([tokens[r * S:r * S + S + 1] for r in rows.tolist()]).astype(np.int64)
        np.testing.assert_array_equal(views[0], windows[:, :-1])
    finally:
        ds.close()


@pytest.mark.parametrize("server", ["http", "s3"])
def test_cache_limit_bounds_the_chunks_on_disk(big_root, nginx, moto, tmp_path, server):
    base, so = _base(server, nginx, moto)
    idx = sum(os.path.getsize(os.path.join(big_root, f"m-{k}.idx")) for k in range(NFILES))
    limit = idx + 12 * CHUNK
    local = ll.TokenDataset([os.path.join(big_root, f"m-{k}") for k in range(NFILES)], S, eos_id=EOS)
    ds = _remote(base, so, tmp_path / "cache", cache_limit=limit)
    try:
        budget = ds._ranges.budget
        assert budget == 12 * CHUNK
        batches = _order(len(ds), seed=3)[:300]
        loader = ll.DataLoader(ds, batch_sampler=batches, num_threads=2)
        worst = 0
        got = []
        for y in loader:
            worst = max(worst, ds._ranges.disk_bytes())
            got.append({k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in y.items()})
        loader.close()
        # the limit, plus what the batches in flight pin beyond it (one batch of B rows: 2 * B chunks)
        assert worst <= budget + 2 * B * CHUNK
        assert ds._ranges.peak <= budget + 2 * B * CHUNK
        assert ds._ranges.evicted > 0
        assert ds._ranges.held == int(ds._ranges.present.sum()) * CHUNK
        assert ds._ranges.disk_bytes() <= budget
        _same(_run(local, batches, 2), got)
    finally:
        ds.close()


def test_a_cache_limit_below_one_batch_is_an_error(big_root, nginx, tmp_path):
    base, so = _base("http", nginx, None)
    idx = sum(os.path.getsize(os.path.join(big_root, f"m-{k}.idx")) for k in range(NFILES))
    ds = _remote(base, so, tmp_path / "cache", cache_limit=idx + 2 * CHUNK)
    try:
        rows = np.asarray(_order(len(ds), seed=1)[0], np.int64)
        views = [np.empty(shape, dt) for shape, dt in ds.token_parts(rows.size)]
        with pytest.raises(ValueError, match=r"cache_limit is too small for one batch: its rows read \d+ chunks"):
            ds.gather_into(rows, views)
    finally:
        ds.close()


def test_a_failing_range_names_the_url(big_root, nginx, proxy, tmp_path):
    base, so = _base("proxy", nginx, None, proxy)
    ds = _remote(base, so, tmp_path / "cache")
    try:
        proxy.add("status", match="m-2.bin", method="GET", ranged=True, status=500, times=1 << 20)
        rows = np.arange(len(ds), dtype=np.int64)
        with pytest.raises(ll.RemoteReadError, match=r"m-2\.bin \(HTTP 500\).*token bytes \d+-\d+"):
            list(ll.DataLoader(ds, batch_size=64, num_threads=2, sampler=rows.tolist()))
        proxy.reset()   # the store answers again: the same dataset reads on
        y = next(iter(ll.DataLoader(ds, batch_size=2, num_threads=1)))
        np.testing.assert_array_equal(y["input_ids"][0], _local_tokens(big_root)[:S])
    finally:
        ds.close()


def test_a_stalled_range_read_times_out_naming_the_batch(big_root, nginx, proxy, tmp_path):
    # NOTE [ Token batches driven by the consumer ]: no driver thread, so the loader's timeout
    # is the wait for a batch's chunks; past it the error names the batch, nothing hangs, and
    # the dataset reads on once the store answers.
    base, so = _base("proxy", nginx, None, proxy)
    ds = _remote(base, {**so, "timeout": 60}, tmp_path / "cache")
    try:
        proxy.add("stall", match="m-2.bin", method="GET", ranged=True, times=1 << 20)
        rows = np.arange(len(ds), dtype=np.int64)
        loader = ll.DataLoader(ds, batch_size=64, num_threads=1, sampler=rows.tolist(), timeout=1)
        with pytest.raises(ll.LoaderTimeoutError,
                           match=r"no batch within timeout=1 s while batch \d+ of epoch 0 waited for its token chunks"):
            list(loader)
        assert not [t for t in threading.enumerate() if t.name == "loaderlib-driver"]
        loader.close()
        proxy.reset()
        proxy.released.set()
        y = next(iter(ll.DataLoader(ds, batch_size=2, num_threads=1)))
        np.testing.assert_array_equal(y["input_ids"][0], _local_tokens(big_root)[:S])
    finally:
        proxy.released.set()
        ds.close()


def test_a_batch_given_up_is_never_written_late(big_root, nginx, proxy, tmp_path):
    # A batch whose chunks did not come in time is given up: when they come, its rows are not
    # queued, so nothing writes into the slot it had (which may hold another batch by then).
    base, so = _base("proxy", nginx, None, proxy)
    ds = _remote(base, {**so, "timeout": 60}, tmp_path / "cache")
    try:
        proxy.add("stall", match=".bin", method="GET", ranged=True, times=1 << 20)
        rows = np.asarray(_order(len(ds), seed=3)[0], np.int64)
        views = [np.full(shape, 7, dt) for shape, dt in ds.token_parts(rows.size)]
        gather = ds.start_gather(rows, views, num_threads=1)
        fetch = gather.fetch
        with pytest.raises(ll.LoaderTimeoutError, match=r"the token chunks of 4 rows did not come within 0\.2 s"):
            gather.wait(0.2)
        proxy.reset()
        proxy.released.set()
        rows_job, _read = fetch.future.result(60)   # the chunks came...
        assert rows_job is None                      # ...and no rows were queued
        assert all((v == 7).all() for v in views)
        gather.abandon()   # a given-up batch lets go at once
        want = [np.zeros(shape, dt) for shape, dt in ds.token_parts(rows.size)]
        ds.gather_into(rows, want, num_threads=1)   # the chunks are here now: the same rows read
        np.testing.assert_array_equal(want[0][0], _local_tokens(big_root)[rows[0] * S:rows[0] * S + S])
    finally:
        proxy.released.set()
        ds.close()


def test_an_object_deleted_mid_run_is_named(big_root, moto, tmp_path):
    moto.upload_folder(BUCKET, big_root, prefix="tokdel/")
    so = {**moto.storage_options, **FAST}
    ds = ll.TokenDataset(f"s3://{BUCKET}/tokdel/m-{{0..{NFILES - 1}}}.bin", S, eos_id=EOS, storage_options=so,
                         cache_dir=str(tmp_path / "cache"))
    try:
        first = next(iter(ll.DataLoader(ds, batch_size=2, num_threads=1)))
        np.testing.assert_array_equal(first["input_ids"][0], _local_tokens(big_root)[:S])
        moto.client().delete_object(Bucket=BUCKET, Key="tokdel/m-3.bin")
        last = np.arange(len(ds) - 8, len(ds), dtype=np.int64)   # rows in the last file
        with pytest.raises(ll.RemoteReadError, match=r"tokdel/m-3\.bin .*token bytes"):
            list(ll.DataLoader(ds, batch_size=4, num_threads=2, sampler=last.tolist()))
    finally:
        ds.close()


def _fds() -> set[str]:
    """This process's descriptors but sockets and event descriptors: the process-wide fetch
    pool keeps connections (as many as reads were in flight at once) open by design."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:   # closed while listing (the listing's own descriptor)
            continue
        if not target.startswith(("socket:", "anon_inode:")):
            out.add(f"{fd} {target}")
    return out


def test_close_leaves_no_thread_descriptor_or_file(big_root, nginx, tmp_path):
    base, so = _base("http", nginx, None)
    cache = tmp_path / "cache"
    before = _fds()
    # Threads an earlier test left (a failed test's traceback keeps its dataset alive) are
    # not this dataset's: only threads started here must be gone.
    earlier = set(threading.enumerate())
    ds = _remote(base, so, cache, cache_limit=1 << 30)
    batches = _order(len(ds), seed=9)[:20]
    list(ll.DataLoader(ds, batch_sampler=batches, num_threads=2))
    assert [t for t in threading.enumerate() if t.name.startswith("ll-token-fetch")]
    sparse = ds._ranges.paths()
    assert sparse and all(os.path.exists(p) for p in sparse)
    ds.close()
    assert not [t for t in threading.enumerate()
                if t not in earlier and t.name.startswith(("ll-token-fetch", "ll-shard-cache"))]
    assert not any(os.path.exists(p) for p in sparse)
    assert not [n for n in os.listdir(cache) if ".chunks-" in n]
    assert _fds() <= before


def test_whole_files_stay_available(big_root, nginx, tmp_path):
    base, so = _base("http", nginx, None)
    local = ll.TokenDataset([os.path.join(big_root, f"m-{k}") for k in range(NFILES)], S, eos_id=EOS)
    ds = _remote(base, so, tmp_path / "cache", remote_reads="files")
    try:
        assert ds._ranges is None
        batches = _order(len(ds), seed=4)[:10]
        _same(_run(local, batches, 2), _run(ds, batches, 2))
    finally:
        ds.close()
    with pytest.raises(ValueError, match=r"remote_reads must be one of \('ranges', 'files'\), got 'bytes'"):
        ll.TokenDataset(f"{base}/m-0.bin", S, storage_options=so, cache_dir=str(tmp_path / "c2"),
                        remote_reads="bytes")


@pytest.mark.parametrize("engine", ["threads", "processes"])
def test_python_engines_read_ranges_too(big_root, nginx, tmp_path, engine):
    base, so = _base("http", nginx, None)
    local = ll.TokenDataset([os.path.join(big_root, f"m-{k}") for k in range(NFILES)], S, eos_id=EOS)
    ds = _remote(base, so, tmp_path / "cache", cache_limit=1 << 30)
    try:
        batches = _order(len(ds), seed=8)[:12]
        kw = {"num_workers": 2} if engine == "processes" else {"num_threads": 2}
        loader = ll.DataLoader(ds.transform(lambda s: s), batch_sampler=batches, **kw)
        assert loader.engine == engine
        got = list(loader)
        loader.close()
        _same(_run(local, batches, 1), got)
    finally:
        ds.close()


def test_batches_planned_from_several_threads_at_once(big_root, nginx, tmp_path):
    # Three threads plan and gather batches of one dataset while a fourth reads ahead, under a
    # cache_limit of a few batches: every batch equals numpy's windows of the local files.
    base, so = _base("http", nginx, None)
    idx = sum(os.path.getsize(os.path.join(big_root, f"m-{k}.idx")) for k in range(NFILES))
    ds = _remote(base, so, tmp_path / "cache", cache_limit=idx + 4 * 2 * B * CHUNK)
    tokens = _local_tokens(big_root)
    errors: list[BaseException] = []

    def gather(seed: int) -> None:
        try:
            for rows in _order(len(ds), seed=seed)[:60]:
                rows = np.asarray(rows, np.int64)
                views = [np.empty(shape, dt) for shape, dt in ds.token_parts(rows.size)]
                ds.gather_into(rows, views, num_threads=1)
                want = np.stack([tokens[r * S:r * S + S] for r in rows.tolist()])
                np.testing.assert_array_equal(views[0], want)
        except BaseException as e:   # handed to the test's thread
            errors.append(e)

    def ahead() -> None:
        try:
            for rows in _order(len(ds), seed=99)[:60]:
                ds.read_ahead(np.asarray(rows, np.int64))
        except BaseException as e:
            errors.append(e)

    try:
        threads = [threading.Thread(target=gather, args=(s,)) for s in (21, 22, 23)]
        threads.append(threading.Thread(target=ahead))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[0]
        assert ds._ranges.evicted > 0
        assert ds._ranges.held == int(ds._ranges.present.sum()) * CHUNK and not ds._ranges.pins
    finally:
        ds.close()


def test_resume_reads_the_same_rows(big_root, nginx, tmp_path):
    # The chunks are no part of the state: a loader resumed from a state saved mid-epoch (on a
    # fresh dataset, its cache empty) delivers what the uninterrupted run delivered.
    base, so = _base("http", nginx, None)

    def dataset(name):
        return _remote(base, so, tmp_path / name, cache_limit=1 << 30)

    a, b = dataset("a"), dataset("b")
    try:
        full = [y["input_ids"].copy() for _, y in zip(range(12), ll.DataLoader(a, batch_size=B, shuffle=True, seed=4))]
        first = ll.DataLoader(a, batch_size=B, shuffle=True, seed=4)
        it = iter(first)
        head = [next(it)["input_ids"].copy() for _ in range(5)]
        state = first.state_dict()
        first.close()
        second = ll.DataLoader(b, batch_size=B, shuffle=True, seed=4)
        second.load_state_dict(state)
        tail = [y["input_ids"].copy() for _, y in zip(range(7), second)]
        second.close()
        for x, y in zip(full, head + tail):
            np.testing.assert_array_equal(x, y)
    finally:
        a.close()
        b.close()


def test_two_datasets_of_one_url_in_one_folder(big_root, nginx, tmp_path):
    # Each has sparse files of its own: opening or reading one never changes what the other
    # holds (a's chunks, fetched before b opens, are read again from a's file afterwards).
    base, so = _base("http", nginx, None)
    url = f"{base}/m-{{0..{NFILES - 1}}}.bin"
    tokens = _local_tokens(big_root)
    rows = np.asarray(_order(len(tokens) // S - 1, seed=31)[0], np.int64)
    want = np.stack([tokens[r * S:r * S + S] for r in rows.tolist()])

    def read(ds):
        views = [np.empty(shape, dt) for shape, dt in ds.token_parts(rows.size)]
        ds.gather_into(rows, views)
        np.testing.assert_array_equal(views[0], want)

    a = ll.TokenDataset(url, S, eos_id=EOS, storage_options=so, cache_dir=str(tmp_path / "c"))
    b = None
    try:
        read(a)
        fetched = a._ranges.fetched_chunks
        b = ll.TokenDataset(url, S, eos_id=EOS, storage_options=so, cache_dir=str(tmp_path / "c"))
        assert not set(a._ranges.paths()) & set(b._ranges.paths())
        read(a)
        assert a._ranges.fetched_chunks == fetched   # read from a's chunks, not fetched again
        read(b)
    finally:
        a.close()
        if b is not None:
            b.close()


def test_the_fetches_are_in_the_loaders_extract_stats(big_root, nginx, tmp_path):
    base, so = _base("http", nginx, None)
    ds = _remote(base, so, tmp_path / "cache")
    try:
        loader = ll.DataLoader(ds, batch_sampler=_order(len(ds), seed=12)[:30], num_threads=2, profile=True)
        list(loader)
        ex = loader.stats.extract
        loader.close()
        assert ex is not None and 0 < ex.reads <= 30
        assert ex.bytes == ds._ranges.fetched_bytes
        assert ex.latency_p50_ms > 0
    finally:
        ds.close()
