"""PyTorch Lightning: a loaderlib ``DataLoader`` in the ``Trainer`` as it is, and a callback that
logs the loader's throughput, the model's wait for data and the bottleneck verdict.

NOTE [ Lightning and the loader state ]
Lightning (2.2 on) treats a train loader that has ``state_dict``/``load_state_dict`` as
stateful: each checkpoint holds ``loader.state_dict()`` of global rank 0 only, and
``fit(ckpt_path=...)`` calls ``load_state_dict`` with that one state on every rank before the
epoch's ``iter()``. A loaderlib state saved in lockstep resumes every rank from it (NOTE [ One
state for every rank ] in ``_loader/elastic.py``), on the same or another number of devices,
so nothing is needed beyond returning the loader from ``train_dataloader()``: build it with a
:class:`~loaderlib.ShardedSampler` of ``(trainer.world_size, trainer.global_rank)`` (Lightning
inserts a ``DistributedSampler`` only into torch's own ``DataLoader``) and ``on_error="raise"``
(the default). Lightning also calls ``set_epoch`` on ``loader.sampler`` before each epoch and
``iter()`` once more than it consumes (its check that the loader is iterable), which the
sampler's ``set_epoch`` makes harmless. ``tests/frameworks/test_lightning.py`` trains on two
processes (DDP, gloo) and checks that a resumed run sees, on each rank, the batches of a
straight one.
"""

from __future__ import annotations

import logging
from typing import Any

from .._observe.stats import Stats, split_window, window_of
from .._threads import available_cpus
from ..loader import DataLoader
from ._versions import check_version

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback
except ImportError:   # the standalone package
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import Callback

__all__ = ["SUPPORTED", "LoaderMonitor"]

_log = logging.getLogger(__name__)

#: Lightning versions this module supports: ``(lowest, first unsupported)`` (NOTE [ Framework
#: version ranges ]).
SUPPORTED = ((2, 2), (3, 0))


def _check_version(text: str) -> None:
    check_version("lightning", "Lightning", pl.__name__, text, SUPPORTED,
                  "before 2.2 Lightning saves no loader state; 3 is untested")


_check_version(pl.__version__)


def train_loaders(trainer: Any) -> list[DataLoader]:
    """The loaderlib loaders among the Trainer's train dataloaders (one, a list or a dict)."""
    dl = getattr(trainer, "train_dataloader", None)
    items = dl.values() if isinstance(dl, dict) else dl if isinstance(dl, (list, tuple)) else [dl]
    return [d for d in items if isinstance(d, DataLoader)]


class LoaderMonitor(Callback):
    """Log a loaderlib loader's throughput, the model's wait for data and the bottleneck
    verdict to the Trainer's loggers (TensorBoard, CSV, W&B, ...) every ``every_n_steps``.

    The figures are those of the loader's own recorder (``loader.stats``, turned on at the
    start of training) over the steps since the last log, judged by
    :func:`loaderlib.profiling.diagnose` with the training step as the model:

    * ``loader/samples_per_s``: samples the loader delivered per second;
    * ``loader/wait_share``: share of the time the training loop waited in ``next()`` (the
      accelerator idle on data);
    * ``loader/busy``: share of the loader threads' time spent working;
    * ``loader/bound_<stage>``: 1 for the stage the verdict names (``model`` when the loop
      hardly waited: data is not the bottleneck), logged only when the evidence is enough.

    The verdict's sentence goes to loggers that take text (TensorBoard's ``add_text``) and to
    this module's logger; :attr:`last_verdict` holds the latest one.

    Parameters
    ----------
    every_n_steps : int
        Optimizer steps between two logs.
    loader : DataLoader, optional
        The loader to watch (default: the loaderlib loader among the Trainer's train
        dataloaders).
    prefix : str
        Prefix of the logged names.

    Examples
    --------
    >>> trainer = Trainer(callbacks=[LoaderMonitor(every_n_steps=100)])  # doctest: +SKIP
    """

    def __init__(self, every_n_steps: int = 50, loader: DataLoader | None = None, prefix: str = "loader/") -> None:
        super().__init__()
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps must be a positive int, got {every_n_steps!r}")
        self.every_n_steps = every_n_steps
        self.prefix = prefix
        self._given = loader
        self.loader: DataLoader | None = loader
        self.last_verdict: Any = None
        self._since: float | None = None        # end of the last logged window (profiling clock, s)
        self._epochs: list[Stats] = []          # the epoch before the current one, if it is in the window

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self._given is None:
            found = train_loaders(trainer)
            if not found:
                _log.warning("LoaderMonitor: no loaderlib DataLoader among the Trainer's train dataloaders; "
                             "nothing will be logged")
            self.loader = found[0] if found else None
        if self.loader is not None:
            self.loader.recorder.enabled = True

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.loader is None or trainer.global_step % self.every_n_steps:
            return
        metrics = self.measure()
        if not metrics:
            return
        for lg in trainer.loggers:
            lg.log_metrics(metrics, step=trainer.global_step)
            add_text = getattr(getattr(lg, "experiment", None), "add_text", None)
            if callable(add_text) and self.last_verdict is not None and trainer.is_global_zero:
                add_text(f"{self.prefix}verdict", self.last_verdict.summary, trainer.global_step)
        if self.last_verdict is not None and trainer.is_global_zero:
            _log.info("loader at step %d: %s", trainer.global_step, self.last_verdict.summary)

    def measure(self) -> dict[str, float]:
        """The figures over the window since the last call (empty when nothing was recorded),
        and :attr:`last_verdict` updated."""
        from ..profiling.verdict import diagnose  # profiling reads the core; never the reverse

        ld = self.loader
        assert ld is not None
        stats = ld.stats
        end = stats.started_s + stats.elapsed_s
        if self._epochs and self._epochs[-1].started_s != stats.started_s:
            ended = ld.recorder.previous_epoch()
            self._epochs = [ended] if ended is not None else []
        epochs = [e for e in self._epochs if e.started_s != stats.started_s] + [stats]
        first = min(e.started_s for e in epochs)
        start = first if self._since is None else max(first, self._since)
        self._epochs = [stats]
        if end <= start or not stats.batches:
            return {}
        self._since = end
        window = window_of(epochs, start, end)
        parts = split_window(epochs, start, end, max(1, min(8, round((end - start) / 0.5))))
        verdict = diagnose(window, parts=parts, threads=stats.num_threads or ld.num_threads, cpus=available_cpus(),
                           model_ran=True, gil_held=stats.gil_held, extract=stats.extract)
        self.last_verdict = verdict
        p = self.prefix
        out = {f"{p}samples_per_s": float(window.samples_per_s), f"{p}wait_share": float(window.wait_fraction),
               f"{p}busy": float(window.busy_fraction)}
        if verdict.enough and verdict.bottleneck is not None:
            out[f"{p}bound_{verdict.bottleneck}"] = 1.0
        return out
