"""WebDataset sidecar indexes: DALI's ``wds2idx`` ``.idx`` format, read and written.

NOTE [ WebDataset sidecar index ]
Without the shard cache a WebDataset shard in a store is read by byte range, but its members
must be found first: the tar headers are spread through the whole shard, so indexing it meant
downloading it whole once when the dataset opened. A ``.idx`` beside the shard (``train-0000.tar``
-> ``train-0000.idx``, as NVIDIA DALI's ``tools/wds2idx.py`` writes it and its
``fn.readers.webdataset`` reads it) lists the members instead. Its format, version ``v1.2``:

    v1.2 <samples>
    <ext> <offset> <size> <name> [<ext> <offset> <size> <name> ...]    (one line per sample)

with ``offset`` the member's data offset in the tar (a multiple of 512) and ``name`` its path
in the tar (``v1.0`` / ``v1.1`` lines have no names: three fields per member). Members of one
sample share the name up to the first dot of the base name, as in the tar.

- Reading: a dataset over uncached URLs fetches ``X.idx`` for shard ``X.tar``; when there is none
  (a 404) it indexes the shard as before. With one, the dataset opens with the ``.idx``, a
  HEAD of the shard (its size), one 512-byte range before the first and the last sample's
  image (their tar headers must name the ``.idx``'s members, with its sizes: an ``.idx`` of
  another shard or an older version of it is caught there) and, when samples carry labels,
  ranges over the ``.cls``/``.json`` members only (neighbours within ``LABEL_GAP`` bytes share
  a request; a label sits beside its image, so that is usually one small request per sample,
  all sent at once). No image byte is read. Local shards and the shard cache's copies are
  indexed from the tar itself, which reading them locally makes cheap and which is
  authoritative.
- A ``.idx`` that is malformed or does not match its shard (a count that disagrees, an offset
  not on a tar block or past the shard's end, a header that names another member) is an
  error that names the ``.idx`` and says what is wrong: the choice here is to refuse, not to
  fall back to downloading the shard, because a stale index next to a rewritten shard would
  otherwise silently cost a whole download per shard and epoch start. Delete or rewrite it
  (:func:`loaderlib.write_webdataset_index`).
- Writing: :func:`loaderlib.write_webdataset` writes one beside each shard it writes, and
  :func:`loaderlib.write_webdataset_index` beside an existing local shard. A member name with
  white space cannot be written in this format: such a shard gets no ``.idx`` (a warning
  says so).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import LoaderError

__all__ = ["BLOCK", "LABEL_GAP", "SidecarError", "Member", "format_index", "index_path", "parse_index",
           "tar_members", "write_index"]

#: A tar block: member data starts on one.
BLOCK = 512
#: Label members this close (bytes) share a request (NOTE [ WebDataset sidecar index ]).
LABEL_GAP = 4096
VERSION = "v1.2"


class SidecarError(LoaderError):
    """A ``.idx`` that is malformed or does not match its shard."""


@dataclass(frozen=True)
class Member:
    """One member of a tar shard: its extension (``jpg``), data offset, size and name."""

    ext: str
    offset: int
    size: int
    name: str


def index_path(shard: str) -> str:
    """The sidecar of ``shard``: ``X.tar`` -> ``X.idx`` (another name gets ``.idx`` appended)."""
    return shard[:-4] + ".idx" if shard.endswith(".tar") else shard + ".idx"


def _split(name: str) -> tuple[str, str] | None:
    base = os.path.basename(name)
    if "." not in base or base.startswith("."):
        return None
    dot = base.index(".")
    return name[:len(name) - len(base) + dot], base[dot + 1:]


def parse_index(text: str, where: str, shard_size: int | None = None) -> list[tuple[str, list[Member]]]:
    """The samples of an ``.idx`` (``(key, members)`` in order), checked for form and, with
    ``shard_size``, against the shard's bounds; :class:`SidecarError` naming ``where``
    otherwise."""
    lines = text.splitlines()
    if not lines:
        raise SidecarError(f"{where}: empty WebDataset index")
    head = lines[0].split()
    if len(head) != 2 or head[0] not in ("v1.0", "v1.1", "v1.2") or not head[1].isdecimal():
        raise SidecarError(f"{where}: not a WebDataset index (first line {lines[0][:60]!r}; expected 'v1.2 <samples>')")
    fields = 4 if head[0] == "v1.2" else 3
    body = [ln for ln in lines[1:] if ln.strip()]
    if len(body) != int(head[1]):
        raise SidecarError(f"{where}: the header says {int(head[1])} samples but {len(body)} lines follow")
    out: list[tuple[str, list[Member]]] = []
    for n, line in enumerate(body, 2):
        tok = line.split()
        if not tok or len(tok) % fields:
            raise SidecarError(f"{where}: line {n} has {len(tok)} fields, not a multiple of {fields}")
        members = []
        key = None
        for k in range(0, len(tok), fields):
            ext, off, size = tok[k], tok[k + 1], tok[k + 2]
            if not (off.isdecimal() and size.isdecimal()):
                raise SidecarError(f"{where}: line {n}: offset {off!r} and size {size!r} must be integers")
            o, s = int(off), int(size)
            if o % BLOCK:
                raise SidecarError(f"{where}: line {n}: offset {o} of member {ext!r} is not on a tar block")
            if shard_size is not None and o + s > shard_size:
                raise SidecarError(f"{where}: line {n}: member {ext!r} at {o} + {s} bytes ends past the shard's "
                                  f"{shard_size} bytes (an index of another shard?)")
            name = tok[k + 3] if fields == 4 else ""
            if name:
                sk = _split(name)
                if sk is None or sk[1].lower() != ext.lower():
                    raise SidecarError(f"{where}: line {n}: member name {name!r} does not end in .{ext}")
                if key is not None and sk[0] != key:
                    raise SidecarError(f"{where}: line {n}: members {key!r} and {sk[0]!r} of one sample")
                key = sk[0]
            members.append(Member(ext.lower(), o, s, name))
        out.append((key if key is not None else f"sample{n - 2}", members))
    return out


def check_header(header: bytes, member: Member, where: str) -> None:
    """The 512-byte tar header before ``member``'s data must name it with its size."""
    name = header[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
    prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "replace") if header[257:262] == b"ustar" else ""
    full = f"{prefix}/{name}" if prefix else name
    try:
        size = int(header[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        size = -1
    if (member.name and full != member.name) or size != member.size or len(header) != BLOCK:
        raise SidecarError(f"{where}: the shard's member at {member.offset} is {full!r} of {size} bytes, the index says "
                          f"{member.name or member.ext!r} of {member.size} bytes (an index of another shard or of an "
                          "older version of it: delete it or rewrite it with ll.write_webdataset_index)")


def format_index(samples: Sequence[Sequence[Member]]) -> str:
    """The ``v1.2`` text of an index of ``samples`` (each its members, in tar order)."""
    lines = [f"{VERSION} {len(samples)}"]
    for members in samples:
        lines.append(" ".join(f"{m.ext} {m.offset} {m.size} {m.name}" for m in members))
    return "\n".join(lines) + "\n"


def tar_members(path: str) -> list[list[Member]] | None:
    """The samples of a local tar shard, each its file members in tar order (None when a
    member name holds white space, which the format cannot carry)."""
    import tarfile  # here, not at import: NOTE [ What import costs ] in loaderlib/__init__.py

    samples: list[list[Member]] = []
    last = None
    with tarfile.open(path, "r:") as tf:
        for m in tf:
            if not m.isfile():
                continue
            sk = _split(m.name)
            if sk is None:
                continue
            if any(c.isspace() for c in m.name):
                return None
            if sk[0] != last:
                samples.append([])
                last = sk[0]
            samples[-1].append(Member(sk[1], m.offset_data, m.size, m.name))
    return samples


def write_index(shard: str, index: str | None = None) -> str | None:
    """Write the ``.idx`` of the local tar ``shard`` (beside it by default); returns its path,
    or None (with a warning) when the shard's member names cannot be written."""
    samples = tar_members(shard)
    if samples is None:
        warnings.warn(f"{shard}: a member name holds white space, which a WebDataset .idx cannot carry; no index "
                      "written", RuntimeWarning, stacklevel=3)
        return None
    out = index or index_path(shard)
    tmp = f"{out}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(format_index(samples))
    os.replace(tmp, out)
    return out
