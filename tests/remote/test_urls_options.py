"""URL parsing, brace ranges, globs, and storage_options / AWS environment resolution."""

from __future__ import annotations

import itertools
import re
import tracemalloc

import pytest

import loaderlib as ll
from loaderlib._extract.remote import urls
from loaderlib._extract.remote.options import StoreOptions
from loaderlib._extract.remote.urls import MAX_BRACE_NAMES, brace_count, expand_braces, is_url, parse_url


def test_is_url():
    assert is_url("s3://b/k") and is_url("gs://b/k") and is_url("HTTPS://h/p") and is_url("http://h:1/p")
    assert not is_url("/data/x.tar") and not is_url("file:///x") and not is_url(b"s3://b/k")


def test_brace_ranges_keep_width_and_order():
    assert expand_braces("s3://b/part-{0008..0011}.llrec") == [
        "s3://b/part-0008.llrec", "s3://b/part-0009.llrec", "s3://b/part-0010.llrec", "s3://b/part-0011.llrec"]
    assert expand_braces("h/{train,val}-{0..1}.tar") == ["h/train-0.tar", "h/train-1.tar", "h/val-0.tar",
                                                        "h/val-1.tar"]
    assert expand_braces("plain") == ["plain"]
    with pytest.raises(ValueError, match="runs backwards"):
        expand_braces("p-{5..1}")


def _model(pattern: str) -> list[str]:
    """Brace expansion as documented, written independently: split on each brace left to
    right, one list of choices per brace, the cartesian product with the leftmost slowest."""
    pieces, choices = [], []
    at = 0
    for m in re.finditer(r"\{(\d+)\.\.(\d+)\}|\{([^{}]*,[^{}]*)\}", pattern):
        pieces.append(pattern[at:m.start()])
        if m.group(3) is None:
            lo, hi = m.group(1), m.group(2)
            choices.append([str(k).zfill(len(lo)) for k in range(int(lo), int(hi) + 1)])
        else:
            choices.append(m.group(3).split(","))
        at = m.end()
    tail = pattern[at:]
    return ["".join(p + c for p, c in zip(pieces, combo)) + tail for combo in itertools.product(*choices)]


@pytest.mark.parametrize("pattern", ["plain", "p-{00..11}.tar", "{a,b}/{0..2}-{x,y,z}", "s3://b/{9..10}{,_}.x",
                                     "{0..0}", "d/{001..003}/{train,val}.llrec"])
def test_brace_count_and_expansion_follow_the_model(pattern):
    want = _model(pattern)
    assert expand_braces(pattern) == want
    assert brace_count(pattern) == len(want)


def test_the_limit_is_inclusive_and_names_the_count():
    assert len(expand_braces("a{0..9}{0..9}", limit=100)) == 100
    with pytest.raises(ValueError, match=r"'a\{0\.\.9\}\{0\.\.9\}' names 100 paths, more than the limit of 99"):
        expand_braces("a{0..9}{0..9}", limit=99)
    # Braces that form a new brace as they expand are held to the limit by the expansion itself.
    assert brace_count("{{0..1}..3}") == 2 and len(expand_braces("{{0..1}..3}")) == 7
    with pytest.raises(ValueError, match="names more than the limit of 5 paths"):
        expand_braces("{{0..1}..3}", limit=5)


@pytest.mark.parametrize("make", [
    lambda: ll.RecordFileDataset("http://127.0.0.1:9/part-{0000..99999999}.llrec"),
    lambda: ll.RecordFileDataset("s3://bucket/part-{0000..99999999}.llrec"),
    lambda: ll.RecordFileDataset("/nonexistent/part-{0000..99999999}.llrec"),
    lambda: ll.WebDataset("/nonexistent/train-{0000..99999999}.tar"),
    lambda: ll.WebDataset("https://h.example/train-{0000..99999999}.tar"),
    lambda: ll.ImageFolderDataset("s3://bucket/{0000..99999999}/"),
], ids=["records-http", "records-s3", "records-local", "wds-local", "wds-https", "folder-s3"])
def test_an_oversized_brace_range_fails_before_anything_is_expanded(monkeypatch, make):
    """NOTE [ Brace patterns are bounded ]: 100 million names are refused from the braces
    alone. The expansion is replaced by a tripwire, so the test fails if any name is made
    before the check; the memory traced while the dataset is refused stays tiny."""

    def tripwire(*args, **kw):
        raise AssertionError("a brace pattern was expanded before its size was checked")

    monkeypatch.setattr(urls, "_expand_into", tripwire)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=rf"names 100,000,000 paths, more than the limit of {MAX_BRACE_NAMES:,}"):
            make()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.parametrize("make", [ll.RecordFileDataset, ll.WebDataset, ll.ImageFolderDataset, ll.ImageRecordDataset,
                                  lambda p: ll.ImageListDataset([p, p])])
def test_an_unsupported_scheme_is_named(make):
    with pytest.raises(ValueError, match=r"unsupported URL scheme 'ftp' in 'ftp://host/data/x.tar'; loaderlib reads "
                                         r"local paths and s3://, gs://, http://, https:// URLs"):
        make("ftp://host/data/x.tar")


def test_parse_url_splits_store_and_path():
    u = parse_url("s3://bucket/a/b%20c.tar")
    assert (u.scheme, u.store, u.path) == ("s3", "s3://bucket", "a/b c.tar")
    u = parse_url("http://127.0.0.1:8080/data/x.llrec")
    assert (u.store, u.path, u.is_object_store) == ("http://127.0.0.1:8080", "data/x.llrec", False)
    with pytest.raises(ValueError, match="has no bucket"):
        parse_url("s3:///key")
    with pytest.raises(ValueError, match="not a URL"):
        parse_url("/local/path")


def test_glob_segments():
    u = parse_url("s3://b/train/x.tar")
    assert u.matches("train/*.tar") and u.matches("**/*.tar") and u.matches("train/?.tar")
    assert not u.matches("*.tar")                       # '*' does not cross '/'
    assert not parse_url("s3://b/train/sub/x.tar").matches("train/*.tar")


def test_storage_options_over_environment():
    env = {"AWS_ACCESS_KEY_ID": "envkey", "AWS_SECRET_ACCESS_KEY": "envsecret", "AWS_DEFAULT_REGION": "eu-west-1",
           "AWS_REGION": "eu-north-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:1"}
    o = StoreOptions.resolve({"aws_access_key_id": "given", "timeout": 2}, environ=env)
    assert o.aws_access_key_id == "given" and o.aws_secret_access_key == "envsecret"
    assert o.region_name == "eu-north-1"                # AWS_REGION wins over AWS_DEFAULT_REGION
    assert o.endpoint_url == "http://127.0.0.1:1" and o.timeout == 2
    cfg = o.s3_config()
    assert cfg == {"endpoint": "http://127.0.0.1:1", "access_key_id": "given", "secret_access_key": "envsecret",
                   "region": "eu-north-1"}
    assert o.client_options(url_is_http=False)["allow_http"] is True      # http endpoint
    assert StoreOptions.resolve({}, environ={}).client_options(url_is_http=False)["allow_http"] is False
    # Anything else is passed to the store as it is.
    assert StoreOptions.resolve({"virtual_hosted_style_request": True}, environ={}).s3_config() == {
        "virtual_hosted_style_request": True}


@pytest.mark.parametrize("bad, match", [({"timeout": 0}, "timeout"), ({"max_retries": -1}, "max_retries"),
                                        ({"backoff": "x"}, "backoff")])
def test_bad_storage_options(bad, match):
    with pytest.raises(ValueError, match=match):
        StoreOptions.resolve(bad, environ={})


def test_missing_library_names_the_extra():
    import subprocess
    import sys

    code = ("import sys; sys.modules['obstore'] = None\n"
            "from loaderlib._extract.remote import open_store\n"
            "try:\n    open_store('s3://b/k', {})\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "pip install loaderlib[remote]" in out.stdout, out.stdout + out.stderr
