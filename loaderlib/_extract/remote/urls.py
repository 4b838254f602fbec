"""URLs of remote objects: which strings are URLs, brace ranges, and where a URL's store
ends and its object path begins."""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

__all__ = ["SCHEMES", "ObjectURL", "expand_braces", "has_glob", "is_url", "parse_url"]

# The schemes the remote layer reads: object stores (bucket/key) and plain HTTP(S) servers.
SCHEMES = ("s3", "gs", "http", "https")
_URL = re.compile(r"^(s3|gs|https?)://", re.IGNORECASE)
_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_LIST = re.compile(r"\{([^{}]*,[^{}]*)\}")


def is_url(path: object) -> bool:
    """Whether ``path`` is a string naming a remote object (``s3://``, ``gs://``, ``http(s)://``)."""
    return isinstance(path, str) and _URL.match(path) is not None


def expand_braces(pattern: str | os.PathLike) -> list[str]:
    """Every string a brace pattern names, in order.

    ``{0000..0099}`` is a numeric range, zero-padded to the width of its first bound
    (WebDataset's notation); ``{train,val}`` is a list. Several braces multiply out, leftmost
    slowest. A string without braces is returned alone.

    >>> expand_braces("s3://b/part-{00..02}.tar")
    ['s3://b/part-00.tar', 's3://b/part-01.tar', 's3://b/part-02.tar']
    """
    pattern = os.fspath(pattern)
    m = _RANGE.search(pattern)
    n = _LIST.search(pattern)
    if m is None and n is None:
        return [pattern]
    if m is not None and (n is None or m.start() < n.start()):
        lo, hi = m.group(1), m.group(2)
        if int(hi) < int(lo):
            raise ValueError(f"brace range {m.group(0)!r} in {pattern!r} runs backwards")
        choices = [str(k).zfill(len(lo)) for k in range(int(lo), int(hi) + 1)]
        start, end = m.start(), m.end()
    else:
        choices = n.group(1).split(",")
        start, end = n.start(), n.end()
    out: list[str] = []
    for c in choices:
        out += expand_braces(pattern[:start] + c + pattern[end:])
    return out


def has_glob(path: str) -> bool:
    """Whether ``path`` holds a glob wildcard (``*``, ``?``, ``[``)."""
    return any(c in path for c in "*?[")


@dataclass(frozen=True)
class ObjectURL:
    """A URL split into the store that holds the object and the object's path in it.

    For ``s3://bucket/a/b.tar`` the store is ``s3://bucket`` and the path ``a/b.tar``; for
    ``https://host:8080/data/b.tar`` the store is the origin ``https://host:8080`` and the
    path ``data/b.tar``.
    """

    scheme: str
    store: str      # the store's root URL: "s3://bucket", "https://host:port"
    path: str       # the object path inside the store, no leading "/"

    @property
    def url(self) -> str:
        return f"{self.store}/{self.path}"

    @property
    def is_object_store(self) -> bool:
        return self.scheme in ("s3", "gs")

    def child(self, path: str) -> ObjectURL:
        return ObjectURL(self.scheme, self.store, path)

    def matches(self, pattern: str) -> bool:
        """Whether this object's path matches a glob on paths (``*`` does not cross ``/``)."""
        return _glob_re(pattern).fullmatch(self.path) is not None


def _glob_re(pattern: str) -> re.Pattern:
    # fnmatch's '*' crosses '/', a shell's does not: translate segment by segment so
    # "train/*.tar" does not match "train/sub/x.tar"; "**" matches any depth.
    parts = []
    for seg in pattern.split("/"):
        if seg == "**":
            parts.append("(?:.*/)?")
            continue
        rx = fnmatch.translate(seg)[4:-3]     # strip fnmatch's "(?s:" ... ")\Z"
        parts.append(rx.replace(".*", "[^/]*") + "/")
    return re.compile("".join(parts)[:-1] if parts else "")


@functools.lru_cache(maxsize=1 << 14)
def parse_url(url: str) -> ObjectURL:
    """Split a URL into store and object path; ``ValueError`` for what is not a remote URL.
    Cached: a shard's URL is parsed for every request that reads it."""
    if not is_url(url):
        raise ValueError(f"{url!r} is not a URL this reader knows (schemes: {', '.join(SCHEMES)})")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if not parts.netloc:
        raise ValueError(f"{url!r} has no {'bucket' if scheme in ('s3', 'gs') else 'host'}")
    path = unquote(parts.path).lstrip("/")
    if parts.query:
        raise ValueError(f"{url!r}: query strings are not supported in object URLs")
    return ObjectURL(scheme, f"{scheme}://{parts.netloc}", path)
