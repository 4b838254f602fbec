"""Build the C programs of tests/kernels against the native headers (pyx/include)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_c(tmp_path, src: str, flags: list[str], *, asan: bool = False) -> str:
    """Build the C program ``src`` (a path under ``ROOT``, written out as
    ``os.path.join(ROOT, ...)`` so that tests/unit/test_packaging.py sees the sdist needs it)
    into ``tmp_path`` with ``flags`` after the sources (libraries, ``-fopenmp``); returns the
    executable's path. ``asan``: with AddressSanitizer where the compiler has its runtime,
    without it otherwise. A missing compiler or a failed build fails the test (the extensions
    need the same compiler)."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    assert shutil.which(cc), f"no C compiler {cc!r} (the extensions need one too)"
    exe = str(tmp_path / os.path.basename(src)[:-2])
    base = [cc, "-O1", "-g", "-I", os.path.join(ROOT, "pyx", "include"), src, "-o", exe, *flags]
    built = subprocess.run([*base, "-fsanitize=address"] if asan else base, capture_output=True, text=True,
                           check=False)
    if asan and built.returncode != 0:   # no AddressSanitizer runtime
        built = subprocess.run(base, capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr
    return exe


def libjpeg_flags() -> list[str]:
    """How to build against libjpeg: pkg-config's flags, or ``-ljpeg`` where pkg-config is
    missing or does not know it."""
    if shutil.which("pkg-config"):
        got = subprocess.run(["pkg-config", "--cflags", "--libs", "libjpeg"], capture_output=True, text=True,
                             check=False)
        if got.returncode == 0 and got.stdout.split():
            return got.stdout.split()
    return ["-ljpeg"]
