"""The run options of a Pipeline (``Pipeline.with_options``), as one frozen object.

A pipeline holds a :class:`PipelineOptions`; ``with_options`` makes a new one with
``dataclasses.replace``, which validates it again (``__post_init__``), so an options object
that exists is valid and a pipeline's options never change under it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .._autotune import AUTOTUNE
from .._checks import check_int, parse_bytes

__all__ = ["PipelineOptions"]


def _tunable(value: int | None, name: str, minimum: int) -> int | None:
    if value is None or value == AUTOTUNE:
        return value
    return check_int(value, name, minimum=minimum)


@dataclass(frozen=True)
class PipelineOptions:
    """How a pipeline runs (``Pipeline.with_options`` documents each field); None: the default.

    ``seed_drawn`` says the seed was drawn, not given: a resumed state may replace it
    (NOTE [ Pipeline resume ] in ``pipeline.py``).
    """

    seed: int | None = None
    seed_drawn: bool = False
    num_threads: int | None = None
    prefetch: int | None = None
    ram_budget: int | None = None
    num_workers: int | None = None
    autotune_clock: Callable[[], float] | None = None
    io_depth: int | None = None

    def __post_init__(self) -> None:
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        put("seed", check_int(self.seed, "seed", minimum=0, allow_none=True))
        put("num_threads", _tunable(self.num_threads, "num_threads", 0))
        put("prefetch", _tunable(self.prefetch, "prefetch", 1))
        if self.ram_budget is not None:
            put("ram_budget", parse_bytes(self.ram_budget, "ram_budget"))
        put("num_workers", check_int(self.num_workers, "num_workers", minimum=0, allow_none=True))
        put("io_depth", _tunable(self.io_depth, "io_depth", 0))
