"""The Extract stage: how a dataset's bytes are found and read, ahead of the compute threads.

- ``source``: ``NativeSource``, what a dataset tells the engines about its bytes (files, shards,
  buffers, pixels, arrays), the readers per kind, and the epoch's order handed to the dataset.
- ``readahead``: the read-ahead policy for local files and record ranges (depth by Little's
  law, reads that are work, memory); the native half is ``pyx/include/ll_readahead.h``.
- ``shardfiles``: shard plumbing shared by the shard formats (record files, WebDataset, RecordIO):
  local descriptors or a store's ranges and cached copies.
- ``remote``: object stores and HTTP (obstore): URLs, ``storage_options``, retries and errors,
  the shard cache, and the read-ahead of a store's samples.
"""
