"""Command line: ``python -m loaderlib {pack,bench} ...``.

``pack IMAGE_DIR OUT``: pack an image folder (one sub-folder per class) into record shards
(``OUT.llrec`` plus ``OUT.llidx``), readable with :class:`loaderlib.RecordFileDataset`.
``bench ...``: the profiling harness (``loaderlib.profiling.cli``).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings


def _pack(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m loaderlib pack",
                                description="Pack IMAGE_DIR/<class>/<image> into record shards (data plus index).")
    p.add_argument("image_dir", help="folder with one sub-folder per class")
    p.add_argument("out", help="output name: writes OUT.llrec and OUT.llidx (or OUT-00000.llrec, ... with "
                               "--shard-size)")
    p.add_argument("--shard-size", default=None, help="start a new shard every SIZE bytes (e.g. 1GB)")
    p.add_argument("--force", action="store_true", help="replace existing output files")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)

    from tqdm.auto import tqdm

    from .datasets import ImageFolderDataset
    from .errors import LoaderError
    from .records import parse_size, write_records

    if not os.path.isdir(args.image_dir):
        print(f"error: {args.image_dir!r} is not a folder", file=sys.stderr)
        return 1
    try:
        shard_size = parse_size(args.shard_size) if args.shard_size is not None else None
    except ValueError as e:
        print(f"error: --shard-size: {e}", file=sys.stderr)
        return 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = ImageFolderDataset(args.image_dir)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    if not len(ds):
        print(f"error: no images under {args.image_dir!r}", file=sys.stderr)
        return 1
    paths = [path for path, _ in ds.items]
    try:
        written = write_records(args.out, tqdm(paths, desc="packing", unit="img", disable=args.quiet), ds.labels,
                                synsets=ds.synsets, overwrite=args.force, shard_size=shard_size)
    except (OSError, LoaderError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    shards = written if isinstance(written, list) else [written]
    print(f"packed {len(paths)} images in {len(ds.synsets)} classes into {len(shards)} shard(s): "
          f"{shards[0][0]}{' ...' if len(shards) > 1 else ''}")
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
