"""``torch.distributed.checkpoint`` (DCP, as torchtitan uses it): a loader's position under a key
of its own rank, resumed on the same or another data-parallel size.

NOTE [ Loader state in DCP ]
DCP saves one state dict per job, flattened to keys; values that are not tensors are written
once per key, so the states of several ranks need a key each (``rank_<r>``, torchtitan's
choice). Loading is driven by the template the object returns: DCP calls ``state_dict()`` and
fills in the keys the template names, then calls ``load_state_dict``. :class:`LoaderState`
given the checkpoint to read (``checkpoint_id=``) returns a template of every saved rank's key,
which it finds in the checkpoint's metadata, so each rank receives the state of every rank of
the saved job: on the same layout it continues its own (bitwise, whatever ``on_error``), on
another the states are merged (:func:`loaderlib.merge_state_dicts`) and the rest of the epoch
is split again (NOTE [ Elastic resume ] in ``_loader/elastic.py``). Each value is the loader
state as a JSON string: DCP stores it as bytes, and no pickle of loaderlib objects is involved.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from .._loader.elastic import merge_state_dicts
from ..errors import StateError
from ..loader import DataLoader
from ._versions import check_version

__all__ = ["SUPPORTED", "LoaderState"]

#: torch versions this module supports: ``(lowest, first unsupported)`` (NOTE [ Framework
#: version ranges ]): ``dcp.save``/``dcp.load`` and a reader's ``read_metadata`` as used here
#: came with 2.2.
SUPPORTED = ((2, 2), (3, 0))


def _check_version(text: str) -> None:
    check_version("dcp", "torch", "torch", text, SUPPORTED,
                  "torch.distributed.checkpoint's save, load and metadata as used here came with 2.2; 3 is untested")


_check_version(torch.__version__)

_PREFIX = "rank_"


def _rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class LoaderState:
    """A loader as a DCP ``Stateful``: saved under the key of its rank, loaded from every rank's.

    Parameters
    ----------
    loader : DataLoader
        The loader of this rank.
    checkpoint_id : str or os.PathLike, optional
        When loading: the checkpoint directory given to ``dcp.load`` (its metadata says which
        ranks were saved). Not needed when saving.
    key : str
        The name this object has in the app state dict given to ``dcp.save``/``dcp.load``.
    rank : int, optional
        This rank (default: ``torch.distributed``'s, else ``RANK``).

    Examples
    --------
    >>> dcp.save({"loader": LoaderState(loader)}, checkpoint_id=path)  # doctest: +SKIP
    >>> dcp.load({"loader": LoaderState(loader, checkpoint_id=path)}, checkpoint_id=path)  # doctest: +SKIP
    """

    def __init__(self, loader: DataLoader, checkpoint_id: str | os.PathLike | None = None, *, key: str = "loader",
                 rank: int | None = None) -> None:
        if not isinstance(loader, DataLoader):
            raise TypeError(f"LoaderState wraps a loaderlib DataLoader, got {type(loader).__name__}")
        self.loader = loader
        self.key = key
        self.rank = _rank_world()[0] if rank is None else int(rank)
        self.checkpoint_id = None if checkpoint_id is None else os.fspath(checkpoint_id)
        self.applied: str | None = None   # how the last load was applied ("own", "merged", "one")

    def saved_ranks(self) -> list[str]:
        """The rank keys saved in :attr:`checkpoint_id` (NOTE [ Loader state in DCP ])."""
        from torch.distributed.checkpoint import FileSystemReader

        assert self.checkpoint_id is not None
        meta = FileSystemReader(self.checkpoint_id).read_metadata()
        head = f"{self.key}."
        keys = sorted(k[len(head):] for k in meta.state_dict_metadata if k.startswith(head + _PREFIX))
        if not keys:
            raise StateError(f"the checkpoint {self.checkpoint_id!r} holds no loader state under {self.key!r} "
                             f"(keys {sorted(meta.state_dict_metadata)[:8]}...)")
        return keys

    def state_dict(self) -> dict[str, Any]:
        """To save: ``{"rank_<r>": state as JSON}``. Given ``checkpoint_id``: the template of
        every saved rank's key, for ``dcp.load``."""
        if self.checkpoint_id is not None:
            return dict.fromkeys(self.saved_ranks(), "")
        return {f"{_PREFIX}{self.rank}": json.dumps(self.loader.state_dict())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the loader from the states of every saved rank (NOTE [ Loader state in DCP ])."""
        states = {int(k[len(_PREFIX):]): json.loads(v) for k, v in state.items() if k.startswith(_PREFIX) and v}
        if not states:
            self.loader.load_state_dict({})
            return
        world = len(states)
        mine = self.loader.state_dict()
        lay = mine.get("layout") or {}
        same = lay.get("num_shards", lay.get("world_size")) == world
        if same and self.rank in states:
            self.loader.load_state_dict(states[self.rank])
            self.applied = "own"
        elif world == 1:
            self.loader.load_state_dict(states[min(states)])
            self.applied = "one"
        else:
            self.loader.load_state_dict(merge_state_dicts(states[r] for r in sorted(states)))
            self.applied = "merged"
