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
every rank ]); a job on another number of processes loads the merge of every rank's state
(:func:`loaderlib.merge_state_dicts`), which splits the rest of the epoch again over its ranks.

NOTE [ The Trainer's epoch numbers after a resume ]
On resume the Trainer starts at epoch ``global_step // steps_per_epoch`` and calls
``set_epoch`` with it, ``steps_per_epoch`` being ``len(loader)`` of *this* job. On the saved
number of processes that is the epoch the state is in, which keeps its position. On another
number, ``len(loader)`` differs, and so does the Trainer's count: 6 steps of 4 batches an epoch
(2 processes) are epoch 1, but 6 steps of 8 (1 process) are epoch 0; ``set_epoch(0)`` would
drop the loaded state and start the loader's epoch 0 again. So the callback, when the two
differ, shifts the epochs the Trainer gives ``set_epoch`` by the difference (the state's epoch
minus the Trainer's) until training ends: the Trainer's first epoch runs the rest of the
state's, and each one after is the loader's next, as in a straight run. ``len(loader)`` stays
the per-epoch length of this job (the Trainer's step counts), and a resumed epoch that holds
fewer batches ends early, which the Trainer takes as the end of its epoch.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import transformers
from transformers import TrainerCallback

from .. import merge_state_dicts
from ..errors import StateError
from ..loader import DataLoader
from ._versions import check_version

__all__ = ["SUPPORTED", "LoaderCheckpointCallback"]

#: transformers versions this module supports: ``(lowest, first unsupported)`` (NOTE [ Framework
#: version ranges ]): the 5 line, tested (NOTE [ The Trainer's epoch numbers after a resume ]
#: rests on how it counts epochs).
SUPPORTED = ((5, 0), (6, 0))


def _check_version(text: str) -> None:
    check_version("hf_trainer", "transformers", "transformers", text, SUPPORTED,
                  "the Trainer's resume and epoch count as tested; other lines are untested")


_check_version(transformers.__version__)

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
        self.epoch_shift = 0                  # NOTE [ The Trainer's epoch numbers after a resume ]

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not args.ignore_data_skip:
            raise ValueError("LoaderCheckpointCallback needs TrainingArguments(ignore_data_skip=True): otherwise the "
                             "Trainer resumes by skipping batches of a torch DataLoader it builds in the loader's "
                             "place (Accelerate's skip_first_batches), not with the loader's own state")
        if state.global_step > 0:
            epoch = self.restore(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"),
                                 args.process_index, args.world_size)
            # NOTE [ The Trainer's epoch numbers after a resume ]: the Trainer's epoch count.
            per_epoch = max(-(-len(self.loader) // max(int(args.gradient_accumulation_steps), 1)), 1)
            self._shift_epochs(epoch - state.global_step // per_epoch)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._shift_epochs(0)

    def _shift_epochs(self, shift: int) -> None:
        """Make the loader's ``set_epoch(e)`` run epoch ``e + shift`` (NOTE [ The Trainer's epoch
        numbers after a resume ]); ``0`` gives it back its own method."""
        self.epoch_shift = int(shift)
        self.loader.__dict__.pop("set_epoch", None)
        if self.epoch_shift:
            own = self.loader.set_epoch
            self.loader.set_epoch = lambda epoch: own(int(epoch) + self.epoch_shift)  # type: ignore[method-assign]

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, _FILE.format(args.process_index))
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.loader.state_dict(), f)
        os.replace(tmp, path)

    def restore(self, folder: str, rank: int, world: int) -> int:
        """Load the loader state saved in checkpoint ``folder`` for ``rank`` of ``world``; returns
        the epoch the loaded state is in.

        On the saved number of processes each rank loads its own state; on another, the merge
        of every saved rank's (:func:`loaderlib.merge_state_dicts`).
        """
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
        if saved_world == world and rank in states:
            state, self.applied = states[rank], "own"
        elif len(states) == 1:   # one file per checkpoint (a copy from the main process only): ranks in step
            state, self.applied = next(iter(states.values())), "one"
        else:   # another number of processes: the rest of the epoch split again over this job's ranks
            state, self.applied = merge_state_dicts(states[r] for r in sorted(states)), "merged"
        self.loader.load_state_dict(state)
        self.loaded_from = folder
        return int(state.get("epoch", 0))
