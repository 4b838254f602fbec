"""The engines layer: what runs an epoch, batch by batch, below ``DataLoader`` and ``Pipeline``.

An engine is a :class:`~loaderlib._engines.base.Producer` (NOTE [ Engine stages ]): the run's
driver thread asks it for each batch of the epoch's plan (a ``RunState``, NOTE [ Iterator
state ]) and queues the batches for the user. Which engine a loader runs is decided in
``loader.py``; the engines only produce.

- ``base.py``: the epoch plan (``RunState``, ``Task``), the ``Producer`` interface, the
  prefetch queue, the driver thread and the iterator the user holds.
- ``native.py``: the native engine, one nogil kernel pass per batch into an arena slot.
- ``threads.py``: the threads engine (``dataset[i]`` or a chain's Python tail on the loader's
  pool of daemon threads) and that pool.
- ``collate.py``: Python samples collated into arena memory (threads engine, workers, iterables).
- ``processes.py``: the processes engine, persistent worker processes writing into
  shared-memory slots, and those slots.
- ``worker.py``: the body of a worker process.
- ``messages.py``: the messages between the loader and its workers, one type each.

Imported by module (``from loaderlib._engines.base import RunState``): this file imports
nothing, so importing one engine never imports the others.
"""
