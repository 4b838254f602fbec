"""loaderlib: a data loader whose common path runs in nogil kernels on an OpenMP pool."""

from . import batchify, sampler, transforms
from ._build import build_info
from .arena import BatchArena
from .datasets import (
    ArrayDataset,
    Dataset,
    ImageFolderDataset,
    ImageListDataset,
    RecordFileDataset,
    SimpleDataset,
    TupleDataset,
    write_records,
)
from .decode import DecodeError, decode, decode_batch, jpeg_info
from .errors import DecodeWarning, LoaderError
from .loader import DataLoader, LoaderTimeoutError, SampleFailure, WorkerError
from .sampler import BatchSampler, RandomSampler, SequentialSampler, ShardedSampler, WeightedRandomSampler

__version__ = "0.1.0"

__all__ = [
    "build_info",
    "decode",
    "decode_batch",
    "jpeg_info",
    "DecodeError",
    "DecodeWarning",
    "LoaderError",
    "transforms",
    "batchify",
    "sampler",
    "BatchArena",
    "Dataset",
    "SimpleDataset",
    "ArrayDataset",
    "TupleDataset",
    "ImageFolderDataset",
    "ImageListDataset",
    "RecordFileDataset",
    "write_records",
    "DataLoader",
    "LoaderTimeoutError",
    "SampleFailure",
    "WorkerError",
    "SequentialSampler",
    "RandomSampler",
    "BatchSampler",
    "WeightedRandomSampler",
    "ShardedSampler",
]
