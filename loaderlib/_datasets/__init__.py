"""Datasets by family, one module or subpackage each: ``base`` (``Dataset`` and its transform
layers), ``images`` (arrays, image folders and lists), ``records`` (record shards),
``webdataset`` (tar shards), ``recordio`` (MXNet ``.rec``), ``mixture`` (``MixtureDataset``),
``iterable`` (iterable datasets on the loader's engines) and ``tokens/`` (token streams). The
public modules (``loaderlib.datasets``, ``loaderlib.records``, ``loaderlib.webdataset``,
``loaderlib.recordio``) are thin over them."""
