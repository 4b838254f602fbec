"""One process of a JAX job whose loader is checkpointed with Orbax, for test_orbax.py.

    python orbax_run.py OUT --processes P --process-id I --port PORT --ckpt DIR --steps S
        [--save-at K ...] [--resume K]

With ``P > 1`` the process joins a ``jax.distributed`` job (CPU, coordinator on 127.0.0.1:PORT)
and shards the loader by ``(jax.process_count(), jax.process_index())``. ``--save-at`` (repeated) saves
step K with an ``ocp.CheckpointManager`` (the loader through ``LoaderSave`` beside a train state);
``--resume`` restores step K first (``LoaderRestore``). Each process writes ``OUT/process{I}.json``:
the sample indices of each batch it took, how the state was applied, and the files of the saved
loader item.
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp

import loaderlib as ll
from loaderlib.integrations.orbax import LoaderCheckpointHandler, LoaderRestore, LoaderSave

N, BATCH, ORDER_SEED = 30, 4, 3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--process-id", type=int, default=0)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--save-at", type=int, action="append", default=[])
    p.add_argument("--resume", type=int)
    a = p.parse_args()
    if a.processes > 1:
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{a.port}", num_processes=a.processes,
                                   process_id=a.process_id)
    rank, world = jax.process_index(), jax.process_count()
    assert (rank, world) == (a.process_id, a.processes), (rank, world)
    loader = ll.DataLoader(ll.ArrayDataset(np.arange(N, dtype=np.int64)), batch_size=BATCH, seed=0, num_threads=1,
                           sampler=ll.ShardedSampler(world, rank, shuffle=True, seed=ORDER_SEED))
    handler = LoaderCheckpointHandler()
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False)
    state = {"step": np.zeros((), np.int64)}
    step = 0
    with ocp.CheckpointManager(os.path.abspath(a.ckpt), options=options,
                               item_handlers={"loader": handler, "state": ocp.StandardCheckpointHandler()}) as mngr:
        if a.resume is not None:
            got = mngr.restore(a.resume, args=ocp.args.Composite(loader=LoaderRestore(loader),
                                                                 state=ocp.args.StandardRestore(state)))
            step = int(got.state["step"])
        seen: list[list[int]] = []
        while step < a.steps:
            for b in loader:
                seen.append([int(v) for v in b.tolist()])
                step += 1
                if step in a.save_at:
                    state = {"step": np.asarray(step, np.int64)}
                    mngr.save(step, args=ocp.args.Composite(loader=LoaderSave(loader),
                                                            state=ocp.args.StandardSave(state)))
                    mngr.wait_until_finished()
                if step == a.steps:
                    break
    files = {k: sorted(os.listdir(os.path.join(a.ckpt, str(k), "loader"))) for k in a.save_at}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"process{rank}.json"), "w") as f:
        json.dump({"batches": seen, "applied": handler.applied, "files": files, "world": world}, f)
    if a.processes > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
