"""Hugging Face ``Trainer``: a callback that saves a loaderlib loader's position with each
checkpoint and restores it on ``trainer.train(resume_from_checkpoint=...)``.

NOTE [ Loader state in the Hugging Face Trainer ]
The ``Trainer`` saves no loader state: on resume it calls Accelerate's ``skip_first_batches``,
which reads ``.dataset`` and swaps in a torch ``DataLoader`` (transformers issue 31441), or with
``TrainingArguments(ignore_data_skip=True)`` it starts the epoch again from its first batch.
:class:`LoaderCheckpointCallback` needs ``ignore_data_skip=True`` (it refuses to start
otherwise, saying so): after every checkpoint each rank writes its loader's state into the
checkpoint folder (``loaderlib-state-rank<r>.json``), and when training starts from a
checkpoint each rank loads, before its first batch, its own state (or, when only one was
kept, that one, which resumes every rank when the ranks ran in step: NOTE [ One state for
every rank ]). The Trainer then calls ``set_epoch`` with the epoch the state is in, which keeps
its position. The Trainer numbers epochs by its steps per epoch, which change with the number
of processes, so a resume on another number of processes is refused with a StateError.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from transformers import TrainerCallback

from ..errors import StateError
from ..loader import DataLoader

__all__ = ["LoaderCheckpointCallback"]

_FILE = "loaderlib-state-rank{}.json"


class LoaderCheckpointCallback(TrainerCallback):
    """Save and restore a loaderlib loader with the ``Trainer``'s checkpoints.

    Parameters
    ----------
    loader : DataLoader
        The loader ``get_train_dataloader()`` returns (override it in a ``Trainer`` subclass).

    Notes
    -----
    Pass ``TrainingArguments(ignore_data_skip=True)``: the Trainer then leaves the loader as
    it is instead of fast-forwarding a torch copy of it. See NOTE [ Loader state in the
    Hugging Face Trainer ].
    """

    def __init__(self, loader: DataLoader) -> None:
        if not isinstance(loader, DataLoader):
            raise TypeError(f"LoaderCheckpointCallback takes a loaderlib DataLoader, got {type(loader).__name__}")
        self.loader = loader
        self.loaded_from: str | None = None   # the checkpoint folder the state came from
        self.applied: str | None = None       # "own", "merged" or "one"

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not args.ignore_data_skip:
            raise ValueError("LoaderCheckpointCallback needs TrainingArguments(ignore_data_skip=True): otherwise the "
                             "Trainer resumes by skipping batches of a torch DataLoader it builds in the loader's "
                             "place (Accelerate's skip_first_batches), not with the loader's own state")
        if state.global_step > 0:
            self.restore(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"), args.process_index,
                         args.world_size)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, _FILE.format(args.process_index))
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.loader.state_dict(), f)
        os.replace(tmp, path)

    def restore(self, folder: str, rank: int, world: int) -> None:
        """Load the loader state saved in checkpoint ``folder`` for ``rank`` of ``world``."""
        states = {}
        for name in os.listdir(folder) if os.path.isdir(folder) else ():
            m = re.fullmatch(r"loaderlib-state-rank(\d+)\.json", name)
            if m:
                with open(os.path.join(folder, name)) as f:
                    states[int(m.group(1))] = json.load(f)
        if not states:
            raise StateError(f"the checkpoint {folder!r} holds no loaderlib state ({_FILE.format('<r>')}): was it "
                             "saved with LoaderCheckpointCallback?")
        saved_world = (next(iter(states.values())).get("layout") or {}).get("num_shards", len(states))
        if saved_world != world:
            # The Trainer numbers epochs by its steps per epoch, which change with the number of
            # processes: its set_epoch would then name another epoch than the state's.
            raise StateError(f"the checkpoint {folder!r} was saved by {saved_world} processes, this job has {world}: "
                             "the Trainer counts epochs from the steps per epoch, which differ, so resume on "
                             f"{saved_world} processes (ll.merge_state_dicts resumes the loader itself on any number)")
        if rank in states:
            self.loader.load_state_dict(states[rank])
            self.applied = "own"
        else:   # one file per checkpoint (a copy from the main process only): ranks in step
            self.loader.load_state_dict(states[min(states)])
            self.applied = "one"
        self.loaded_from = folder
