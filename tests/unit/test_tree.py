"""tree_map and tree_leaves: the one walker over batch and element structures (``loaderlib/_tree.py``)."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from loaderlib._tree import is_namedtuple, tree_leaves, tree_map
from loaderlib.batchify import Shards

Point = collections.namedtuple("Point", "x y")


class Tagged(list):
    """A list subclass with a meaning of its own, as ``batchify.Shards``."""


def test_tuples_lists_and_dicts_are_containers_and_keep_their_type():
    tree = ({"a": [1, 2], "b": (3,)}, 4)
    out = tree_map(lambda x: x * 10, tree)
    assert out == ({"a": [10, 20], "b": (30,)}, 40)
    assert type(out[0]["a"]) is list and type(out[0]["b"]) is tuple
    assert tree_leaves(tree) == [1, 2, 3, 4]


def test_dicts_keep_their_key_order_and_must_match_by_keys():
    assert list(tree_map(lambda x: x, {"b": 1, "a": 2})) == ["b", "a"]
    assert tree_map(lambda x, y: x + y, {"a": 1, "b": 2}, {"b": 20, "a": 10}) == {"a": 11, "b": 22}
    with pytest.raises(ValueError, match=r"structures differ: a dict with keys \['a'\] vs a dict with keys \['b'\]"):
        tree_map(lambda x, y: x, {"a": 1}, {"b": 1})


def test_namedtuples_are_containers_rebuilt_as_themselves():
    p = Point(np.zeros(2), 1)
    out = tree_map(lambda x: x + 1, p)
    assert type(out) is Point and out.y == 2
    np.testing.assert_array_equal(out.x, [1, 1])
    assert is_namedtuple(p) and not is_namedtuple((1, 2)) and not is_namedtuple(Tagged())
    assert tree_leaves([p, Point(3, 4)])[1:] == [1, 3, 4]
    with pytest.raises(ValueError, match="structures differ: a Point of 2 vs a tuple of 2"):
        tree_map(lambda a, b: a, p, (1, 2))


def test_list_subclasses_are_leaves():
    shards = Shards(np.zeros((4, 2)), 2)
    assert tree_leaves((shards, 1)) == [shards, 1]
    seen = []
    out = tree_map(lambda x: seen.append(type(x)) or x, {"t": Tagged([1, 2]), "s": shards})
    assert seen == [Tagged, Shards] and out["t"] == [1, 2] and out["s"] is shards


def test_structures_must_match_down_to_the_first_trees_leaves():
    assert tree_map(lambda a, b: (a, b), (1, 2), (3, [4])) == ((1, 3), (2, [4]))   # below a leaf: anything
    with pytest.raises(ValueError, match="structures differ: a tuple of 2 vs a list of 2"):
        tree_map(lambda a, b: a, (1, 2), [1, 2])
    with pytest.raises(ValueError, match="structures differ: a list of 2 vs a list of 3"):
        tree_map(lambda a, b: a, [1, 2], [1, 2, 3])
    assert tree_map(len, ([1, 2], [3]), is_leaf=lambda x: isinstance(x, list)) == (2, 1)
