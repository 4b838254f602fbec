"""Host-to-GPU hand-off: pinned vs pageable copies, and what ``ll.to_device`` overlaps.

Needs torch with CUDA; on a machine without it, prints that it skipped and exits 0 (``--device
cpu`` runs the same code on the CPU, as a check that it runs: copies there are memcpy and
nothing overlaps, so its figures mean nothing for a GPU).

Measures, on one GPU, with a ResNet-50-shaped batch (default 256x3x224x224 float32, 154 MB):

1. ``copy``: host-to-device copy bandwidth (GB/s) from a pageable numpy slot and from a pinned
   one (``DataLoader(pin_memory=True)`` allocates slots like this, once), timed with CUDA
   events over ``--repeat`` copies (median);
2. ``overlap`` (torch): a real training step of a small convolutional network (four strided
   convolutions with batch norm, pooling, a 1000-way linear layer; bf16 autocast, SGD) on each
   batch, for ``--batches`` batches, fed three ways: the data already on the GPU (the step
   alone), the copy done inline (``.to(device)`` then the step), and through
   ``ll.to_device(batches, "cuda", prefetch=2)`` (the copy of batch k+1 on a side stream during
   the step on batch k). The host batches are ``--slots`` prepared slots visited in turn, so
   the host side costs nothing and the figures are the copy and the step alone; pageable and
   pinned. Wall time per batch, and the share of the copy that ``to_device`` hid:
   ``(inline - to_device) / (inline - step alone)``.
3. ``loader``: the same with the batches coming from a real ``DataLoader`` (``ArrayDataset``,
   native engine) through ``to_device``, against the step alone: what is left of the hand-off
   end to end (the loader's own gather of each batch included, on ``--threads`` threads);
4. ``jax``: when JAX sees a GPU, a jitted convolution + dense step fed by ``jax.device_put``
   inline against ``ll.to_device(batches, jax_device)``.

``--json PATH`` writes every figure (``benchmarks/device_check.py`` reads it).

Usage::

    python benchmarks/device.py                    # 256x3x224x224 float32, 20 batches
    python benchmarks/device.py --batch 128 --batches 40 --dtype uint8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np


def _sync(torch: Any, dev: Any) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def copy_bandwidth(torch: Any, dev: Any, shape: tuple, dtype: str, repeat: int) -> dict:
    """Median seconds and GB/s of one host-to-device copy of a pageable and of a pinned slot."""
    import loaderlib as ll

    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    out: dict = {}
    hosts = {"pageable": torch.from_numpy(ll.arena.aligned_empty(shape, dtype))}
    if dev.type == "cuda":
        hosts["pinned"] = torch.empty(shape, dtype=hosts["pageable"].dtype, pin_memory=True)
    else:
        out["pinned"] = {"skipped": "pinned memory needs CUDA"}
    for name, host in hosts.items():
        host.numpy()[...] = 1
        times = []
        for _ in range(repeat + 1):
            if dev.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                host.to(dev, non_blocking=True)
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1000)
            else:
                t0 = time.perf_counter()
                host.clone()
                times.append(time.perf_counter() - t0)
        t = statistics.median(times[1:])
        out[name] = {"seconds": t, "GB_per_s": nbytes / t / 1e9}
    return out


def torch_model(torch: Any, dev: Any, classes: int = 1000) -> Any:
    """A small convolutional classifier and one SGD training step on it (bf16 autocast on CUDA)."""
    nn = torch.nn

    def block(cin: int, cout: int, k: int) -> list:
        return [nn.Conv2d(cin, cout, k, stride=2, padding=k // 2, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    model = nn.Sequential(*block(3, 32, 7), nn.MaxPool2d(3, 2, 1), *block(32, 64, 3), *block(64, 128, 3),
                          *block(128, 256, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, classes)).to(dev)
    model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(x: Any, y: Any) -> Any:
        if x.dtype != torch.float32:
            x = x.float()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            loss = nn.functional.cross_entropy(model(x.contiguous(memory_format=torch.channels_last)), y % classes)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


def _per_batch(torch: Any, dev: Any, fn: Any, batches: int) -> float:
    """Wall seconds per batch of ``fn()`` (which runs ``batches`` batches), synchronised at both ends."""
    _sync(torch, dev)
    t0 = time.perf_counter()
    fn()
    _sync(torch, dev)
    return (time.perf_counter() - t0) / batches


def overlap_torch(torch: Any, dev: Any, shape: tuple, dtype: str, batches: int, slots: int, rounds: int) -> dict:
    """The step alone, inline copy + step and ``to_device``, pageable and pinned (medians of rounds)."""
    import loaderlib as ll

    step = torch_model(torch, dev)
    n = shape[0]
    labels = np.arange(n, dtype=np.int64)
    on_dev = torch.from_numpy(ll.arena.aligned_empty(shape, dtype)).to(dev)
    on_dev_y = torch.from_numpy(labels).to(dev)
    for _ in range(3):   # warm-up: cuDNN's algorithm choice, the allocator's pool
        step(on_dev, on_dev_y)
    out: dict = {}
    alone = []

    def run_alone() -> None:
        for _ in range(batches):
            step(on_dev, on_dev_y)

    kinds = ["pageable"] + (["pinned"] if dev.type == "cuda" else [])
    hosts = {}
    for kind in kinds:
        rng = np.random.default_rng(0)
        made = []
        for _ in range(slots):
            if kind == "pinned":
                t = torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype, pin_memory=True)
                a = t.numpy()
            else:
                a = ll.arena.aligned_empty(shape, dtype)
            a[...] = rng.integers(0, 255, size=shape[-1], dtype=np.uint8).astype(dtype)
            made.append((a, labels))
        hosts[kind] = made
    res: dict = {k: {"inline": [], "to_device": []} for k in kinds}
    for _ in range(rounds):
        alone.append(_per_batch(torch, dev, run_alone, batches))
        for kind in kinds:
            src = hosts[kind]
            pin = kind == "pinned"

            def inline(src: list = src, pin: bool = pin) -> None:
                for k in range(batches):
                    x, y = src[k % len(src)]
                    step(torch.from_numpy(x).to(dev, non_blocking=pin), torch.from_numpy(y).to(dev, non_blocking=pin))

            def overlapped(src: list = src) -> None:
                for x, y in ll.to_device((src[k % len(src)] for k in range(batches)), dev, prefetch=2):
                    step(x, y)

            res[kind]["inline"].append(_per_batch(torch, dev, inline, batches))
            res[kind]["to_device"].append(_per_batch(torch, dev, overlapped, batches))
    a = statistics.median(alone)
    out["step_alone_s"] = a
    for kind in kinds:
        i, o = statistics.median(res[kind]["inline"]), statistics.median(res[kind]["to_device"])
        out[kind] = {"inline_s": i, "to_device_s": o, "copy_cost_s": i - a,
                     "hidden": (i - o) / (i - a) if i - a > 1e-9 else None,
                     "rounds": res[kind]}
    return out


def loader_torch(torch: Any, dev: Any, shape: tuple, dtype: str, batches: int, threads: int) -> dict:
    """``to_device`` over a real DataLoader (ArrayDataset, native engine), pageable and pinned,
    against the step alone."""
    import loaderlib as ll

    step = torch_model(torch, dev)
    n = shape[0]
    data = np.ones((n, *shape[1:]), dtype)
    labels = np.arange(n, dtype=np.int64)
    order = [i % n for i in range(n * batches)]
    on_dev, on_dev_y = torch.from_numpy(data).to(dev), torch.from_numpy(labels).to(dev)
    for _ in range(3):
        step(on_dev, on_dev_y)

    def run_alone() -> None:
        for _ in range(batches):
            step(on_dev, on_dev_y)

    out: dict = {"step_alone_s": _per_batch(torch, dev, run_alone, batches)}
    for pin in ([False, True] if dev.type == "cuda" else [False]):
        loader = ll.DataLoader(ll.ArrayDataset(data, labels), batch_size=n, sampler=order, pin_memory=pin,
                               num_threads=threads)
        list(loader)   # slots allocated (and pinned) before timing
        dl = ll.to_device(loader, dev, prefetch=2)

        def run(dl: Any = dl) -> None:
            for x, y in dl:
                step(x, y)

        run()
        out["pinned" if pin else "pageable"] = {"to_device_s": _per_batch(torch, dev, run, batches),
                                                "engine": loader.engine}
        loader.close()
    return out


def overlap_jax(shape: tuple, dtype: str, batches: int, slots: int, rounds: int, platform: str = "gpu") -> dict:
    """A jitted convolution + dense step on JAX's GPU (``platform``): inline ``device_put`` vs ``to_device``."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return {"skipped": "JAX is not installed"}
    try:
        dev = jax.devices(platform)[0]
    except RuntimeError as e:
        return {"skipped": f"JAX {jax.__version__} sees no {platform.upper()} ({str(e).splitlines()[0]})"}
    import loaderlib as ll

    key = jax.random.PRNGKey(0)
    w1 = jax.device_put(jax.random.normal(key, (64, shape[1], 7, 7), jnp.bfloat16) * 0.05, dev)
    w2 = jax.device_put(jax.random.normal(key, (64, 1000), jnp.bfloat16) * 0.05, dev)

    @jax.jit
    def step(x: Any, y: Any) -> Any:
        h = jax.lax.conv_general_dilated(x.astype(jnp.bfloat16), w1, (4, 4), "SAME")
        h = jax.nn.relu(h).mean(axis=(2, 3))
        logits = (h @ w2).astype(jnp.float32)
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(x.shape[0]), y % 1000])

    labels = np.arange(shape[0], dtype=np.int32)
    src = [(ll.arena.aligned_empty(shape, dtype), labels) for _ in range(slots)]
    for a, _ in src:
        a[...] = 1
    x0 = jax.device_put(src[0][0], dev)
    step(x0, jax.device_put(labels, dev)).block_until_ready()

    def timed(fn: Any) -> float:
        t0 = time.perf_counter()
        fn().block_until_ready()
        return (time.perf_counter() - t0) / batches

    def alone() -> Any:
        y = jax.device_put(labels, dev)
        out = None
        for _ in range(batches):
            out = step(x0, y)
        return out

    def inline() -> Any:
        out = None
        for k in range(batches):
            x, y = src[k % slots]
            out = step(jax.device_put(x, dev), jax.device_put(y, dev))
        return out

    def overlapped() -> Any:
        out = None
        for x, y in ll.to_device((src[k % slots] for k in range(batches)), dev, prefetch=2):
            out = step(x, y)
        return out

    res: dict = {"alone": [], "inline": [], "to_device": []}
    for _ in range(rounds):
        res["alone"].append(timed(alone))
        res["inline"].append(timed(inline))
        res["to_device"].append(timed(overlapped))
    a, i, o = (statistics.median(res[k]) for k in ("alone", "inline", "to_device"))
    return {"jax": jax.__version__, "device": str(dev), "step_alone_s": a, "inline_s": i, "to_device_s": o,
            "hidden": (i - o) / (i - a) if i - a > 1e-9 else None, "rounds": res}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=10, help="copies timed per bandwidth figure")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the overlap figures (median)")
    ap.add_argument("--slots", type=int, default=4, help="prepared host batches the overlap runs visit in turn")
    ap.add_argument("--threads", type=int, default=None, help="loader threads of the DataLoader row")
    ap.add_argument("--dtype", choices=("float32", "float16", "uint8"), default="float32")
    ap.add_argument("--device", default="cuda", help="'cuda' (default) or 'cpu' (a check that the code runs)")
    ap.add_argument("--no-jax", action="store_true", help="leave JAX out")
    ap.add_argument("--json", default=None, help="write every figure here")
    args = ap.parse_args()
    report: dict = {"args": vars(args)}

    def done(code: int = 0) -> int:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
        return code

    try:
        import torch
    except ImportError:
        report["skipped"] = "torch is not installed"
        print(f"benchmarks/device.py: skipped ({report['skipped']})")
        return done()
    if args.device == "cuda" and not torch.cuda.is_available():
        report["skipped"] = f"torch {torch.__version__} sees no CUDA device on this machine"
        print(f"benchmarks/device.py: skipped ({report['skipped']})")
        return done()

    dev = torch.device(args.device)
    if dev.type == "cpu":
        torch.set_num_threads(1)   # a check that the code runs: keep it off the other cores
    shape = (args.batch, 3, args.size, args.size)
    nbytes = int(np.prod(shape)) * np.dtype(args.dtype).itemsize
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    report.update(device=name, torch=torch.__version__, cuda=torch.version.cuda, batch_bytes=nbytes)
    print(f"device: {name}; torch {torch.__version__}, CUDA {torch.version.cuda}; "
          f"batch {shape} {args.dtype} = {nbytes / 1e6:.0f} MB")

    report["copy"] = copy_bandwidth(torch, dev, shape, args.dtype, args.repeat)
    for kind, r in report["copy"].items():
        if "skipped" in r:
            print(f"copy  {kind:<9} skipped: {r['skipped']}")
        else:
            print(f"copy  {kind:<9} {r['GB_per_s']:6.1f} GB/s  ({1000 * r['seconds']:.2f} ms per batch, "
                  f"median of {args.repeat})")

    ov = report["overlap"] = overlap_torch(torch, dev, shape, args.dtype, args.batches, args.slots, args.rounds)
    print(f"torch step alone (data on the device): {1000 * ov['step_alone_s']:.2f} ms per batch")
    for kind in ("pageable", "pinned"):
        if kind in ov:
            r = ov[kind]
            hid = "n/a" if r["hidden"] is None else f"{100 * r['hidden']:.0f}%"
            print(f"overlap {kind:<9} inline copy + step {1000 * r['inline_s']:.2f} ms/batch (copy adds "
                  f"{1000 * r['copy_cost_s']:.2f}), to_device {1000 * r['to_device_s']:.2f} ms/batch: {hid} of the "
                  "copy hidden")

    lo = report["loader"] = loader_torch(torch, dev, shape, args.dtype, args.batches, args.threads)
    for kind in ("pageable", "pinned"):
        if kind in lo:
            print(f"loader  {kind:<9} DataLoader -> to_device -> step: {1000 * lo[kind]['to_device_s']:.2f} ms/batch "
                  f"(step alone {1000 * lo['step_alone_s']:.2f})")

    if args.no_jax:
        report["jax"] = {"skipped": "--no-jax"}
    else:
        report["jax"] = overlap_jax(shape, args.dtype, args.batches, args.slots, args.rounds,
                                    "gpu" if dev.type == "cuda" else "cpu")
    j = report["jax"]
    if "skipped" in j:
        print(f"jax: skipped ({j['skipped']})")
    else:
        hid = "n/a" if j["hidden"] is None else f"{100 * j['hidden']:.0f}%"
        print(f"jax {j['jax']} on {j['device']}: step alone {1000 * j['step_alone_s']:.2f} ms/batch, inline "
              f"device_put + step {1000 * j['inline_s']:.2f}, to_device {1000 * j['to_device_s']:.2f}: {hid} of the "
              "copy hidden")
    return done()


if __name__ == "__main__":
    sys.exit(main())
