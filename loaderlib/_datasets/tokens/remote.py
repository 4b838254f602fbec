"""Token files behind URLs (``s3://``, ``gs://``, ``http(s)://``), read through the Extract
stage: by range into sparse files, or whole through the shard cache.

NOTE [ Token files behind URLs ]
A token dataset opens a corpus in O(files) (NOTE [ Opening a token corpus ] in formats.py);
behind URLs that stays so: each file's index (``.idx``, ``.ds.index``) is downloaded into the
shard cache when the dataset opens, and its token file is only asked its size (one HEAD).
Files whose content must be read to open them (``.npy`` headers, Arrow and Parquet) are
downloaded when the dataset opens. The token files are then read one of two ways
(``remote_reads``):
- ``"ranges"`` (default): a batch fetches the chunks its rows touch into sparse local files
  before its rows are gathered (NOTE [ Token files read by range ] in ranges.py); flat files
  without an index in ``pack``/``pad`` mode, which are scanned for EOS at open, are read whole
  as below.
- ``"files"``: downloaded whole in the background, in file order, by the cache
  (``RemoteFiles.prefetch``). A batch whose rows lie in files not yet local waits for exactly
  those (``TokenDataset._ensure``), maps them and hands them to the kernel's corpus
  (``Corpus.set_tokens``); a file without its tokens is never read (the kernel answers an error
  for it, not a read of memory). Mapped files stay leased in the cache until the dataset is
  closed, so the cache must have room for the files a run reads.
Without ``cache_dir`` a token dataset cannot read URLs: both ways keep the bytes in a local
folder (the kernel reads spans of files at random, and a range request per row and epoch with
nothing kept would cost a round trip per sample).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..._extract.remote.files import RemoteFiles, remote_files
from ..._extract.remote.store import expand_urls
from .formats import TokenFile, TokenFormatError, open_arrow, open_datatrove, open_flat, open_megatron
from .ranges import CHUNK, TokenRanges

__all__ = ["open_ranges", "open_remote"]

SUFFIXES = (".idx", ".bin", ".npy", ".ds", ".parquet", ".arrow")


def _exists(remote: RemoteFiles, url: str) -> int | None:
    try:
        return remote.size(url)
    except (FileNotFoundError, OSError, LookupError):
        return None
    except Exception as e:   # a store's own "not found" error types
        if "404" in str(e) or "not found" in str(e).lower() or "NoSuchKey" in str(e):
            return None
        raise


def open_remote(sources: Any, *, storage_options: Mapping[str, Any] | None, cache_dir: Any, cache_limit: Any,
                dtype: Any = None, column: str = "input_ids") -> tuple[list[TokenFile], RemoteFiles] | None:
    """The files of ``sources`` when they are URLs (None for local paths), with the
    :class:`RemoteFiles` that downloads them (NOTE [ Token files behind URLs ])."""
    remote = remote_files(sources, storage_options, cache_dir, cache_limit, "TokenDataset")
    if remote is None:
        return None
    if not remote.cached:
        raise ValueError("TokenDataset reads URLs through the shard cache: pass cache_dir= (a local folder; "
                         "cache_limit= bounds it) (NOTE [ Token files behind URLs ])")
    items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    urls = expand_urls([os.fspath(s) for s in items], remote.options, SUFFIXES)
    out: list[TokenFile] = []
    seen: set[str] = set()
    for url in urls:
        if url.endswith((".idx", ".bin")):
            prefix = url[:-4]
            if prefix in seen:
                continue
            bin_size = _exists(remote, prefix + ".bin")
            if url.endswith(".bin") and _exists(remote, prefix + ".idx") is None:
                if bin_size is None:
                    raise FileNotFoundError(f"token file not found: {url}")
                seen.add(prefix)
                out.append(open_flat(url, dtype, remote_size=bin_size))
                continue
            if bin_size is None:
                raise FileNotFoundError(f"token file not found: {prefix}.bin (the data of {prefix}.idx)")
            seen.add(prefix)
            (idx_local,) = remote.local([prefix + ".idx"])
            out.append(_megatron(idx_local, prefix, bin_size))
        elif url.endswith(".ds"):
            size = _exists(remote, url)
            if size is None:
                raise FileNotFoundError(f"token file not found: {url}")
            (index_local,) = remote.local([url + ".index"])
            out.append(open_datatrove(url, dtype, index=index_local, remote_size=size))
        elif url.endswith(".npy"):
            (local,) = remote.local([url])
            out.append(_named(open_flat(local, dtype), url))
        elif url.endswith((".parquet", ".arrow")):
            (local,) = remote.local([url])
            out.append(_named(open_arrow(local, column), url))
        else:
            raise TokenFormatError(f"{url}: not a token file loaderlib knows (Megatron .bin/.idx, .bin, .npy, "
                                   "datatrove .ds, .parquet, .arrow)")
    if not out:
        raise FileNotFoundError(f"no token files at {sources!r}")
    return out, remote


def open_ranges(remote: RemoteFiles, files: list[TokenFile], file_start: Any, corpus: Any, packing: str,
                remote_reads: str) -> TokenRanges | None:
    """Start reading the token files of ``files`` behind URLs: by range into sparse files
    (``remote_reads="ranges"``, NOTE [ Token files read by range ] in ranges.py), or whole,
    downloaded in file order in the background (``"files"``, and the flat files a ``pack`` or
    ``pad`` dataset scans for EOS at open); the :class:`TokenRanges` of the first kind."""
    ranged = [f for f, tf in enumerate(files) if tf.url is not None and remote_reads == "ranges"
              and not (packing != "concat" and tf.bounds is None)]
    whole = [tf.url for f, tf in enumerate(files) if tf.url is not None and f not in ranged]
    if whole:
        remote.prefetch(whole)   # in file order, in the background
    if not ranged:
        return None
    cache = remote.cache
    budget = None
    if cache.limit is not None:
        held = remote.held_bytes() + sum(files[f].num_tokens * files[f].token_dtype.itemsize
                                         for f, tf in enumerate(files) if tf.url is not None and f not in ranged)
        budget = cache.limit - held
        if budget < CHUNK:
            raise ValueError(f"cache_limit={cache.limit} bytes leaves {budget} for chunks of token files read by "
                             f"range: the dataset's whole files (indexes, files read whole) take {held}; raise "
                             "cache_limit (NOTE [ Token files read by range ] in ranges.py)")
    return TokenRanges(files, ranged, file_start, cache.dir, remote.options, budget, corpus)


def _megatron(idx_local: str, prefix: str, bin_size: int) -> TokenFile:
    return open_megatron(prefix, local_idx=idx_local, remote_bin=(prefix + ".bin", bin_size))


def _named(tf: TokenFile, url: str) -> TokenFile:
    from dataclasses import replace

    return replace(tf, path=url)
