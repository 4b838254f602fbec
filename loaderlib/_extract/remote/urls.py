"""URLs of remote objects: which strings are URLs, brace ranges, and where a URL's store
ends and its object path begins.

NOTE [ Brace patterns are bounded ]
Brace patterns are expanded into a list of names when a dataset opens, for local paths and
URLs alike. A range one digit too wide (``part-{0000..99999999}.llrec``) named 100 million
shards: the expansion grew to 5.7 GB in 26 s before it was stopped, silently. So a pattern's
size is computed from its braces first (the product of each range's and list's choices,
nothing expanded) and a pattern naming more than ``MAX_BRACE_NAMES`` (1,000,000) names is
refused with an error that gives the count and the limit; the expansion itself stops at the
limit too, whatever the pattern. A million shard names is far beyond any real dataset's
shard count (ImageNet's 1.28 M photos make about 1,000 shards of 1 GB) while the list stays
under about 100 MB; a dataset of one object per file names its files in a list instead.

NOTE [ Unsupported URL schemes ]
A path that starts like a URL (``ftp://host/x``, ``hdfs://...``) but whose scheme no reader
here knows is refused as an "unsupported URL scheme", naming the schemes that are
supported, instead of being taken for a local path that "does not exist".
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["MAX_BRACE_NAMES", "SCHEMES", "ObjectURL", "brace_count", "check_scheme", "expand_braces", "has_glob",
           "is_url", "parse_url"]

# The schemes the remote layer reads: object stores (bucket/key) and plain HTTP(S) servers.
SCHEMES = ("s3", "gs", "http", "https")
_URL = re.compile(r"^(s3|gs|https?)://", re.IGNORECASE)
_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_LIST = re.compile(r"\{([^{}]*,[^{}]*)\}")
_ANY_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")
#: The most names one brace pattern may expand to (NOTE [ Brace patterns are bounded ]).
MAX_BRACE_NAMES = 1_000_000


def is_url(path: object) -> bool:
    """Whether ``path`` is a string naming a remote object (``s3://``, ``gs://``, ``http(s)://``)."""
    return isinstance(path, str) and _URL.match(path) is not None


def check_scheme(path: object, who: str = "") -> None:
    """Refuse a string that looks like a URL of a scheme no reader here knows (NOTE
    [ Unsupported URL schemes ]); anything else passes."""
    if not isinstance(path, str) or is_url(path):
        return
    m = _ANY_SCHEME.match(path)
    if m is not None:
        raise ValueError(f"{who + ': ' if who else ''}unsupported URL scheme {m.group(1)!r} in {path!r}; loaderlib "
                         f"reads local paths and {', '.join(s + '://' for s in SCHEMES)} URLs")


def _brace_choices(pattern: str, at: int) -> tuple[int, int, int] | None:
    """(start, end, number of choices) of the leftmost brace at or after ``at``, or None."""
    m = _RANGE.search(pattern, at)
    n = _LIST.search(pattern, at)
    if m is None and n is None:
        return None
    if m is not None and (n is None or m.start() < n.start()):
        lo, hi = int(m.group(1)), int(m.group(2))
        return m.start(), m.end(), max(0, hi - lo + 1)
    assert n is not None
    return n.start(), n.end(), n.group(1).count(",") + 1


def brace_count(pattern: str | os.PathLike) -> int:
    """How many names a brace pattern expands to, computed from its braces alone (nothing is
    expanded: NOTE [ Brace patterns are bounded ])."""
    pattern = os.fspath(pattern)
    total, at = 1, 0
    while (b := _brace_choices(pattern, at)) is not None:
        total *= b[2]
        at = b[1]
    return total


def expand_braces(pattern: str | os.PathLike, limit: int | None = None) -> list[str]:
    """Every string a brace pattern names, in order.

    ``{0000..0099}`` is a numeric range, zero-padded to the width of its first bound
    (WebDataset's notation); ``{train,val}`` is a list. Several braces multiply out, leftmost
    slowest. A string without braces is returned alone. A pattern that names more than
    ``limit`` (default ``MAX_BRACE_NAMES``) strings is refused before anything is expanded
    (NOTE [ Brace patterns are bounded ]).

    >>> expand_braces("s3://b/part-{00..02}.tar")
    ['s3://b/part-00.tar', 's3://b/part-01.tar', 's3://b/part-02.tar']
    """
    pattern = os.fspath(pattern)
    limit = MAX_BRACE_NAMES if limit is None else int(limit)
    count = brace_count(pattern)
    if count > limit:
        raise ValueError(f"the brace pattern {pattern!r} names {count:,} paths, more than the limit of {limit:,}; "
                         "check the range's bounds (a digit too many?), or list the paths instead")
    out: list[str] = []
    _expand_into(pattern, out, limit, pattern)
    return out


def _expand_into(pattern: str, out: list[str], limit: int, whole: str) -> None:
    m = _RANGE.search(pattern)
    n = _LIST.search(pattern)
    if m is None and n is None:
        if len(out) >= limit:   # a pattern whose braces form new ones as they expand
            raise ValueError(f"the brace pattern {whole!r} names more than the limit of {limit:,} paths")
        out.append(pattern)
        return
    choices: Any
    if m is not None and (n is None or m.start() < n.start()):
        lo, hi = m.group(1), m.group(2)
        if int(hi) < int(lo):
            raise ValueError(f"brace range {m.group(0)!r} in {whole!r} runs backwards")
        choices = (str(k).zfill(len(lo)) for k in range(int(lo), int(hi) + 1))
        start, end = m.start(), m.end()
    else:
        assert n is not None
        choices = n.group(1).split(",")
        start, end = n.start(), n.end()
    for c in choices:
        _expand_into(pattern[:start] + c + pattern[end:], out, limit, whole)


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
