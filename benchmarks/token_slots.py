"""Where a token loader's batch costs more than its kernel: the output buffers it rotates through.

On the corpus of ``benchmarks/tokens.py`` (its ``make_corpus``, in its ``--data`` folder;
written here when missing), at
``--seq-lens`` with batches of 131,072 tokens, shuffled concat rows, one kernel thread:

- ``kernel xR``: ``TokenDataset.gather_into`` in a loop (no loader, no threads) writing batch
  n into output set ``n % R`` of ``R`` preallocated sets: R = 1 is the ``loaderlib-kernel``
  system of ``benchmarks/tokens.py`` (one set that stays in the caches), R = 6 as many sets as
  a ``DataLoader``'s arena rotates through;
- ``loader prefetch=P``: ``DataLoader(shuffle=True, num_threads=1, prefetch=P)``, the default
  and ``prefetch=1`` (one arena slot fewer); the arena's slot count is printed.

Every process first gathers each row once (its mapping's pages), then the figure is the best of
``--rounds`` rounds of ``--round-s`` seconds; the configurations alternate ``--repeats`` times,
each in a fresh process. Tokens handed out per wall-clock second, as in ``benchmarks/tokens.py``
(docs/tokens-benchmark.md quotes this run).

Usage::

    python benchmarks/token_slots.py [--seq-lens 2048,8192] [--repeats 2] [--rounds 3] [--round-s 1.5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BATCH_TOKENS = 131072


def _child(cfg: dict) -> dict:
    import numpy as np

    import loaderlib as ll
    from loaderlib.datasets import TokenDataset

    S, B = cfg["seq_len"], BATCH_TOKENS // cfg["seq_len"]
    ds = TokenDataset(cfg["prefix"], S)
    order = np.random.default_rng(0).permutation(len(ds))
    warm = [np.zeros(shape, dt) for shape, dt in ds.token_parts(B)]
    for a in range(0, order.size - B, B):   # every page of the mapping, once
        ds.gather_into(np.sort(order[a:a + B]), warm, num_threads=1)
    out: dict = {}
    if cfg["kind"] == "kernel":
        sets = [[np.zeros(shape, dt) for shape, dt in ds.token_parts(B)] for _ in range(cfg["n"])]
        state = {"at": 0, "n": 0}

        def step() -> None:
            a = state["at"] if state["at"] + B <= order.size else 0
            ds.gather_into(order[a:a + B], sets[state["n"] % len(sets)], num_threads=1)
            state["at"], state["n"] = a + B, state["n"] + 1
    else:
        kw = {"prefetch": cfg["n"]} if cfg["n"] else {}
        loader = ll.DataLoader(ds, batch_size=B, shuffle=True, num_threads=1, seed=0, **kw)
        it = iter(loader)

        def step() -> None:
            nonlocal it
            try:
                next(it)
            except StopIteration:
                it = iter(loader)
                next(it)

        step()
        out["slots"] = loader._arena_ring.num_slots
    for _ in range(20):
        step()
    best = 0.0
    for _ in range(cfg["rounds"]):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < cfg["round_s"]:
            step()
            n += 1
        best = max(best, n * BATCH_TOKENS / (time.perf_counter() - t0) / 1e6)
    out["mtok_s"] = best
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=os.path.join(HERE, ".data", "tokens"), help="benchmarks/tokens.py's corpus folder")
    p.add_argument("--tokens", type=int, default=400_000_000, help="the corpus's size (its file name)")
    p.add_argument("--seq-lens", default="2048,8192")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--round-s", type=float, default=1.5)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return
    from _report import machine_summary
    from tokens import make_corpus

    prefix, _meta = make_corpus(args.data, args.tokens, 0, "web")

    print(machine_summary())
    print(f"corpus {prefix}.bin/.idx, batches of {BATCH_TOKENS} tokens, shuffled concat rows, 1 kernel thread; "
          f"best of {args.rounds} rounds of {args.round_s} s, each configuration in a fresh process, "
          f"{args.repeats} alternating repeats")
    configs = [("kernel", 1), ("kernel", 6), ("loader", 0), ("loader", 1)]
    env = dict(os.environ, PYTHONPATH=ROOT)
    for S in (int(s) for s in args.seq_lens.split(",")):
        got: dict = {c: [] for c in configs}
        for _ in range(args.repeats):
            for kind, n in configs:
                cfg = {"prefix": prefix, "seq_len": S, "kind": kind, "n": n, "rounds": args.rounds,
                       "round_s": args.round_s}
                r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(cfg)], env=env,
                                   capture_output=True, text=True, timeout=900, check=True)
                got[(kind, n)].append(json.loads(r.stdout.strip().splitlines()[-1]))
        for (kind, n), runs in got.items():
            name = f"kernel x{n}" if kind == "kernel" else f"loader prefetch={n or 'default'}"
            slots = f" ({runs[0]['slots']} slots)" if "slots" in runs[0] else ""
            rates = " / ".join(f"{r['mtok_s']:,.0f}" for r in runs)
            print(f"seq_len {S}: {name}{slots}: {rates} M tokens/s")


if __name__ == "__main__":
    main()
