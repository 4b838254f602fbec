"""URL parsing, brace ranges, globs, and storage_options / AWS environment resolution."""

from __future__ import annotations

import pytest

from loaderlib._extract.remote.options import StoreOptions
from loaderlib._extract.remote.urls import expand_braces, is_url, parse_url


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
