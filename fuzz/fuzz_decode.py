"""Coverage-guided fuzzing of the decoders and the fused chain (``make fuzz``).

Every input is tried as one image through ``ll.decode`` (full, DCT-scaled, cropped),
``ll.decode_batch`` (2 threads, alongside a valid image) and a fused native chain
(``RandomResizedCrop`` + flip + ``Normalize`` + ``ToCHW`` on 2 threads). Any exception other than
the documented ones (``DecodeError``, and ``ValueError`` for a crop outside the image) is a
finding, and so is a crash of the process (memory safety: the native code must never fault on
bad input).

Usage::

    python fuzz/fuzz_decode.py [libFuzzer options] fuzz/corpus     # needs atheris
    python fuzz/fuzz_decode.py --slice 2000 fuzz/corpus             # deterministic, no atheris
    python fuzz/fuzz_decode.py --sanitized --slice N DIR...         # ASan/UBSan build (make fuzz)

``--sanitized`` first checks that the extensions in use are the sanitizer build (libasan
mapped, extensions outside the source tree), replays every corpus file as it is, then runs
the slice. See NOTE [ Sanitizers and atheris ] in the Makefile.
"""

from __future__ import annotations

import os
import sys
import warnings

os.environ.setdefault("OPENCV_LOG_LEVEL", "FATAL")   # OpenCV's own stderr notes on every bad input

import numpy as np

import loaderlib as ll
from loaderlib import transforms as T
from loaderlib._chain import compile_chain

warnings.simplefilter("ignore", ll.DecodeWarning)
_PLAN = compile_chain(T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(),
                                 T.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)), T.ToCHW()]))
_OUT = np.zeros((2, 3, 16, 16), np.float32)
_GOOD: bytes | None = None


def one_input(data: bytes) -> None:
    """Run one input through every entry point; raise only on an undocumented failure."""
    for kwargs in ({}, {"scale": 0.5}, {"crop": (1, 1, 5, 5)}, {"mode": "GRAY", "strict": True}):
        try:
            ll.decode(data, max_pixels=4_000_000, **kwargs)
        except ll.DecodeError:
            pass
        except ValueError as e:
            if "crop box" not in str(e):
                raise
    good = _GOOD if _GOOD is not None else data
    res = ll.decode_batch([data, good], max_pixels=4_000_000, num_threads=2, on_error="return")
    assert len(res.images) == 2
    st = _PLAN.run_buffers_into([data, good], _OUT, np.array([7, 8]), seed=1, epoch=0, num_threads=2)
    assert st.status.shape == (2,)


def _corpus(paths: list[str]) -> list[bytes]:
    files = []
    for p in paths:
        names = [os.path.join(p, n) for n in sorted(os.listdir(p))] if os.path.isdir(p) else [p]
        for name in filter(os.path.isfile, names):   # fuzz/corpus/<target>/: the parser targets' seeds
            with open(name, "rb") as f:
                files.append(f.read())
    return files


def run_slice(n: int, corpus: list[bytes], seed: int = 0) -> int:
    """``n`` deterministic mutations of the corpus (truncations, bit flips, byte runs, splices)."""
    rng = np.random.default_rng(seed)
    for k in range(n):
        base = bytearray(corpus[k % len(corpus)])
        kind = k % 4
        if kind == 0:
            base = base[: int(rng.integers(0, len(base) + 1))]
        elif kind == 1:
            for _ in range(int(rng.integers(1, 8))):
                i = int(rng.integers(0, len(base)))
                base[i] ^= 1 << int(rng.integers(0, 8))
        elif kind == 2:
            i = int(rng.integers(0, len(base)))
            base[i:i + int(rng.integers(1, 32))] = bytes([int(rng.integers(0, 256))]) * int(rng.integers(1, 32))
        else:
            other = corpus[int(rng.integers(0, len(corpus)))]
            i, j = int(rng.integers(0, len(base))), int(rng.integers(0, len(other)))
            base = base[:i] + other[j:]
        one_input(bytes(base))
    return n


def main(argv: list[str]) -> int:
    global _GOOD
    slice_n = int(argv[argv.index("--slice") + 1]) if "--slice" in argv else None
    rest = [a for k, a in enumerate(argv) if not (a == "--slice" or (k and argv[k - 1] == "--slice"))]
    paths = [a for a in rest if not a.startswith("-")]
    corpus = _corpus(paths or [os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")])
    _GOOD = corpus[0]
    if "--sanitized" in argv:
        from loaderlib._ext import _jpeg

        with open("/proc/self/maps") as f:
            maps = f.read()
        if "libasan" not in maps or "libubsan" not in maps or "asan" not in _jpeg.__file__:
            raise SystemExit(f"--sanitized: not the ASan/UBSan build ({_jpeg.__file__}); run `make fuzz`")
        for data in corpus:
            one_input(data)
        n = run_slice(slice_n or 0, corpus)
        print(f"{len(corpus) + n} inputs ({len(corpus)} corpus files replayed, {n} mutations) under "
              f"AddressSanitizer + UBSan ({os.path.dirname(_jpeg.__file__)}): 0 findings")
        return 0
    if slice_n is not None:
        print(f"{run_slice(slice_n, corpus)} inputs, 0 findings")
        return 0
    import atheris

    atheris.instrument_all()   # Python coverage of loaderlib's owners; native faults end the run
    atheris.Setup([sys.argv[0], *rest], lambda data: one_input(bytes(data)))
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
