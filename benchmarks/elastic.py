"""What elastic resume costs: merging the states of 64 ranks of a 1.28M-sample epoch, and
loading the merged state on a new layout.

A 64-rank job over an ImageNet-sized epoch (1,281,167 samples, ``ShardedSampler(64, r,
shuffle=True)``, batch 256) is saved mid-epoch: every rank's loader runs for real to its
state (``DataLoader.state_dict()`` after ``--steps`` batches of a uint8 ``ArrayDataset``,
whose samples cost nothing to load, so the states are what a training job saves). Two cases:

* "lockstep": every rank delivered ``--steps`` batches (a checkpoint taken at one step);
* "skewed": the odd ranks delivered one batch more (states saved one step apart), which
  turns the delivered positions into a strided set: the merged state holds it as a
  compressed bitmap instead of ranges.

Timed (median of ``--rounds`` interleaved rounds, wall clock):

* ``merge``: ``ll.merge_state_dicts(states)`` of the 64 states;
* ``load on 48``: ``load_state_dict(merged)`` on rank 0 of a 48-rank loader plus its first
  batch (which plans the re-split rest of the epoch), against
* ``own state``: the same rank-0 loader of the 64-rank layout loading its own state plus its
  first batch (the resume without a change of layout: the baseline).

Also printed: the size of the merged state as JSON. The machine may be shared: figures are
medians and the two loads are timed in the same rounds.

Usage::

    python benchmarks/elastic.py [--rounds 5] [--steps 20] [--ranks 64] [--new-ranks 48]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from _report import machine_summary, med

HERE = os.path.dirname(os.path.abspath(__file__))
N = 1_281_167
BATCH = 256


def _loader(ds, world: int, rank: int):
    import loaderlib as ll

    return ll.DataLoader(ds, batch_size=BATCH, sampler=ll.ShardedSampler(world, rank, shuffle=True, seed=0), seed=0,
                         num_threads=1)


def _states(ds, world: int, steps: int, skew: bool) -> list[dict]:
    out = []
    for r in range(world):
        ld = _loader(ds, world, r)
        it = iter(ld)
        for _ in range(steps + (r % 2 if skew else 0)):
            next(it)
        out.append(json.loads(json.dumps(ld.state_dict())))
        ld.close()
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--new-ranks", type=int, default=48)
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(HERE))
    import numpy as np

    import loaderlib as ll

    print(machine_summary())
    print(f"data: ArrayDataset of {N:,} uint8 samples, ShardedSampler({a.ranks}, r, shuffle=True), batch {BATCH}, "
          f"states after {a.steps} batches per rank; {a.rounds} rounds, medians\n")
    ds = ll.ArrayDataset(np.zeros(N, np.uint8))
    for name, skew in (("lockstep", False), ("skewed", True)):
        states = _states(ds, a.ranks, a.steps, skew)
        merged = ll.merge_state_dicts(states)
        size = len(json.dumps(merged))
        form = "bitmap" if "bitmap" in merged["delivered"] else f"{len(merged['delivered']['ranges']) // 2} ranges"
        merge_s, elastic_s, own_s = [], [], []
        for _ in range(a.rounds):
            merge_s.append(_timed(lambda: ll.merge_state_dicts(states)))
            for out, world, state in ((elastic_s, a.new_ranks, merged), (own_s, a.ranks, states[0])):
                ld = _loader(ds, world, 0)

                def load(ld=ld, state=state) -> None:
                    ld.load_state_dict(state)
                    next(iter(ld))

                out.append(_timed(load))
                ld.close()
        print(f"{name:>9}: merge {med(merge_s) * 1e3:7.1f} ms   merged state {size / 1e3:6.1f} kB JSON "
              f"(delivered as {form})")
        print(f"{'':>9}  load on {a.new_ranks} + first batch {med(elastic_s) * 1e3:7.1f} ms   "
              f"own state on {a.ranks} + first batch {med(own_s) * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
