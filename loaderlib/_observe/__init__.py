"""What a loader observes about itself and its machine: ``stats`` (the ``Stats`` snapshot and
the one accounting), ``recorder`` (what the engines feed while they run), ``probe`` with
``probe_cpu`` and ``probe_text`` (``doctor --storage``) and ``doctor`` (``python -m loaderlib
doctor``). The public module ``loaderlib.stats`` is thin over ``stats``."""
