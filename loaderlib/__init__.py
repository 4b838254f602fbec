"""loaderlib: a data loader whose common path runs in nogil kernels on an OpenMP pool.

NOTE [ What import costs ]
Importing a module costs resident memory for as long as the process lives: its code objects,
and any shared library it loads (``hashlib`` maps libcrypto, 3.6 MB of PSS). Every process
that imports loaderlib pays it: the training process, and each worker process of the
processes engine, which is a fresh interpreter. So modules that only some calls need are
imported inside those calls: ``hashlib`` (cache and pipeline fingerprints, shard-cache
names), ``tarfile`` (WebDataset indexing), ``tempfile``, ``uuid`` and ``zipfile`` (record
writing and index checks), ``shutil`` (pipeline cache commits) and ``html`` (the stats
table in a notebook). ``import loaderlib`` then adds 8.6 MB of PSS to numpy's, against
14 MB before (``tests/unit/test_import_cost.py`` keeps those modules out). A loader's first
seed imports ``numpy.random``, which brings ``hashlib`` along (through ``secrets``); the
others stay out of a training process that never calls what needs them.
"""

# First: a missing or broken build fails here with advice (NOTE [ Check the build first ]).
from . import _check_build  # noqa: F401  # isort: skip
from . import batchify, sampler, transforms
from ._autotune import AUTOTUNE
from ._build import build_info
from ._datasets.tokens.write import TokenWriteReport, write_tokens
from ._device import DeviceLoader, to_device
from ._loader.elastic import merge_state_dicts
from ._observe.probe import probe_storage
from ._observe.recorder import StageRecorder
from ._threads import available_cpus, default_num_threads
from ._worker_info import WorkerInfo, get_worker_info
from .arena import BatchArena
from .datasets import (
    ArrayDataset,
    Dataset,
    ImageFolderDataset,
    ImageListDataset,
    MixtureDataset,
    SimpleDataset,
    TokenDataset,
    TupleDataset,
)
from .decoding import DecodeError, decode, decode_batch, jpeg_info
from .errors import (
    DecodeWarning,
    LoaderError,
    LoaderTimeoutError,
    RemoteReadError,
    SampleFailure,
    SkipWarning,
    StateError,
    WorkerError,
)
from .loader import DataLoader
from .pipeline import Pipeline
from .recordio import ImageRecordDataset
from .records import PackReport, RecordFileDataset, pack, write_records
from .sampler import BatchSampler, RandomSampler, SequentialSampler, ShardedSampler, WeightedRandomSampler
from .stats import Stats
from .webdataset import WebDataset, write_webdataset, write_webdataset_index

__version__ = "0.1.0"

__all__ = [
    "AUTOTUNE",
    "ArrayDataset",
    "BatchArena",
    "BatchSampler",
    "DataLoader",
    "Dataset",
    "DecodeError",
    "DecodeWarning",
    "DeviceLoader",
    "ImageFolderDataset",
    "ImageListDataset",
    "ImageRecordDataset",
    "LoaderError",
    "LoaderTimeoutError",
    "MixtureDataset",
    "PackReport",
    "Pipeline",
    "RandomSampler",
    "RecordFileDataset",
    "RemoteReadError",
    "SampleFailure",
    "SequentialSampler",
    "ShardedSampler",
    "SimpleDataset",
    "SkipWarning",
    "StageRecorder",
    "StateError",
    "Stats",
    "TokenDataset",
    "TokenWriteReport",
    "TupleDataset",
    "WebDataset",
    "WeightedRandomSampler",
    "WorkerError",
    "WorkerInfo",
    "available_cpus",
    "batchify",
    "build_info",
    "decode",
    "decode_batch",
    "default_num_threads",
    "get_worker_info",
    "jpeg_info",
    "merge_state_dicts",
    "pack",
    "probe_storage",
    "sampler",
    "to_device",
    "transforms",
    "write_records",
    "write_tokens",
    "write_webdataset",
    "write_webdataset_index",
]
