"""Record shards: atomic, identified writes; validated opening; shards and globs; native reads."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading

import cv2
import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T
from loaderlib.records import RecordFileDataset, parse_size, write_records

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "kernels"))


def _jpegs(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ok, buf = cv2.imencode(".jpg", rng.integers(0, 256, (20 + i % 7, 24 + i % 5, 3), dtype=np.uint8))
        assert ok
        out.append(buf.tobytes())
    return out


def _rgb(data):
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)[:, :, ::-1]


def test_parse_size():
    assert parse_size("1GiB") == 1 << 30 and parse_size("512mib") == 512 << 20 and parse_size(100) == 100
    assert parse_size("1GB") == 10**9 and parse_size("1.5k") == 1500   # as ram_budget and cache_limit read them
    with pytest.raises(ValueError, match="size must be a positive number of bytes"):
        parse_size("lots")
    with pytest.raises(ValueError, match="positive"):
        parse_size(0)


def test_shards_globs_and_native_reads(tmp_path):
    blobs = _jpegs(23)
    labels = list(range(23))
    shards = write_records(tmp_path / "train", blobs, labels, shard_size=2000)
    assert len(shards) > 2 and all(d.endswith(".llrec") and i.endswith(".llidx") for d, i in shards)
    for spec in (str(tmp_path / "train-*.llrec"), [d for d, _ in shards], [d[:-6] for d, _ in shards]):
        ds = RecordFileDataset(spec)
        assert len(ds) == 23 and ds.labels.tolist() == labels and sum(ds.shard_sizes) == 23
    ds = RecordFileDataset(str(tmp_path / "train-*.llrec"))
    for i in (0, 9, 22):
        np.testing.assert_array_equal(ds[i][0], _rgb(blobs[i]))
    # The same images from one shard (one descriptor per batch) and from files: the mixed-shard
    # batches must be identical, sample for sample (the fused chain may decode at a DCT scale,
    # so the reference is the same kernel path, not a full decode).
    one = RecordFileDataset(write_records(tmp_path / "single", blobs, labels)[0])
    chain = T.Compose([T.Resize((12, 12)), T.ToCHW()])
    ref = [(np.array(a), np.array(b)) for a, b in ll.DataLoader(one.transform_first(chain), batch_size=5,
                                                                 shuffle=True, seed=1, num_threads=1)]
    for threads in (1, 2):
        loader = ll.DataLoader(ds.transform_first(chain), batch_size=5, shuffle=True, seed=1, num_threads=threads)
        assert loader.engine == "native"
        got = [(np.array(a), np.array(b)) for a, b in loader]
        assert sorted(np.concatenate([b for _, b in got]).tolist()) == labels
        for (a, b), (ra, rb) in zip(got, ref):
            np.testing.assert_array_equal(b, rb)
            np.testing.assert_array_equal(a, ra)


def test_refuses_to_overwrite_unless_asked(tmp_path):
    write_records(tmp_path / "a", [b"1", b"2"])
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_records(tmp_path / "a", [b"3"])
    assert RecordFileDataset(tmp_path / "a", raw=True)[1][0] == b"2"
    write_records(tmp_path / "a", [b"3"], overwrite=True)
    assert RecordFileDataset(tmp_path / "a", raw=True)[0][0] == b"3"
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_concurrent_packs_never_pair_mismatched_files(tmp_path):
    """Two writers racing to one name with overwrite=True: the pair on disk is either valid or
    refused at open, never one run's data under the other's index."""
    results = []
    errors = []

    def pack(k):
        try:
            write_records(tmp_path / "race", [bytes([k]) * (10 + j) for j in range(50)], [k] * 50, overwrite=True)
        except Exception as e:  # noqa: BLE001 - either outcome is allowed, both are recorded
            errors.append(e)

    for _ in range(20):
        threads = [threading.Thread(target=pack, args=(k,)) for k in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        try:
            ds = RecordFileDataset(tmp_path / "race", raw=True)
        except ll.LoaderError as e:
            assert "different pack runs" in str(e)
            results.append("refused")
            continue
        k = ds.labels[0]
        assert all(ds[i] == (bytes([k]) * (10 + i), k) for i in range(50))
        results.append("valid")
    assert set(results) <= {"valid", "refused"} and not errors


def test_tampered_index_is_refused(tmp_path):
    _d, i = write_records(tmp_path / "t", _jpegs(5))
    with np.load(i) as z:
        parts = {k: z[k] for k in z.files}
    parts["sizes"] = parts["sizes"].copy()
    parts["sizes"][3] = -7
    with open(i, "wb") as f:
        np.savez(f, **parts)
    with pytest.raises(ll.LoaderError, match="checksum mismatch"):
        RecordFileDataset(tmp_path / "t")


def test_index_outside_the_data_names_the_record(tmp_path):
    write_records(tmp_path / "old", _jpegs(4))
    # A version-1 index (no checksum) pointing past the end: the record is named at open.
    np.savez(tmp_path / "v1.idx", version=np.int64(1), offsets=np.array([0, 5, 10**9]), sizes=np.array([5, 5, 5]),
             labels=np.zeros(3, np.int64), keys=np.array(["a", "b", "c"]), synsets=np.array([], dtype=str))
    os.replace(tmp_path / "v1.idx.npz", tmp_path / "v1.idx")
    (tmp_path / "v1.rec").write_bytes(b"x" * 20)
    with pytest.raises(ll.LoaderError, match=r"record 2 \('c'\) has offset 1000000000"):
        RecordFileDataset(tmp_path / "v1.rec")
    np.savez(tmp_path / "v1b.idx", version=np.int64(1), offsets=np.array([0]), sizes=np.array([5]),
             labels=np.zeros(2, np.int64), keys=np.array(["a"]), synsets=np.array([], dtype=str))
    os.replace(tmp_path / "v1b.idx.npz", tmp_path / "v1b.idx")
    (tmp_path / "v1b.rec").write_bytes(b"x" * 20)
    with pytest.raises(ll.LoaderError, match="2 labels"):
        RecordFileDataset(tmp_path / "v1b.rec")


def test_truncated_data_is_refused(tmp_path):
    d, _ = write_records(tmp_path / "cut", _jpegs(3))
    with open(d, "r+b") as f:
        f.truncate(os.path.getsize(d) - 10)
    with pytest.raises(ll.LoaderError, match="truncated"):
        RecordFileDataset(tmp_path / "cut")


def test_mxnet_record_file_is_recognised(tmp_path):
    rec = tmp_path / "mx.rec"
    rec.write_bytes(struct.pack("<II", 0xCED7230A, 4) + b"abcd")
    (tmp_path / "mx.idx").write_text("0\t0\n")
    with pytest.raises(ll.LoaderError, match="MXNet RecordIO"):
        RecordFileDataset(rec)


def test_missing_and_non_index_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        RecordFileDataset(tmp_path / "none")
    (tmp_path / "junk.llrec").write_bytes(b"LLREC")
    (tmp_path / "junk.llidx").write_bytes(b"not an npz")
    with pytest.raises(ll.LoaderError, match="not a loaderlib record index"):
        RecordFileDataset(tmp_path / "junk")
    with pytest.raises(FileNotFoundError, match="no record shard matches"):
        RecordFileDataset(str(tmp_path / "nothing-*.llrec"))


def test_bad_record_obeys_on_error(tmp_path):
    blobs = _jpegs(6)
    blobs[2] = blobs[2][:20]
    ds = RecordFileDataset(write_records(tmp_path / "bad", blobs, list(range(6)))[0]).transform_first(
        T.Resize((8, 8)))
    with pytest.raises(ll.DecodeError, match="record 2"):
        list(ll.DataLoader(ds, batch_size=3))
    loader = ll.DataLoader(ds, batch_size=3, on_error="skip")
    assert [b.tolist() for _, b in loader] == [[0, 1, 3], [4, 5]]
    assert [e.index for e in loader.errors] == [2]


def test_pack_command_shards_and_force(tmp_path):
    from _loader_images import make_image_folder

    folder = make_image_folder(tmp_path / "imgs", num_classes=2, per_class=4)
    out = tmp_path / "packed"
    cmd = [sys.executable, "-m", "loaderlib", "pack", folder, str(out), "--quiet", "--shard-size", "2KB"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    ds = RecordFileDataset(str(tmp_path / "packed-*.llrec"))
    assert len(ds) == 8 and len(ds.paths) > 1
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 1 and "exists" in r.stderr and "--force" in r.stderr
    r = subprocess.run([*cmd, "--force"], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "loaderlib", "pack", str(tmp_path / "nope"), str(out)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 1 and "is not a folder" in r.stderr


def test_three_ranks_over_ten_shards(tmp_path):
    from loaderlib.sampler import ShardedSampler

    blobs = [bytes([k % 251]) * (8 + k % 5) for k in range(61)]
    shards = write_records(tmp_path / "s", blobs, list(range(61)), shard_size=60)
    assert len(shards) >= 10
    ds = RecordFileDataset(str(tmp_path / "s-*.llrec"), raw=True)

    def collate(samples):
        return np.array([lab for _b, lab in samples])

    for drop_last in (True, False):
        per_rank = []
        for rank in range(3):
            loader = ll.DataLoader(ds, batch_size=4, collate_fn=collate, num_threads=1,
                                   sampler=ShardedSampler(3, rank, shuffle=True, seed=5, drop_last=drop_last))
            per_rank.append([b.tolist() for b in loader])
        assert len({len(r) for r in per_rank}) == 1          # the same number of batches on every rank
        items = [i for r in per_rank for b in r for i in b]
        if drop_last:
            assert len(items) == len(set(items)) == 60       # disjoint
        else:
            assert set(items) == set(range(61)) and len(items) == 63   # padded by wrapping around


def test_resume_mid_shard_with_shard_shuffle(tmp_path):
    import json

    from loaderlib.sampler import ShardShuffleSampler

    blobs = _jpegs(30)
    write_records(tmp_path / "r", blobs, list(range(30)), shard_size=3000)
    ds = RecordFileDataset(str(tmp_path / "r-*.llrec"))
    chain = T.Compose([T.RandomResizedCrop(12), T.RandomHorizontalFlip(), T.ToCHW()])

    def make():
        return ll.DataLoader(ds.transform_first(chain), batch_size=4, seed=9, num_threads=2,
                             sampler=ShardShuffleSampler(ds.shard_sizes, buffer_size=6, seed=4))

    loader = make()
    ref = [[(np.array(a), np.array(b)) for a, b in loader] for _ in range(2)]
    first = make()
    list(first)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    second = make()
    second.load_state_dict(state)
    rest = [(np.array(a), np.array(b)) for a, b in second]
    assert len(rest) == len(ref[1]) - 3
    for (a, b), (ra, rb) in zip(rest, ref[1][3:]):
        np.testing.assert_array_equal(b, rb)
        np.testing.assert_array_equal(a, ra)
