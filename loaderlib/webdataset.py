"""WebDataset tar shards read natively: each sample's image is a byte range of its shard.

NOTE [ WebDataset layout ]
A WebDataset shard is a plain (uncompressed) POSIX tar file. Members that share a *key*
form one sample: the key is the member's path up to the first dot of its file name, the
rest is the field (``n01440764/img_001.jpg`` and ``n01440764/img_001.cls`` are key
``n01440764/img_001``, fields ``jpg`` and ``cls``). The image field is the first of ``jpg``,
``jpeg``, ``png`` present; the label is the integer in ``cls``, or from ``json`` (an integer,
or an object's ``"label"``/``"cls"`` entry). Opening a shard reads only the tar headers
(``tarfile`` seeks over the data), so the dataset knows every image's offset and size and
the DataLoader reads and decodes them inside its kernels with ``pread``, like a record file.
Compressed shards (``.tar.gz``) have no byte ranges and are refused.
"""

from __future__ import annotations

import glob
import json
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._extract.remote.files import remote_files
from ._extract.remote.store import expand_urls
from ._extract.remote.urls import expand_braces
from ._extract.shardfiles import ShardFiles
from ._extract.source import NativeSource, SourceKind
from .datasets import Dataset
from .decoding import decode
from .errors import LoaderError

__all__ = ["WebDataset", "expand_shards"]

IMAGE_FIELDS = ("jpg", "jpeg", "png")


def expand_shards(shards: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Shard paths from a path, a list, a glob (``*.tar``) or a brace range
    (``train-{0000..0099}.tar``, WebDataset's notation; at most ``MAX_BRACE_NAMES`` names,
    NOTE [ Brace patterns are bounded ] in ``_extract/remote/urls.py``)."""
    if isinstance(shards, (str, os.PathLike)):
        pattern = os.fspath(shards)
        names = expand_braces(pattern)
        if names != [pattern]:
            out: list[str] = []
            for name in names:
                out += expand_shards(name)
            return out
        if any(c in pattern for c in "*?["):
            found = sorted(glob.glob(pattern))
            if not found:
                raise FileNotFoundError(f"no shard matches {pattern!r}")
            return found
        return [pattern]
    out = []
    for s in shards:
        out += expand_shards(s)
    return out


def _label(field: str, data: bytes, where: str) -> Any:
    text = data.decode("utf-8", "replace").strip()
    if field == "cls":
        try:
            return int(text)
        except ValueError:
            raise LoaderError(f"{where}: .cls holds {text[:40]!r}, not an integer") from None
    obj = json.loads(text)
    if isinstance(obj, int):
        return obj
    if isinstance(obj, dict):
        for k in ("label", "cls"):
            if isinstance(obj.get(k), int):
                return obj[k]
    return obj


class WebDataset(ShardFiles, Dataset):
    """Samples of WebDataset tar shards: ``(HWC uint8 RGB image, label)`` or the image alone.

    Parameters
    ----------
    shards : str, path or list
        One shard, a list, a glob (``"train-*.tar"``) or a brace range
        (``"train-{0000..0009}.tar"``). See NOTE [ WebDataset layout ]. URLs too
        (``s3://``, ``gs://``, ``http(s)://``; globs in object stores); see
        NOTE [ Remote datasets: cache or ranges ]. Without the cache each shard is read
        whole once when the dataset opens, to index its members, then by byte range.
    storage_options : dict, optional
        For URLs: boto3's names (``endpoint_url``, ``aws_access_key_id``, ...), ``timeout``,
        ``max_retries``; the AWS environment variables otherwise.
    cache_dir : str, optional
        For URLs: download whole shards into this folder and read them as local files.
    cache_limit : int or str, optional
        Bytes (or ``"20GB"``) the cache may hold: at least the largest shard; the dataset
        holds only the shards it is reading (NOTE [ Shards held by a dataset ]).

    Attributes
    ----------
    paths : list of str
        The shards, in order.
    keys : list of str
        Each sample's key, shard by shard in tar order.
    labels : numpy.ndarray or None
        int64 labels when every sample has an integer label; None when no sample has one.
    shard_of, offsets, sizes : numpy.ndarray
        Where each sample's image bytes are: shard number, byte offset, length.

    Notes
    -----
    A DataLoader over a WebDataset (with a native transform chain) runs on the native
    engine: reads, decodes and transforms happen in the kernels. Shuffling is global (any
    sampler works: the reads are random access); ranks use ``ShardedSampler``.
    """

    def __init__(self, shards: str | os.PathLike | Sequence[str | os.PathLike], *,
                 storage_options: dict | None = None, cache_dir: str | os.PathLike | None = None,
                 cache_limit: int | str | None = None) -> None:
        self._remote = remote_files(shards, storage_options, cache_dir, cache_limit, "WebDataset")
        if self._remote is None:
            self.urls = None
            self.paths = expand_shards(shards)
        else:
            self.urls = expand_urls([shards] if isinstance(shards, str) else list(shards), self._remote.options,
                                    suffixes=(".tar",))
            self.paths = ([self._remote.cache.path_of(u) for u in self.urls] if self._remote.cached
                          else list(self.urls))
        if not self.paths:
            raise ValueError("WebDataset needs at least one shard")
        if self._remote is not None and self._remote.cached:
            self._remote.cache.prefetch(self.urls)      # indexed one by one as they arrive
        shard_of, offsets, sizes, keys, labels, fields = [], [], [], [], [], []
        for s, path in enumerate(self.paths):
            if self._remote is not None and self._remote.cached:
                # Held only while it is indexed (NOTE [ Shards held by a dataset ]).
                with self._remote.cache.acquire(self.urls[s]) as lease:
                    members = self._index(lease.path)
            else:
                members = self._index(path, self._remote.open_bytes(path) if self._ranges else None)
            for key, (field, off, size), label in members:
                shard_of.append(s)
                offsets.append(off)
                sizes.append(size)
                keys.append(key)
                labels.append(label)
                fields.append(field)
        self.shard_of = np.asarray(shard_of, np.int64)
        self.offsets = np.asarray(offsets, np.int64)
        self.sizes = np.asarray(sizes, np.int64)
        self.keys = keys
        self.fields = fields
        if labels and all(isinstance(v, int) for v in labels):
            self.labels: Any = np.asarray(labels, np.int64)
        elif all(v is None for v in labels):
            self.labels = None
        else:
            self.labels = labels   # Python objects (json): collated in Python
        self._init_files()

    @property
    def _ranges(self) -> bool:
        """Members are read by byte range from a store (NOTE [ Remote datasets: cache or ranges ])."""
        return self._remote is not None and not self._remote.cached

    @staticmethod
    def _index(path: str, fileobj: Any = None) -> list:
        import tarfile  # here, not at import: NOTE [ What import costs ] in loaderlib/__init__.py

        try:
            tf = tarfile.open(path if fileobj is None else None, "r:", fileobj=fileobj)  # noqa: SIM115 - closed below
        except FileNotFoundError:
            raise FileNotFoundError(f"WebDataset shard {path!r} does not exist") from None
        except tarfile.ReadError as e:
            raise LoaderError(f"WebDataset shard {path!r} is not an uncompressed tar file ({e}); compressed "
                              "shards cannot be read by byte range") from None
        groups: dict[str, dict] = {}
        order: list[str] = []
        with tf:
            for m in tf:
                if not m.isfile():
                    continue
                base = os.path.basename(m.name)
                if "." not in base or base.startswith("."):
                    continue
                dot = base.index(".")
                key = m.name[:len(m.name) - len(base) + dot]
                field = base[dot + 1:].lower()
                if key not in groups:
                    groups[key] = {}
                    order.append(key)
                groups[key][field] = m
            out = []
            skipped = 0
            for key in order:
                g = groups[key]
                image = next((f for f in IMAGE_FIELDS if f in g), None)
                if image is None:
                    skipped += 1
                    continue
                m = g[image]
                label = None
                for f in ("cls", "json"):
                    if f in g:
                        data = tf.extractfile(g[f]).read()
                        label = _label(f, data, f"{path}:{key}.{f}")
                        break
                out.append((key, (image, m.offset_data, m.size), label))
        if skipped:
            warnings.warn(f"WebDataset shard {path!r}: {skipped} sample(s) without a {'/'.join(IMAGE_FIELDS)} "
                          "member were skipped", RuntimeWarning, stacklevel=3)
        return out

    def __len__(self) -> int:
        return int(self.offsets.size)

    @property
    def shard_sizes(self) -> list[int]:
        """Samples per shard, in order (for ``sampler.ShardShuffleSampler``)."""
        return np.bincount(self.shard_of, minlength=len(self.paths)).tolist()

    def native_source(self) -> NativeSource | None:
        """SHARDS: members read by byte range with ``pread`` by the kernels (None when labels
        are not one integer per sample); BUFFERS for shards in a store, read by byte range
        or sliced from the shard cache's copies."""
        if self.labels is not None and not isinstance(self.labels, np.ndarray):
            return None
        if self._remote is not None and self._remote.cached:
            return NativeSource(SourceKind.BUFFERS, stage="WebDataset: slices of the shard cache's local copies",
                                dataset=self, labels=self.labels, description=repr(self))
        if self._ranges:
            return NativeSource(SourceKind.BUFFERS, stage="WebDataset: members by byte range from the store, a "
                                "batch's requests concurrent", dataset=self, labels=self.labels, description=repr(self))
        return NativeSource(SourceKind.SHARDS,
                            stage="WebDataset: byte ranges of the tar shards, pread inside the kernel",
                            dataset=self, labels=self.labels, description=repr(self))

    def source(self, idx: int) -> str | None:
        i = int(idx)
        return f"{(self.urls or self.paths)[int(self.shard_of[i])]}:{self.keys[i]}.{self.fields[i]}"

    def read(self, idx: int) -> bytes:
        """The raw image bytes of sample ``idx``."""
        i = int(idx)
        if self._ranges:
            s = int(self.shard_of[i])
            return bytes(self._remote.read([self.paths[s]], self.offsets[i:i + 1], self.sizes[i:i + 1], [i])[0])
        if self._remote is not None:
            return self._read_cached(i)
        size = int(self.sizes[i])
        data = os.pread(self.fileno(int(self.shard_of[i])), size, int(self.offsets[i]))
        if len(data) != size:
            raise LoaderError(f"{self.source(i)}: shard ends after {len(data)} of {size} bytes")
        return data

    def __getitem__(self, idx: int) -> Any:
        i = int(idx)
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {idx} out of range for a WebDataset of {len(self)} samples")
        i %= len(self)
        return self.item_from_bytes(i, self.read(i))

    def item_from_bytes(self, i: int, data: Any) -> Any:
        """Item ``i`` from its image bytes ``data`` (read ahead by the loader)."""
        img = decode(data, source=self.source(i))
        if self.labels is None:
            return img
        return img, self.labels[i] if isinstance(self.labels, list) else int(self.labels[i])

    def __repr__(self) -> str:
        return f"WebDataset({len(self.paths)} shards, {len(self)} samples)"
