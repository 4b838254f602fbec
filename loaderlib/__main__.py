"""Command line: ``python -m loaderlib {bench,pack,tokenize,doctor} ...`` (also installed as ``loaderlib``).

``bench``: the profiling harness (its options and code live in ``loaderlib.profiling.cli``,
imported only when this subcommand runs: the core never imports profiling otherwise).
``pack IMAGE_DIR OUT``: pack an image folder (one sub-folder per class) into record shards
(``OUT.llrec`` plus ``OUT.llidx``), readable with :class:`loaderlib.RecordFileDataset`;
``--max-side N --quality Q [--raw-below PIXELS] [--reencode]`` store images at a capped
resolution (:func:`loaderlib.pack`).
``tokenize INPUT... OUT --tokenizer tokenizer.json``: tokenize JSON Lines, text or Parquet files
into a Megatron-LM indexed dataset (``OUT.bin`` plus ``OUT.idx``; :func:`loaderlib.write_tokens`).
``doctor``: what this installation was built with and why the defaults are what they are.

Exit status: 0 success, 1 the command failed (a message says why), 2 bad command line (one
line on stderr naming the problem and the ``--help`` to read).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import warnings
from typing import NoReturn

PROG = "python -m loaderlib"

EXAMPLES = f"""examples:
  {PROG} doctor                         what this build got (OpenMP, SIMD, libjpeg-turbo, threads)
  {PROG} bench                          benchmark on the demo dataset
  {PROG} bench --data ~/imagenet/train --threads 8
  {PROG} pack ~/imagenet/train train --shard-size 1GB
  {PROG} tokenize corpus/*.jsonl.zst corpus --tokenizer tokenizer.json --append-eos
"""

PACK_EXAMPLES = f"""examples:
  {PROG} pack photos/ photos                     writes photos.llrec and photos.llidx
  {PROG} pack ~/imagenet/train train --shard-size 1GB --force
  {PROG} pack ~/imagenet/train train256 --max-side 256 --quality 90 --shard-size 1GB
                                      longer sides over 256 px resized, re-encoded at q90
  {PROG} pack photos/ small --max-side 160 --raw-below 30000
                                      images under 30,000 pixels stored as raw pixels
then read it with:  loaderlib.RecordFileDataset("train-*.llrec")
"""

TOKENIZE_EXAMPLES = f"""examples:
  {PROG} tokenize train.jsonl train --tokenizer tokenizer.json       writes train.bin and train.idx
  {PROG} tokenize shards/*.jsonl.zst web --tokenizer tok/ --append-eos
                                      tok/tokenizer.json; EOS from tok/tokenizer_config.json
  {PROG} tokenize wiki.parquet wiki --tokenizer tokenizer.json --text-key article --append-eos --eos-id 2
  {PROG} tokenize books/*.txt books --tokenizer tokenizer.json         each .txt file is one document
then read it with loaderlib.TokenDataset, or with Megatron-LM: IndexedDataset("train")
"""

DOCTOR_EXAMPLES = f"""examples:
  {PROG} doctor                         the report, with a 2-second decode self-check
  {PROG} doctor --seconds 0             without the self-check
  {PROG} doctor --json                  the same facts as JSON
  {PROG} doctor --storage photos/       what the storage delivers: read latency, files/s at
                                                  1 to 256 reads in flight, the io_depth and ceiling
  {PROG} doctor --storage s3://bucket/train/ --seconds 20 --json
"""


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error: ``PROG: error: MESSAGE (see PROG --help)``, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _shard_size(text: str) -> int:
    from ._datasets.records import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _max_side(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of pixels, got {text!r}") from None
    if v < 16:
        raise argparse.ArgumentTypeError(f"must be at least 16 pixels, got {v}")
    return v


def _quality(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a JPEG quality from 1 to 100, got {text!r}") from None
    if not 1 <= v <= 100:
        raise argparse.ArgumentTypeError(f"must be from 1 to 100, got {v}")
    return v


def _pixels(text: str) -> int:
    try:
        v = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a pixel count, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {v}")
    return v


def _threads(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of threads, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def _count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {v}")
    return v


def _documents(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of documents, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 <= v <= 3600:
        raise argparse.ArgumentTypeError(f"expected 0 to 3600 seconds, got {text!r}")
    return v


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``python -m loaderlib`` parser.

    Parameters
    ----------
    argv : list of str, optional
        The arguments about to be parsed: the ``bench`` options are added (importing
        ``loaderlib.profiling.cli``) only when they start with ``bench``.
    """
    from . import __version__

    p = _Parser(prog=PROG, description="loaderlib: a data loader whose common path runs in native kernels.",
                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"loaderlib {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands", parser_class=_Parser)
    sub.required = True

    bench = sub.add_parser("bench", help="benchmark loaderlib against the loaders people use, with verdicts",
                           description="Benchmark loaderlib's DataLoader (see --help of this command).")
    if argv is not None and argv[:1] == ["bench"]:
        from .profiling.cli import add_arguments  # only this subcommand loads loaderlib.profiling

        add_arguments(bench)

    pack = sub.add_parser("pack", help="pack an image folder into record shards",
                          description=textwrap.fill("Pack IMAGE_DIR/<class>/<image> into record shards (data "
                                                    "plus index), readable with loaderlib.RecordFileDataset.", 88),
                          epilog=PACK_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    pack.add_argument("image_dir", help="folder with one sub-folder per class")
    pack.add_argument("out", help="output name: writes OUT.llrec and OUT.llidx (or OUT-00000.llrec, ... with "
                                  "--shard-size)")
    pack.add_argument("--shard-size", type=_shard_size, default=None, metavar="SIZE",
                      help="start a new shard every SIZE bytes (e.g. 1GB)")
    pack.add_argument("--max-side", type=_max_side, default=None, metavar="N",
                      help="resize images whose longer side exceeds N pixels (at least 16), antialiased, and "
                           "re-encode them; records keep the original size")
    pack.add_argument("--quality", type=_quality, default=90, metavar="Q",
                      help="JPEG quality of re-encoded images, 1-100 (default 90)")
    pack.add_argument("--raw-below", type=_pixels, default=0, metavar="PIXELS",
                      help="store images of fewer stored pixels than this as raw pixels (no decode when loading)")
    pack.add_argument("--reencode", action="store_true",
                      help="re-encode images within --max-side too (default: keep their bytes)")
    pack.add_argument("--on-error", choices=("raise", "skip"), default="raise",
                      help="an image that cannot be read or decoded: stop (raise, the default; nothing is written) "
                           "or leave it out (skip)")
    pack.add_argument("--threads", type=_threads, default=None, metavar="N",
                      help="threads that pack images (default: the available CPUs)")
    pack.add_argument("--force", action="store_true", help="replace existing output files")
    pack.add_argument("--quiet", action="store_true", help="no progress bar")

    tok = sub.add_parser("tokenize", help="tokenize text files into a Megatron .bin/.idx token corpus",
                         description=textwrap.fill(
                             "Tokenize INPUT files (JSON Lines .jsonl/.ndjson/.json, plain .txt: one document per "
                             "file, either optionally .gz or .zst; .parquet) with a Hugging Face tokenizer into "
                             "OUT.bin and OUT.idx, the Megatron-LM indexed dataset format (uint16 tokens up to "
                             "65,536 ids, else int32), one sequence per document; empty documents are skipped. "
                             "The files appear only once complete. Needs the [tokens] extra.", 88),
                         epilog=TOKENIZE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    tok.add_argument("inputs", nargs="+", metavar="INPUT", help="text files to tokenize, in this order")
    tok.add_argument("out", metavar="OUT", help="output prefix: writes OUT.bin and OUT.idx (replacing them)")
    tok.add_argument("--tokenizer", required=True, metavar="FILE",
                     help="a Hugging Face tokenizer.json, or a folder holding one")
    tok.add_argument("--text-key", default="text", metavar="KEY",
                     help="the JSON key or Parquet column holding the text (default: text)")
    tok.add_argument("--append-eos", action="store_true",
                     help="append an end-of-document id to every document (the tokenizer's EOS, or --eos-id)")
    tok.add_argument("--eos-id", type=_count, default=None, metavar="N", help="the id --append-eos appends")
    tok.add_argument("--batch-size", type=_documents, default=1000, metavar="N",
                     help="documents per tokenizer batch (default 1000)")
    tok.add_argument("--no-progress", action="store_true", help="no progress bar")

    doctor = sub.add_parser("doctor", help="report the build, thread defaults, fork safety and extras",
                            description=textwrap.fill(
                                "What this installation of loaderlib was built with (OpenMP, SIMD, libjpeg-turbo), "
                                "the default thread count and why (affinity, cgroup quota, LOCAL_WORLD_SIZE), fork "
                                "safety, the optional packages found, and a decode self-check. Exit status 1 when "
                                "a problem is found.", 88),
                            epilog=DOCTOR_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    doctor.add_argument("--seconds", type=_seconds, default=None, metavar="S",
                        help="length of the decode self-check (default 2; 0 skips it); with --storage, the "
                             "probe's time budget (default 10)")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument("--storage", metavar="PATH_OR_URL",
                        help="probe where the data lives instead (a folder, file, glob, s3://, gs:// or http(s):// "
                             "URL): read latency p50/p95/p99, bytes/s and files/s at 1, 8, 64 and 256 reads in "
                             "flight, the CPU each read costs this machine, the io_depth the loader needs there "
                             "and its ceiling, min(cores with the reads' CPU, storage)")
    return p


def _pack(args: argparse.Namespace) -> int:
    from ._datasets.records import pack
    from .errors import LoaderError

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            report = pack(args.image_dir, args.out, max_side=args.max_side, quality=args.quality,
                          raw_below=args.raw_below, reencode=args.reencode, shard_size=args.shard_size,
                          overwrite=args.force, on_error=args.on_error, num_threads=args.threads,
                          progress=not args.quiet)
        except FileExistsError as e:
            print(f"error: {str(e).replace('pass overwrite=True (--force)', 'pass --force')}", file=sys.stderr)
            return 1
        except (OSError, LoaderError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        finally:
            for w in caught:
                print(f"warning: {w.message}", file=sys.stderr)
    shards = report.shards
    mb_in, mb_out = report.bytes_in / 1e6, report.bytes_out / 1e6
    kinds = ", ".join(f"{v} {k}" for k, v in report.kinds.items() if v)
    print(f"packed {report.images} images in {report.classes} classes into {len(shards)} shard(s): "
          f"{shards[0][0]}{' ...' if len(shards) > 1 else ''}")
    saved = report.bytes_saved
    share = f" ({100 * saved / report.bytes_in:.0f}%)" if report.bytes_in else ""
    print(f"{mb_in:,.1f} MB in, {mb_out:,.1f} MB out: {saved / 1e6:,.1f} MB saved{share}; records: {kinds}; "
          f"{report.seconds:.1f} s ({report.images / max(report.seconds, 1e-9):,.0f} images/s)")
    if report.skipped:
        print(f"skipped {len(report.skipped)} image(s) that could not be read or decoded (listed above)")
    return 0


def _tokenize(args: argparse.Namespace) -> int:
    from . import write_tokens
    from .errors import LoaderError

    try:
        report = write_tokens(args.inputs, args.out, tokenizer=args.tokenizer, text_key=args.text_key,
                              append_eos=args.append_eos, eos_id=args.eos_id, batch_size=args.batch_size,
                              progress=not args.no_progress)
    except (OSError, LoaderError, ValueError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)   # the messages name the flag beside the keyword
        return 1
    print(report.summary())
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from ._observe.doctor import diagnose, format_report

    if args.storage is not None:
        return _doctor_storage(args)
    report = diagnose(seconds=2.0 if args.seconds is None else args.seconds)
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 1 if report["problems"] else 0


def _doctor_storage(args: argparse.Namespace) -> int:
    from ._observe.probe import probe_storage

    seconds = 10.0 if args.seconds is None else args.seconds
    if seconds <= 0:
        print("error: --seconds must be above 0 with --storage", file=sys.stderr)
        return 2
    try:
        report = probe_storage(args.storage, seconds=seconds)
    except (OSError, ValueError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(report.to_dict(), indent=1) if args.json else str(report))
    return 0 if any(lv.reads for lv in report.levels) else 1   # nothing answered: a problem


def main(argv: list[str] | None = None) -> int:
    """Run one command and return the exit status.

    Parameters
    ----------
    argv : list of str, optional
        The arguments (``sys.argv[1:]`` when None).

    Returns
    -------
    int
        0 success, 1 the command failed, 2 a bad command line (one line on stderr says
        what). ``--help`` and ``--version`` print and raise ``SystemExit(0)``, as argparse does.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(argv).parse_args(argv)
    except SystemExit as e:
        if e.code in (0, None):
            raise
        return e.code if isinstance(e.code, int) else 2
    if args.command == "pack":
        return _pack(args)
    if args.command == "tokenize":
        return _tokenize(args)
    if args.command == "doctor":
        return _doctor(args)
    from .profiling.cli import run  # imported lazily: only this subcommand needs it

    return run(args)


def entry_point() -> NoReturn:
    """The ``loaderlib`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    entry_point()
