"""Orbax: a loaderlib loader's position in an Orbax checkpoint (JAX training loops), one file per
process.

NOTE [ Loader state in Orbax ]
Orbax checkpoints a Grain iterator through a handler of Grain's; any other iterator needs a
handler of its own. :class:`LoaderCheckpointHandler` is one: saved with ``LoaderSave(loader)``
(inside ``ocp.args.Composite`` beside the train state), each process writes its loader's state
as JSON to ``process_<i>.json`` in the item's directory; restored with
``LoaderRestore(loader)``, each process loads its own file when the job has as many processes
as the saved one, the only file when one was written (which resumes every process when they ran
in step: NOTE [ One state for every rank ]), and otherwise the merge of every file
(:func:`loaderlib.merge_state_dicts`), which resumes on any number of processes.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import jax
import orbax.checkpoint as ocp

from .._loader.elastic import merge_state_dicts
from ..errors import StateError
from ..loader import DataLoader
from ._versions import check_version

__all__ = ["SUPPORTED", "LoaderCheckpointHandler", "LoaderRestore", "LoaderSave"]

#: orbax-checkpoint versions this module supports: ``(lowest, first unsupported)`` (NOTE
#: [ Framework version ranges ]): the 0.12 line, tested (a 0.x minor release may change the
#: handler interface).
SUPPORTED = ((0, 12), (0, 13))


def _check_version(text: str) -> None:
    check_version("orbax", "orbax-checkpoint", "orbax-checkpoint", text, SUPPORTED,
                  "the CheckpointHandler interface as tested; a 0.x minor release may change it")


_check_version(ocp.__version__)


class LoaderCheckpointHandler(ocp.CheckpointHandler):
    """Save and restore a loaderlib loader in an Orbax checkpoint (NOTE [ Loader state in Orbax ])."""

    def __init__(self, process_index: int | None = None, process_count: int | None = None) -> None:
        self.process_index = jax.process_index() if process_index is None else int(process_index)
        self.process_count = jax.process_count() if process_count is None else int(process_count)
        self.applied: str | None = None   # how the last restore was applied: "own", "one" or "merged"

    def save(self, directory: Any, args: LoaderSave) -> None:  # type: ignore[override]
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"process_{self.process_index}.json").write_text(json.dumps(args.loader.state_dict()))

    def restore(self, directory: Any, args: LoaderRestore) -> dict:  # type: ignore[override]
        states = {}
        for path in directory.iterdir():
            m = re.fullmatch(r"process_(\d+)\.json", path.name)
            if m:
                states[int(m.group(1))] = json.loads(path.read_text())
        if not states:
            raise StateError(f"{directory} holds no loaderlib state (process_<i>.json): was it saved with LoaderSave?")
        if len(states) == self.process_count and self.process_index in states:
            state, self.applied = states[self.process_index], "own"
        elif len(states) == 1:
            state, self.applied = next(iter(states.values())), "one"
        else:
            state, self.applied = merge_state_dicts(states[i] for i in sorted(states)), "merged"
        args.loader.load_state_dict(state)
        return state


@ocp.args.register_with_handler(LoaderCheckpointHandler, for_save=True)
@dataclasses.dataclass
class LoaderSave(ocp.args.CheckpointArgs):
    """Save ``loader``'s position (with :class:`LoaderCheckpointHandler`)."""

    loader: DataLoader


@ocp.args.register_with_handler(LoaderCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class LoaderRestore(ocp.args.CheckpointArgs):
    """Restore ``loader``'s position (with :class:`LoaderCheckpointHandler`)."""

    loader: DataLoader
