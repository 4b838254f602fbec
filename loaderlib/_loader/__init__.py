"""The parts of :class:`loaderlib.DataLoader` (``loaderlib/loader.py``), one module per concern.

* ``elastic``: every rank's state merged into one that resumes on any layout (``merge_state_dicts``).
* ``analysis``: which engine runs a dataset, chain and batchify function, and why (``explain()``).
* ``options``: the constructor's arguments checked once (``LoaderOptions``).
* ``output``: what a delivered batch becomes (batch transform, torch tensors) and pinning checks.
* ``state``: the state dict and the order a fresh or resumed epoch runs.
"""
