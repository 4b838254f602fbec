"""WebDataset tar shards (NOTE [ WebDataset layout ] in ``loaderlib/webdataset.py``): indexed
and read by byte range (:class:`WebDataset`), written and indexed (:func:`write_webdataset`,
:func:`write_webdataset_index`).
"""

from __future__ import annotations

import glob
import json
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._checks import parse_bytes
from .._extract.remote.files import remote_files
from .._extract.remote.store import _POOL, expand_urls
from .._extract.remote.urls import expand_braces
from .._extract.shardfiles import ShardFiles
from .._extract.source import NativeSource, SourceKind
from .._extract.wds_index import BLOCK, LABEL_GAP, check_header, index_path, parse_index, write_index
from ..decoding import decode
from ..errors import LoaderError, RemoteReadError
from .base import Dataset

__all__ = ["WebDataset", "expand_shards", "write_webdataset", "write_webdataset_index"]

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
            found = sorted(f for f in glob.glob(pattern) if not f.endswith(".idx"))   # not the sidecars
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
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise LoaderError(f"{where}: .json holds no JSON ({type(e).__name__}: {str(e)[:60]})") from None
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
        NOTE [ Remote datasets: cache or ranges ]. Without the cache the members are read by
        byte range; they are found from the shard's ``.idx`` when one is beside it (NOTE
        [ WebDataset sidecar index ]), else by reading the shard whole once when the dataset
        opens. A brace range names at most 1,000,000 shards.
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
            elif self._ranges:
                # NOTE [ WebDataset sidecar index ] in _extract/wds_index.py: with an .idx the
                # shard is never downloaded whole.
                members = self._index_sidecar(path)
                if members is None:
                    members = self._index(path, self._remote.open_bytes(path))
            else:
                members = self._index(path)
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

    def _index_sidecar(self, url: str) -> list | None:
        """The members of the shard at ``url`` from its ``.idx`` (NOTE [ WebDataset sidecar
        index ]), None when it has none; the image bytes are not read."""
        remote = self._remote
        assert remote is not None
        where = index_path(url)
        try:
            text = remote.fetch(where)
        except RemoteReadError as e:
            if e.status == 404:
                return None
            raise
        samples = parse_index(text.decode("utf-8", "replace"), where, remote.size(url))
        images, labels = [], []
        skipped = 0
        for key, members in samples:
            by_ext = {m.ext: m for m in members}
            image = next((by_ext[f] for f in IMAGE_FIELDS if f in by_ext), None)
            if image is None:
                skipped += 1
                continue
            images.append((key, image))
            labels.append(next((by_ext[f] for f in ("cls", "json") if f in by_ext), None))
        if skipped:
            warnings.warn(f"WebDataset shard {url!r}: {skipped} sample(s) without a {'/'.join(IMAGE_FIELDS)} "
                          "member were skipped", RuntimeWarning, stacklevel=3)
        if not images:
            return []
        # The tar headers of the first and last images must be the index's members.
        ends = list(dict.fromkeys([images[0][1], images[-1][1]]))
        jobs = [(m.offset - BLOCK, m.offset) for m in ends]
        wanted = [m for m in labels if m is not None]
        groups: list[list] = []   # label members whose ranges share a request
        for m in sorted(wanted, key=lambda m: m.offset):
            if groups and m.offset - (groups[-1][-1].offset + groups[-1][-1].size) <= LABEL_GAP:
                groups[-1].append(m)
            else:
                groups.append([m])
        jobs += [(g[0].offset, g[-1].offset + g[-1].size) for g in groups]
        bufs = _POOL.run([lambda s=s, e=e: bytes(remote.read_range(url, s, e)) for s, e in jobs])
        for m, buf in zip(ends, bufs):
            check_header(buf, m, where)
        text_of: dict[int, bytes] = {}
        for g, buf in zip(groups, bufs[len(ends):]):
            for m in g:
                text_of[m.offset] = buf[m.offset - g[0].offset:m.offset - g[0].offset + m.size]
        return [(key, (image.ext, image.offset, image.size),
                 None if lab is None else _label(lab.ext, text_of[lab.offset], f"{url}:{key}.{lab.ext}"))
                for (key, image), lab in zip(images, labels)]

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
            try:
                members = list(tf)   # a damaged header further on: tarfile raises while it iterates
            except tarfile.TarError as e:
                raise LoaderError(f"WebDataset shard {path!r} is damaged ({e})") from None
            for m in members:
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
                        try:
                            data = tf.extractfile(g[f]).read()
                        except tarfile.TarError as e:
                            raise LoaderError(f"WebDataset shard {path!r}: {key}.{f} is damaged ({e})") from None
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


def write_webdataset_index(shard: str | os.PathLike, index: str | os.PathLike | None = None) -> str | None:
    """Write the sidecar index of a local WebDataset tar shard, in NVIDIA DALI's ``wds2idx``
    format (NOTE [ WebDataset sidecar index ] in ``_extract/wds_index.py``).

    Upload it beside the shard (``train-0000.tar`` -> ``train-0000.idx``): a
    :class:`WebDataset` over URLs without the shard cache then reads the members' places from
    it instead of downloading the shard whole to find them.

    Parameters
    ----------
    shard : str or path
        A local, uncompressed tar shard.
    index : str or path, optional
        Where to write it (default: beside the shard, ``.tar`` replaced by ``.idx``).

    Returns
    -------
    str or None
        The index's path; None (with a warning) when a member name holds white space, which
        the format cannot carry.
    """
    return write_index(os.fspath(shard), None if index is None else os.fspath(index))


def write_webdataset(path: str | os.PathLike, items: Any, labels: Sequence[int] | None = None, *,
                     keys: Sequence[str] | None = None, ext: str = "jpg", shard_size: int | str | None = None,
                     overwrite: bool = False, index: bool = True) -> list[str]:
    """Write encoded images (and integer labels) as WebDataset tar shards, each with its
    sidecar ``.idx`` (NOTE [ WebDataset sidecar index ] in ``_extract/wds_index.py``).

    Parameters
    ----------
    path : str or path
        ``X`` (or ``X.tar``): writes ``X.tar``; with ``shard_size``, ``X-00000.tar``,
        ``X-00001.tar``, ...
    items : iterable
        Each a bytes-like encoded image, or a path whose file content is one.
    labels : sequence of int, optional
        One label per image, written as the sample's ``.cls`` member.
    keys : sequence of str, optional
        Each sample's key (default: its number, ``"00000000"``, ...); no dots, slashes or
        white space.
    ext : str
        The image members' extension (``"jpg"``, ``"png"``).
    shard_size : int or str, optional
        Start a new shard once one holds this many bytes (``"1GB"``).
    overwrite : bool
        Replace existing shards (default: refuse with ``FileExistsError``).
    index : bool
        Write each shard's ``.idx`` beside it (default True).

    Returns
    -------
    list of str
        The shards written, in order.
    """
    import io
    import tarfile  # here, not at import: NOTE [ What import costs ] in loaderlib/__init__.py

    base = os.fspath(path)
    if base.endswith(".tar"):
        base = base[:-4]
    limit = parse_bytes(shard_size, "shard_size") if shard_size is not None else None
    if ext not in IMAGE_FIELDS:
        raise ValueError(f"write_webdataset: ext={ext!r}; expected one of {IMAGE_FIELDS}")
    out: list[str] = []
    tf: Any = None
    held = 0

    def open_next() -> Any:
        name = f"{base}-{len(out):05d}.tar" if limit is not None else f"{base}.tar"
        if os.path.exists(name) and not overwrite:
            raise FileExistsError(f"write_webdataset: {name!r} exists (pass overwrite=True to replace it)")
        out.append(name)
        return tarfile.open(name, "w", format=tarfile.USTAR_FORMAT)

    def member(name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o644
        tf.addfile(info, io.BytesIO(data))

    try:
        for i, item in enumerate(items):
            if isinstance(item, (str, os.PathLike)):
                with open(item, "rb") as f:
                    data = f.read()
            else:
                data = bytes(item)
            key = keys[i] if keys is not None else f"{i:08d}"
            if not key or any(c in key for c in "./\\") or any(c.isspace() for c in key):
                raise ValueError(f"write_webdataset: key {key!r} of sample {i} must be non-empty, without dots, "
                                 "slashes or white space")
            if tf is None or (limit is not None and held >= limit):
                if tf is not None:
                    tf.close()
                tf, held = open_next(), 0
            member(f"{key}.{ext}", data)
            held += len(data)
            if labels is not None:
                member(f"{key}.cls", str(int(labels[i])).encode())
        if tf is None:
            raise ValueError("write_webdataset: no items")
        tf.close()
        tf = None
    except BaseException:
        if tf is not None:
            tf.close()
        for p in out:   # none may outlive a failed write
            if os.path.exists(p):
                os.unlink(p)
        raise
    if index:
        for p in out:
            write_index(p)
    return out
