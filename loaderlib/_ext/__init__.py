"""Compiled kernels. Private: each module here has one owner module in loaderlib."""
