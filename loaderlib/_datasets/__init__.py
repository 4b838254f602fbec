"""Datasets by family, one subpackage or module each (tokens: ``tokens/``); the public
modules (``loaderlib.datasets``, ``loaderlib.tokens``) are thin over them."""
