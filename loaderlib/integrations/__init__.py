"""Adapters to other data systems (imported on demand; none is needed by ``import loaderlib``)."""
