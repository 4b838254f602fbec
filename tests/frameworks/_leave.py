"""How the torchrun workers of tests/frameworks end.

NOTE [ Workers leave without the interpreter's teardown ]
About one run in 40 of a 2-process gloo job on torch 2.13 died after its last line, in the
interpreter's teardown, with "terminate called without an active exception" (SIGABRT) on one
rank: a C++ thread of the process group still joinable when static destructors run (torch's
own open question, pytorch PR 179291). The worker had already written everything the test
checks, but torchrun reports the job failed. So a worker that has written its results waits
for every rank, takes the process group down itself, flushes, and leaves with ``os._exit``:
what the tests check is written by then, and the teardown that races never runs.
"""

from __future__ import annotations

import os
import sys


def leave() -> None:
    """Wait for every rank, destroy the process group and exit 0 without teardown."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
