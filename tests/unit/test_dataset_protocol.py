"""Datasets describe themselves (``element_spec()``, ``native_source()``, ``unwrap()``,
``zipped_arrays()``): the Pipeline and the loader ask them and never test dataset types."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import pkgutil

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import _datasets, datasets
from loaderlib.pipeline import TensorSpec
from tests.kernels._loader_images import make_image_folder

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The Pipeline (pipeline.py, _pipeline/), the loader (loader.py, _loader/) and its engines.
SCANNED = ["loaderlib/pipeline.py", "loaderlib/loader.py", "loaderlib/_pipeline", "loaderlib/_loader",
           "loaderlib/_engines"]


def dataset_types() -> set[str]:
    """Names of loaderlib's dataset classes (those of every module of ``loaderlib/_datasets/``,
    where each family lives), the base class ``Dataset`` excepted (asking whether an object is
    a loaderlib Dataset at all, to call its methods, is no type test)."""
    out = set()
    families = pkgutil.walk_packages(_datasets.__path__, _datasets.__name__ + ".")
    for mod in (importlib.import_module(m.name) for m in families):
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and issubclass(obj, datasets.Dataset) and obj is not datasets.Dataset:
                out.add(name)
    return out


def _names(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Tuple):
        return [n for e in node.elts for n in _names(e)]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    return []


def type_tests(tree: ast.AST, types: set[str]) -> list[tuple[int, str]]:
    """``isinstance``/``issubclass`` calls and ``type(x) is/== C`` comparisons naming ``types``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "issubclass") \
                and len(node.args) == 2:
            found += [(node.lineno, n) for n in _names(node.args[1]) if n in types]
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call) \
                and isinstance(node.left.func, ast.Name) and node.left.func.id == "type":
            found += [(node.lineno, n) for c in node.comparators for n in _names(c) if n in types]
    return found


def test_the_scan_finds_type_tests():
    types = dataset_types()
    assert {"ImageFolderDataset", "RecordFileDataset", "ArrayDataset", "TupleDataset", "_TransformDataset",
            "WebDataset", "ImageRecordDataset", "MixtureDataset", "TokenDataset"} <= types
    tree = ast.parse("isinstance(ds, (ImageFolderDataset, x.ImageListDataset))\nif type(d) is ArrayDataset: pass\n"
                     "isinstance(ds, Dataset)\n")
    assert type_tests(tree, types) == [(1, "ImageFolderDataset"), (1, "ImageListDataset"), (2, "ArrayDataset")]


def test_no_dataset_type_test_in_the_pipeline_or_the_loader():
    types = dataset_types()
    found = []
    for entry in SCANNED:
        path = ROOT / entry
        for f in [path] if path.is_file() else sorted(path.rglob("*.py")):
            for line, name in type_tests(ast.parse(f.read_text(), str(f)), types):
                found.append(f"{f.relative_to(ROOT)}:{line}: {name}")
    assert not found, "dataset type tests (ask the dataset instead: element_spec(), native_source(), unwrap(), " \
                      "zipped_arrays()):\n" + "\n".join(found)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp("imgs"), num_classes=2, per_class=3)


IMAGE = TensorSpec((None, None, 3), np.uint8)
LABEL = TensorSpec((), np.int64)


def test_datasets_answer_their_element_spec(folder, tmp_path):
    ds = ll.ImageFolderDataset(folder)
    assert ds.element_spec() == (IMAGE, LABEL)
    assert ll.ImageListDataset(ds.paths).element_spec() == IMAGE
    assert ll.ImageListDataset(ds.paths, labels=list(range(len(ds.paths)))).element_spec() == (IMAGE, LABEL)
    path = tmp_path / "r.llrec"
    ll.write_records(path, [open(p, "rb").read() for p in ds.paths[:3]], labels=[0, 1, 0])
    assert ll.RecordFileDataset(str(path)).element_spec() == (IMAGE, LABEL)
    assert ll.RecordFileDataset(str(path), raw=True).element_spec() == (TensorSpec((None,), np.uint8), LABEL)
    a, b = np.zeros((5, 4, 2), np.float32), np.arange(5)
    assert ll.ArrayDataset(a).element_spec() == TensorSpec((4, 2), np.float32)
    assert ll.ArrayDataset(a, b).element_spec() == (TensorSpec((4, 2), np.float32), TensorSpec((), b.dtype))
    assert ds.transform_first(lambda x: x).element_spec() is None  # a transform changes the items
    assert ll.SimpleDataset([1, 2]).element_spec() is None


def test_the_pipeline_takes_the_spec_from_the_dataset(folder):
    # Each source's spec is the dataset's answer, the same as before for the known formats.
    assert ll.Pipeline.from_folder(folder).element_spec == (IMAGE, LABEL)
    assert ll.Pipeline.from_arrays(np.zeros((3, 2), np.uint8)).element_spec == TensorSpec((2,), np.uint8)

    class Described(ll.Dataset):
        """A dataset that knows its items without reading one: reading would fail."""

        def __len__(self):
            return 4

        def __getitem__(self, i):
            raise AssertionError("the spec must not be traced from an item")

        def element_spec(self):
            return (TensorSpec((7,), np.float32), LABEL)

    assert ll.Pipeline.from_dataset(Described()).element_spec == (TensorSpec((7,), np.float32), LABEL)
    # Without an answer the first item is traced, as for any object.
    assert ll.Pipeline.from_dataset(ll.SimpleDataset([np.zeros(3, np.int16)])).element_spec == \
        TensorSpec((3,), np.int16)


def test_a_tuple_of_arrays_still_runs_as_arrays():
    a, b = np.arange(12, dtype=np.float32).reshape(6, 2), np.arange(6)
    ds = ll.TupleDataset(ll.ArrayDataset(a), b)
    assert [x.tolist() for x in ds.zipped_arrays()] == [a.tolist(), b.tolist()]
    assert ll.TupleDataset(ds, b).zipped_arrays() is None   # a part that is not one array
    loader = ll.DataLoader(ds, batch_size=3, num_threads=1)
    assert loader.engine == "native"
    xs, ys = zip(*[(x, y) for x, y in loader])
    assert np.array_equal(np.concatenate(xs), a) and np.array_equal(np.concatenate(ys), b)
    base, layers = ll.ArrayDataset(a).transform(lambda x: x + 1).transform_first(lambda x: x).unwrap()
    assert isinstance(base, ll.ArrayDataset) and [layer.first for layer in layers] == [False, True]
