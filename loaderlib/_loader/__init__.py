"""The parts of :class:`loaderlib.DataLoader` (``loaderlib/loader.py``), one module per concern.

* ``elastic``: every rank's state merged into one that resumes on any layout (``merge_state_dicts``),
  and one rank's state spread over every rank when the ranks ran in step.
* ``analysis``: which engine runs a dataset, chain and batchify function, and why (``explain()``).
* ``options``: the constructor's arguments checked once (``LoaderOptions``).
* ``output``: what a delivered batch becomes (batch transform, torch tensors) and pinning checks.
* ``producers``: the producer that runs one epoch on the engine the analysis chose.
* ``state``: the state dict and the order a fresh or resumed epoch runs.
"""
