"""Reading datasets from object stores (``s3://``, ``gs://``) and HTTP(S) servers.

- ``urls``: which strings are URLs, brace ranges, store/path split.
- ``options``: ``storage_options`` and the AWS environment variables.
- ``store``: one store's requests (head, get, ranges, list) and their errors.
- ``shard_cache``: whole shards downloaded ahead into a local folder, shared by processes.
- ``files``: a dataset's view of its URLs: per-sample reads, whole objects, the cached shards it holds.
- ``readahead``: a store's samples read ahead of the batches, at the read-ahead depth.

The storage library is imported lazily: ``import loaderlib`` never needs it.
"""

from .options import StoreOptions
from .store import ObjectInfo, RemoteStore, expand_urls, open_store, read_ranges
from .urls import expand_braces, is_url, parse_url

__all__ = ["ObjectInfo", "RemoteStore", "StoreOptions", "expand_braces", "expand_urls", "is_url",
           "open_store", "parse_url", "read_ranges"]
