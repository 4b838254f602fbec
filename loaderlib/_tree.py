"""One walker over batch and element structures: nested tuples, lists and dicts of leaves.

Every place that rebuilds a batch or a Pipeline element leaf by leaf (writing it into a
shared-memory slot, reading it back, joining two batches, copying one, stacking elements,
computing an element spec) calls :func:`tree_map` or :func:`tree_leaves` instead of carrying
its own recursion.

What is a container. ``tuple``, ``list`` and ``dict`` (exactly those types) and namedtuples;
everything else is a leaf, subclasses of ``list``, ``tuple`` or ``dict`` included. This is
torch's pytree rule (``torch.utils._pytree`` walks the node types registered by exact type,
plus namedtuples found by their ``_fields``), not the one of torch's ``default_collate`` or
``tf.nest``, which walk any ``Sequence``/``Mapping`` and rebuild a subclass by calling its
type on a list. A subclass carries a meaning a walker cannot know (``batchify.Shards`` is a
``list`` that is a view of one array, split per device: one leaf), and its constructor need
not take a list; a namedtuple's fields are its structure and ``type(t)(*fields)`` rebuilds
it, so a namedtuple element stays a namedtuple through ``map``, ``batch`` and collation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["is_namedtuple", "tree_leaves", "tree_map"]


def is_namedtuple(x: Any) -> bool:
    """Whether ``x`` is a namedtuple (a ``tuple`` subclass with ``_fields``)."""
    return isinstance(x, tuple) and type(x) is not tuple and isinstance(getattr(type(x), "_fields", None), tuple)


def _kind(x: Any) -> str:
    t = type(x)
    if t is dict:
        return f"a dict with keys {list(x)}"
    if t is tuple or t is list or is_namedtuple(x):
        return f"a {t.__name__} of {len(x)}"
    return "a single value"


def tree_map(fn: Callable[..., Any], tree: Any, *rest: Any, is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """``fn`` applied to the leaves of ``tree`` and the matching leaves of ``rest``.

    Containers (module docstring) keep their type; anything else, or anything ``is_leaf``
    accepts, is a leaf. The trees of ``rest`` must have ``tree``'s structure down to its
    leaves (same container types, lengths and dict keys), else ``ValueError`` saying where
    they differ; below a leaf of ``tree`` they may hold anything.
    """
    if is_leaf is not None and is_leaf(tree):
        return fn(tree, *rest)
    t = type(tree)
    if t is dict:
        for r in rest:
            if type(r) is not dict or r.keys() != tree.keys():
                raise ValueError(f"structures differ: {_kind(tree)} vs {_kind(r)}")
        return {k: tree_map(fn, v, *(r[k] for r in rest), is_leaf=is_leaf) for k, v in tree.items()}
    named = t is not tuple and t is not list and is_namedtuple(tree)
    if t is tuple or t is list or named:
        for r in rest:
            if type(r) is not t or len(r) != len(tree):
                raise ValueError(f"structures differ: {_kind(tree)} vs {_kind(r)}")
        parts = [tree_map(fn, x, *(r[k] for r in rest), is_leaf=is_leaf) for k, x in enumerate(tree)]
        return t(*parts) if named else t(parts)
    return fn(tree, *rest)


def tree_leaves(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> list:
    """The leaves of ``tree``, depth first (dicts in their key order)."""
    out: list = []
    tree_map(out.append, tree, is_leaf=is_leaf)
    return out
