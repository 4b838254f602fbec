"""Command line: ``python -m loaderlib {pack,bench} ...``.

``pack IMAGE_DIR OUT``: pack an image folder (one sub-folder per class) into ``OUT.rec`` plus
``OUT.idx``, readable with :class:`loaderlib.RecordFileDataset`.
``bench ...``: the profiling harness (``loaderlib.profiling.cli``).
"""

from __future__ import annotations

import argparse
import sys
import warnings


def _pack(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m loaderlib pack",
                                description="Pack IMAGE_DIR/<class>/<image> into one record file plus an index.")
    p.add_argument("image_dir", help="folder with one sub-folder per class")
    p.add_argument("out", help="output name: writes OUT.rec and OUT.idx")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)

    from tqdm.auto import tqdm

    from .datasets import ImageFolderDataset, write_records

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = ImageFolderDataset(args.image_dir)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    if not len(ds):
        print(f"error: no images under {args.image_dir!r}", file=sys.stderr)
        return 1
    paths = [path for path, _ in ds.items]
    data, index = write_records(args.out, tqdm(paths, desc="packing", unit="img", disable=args.quiet),
                                ds.labels, synsets=ds.synsets)
    print(f"packed {len(paths)} images in {len(ds.synsets)} classes into {data} (index {index})")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"pack": "pack an image folder into a record file", "bench": "run the loader benchmark harness"}
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        lines = "\n".join(f"  {k:<6} {v}" for k, v in commands.items())
        print(f"usage: python -m loaderlib {{{','.join(commands)}}} ...\n\n{lines}",
              file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "pack":
        return _pack(rest)
    from .profiling.cli import main as bench_main  # imported lazily: only this subcommand needs it

    return bench_main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
