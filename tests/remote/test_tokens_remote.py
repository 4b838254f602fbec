"""Token datasets named by URLs (nginx over HTTP, moto over S3) give what the same files give
locally, read through the shard cache (NOTE [ Token files behind URLs ])."""

from __future__ import annotations

import os

import numpy as np
import pytest

import loaderlib as ll
from tests.remote.conftest import BUCKET, FAST
from tests.unit._token_model import write_datatrove, write_megatron
from tests.unit.test_tokens import EOS, flat, make_docs


@pytest.fixture(scope="session")
def tok_root(served, moto):
    root = os.path.join(served, "tok")
    os.makedirs(root)
    a, b = make_docs(11, 80), make_docs(12, 50)
    write_megatron(os.path.join(root, "meg-0"), a)
    write_megatron(os.path.join(root, "meg-1"), b)
    write_datatrove(os.path.join(root, "dt.ds"), b)
    np.asarray(flat(a), np.uint16).tofile(os.path.join(root, "flat.bin"))
    moto.upload_folder(BUCKET, root, prefix="tok/")
    return root


def _url(server, nginx, moto):
    if server == "http":
        return f"{nginx.url}/tok", dict(FAST)
    return f"s3://{BUCKET}/tok", {**moto.storage_options, **FAST}


def _batches(ds, **kw):
    return list(ll.DataLoader(ds, batch_size=6, shuffle=True, seed=2, num_threads=2, **kw))


@pytest.mark.parametrize("server", ["http", "s3"])
@pytest.mark.parametrize("what,packing", [("meg-{0..1}.bin", "concat"), ("meg-{0..1}.idx", "pack"),
                                          ("dt.ds", "pad"), ("flat.bin", "pack")])
def test_remote_tokens_equal_local(tok_root, nginx, moto, tmp_path, server, what, packing):
    base, so = _url(server, nginx, moto)
    local_paths = [os.path.join(tok_root, p) for p in
                   {"meg-{0..1}.bin": ["meg-0", "meg-1"], "meg-{0..1}.idx": ["meg-0", "meg-1"],
                    "dt.ds": ["dt.ds"], "flat.bin": ["flat.bin"]}[what]]
    local = ll.TokenDataset(local_paths, 20, packing=packing, eos_id=EOS)
    remote = ll.TokenDataset(f"{base}/{what}", 20, packing=packing, eos_id=EOS, storage_options=so,
                             cache_dir=str(tmp_path / "cache"))
    assert len(remote) == len(local)
    assert remote.files[0].path.startswith(base)
    for x, y in zip(_batches(local), _batches(remote)):
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            np.testing.assert_array_equal(x[key], y[key])
    remote.close()


def test_urls_need_the_shard_cache(tok_root, nginx):
    with pytest.raises(ValueError, match=r"TokenDataset reads URLs through the shard cache: pass cache_dir="):
        ll.TokenDataset(f"{nginx.url}/tok/flat.bin", 20, storage_options=dict(FAST))


def test_a_missing_remote_file_is_named(tok_root, nginx, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"token file not found: .*tok/nope\.bin"):
        ll.TokenDataset(f"{nginx.url}/tok/nope.bin", 20, storage_options=dict(FAST), cache_dir=str(tmp_path))


@pytest.mark.parametrize("server", ["http", "s3"])
def test_a_corpus_read_partly_by_range_and_partly_whole(tok_root, nginx, moto, tmp_path, server):
    # pack mode: the Megatron file is read by range, the flat file (scanned for EOS at open)
    # whole (NOTE [ Token files behind URLs ]); together they give the local files' batches.
    base, so = _url(server, nginx, moto)
    local = ll.TokenDataset([os.path.join(tok_root, "meg-0"), os.path.join(tok_root, "flat.bin")], 20,
                            packing="pack", eos_id=EOS)
    remote = ll.TokenDataset([f"{base}/meg-0.idx", f"{base}/flat.bin"], 20, packing="pack", eos_id=EOS,
                             storage_options=so, cache_dir=str(tmp_path / "cache"))
    try:
        assert remote._ranges is not None and remote._ranges.which == [0]
        assert remote.files[1].tokens is not None   # downloaded whole to be scanned
        for x, y in zip(_batches(local), _batches(remote)):
            for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
                np.testing.assert_array_equal(x[key], y[key])
    finally:
        remote.close()
