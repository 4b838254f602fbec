"""One walker over batch structures: nested tuples, lists and dicts of leaves.

Every place that rebuilds a batch leaf by leaf (writing it into a shared-memory slot,
reading it back, joining two batches, copying one) calls :func:`tree_map` instead of
carrying its own recursion.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["tree_map"]


def tree_map(fn: Callable[..., Any], tree: Any, *rest: Any, is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """``fn`` applied to the leaves of ``tree`` (and the matching leaves of ``rest``).

    Tuples, lists and dicts are containers and keep their type (a ``list`` subclass such as
    ``batchify.Shards`` is a leaf: it is a view of one array, not a structure); anything else,
    or anything ``is_leaf`` accepts, is a leaf.
    """
    if is_leaf is not None and is_leaf(tree):
        return fn(tree, *rest)
    t = type(tree)
    if t is tuple or t is list:
        return t(tree_map(fn, x, *(r[k] for r in rest), is_leaf=is_leaf) for k, x in enumerate(tree))
    if t is dict:
        return {k: tree_map(fn, v, *(r[k] for r in rest), is_leaf=is_leaf) for k, v in tree.items()}
    return fn(tree, *rest)
