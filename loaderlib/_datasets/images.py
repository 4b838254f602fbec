"""Arrays and image files: :class:`ArrayDataset`, :class:`TupleDataset`, :class:`ImageFolderDataset`
and :class:`ImageListDataset`, and the one reader of a sample's file that the record formats
share (public in ``loaderlib.datasets``).

The image datasets know where each sample's bytes live, so the DataLoader can read and decode
them inside its native kernels; indexing them from Python reads and decodes one image with the
same decoder.
"""

from __future__ import annotations

import errno
import os
import stat
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._extract.remote.files import RemoteFiles, remote_files
from .._extract.remote.store import expand_urls
from .._extract.remote.urls import is_url
from .._extract.source import NativeSource, SourceKind
from .._tensor_spec import TensorSpec
from ..decoding import decode
from ..errors import RemoteReadError
from .base import Dataset, _check_index

__all__ = ["IMAGE_EXTENSIONS", "MAX_FILE_BYTES", "ArrayDataset", "ImageFolderDataset", "ImageListDataset",
           "TupleDataset"]

#: File extensions (lower case) that the image datasets treat as images; matching is
#: case-insensitive (ImageNet ships ``.JPEG``).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


class ArrayDataset(Dataset):
    """Zip arrays (or sequences) of equal length: item ``i`` is ``(a[i], b[i], ...)``.

    With a single array, item ``i`` is ``a[i]`` itself. Lists of numbers are converted to
    numpy arrays; other lists are kept as they are.
    """

    def __init__(self, *arrays: Any) -> None:
        if not arrays:
            raise ValueError("ArrayDataset needs at least one array")
        data = []
        for k, a in enumerate(arrays):
            if isinstance(a, (list, tuple)):
                try:
                    arr = np.asarray(a)
                    a = arr if arr.dtype != object else a
                except ValueError:
                    pass
            if not hasattr(a, "__len__"):
                raise TypeError(f"ArrayDataset: argument {k} has no length")
            data.append(a)
        n = len(data[0])
        for k, a in enumerate(data):
            if len(a) != n:
                raise ValueError(f"ArrayDataset: all arrays must have the same length; array 0 has {n}, "
                                 f"array {k} has {len(a)}")
        self._data = data
        self._length = n

    @property
    def arrays(self) -> list:
        return list(self._data)

    def element_spec(self) -> Any:
        """A row of each array when every column is a numpy array (one spec for one array)."""
        arrays = [a for a in self._data if isinstance(a, np.ndarray)]
        if len(arrays) != len(self._data):
            return None
        specs = [TensorSpec(a.shape[1:], a.dtype) for a in arrays]
        return specs[0] if len(specs) == 1 else tuple(specs)

    def native_source(self) -> NativeSource | None:
        """ARRAYS when every column is a numeric numpy array (rows gathered with ``take``)."""
        if not all(isinstance(a, np.ndarray) and a.dtype != object and a.ndim >= 1 for a in self._data):
            return None
        return NativeSource(SourceKind.ARRAYS, stage="ArrayDataset of numpy arrays: gathered with numpy take",
                            arrays=[np.ascontiguousarray(a) for a in self._data], description=repr(self))

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, idx: int) -> Any:
        if len(self._data) == 1:
            return self._data[0][idx]
        return tuple(a[idx] for a in self._data)


class TupleDataset(Dataset):
    """Zip datasets of equal length: item ``i`` is ``(d0[i], d1[i], ...)``.

    ``TupleDataset([d0, d1])`` and ``TupleDataset(d0, d1)`` are the same.
    """

    def __init__(self, datasets: Any, *more: Any) -> None:
        dsets = [datasets, *more] if more else list(datasets)
        if not dsets:
            raise ValueError("TupleDataset needs at least one dataset")
        n = len(dsets[0])
        for k, d in enumerate(dsets):
            if len(d) != n:
                raise ValueError(f"TupleDataset: dataset 0 has {n} samples, dataset {k} has {len(d)}")
        self.datasets = dsets
        self._length = n

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, idx: int) -> tuple:
        return tuple(d[idx] for d in self.datasets)

    def zipped_arrays(self) -> list | None:
        """The parts' arrays when every part is a numeric numpy array or a one-array
        :class:`ArrayDataset` (the loader then gathers the same items natively)."""
        arrays = [_single_array(d) for d in self.datasets]
        return arrays if all(a is not None for a in arrays) else None


def _single_array(d: Any) -> np.ndarray | None:
    """The array behind a one-array ArrayDataset or a bare array (items are its rows)."""
    if isinstance(d, np.ndarray) and d.ndim >= 1 and d.dtype != object:
        return d
    if type(d) is ArrayDataset and len(d.arrays) == 1 and isinstance(d.arrays[0], np.ndarray) \
            and d.arrays[0].dtype != object:
        return d.arrays[0]
    return None


#: Largest file one sample may be read from (NOTE [ One sample's file size limit ] in
#: pyx/include/ll_read.h; the native reader uses the same value).
MAX_FILE_BYTES = 1 << 30


def _read_stream(fd: int, path: str) -> bytes:
    """A FIFO's or character device's bytes up to end of file, never more than
    :data:`MAX_FILE_BYTES` (blocking: the loader's timeout covers a writer that never comes)."""
    os.set_blocking(fd, True)
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > MAX_FILE_BYTES:
            raise OSError(errno.EFBIG, f"more than the {MAX_FILE_BYTES}-byte limit for one sample came from this "
                          "special file", path)
        chunks.append(chunk)


def _read_file(path: str, special: bool = False) -> bytes:
    """A regular file's bytes. Anything else (a FIFO, a device such as ``/dev/zero``, a
    directory) is refused without blocking or reading without bound, as the native reader does,
    and so is a file larger than :data:`MAX_FILE_BYTES`. With ``special``, FIFOs and character
    devices are read to end of file, still within :data:`MAX_FILE_BYTES`."""
    # Opened without blocking, a FIFO with no writer yet reads as empty, and a writer that
    # connects to that descriptor and finishes before it is closed loses its data; with
    # ``special`` the open blocks until the writer connects (the loader's timeout covers one
    # that never does).
    blocking = 0 if special else getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | blocking)
    try:
        st = os.fstat(fd)
        if special and stat.S_ISFIFO(st.st_mode):
            return _read_stream(fd, path)
        if special and stat.S_ISCHR(st.st_mode):
            return _read_stream(fd, path)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file" + ("" if special else
                          " (ImageListDataset(..., special_files=True) reads FIFOs and devices)"), path)
        if st.st_size > MAX_FILE_BYTES:
            raise OSError(errno.EFBIG, f"file of {st.st_size} bytes is larger than the {MAX_FILE_BYTES}-byte limit "
                          "for one sample", path)
        # NOTE [ Files that change while read ] (include/ll_read.h): one byte more than the size.
        size = st.st_size
        chunks, got = [], 0
        while got <= size:
            chunk = os.read(fd, min(size + 1 - got, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
            if got == size:
                break
        if got != size:
            raise OSError(errno.EIO, f"the file changed size while being read: fstat gave {size} bytes, the read "
                          + ("found more" if got > size else f"ended early (at {got} bytes)"), path)
        return b"".join(chunks)
    finally:
        os.close(fd)


class _ImageFiles(Dataset):
    """Shared behaviour of datasets whose samples are image files."""

    paths: list
    labels: np.ndarray | None
    special_files: bool = False
    _remote: RemoteFiles | None = None     # the paths are URLs (NOTE [ Remote datasets: cache or ranges ])

    def __len__(self) -> int:
        return len(self.paths)

    def source(self, idx: int) -> str:
        return self.paths[_check_index(idx, len(self.paths))]

    def read(self, idx: int) -> bytes:
        """The encoded bytes of sample ``idx``."""
        if self._remote is not None:
            i = _check_index(idx, len(self.paths))
            return bytes(self._remote.read_whole([self.paths[i]], [i])[0])
        return _read_file(self.source(idx), self.special_files)

    def buffers(self, indices: Sequence[int]) -> list:
        """URLs: the objects of samples ``indices``, requested all at once."""
        idx = [int(i) for i in indices]
        remote = self._remote
        assert remote is not None   # only URL datasets answer a BUFFERS source (native_source)
        return remote.read_whole([self.paths[i] for i in idx], idx, record=True)

    def read_failure(self, idx: int) -> RemoteReadError | None:
        """Why sample ``idx`` came back empty from :meth:`buffers` (NOTE [ Remote failures per sample ])."""
        return self._remote.failure(idx) if self._remote is not None else None

    def remote_request(self, i: int) -> tuple[str, int, None] | None:
        """Sample ``i``'s request to its store: the whole object ``(url, 0, None)``
        (NOTE [ One sample, one request ] in ``_extract/remote/readahead.py``)."""
        return (self.paths[i], 0, None) if self._remote is not None else None

    @property
    def python_read(self) -> str | None:
        """Why the samples are read from Python (None: the kernels read them)."""
        if self.special_files:
            return (f"{type(self).__name__}(special_files=True): FIFOs and devices are read from Python, each to "
                    "end of file")
        return None

    def element_spec(self) -> Any:
        """An HWC uint8 RGB image of unknown size, with an int64 label when there are labels."""
        image = TensorSpec((None, None, 3), np.uint8)
        return image if self.labels is None else (image, TensorSpec((), np.int64))

    def native_source(self) -> NativeSource | None:
        """FILES: each sample's file is opened and read by the kernels (None with
        ``special_files=True``: FIFOs and devices are read from Python)."""
        if self.special_files:
            return None
        if self._remote is not None:
            return NativeSource(SourceKind.BUFFERS, stage=f"{type(self).__name__}: one object per sample from the "
                                "store, a batch's requests concurrent", dataset=self, labels=self.labels,
                                description=repr(self))
        return NativeSource(SourceKind.FILES, stage=f"{type(self).__name__}: POSIX reads inside the kernel",
                            paths=self.paths, labels=self.labels, description=repr(self))

    def __getitem__(self, idx: int) -> Any:
        i = _check_index(idx, len(self.paths))
        return self.item_from_bytes(i, self.read(i))

    def item_from_bytes(self, i: int, data: Any) -> Any:
        """Item ``i`` from its file's bytes ``data`` (read ahead by the loader)."""
        img = decode(data, source=self.paths[i])
        if self.labels is None:
            return img
        return img, int(self.labels[i])


class ImageFolderDataset(_ImageFiles):
    """Images in class folders: ``root/<class>/<image>``; item ``i`` is ``(image, label)``.

    ``image`` is an HWC uint8 RGB array, ``label`` the class folder's position in
    :attr:`synsets`.

    Parameters
    ----------
    root : str or path
        Folder holding one sub-folder per class, or a prefix in an object store
        (``s3://bucket/train/``, listed once; ``gs://`` too): each object is read whole.
    extensions : sequence of str, optional
        File extensions that count as images, matched case-insensitively
        (default :data:`IMAGE_EXTENSIONS`). Other files are skipped with one warning.
    storage_options : dict, optional
        For a prefix: boto3's names (``endpoint_url``, ``aws_access_key_id``, ...),
        ``timeout``, ``max_retries``; the AWS environment variables otherwise.

    Attributes
    ----------
    synsets : list of str
        Sorted class folder names.
    items : list of (str, int)
        ``(path, label)`` for every image, classes in order, files sorted by name.
    """

    def __init__(self, root: str | os.PathLike, extensions: Sequence[str] | None = None, *,
                 storage_options: dict | None = None) -> None:
        self._remote = remote_files(root, storage_options, None, None, "ImageFolderDataset")
        exts = tuple(e.lower() if e.startswith(".") else "." + e.lower()
                     for e in (extensions or IMAGE_EXTENSIONS))
        self.synsets: list[str] = []
        self.items: list[tuple[str, int]] = []
        skipped: list[str] = []
        if self._remote is not None:
            self.root = os.fspath(root).rstrip("/") + "/"
            self._list_prefix(exts, skipped)
            names: list[str] = []
        else:
            self.root = os.path.expanduser(os.fspath(root))
            if not os.path.isdir(self.root):
                raise FileNotFoundError(f"ImageFolderDataset: {self.root!r} is not a directory")
            names = sorted(os.listdir(self.root))
        for name in names:
            path = os.path.join(self.root, name)
            if not os.path.isdir(path):
                if not name.startswith("."):
                    skipped.append(path)
                continue
            label = len(self.synsets)
            self.synsets.append(name)
            for fname in sorted(os.listdir(path)):
                fpath = os.path.join(path, fname)
                if fname.startswith(".") or os.path.isdir(fpath):
                    continue
                if os.path.splitext(fname)[1].lower() in exts:
                    self.items.append((fpath, label))
                else:
                    skipped.append(fpath)
        if skipped:
            shown = ", ".join(repr(p) for p in skipped[:3])
            more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
            warnings.warn(
                f"ImageFolderDataset: skipped {len(skipped)} file(s) that are not images in class "
                f"folders (extensions {', '.join(exts)}): {shown}{more}", UserWarning, stacklevel=2)
        self.paths = [p for p, _ in self.items]
        self.labels = np.array([lab for _, lab in self.items], dtype=np.int64)

    def _list_prefix(self, exts: tuple[str, ...], skipped: list[str]) -> None:
        """The class folders of an object-store prefix, listed once: ``root/<class>/<image>``
        objects; deeper objects are not samples (as sub-folders of a class folder are not)."""
        classes: dict[str, list[str]] = {}
        remote = self._remote
        assert remote is not None   # called for a URL root only
        for url in expand_urls(self.root, remote.options):
            rel = url[len(self.root):]
            parts = rel.split("/")
            if len(parts) == 1:
                if not parts[0].startswith("."):
                    skipped.append(url)
            elif len(parts) == 2 and not parts[1].startswith("."):
                classes.setdefault(parts[0], []).append(url)
        for label, name in enumerate(sorted(classes)):
            self.synsets.append(name)
            for url in sorted(classes[name]):
                if os.path.splitext(url)[1].lower() in exts:
                    self.items.append((url, label))
                else:
                    skipped.append(url)

    def __repr__(self) -> str:
        return f"ImageFolderDataset({self.root!r}: {len(self)} images, {len(self.synsets)} classes)"


class ImageListDataset(_ImageFiles):
    """Images given by a list of paths; item ``i`` is ``(image, labels[i])``, or the image alone.

    Parameters
    ----------
    paths : sequence of str
        Image files.
    labels : sequence of int, optional
        One integer label per path. Without labels, items are images only.
    root : str, optional
        Prefix joined to relative paths (a URL prefix too).
    storage_options : dict, optional
        For URLs (``s3://``, ``gs://``, ``http(s)://``; one object per image, read whole):
        boto3's names (``endpoint_url``, ``aws_access_key_id``, ...), ``timeout``,
        ``max_retries``; the AWS environment variables otherwise.
    special_files : bool
        Also read FIFOs and character devices (named pipes fed by another process), to end of
        file and within :data:`MAX_FILE_BYTES`. Off by default: such a path is refused, since a
        pipe nobody writes to would block a reader for ever. With it on, the samples are read
        from Python (the threads or processes engine; the loader's ``timeout`` covers a pipe
        that never delivers) and decoded by the same decoder.
    """

    def __init__(self, paths: Sequence[str | os.PathLike], labels: Sequence[int] | None = None,
                 root: str | os.PathLike | None = None, special_files: bool = False, *,
                 storage_options: dict | None = None) -> None:
        if not isinstance(special_files, bool):
            raise TypeError(f"special_files must be True or False, got {special_files!r}")
        self.special_files = special_files
        base = os.fspath(root) if root is not None else None
        if base is not None and is_url(base):
            self.paths = [os.fspath(p) if is_url(os.fspath(p)) else base.rstrip("/") + "/" + os.fspath(p)
                          for p in paths]
        else:
            self.paths = [os.path.join(base, os.fspath(p)) if base else os.fspath(p) for p in paths]
        self._remote = remote_files(self.paths, storage_options, None, None, "ImageListDataset") if self.paths else None
        if self._remote is not None and special_files:
            raise ValueError("ImageListDataset: special_files=True reads local FIFOs and devices, not URLs")
        if labels is None:
            self.labels = None
        else:
            self.labels = np.asarray(labels, dtype=np.int64).reshape(-1)
            if self.labels.shape[0] != len(self.paths):
                raise ValueError(f"ImageListDataset: {len(self.paths)} paths but {self.labels.shape[0]} labels")

    @property
    def items(self) -> list:
        if self.labels is None:
            return list(self.paths)
        return list(zip(self.paths, self.labels.tolist()))

    def __repr__(self) -> str:
        return f"ImageListDataset({len(self)} images)"


