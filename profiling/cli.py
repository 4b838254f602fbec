"""``python -m loaderlib bench``: loaderlib against the loaders people use, with the verdict.

Runs the ResNet-50 training pipeline (RandomResizedCrop(224), random flip, normalize, CHW
float32) over an image folder (``--data``, or the demo dataset built once and cached, see
NOTE [ Demo dataset ] in ``demo.py``) with, in turn, loaderlib's DataLoader, the plain
Python thread-pool loader most projects write (OpenCV + numpy per sample), and PyTorch's
DataLoader with the same Python per-sample code in worker processes when torch is
installed. Each loader is measured by :func:`loaderlib.profiling.benchmark` for the same
number of seconds; the table shows images/s, the ratio to the Python loader, the
per-stage breakdown and each loader's verdict.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
import warnings
from typing import Any

from ..stats import STAGES

__all__ = ["main"]

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


EXAMPLES = """examples:
  python -m loaderlib bench                          the demo dataset, every available loader
  python -m loaderlib bench --data ~/imagenet/val --threads 8 --seconds 10
  python -m loaderlib bench --model-step-ms 50       with a simulated 50 ms model step
  python -m loaderlib bench --loaders loaderlib --json report.json
"""


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _float_at_least(lo: float, strict: bool) -> Any:
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if math.isnan(v) or not (v > lo if strict else v >= lo):
            raise argparse.ArgumentTypeError(f"expected a number {'>' if strict else '>='} {lo:g}, got {text!r}")
        return v
    return parse


def _crop_size(text: str) -> int:
    v = _positive_int(text)
    if v < 8:
        raise argparse.ArgumentTypeError(f"expected a crop size >= 8, got {text!r}")
    return v


def _loader_list(text: str) -> list[str]:
    wanted = [x.strip() for x in text.split(",") if x.strip()]
    unknown = sorted(set(wanted) - {"loaderlib", "python", "torch"})
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(f"unknown loader(s) {', '.join(unknown) or '(none given)'}; "
                                         f"choose from loaderlib,python,torch")
    return wanted


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``p`` (``python -m loaderlib bench`` builds its parser with it)."""
    p.description = textwrap.fill(
        "Measure loaderlib's DataLoader against a Python thread-pool loader (and PyTorch's DataLoader when "
        "torch is installed) on the ResNet-50 training pipeline, and say what limits each one. Needs OpenCV "
        "(the Python baseline and the demo dataset use it).", 88)
    p.epilog = EXAMPLES
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--data", metavar="DIR", help="image folder (one sub-folder per class); default: the demo "
                   "dataset, built once into the user cache directory")
    p.add_argument("--threads", type=_positive_int, default=None, metavar="N",
                   help="threads (and PyTorch workers) per loader; default: the CPUs available")
    p.add_argument("--batch-size", type=_positive_int, default=64, metavar="B", help="batch size (default 64)")
    p.add_argument("--model-step-ms", type=_float_at_least(0.0, strict=False), default=0.0, metavar="M",
                   help="simulated model step per batch in ms (default 0: an infinitely fast model, "
                        "which measures each loader's ceiling)")
    p.add_argument("--seconds", type=_float_at_least(0.0, strict=True), default=4.0, metavar="S",
                   help="measured seconds per loader and run (default 4)")
    p.add_argument("--size", type=_crop_size, default=224, help="crop size (default 224)")
    p.add_argument("--loaders", type=_loader_list, default=["loaderlib", "python", "torch"],
                   metavar="LIST", help="comma-separated subset of loaderlib,python,torch (default: all available)")
    p.add_argument("--json", metavar="FILE", help="also write every report as JSON to FILE")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _native_loader(root: str, args: argparse.Namespace, threads: int) -> Any:
    import loaderlib as ll
    from loaderlib import transforms as T

    chain = T.Compose([T.RandomResizedCrop(args.size), T.RandomHorizontalFlip(),
                       T.Normalize(mean=MEAN, std=STD), T.ToCHW()])
    ds = ll.ImageFolderDataset(root).transform_first(chain)
    return ll.DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_threads=threads, seed=0)


def _torch_loader(items: list, args: argparse.Namespace, threads: int) -> Any:
    import torch.utils.data as tud

    from .baselines import TorchImageDataset

    return tud.DataLoader(TorchImageDataset(items, args.size), batch_size=args.batch_size, shuffle=True,
                          num_workers=threads, persistent_workers=True, prefetch_factor=2,
                          multiprocessing_context="forkserver", worker_init_fn=_torch_worker_init)


def _torch_worker_init(_worker_id: int) -> None:
    from .._opencv import cv2

    cv2.setNumThreads(1)  # one process per worker already; nested OpenCV threads only contend


def _ms(v: float) -> str:
    return f"{1e3 * v:,.0f} ms"


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for k, r in enumerate(rows):
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        out.append("  ".join(cells).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the benchmark and print the table; returns the exit status
    (2 for bad arguments; ``--help`` exits with status 0).

    Parameters
    ----------
    argv : list of str, optional
        Arguments after ``bench`` (``sys.argv[1:]`` when None; a leading ``bench`` is ignored).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        argv = argv[1:]
    from ..__main__ import main as loaderlib_main  # one parser: python -m loaderlib's

    return loaderlib_main(["bench", *argv])


def run(args: argparse.Namespace) -> int:
    """Run the benchmark for parsed arguments (see :func:`add_arguments`); returns the exit status."""
    wanted = list(args.loaders)
    if not args.data or {"python", "torch"} & set(wanted):  # the demo dataset and the baselines use OpenCV
        try:
            from .._opencv import cv2  # noqa: F401
        except ImportError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1

    from .. import ImageFolderDataset, available_cpus
    from .baselines import python_thread_loader
    from .demo import build_demo_dataset
    from .harness import benchmark

    progress = not args.no_progress
    if args.data:
        root, what = args.data, f"{args.data}"
    else:
        root = str(build_demo_dataset(progress=progress))
        what = f"demo dataset ({root})"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        folder = ImageFolderDataset(root)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    if len(folder) == 0:
        print(f"error: no images under {root!r}", file=sys.stderr)
        return 1
    threads = args.threads or available_cpus()
    step = args.model_step_ms / 1e3

    have_torch = False
    if "torch" in wanted:
        try:
            import torch  # noqa: F401

            have_torch = True
        except ImportError:
            pass

    print("loaderlib bench")
    print(f"  data      {len(folder)} images in {len(folder.synsets)} classes: {what}")
    print(f"  pipeline  RandomResizedCrop({args.size}) -> RandomHorizontalFlip -> Normalize -> ToCHW "
          f"(float32), batch {args.batch_size}")
    print(f"  machine   {available_cpus()} CPUs; {threads} threads per loader; model step "
          + (f"{args.model_step_ms:g} ms (simulated)" if step else "0 (infinitely fast model: the ceiling)")
          + f"; {args.seconds:g} s per run")
    print(flush=True)

    candidates = []
    if "loaderlib" in wanted:
        candidates.append(("loaderlib DataLoader", lambda: _native_loader(root, args, threads)))
    if "python" in wanted:
        candidates.append(("Python thread pool", lambda: python_thread_loader(
            folder.items, batch_size=args.batch_size, num_threads=threads, size=args.size)))
    if have_torch:
        candidates.append((f"PyTorch DataLoader ({threads} workers)", lambda: _torch_loader(folder.items, args,
                                                                                             threads)))
    elif "torch" in wanted:
        print("(PyTorch is not installed: its DataLoader is left out)\n")

    results: list[tuple[str, Any]] = []
    for name, make in candidates:
        loader = make()
        try:
            if progress:
                print(f"{name} ...", file=sys.stderr, flush=True)
            report = benchmark(loader, model_step=step, seconds=args.seconds, progress=progress)
        finally:
            close = getattr(loader, "close", None)
            if callable(close):
                close()
            del loader
        results.append((name, report))

    base = next((r for n, r in results if n == "Python thread pool"), None)
    head = ["loader", "engine", "images/s", "vs python", "first batch", "cores", "peak RSS", "bottleneck"]
    if step:
        head[3:3] = ["ceiling", "accel idle"]
    rows = [head]
    for name, r in results:
        row = [name, str(r.engine or "processes"), f"{r.samples_per_s:,.1f}",
               f"{r.samples_per_s / base.samples_per_s:.2f}x" if base and base.samples_per_s else "-",
               _ms(r.first_batch_s), f"{r.cpu_cores_used:.2f}", f"{r.peak_rss_bytes / 2**20:,.0f} MiB",
               str(r.bottleneck or "-")]
        if step:
            row[3:3] = [f"{r.ceiling_samples_per_s:,.1f}" if r.ceiling_samples_per_s else "-",
                        f"{100 * r.accelerator_idle_fraction:.0f}%"]
        rows.append(row)
    print("\n".join(_table(rows, right=set(range(2, len(head) - 1)))))
    print()

    staged = [(n, r) for n, r in results if r.stage_s is not None]
    if staged:
        rows = [["thread time per image (ms)", *STAGES, "pool busy"]]
        for name, r in staged:
            rows.append([name, *(f"{r.stage_mean_ms[k]:.3f}" for k in STAGES), f"{100 * r.busy_fraction:.0f}%"])
        print("\n".join(_table(rows, right=set(range(1, len(STAGES) + 2)))))
        print()
    if have_torch:
        print("(PyTorch's DataLoader exposes no per-stage timings: its verdict is only model vs data)\n")

    for name, r in results:
        print(f"verdict for {name}: {r.verdict.summary}")
        print(f"  try: {r.verdict.suggestion}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({name: r.to_dict() for name, r in results}, f, indent=1)
        print(f"\nreports written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
