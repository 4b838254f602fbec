"""Build script for loaderlib.

Every ``pyx/_<name>.pyx`` compiles to ``loaderlib._ext._<name>``.  The build probes
for OpenMP and libjpeg-turbo before compiling anything:

* OpenMP: a tiny test program is compiled with the platform's OpenMP flags (gcc:
  ``-fopenmp``; macOS: ``-Xpreprocessor -fopenmp`` and Homebrew's libomp, found with
  ``LOADERLIB_LIBOMP_PREFIX`` or ``brew --prefix libomp``; Windows: MSVC's ``/openmp:llvm``,
  not probed; ``LOADERLIB_OPENMP_CFLAGS``/``LOADERLIB_OPENMP_LDFLAGS`` override them); when
  that fails the extensions are built serially (``pyx/omp.pxd`` supplies no-op stand-ins)
  and a loud warning says so.  ``loaderlib.build_info()["openmp"]`` reports the result.
* libjpeg-turbo: ``LOADERLIB_LIBJPEG_PREFIX=/some/prefix`` (with ``include/`` and
  ``lib/`` or ``lib64/``) overrides everything; otherwise, on Python >= 3.12 on
  x86_64 Linux, the static libjpeg-turbo 3.1 from the ``comma-deps-libjpeg`` wheel
  is used when it is installed; otherwise the system library found by
  ``pkg-config libjpeg`` (Debian: ``apt-get install libjpeg62-turbo-dev``).
  A missing library stops the build with a message saying what to install.

``LOADERLIB_DEBUG=1`` builds with bounds checks on and without optimisation.
``LOADERLIB_SKIP_EXT=1`` leaves the extensions out: the Makefile's editable install sets it,
because ``make build`` compiles them in place right after, two at a time (an editable install
compiles them one at a time, and ``make build`` then compiled them all again: 69 s + 100 s on
a fresh clone instead of 100 s).
"""

from __future__ import annotations

import glob
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
DEBUG = os.environ.get("LOADERLIB_DEBUG", "") not in ("", "0")


def _warn(msg: str) -> None:
    bar = "!" * 78
    sys.stderr.write(f"\n{bar}\nloaderlib build WARNING: {msg}\n{bar}\n\n")


def _compiler() -> str:
    return os.environ.get("CC") or (sysconfig.get_config_var("CC") or "cc").split()[0]


def _try_compile(code: str, cflags: list[str], ldflags: list[str]) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(code)
        cmd = [_compiler(), *cflags, src, "-o", os.path.join(tmp, "probe"), *ldflags]
        try:
            res = subprocess.run(cmd, capture_output=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return res.returncode == 0


def _brew_prefix(formula: str) -> str | None:
    exe = shutil.which("brew")
    if exe is None:
        return None
    res = subprocess.run([exe, "--prefix", formula], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        return None
    return res.stdout.strip() or None


def openmp_flags() -> tuple[list[str], list[str]]:
    """Compile and link flags that turn OpenMP on with this platform's compiler."""
    cflags, ldflags = os.environ.get("LOADERLIB_OPENMP_CFLAGS"), os.environ.get("LOADERLIB_OPENMP_LDFLAGS")
    if cflags is not None or ldflags is not None:
        return shlex.split(cflags or ""), shlex.split(ldflags or "")
    if sys.platform == "darwin":  # Apple clang: the preprocessor flag plus Homebrew's libomp
        prefix = os.environ.get("LOADERLIB_LIBOMP_PREFIX") or _brew_prefix("libomp")
        inc = [f"-I{prefix}/include"] if prefix else []
        lib = [f"-L{prefix}/lib", f"-Wl,-rpath,{prefix}/lib"] if prefix else []
        return ["-Xpreprocessor", "-fopenmp", *inc], [*lib, "-lomp"]
    if sys.platform == "win32":  # MSVC's LLVM-based OpenMP runtime (Visual Studio 2019 16.9 and later)
        return ["/openmp:llvm"], []
    return ["-fopenmp"], ["-fopenmp"]


def probe_openmp() -> tuple[list[str], list[str]] | None:
    """The OpenMP flags when a test program builds with them, else None (serial build)."""
    if os.environ.get("LOADERLIB_NO_OPENMP"):
        _warn("LOADERLIB_NO_OPENMP is set: building without OpenMP (kernels run serially).")
        return None
    cflags, ldflags = openmp_flags()
    if sys.platform == "win32":  # no `cc` to probe with; MSVC 2019+ has /openmp:llvm
        return cflags, ldflags
    code = textwrap.dedent(
        """
        #include <omp.h>
        int main(void) { int n = 0;
        #pragma omp parallel reduction(+:n)
          n += 1;
          return omp_get_max_threads() > 0 && n > 0 ? 0 : 1; }
        """
    )
    if _try_compile(code, cflags, ldflags):
        return cflags, ldflags
    _warn(
        f"the C compiler does not support OpenMP ({' '.join(cflags)} failed). loaderlib is being "
        "built SERIALLY: every kernel will use one thread. Install gcc with libgomp "
        "(Debian: apt-get install gcc; macOS: brew install libomp) and reinstall to get parallel kernels."
    )
    return None


def _pkg_config(*args: str) -> list[str] | None:
    exe = shutil.which("pkg-config")
    if exe is None:
        return None
    res = subprocess.run([exe, *args, "libjpeg"], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        return None
    return res.stdout.split()


def find_libjpeg() -> dict:
    """Return include dirs, library dirs, libraries and extra objects for libjpeg-turbo."""
    prefix = os.environ.get("LOADERLIB_LIBJPEG_PREFIX")
    if prefix:
        libdirs = [d for d in (os.path.join(prefix, "lib64"), os.path.join(prefix, "lib")) if os.path.isdir(d)]
        header = os.path.join(prefix, "include", "jpeglib.h")
        if not os.path.exists(header) or not libdirs:
            raise SystemExit(
                f"LOADERLIB_LIBJPEG_PREFIX={prefix!r} does not contain include/jpeglib.h and lib/: "
                "point it at a libjpeg-turbo installation prefix."
            )
        return {
            "source": f"prefix {prefix}",
            "include_dirs": [os.path.join(prefix, "include")],
            "library_dirs": libdirs,
            "libraries": ["jpeg"],
            "extra_link_args": [] if sys.platform == "win32" else [f"-Wl,-rpath,{d}" for d in libdirs],
        }

    if sys.version_info >= (3, 12) and platform.machine() == "x86_64" and sys.platform == "linux":
        try:  # static libjpeg-turbo 3.1 with SIMD, from PyPI (Python >= 3.12 only)
            import comma_deps_libjpeg as cdl  # type: ignore[import-not-found]

            root = os.path.dirname(cdl.__file__)
            incs = glob.glob(os.path.join(root, "**", "jpeglib.h"), recursive=True)
            libs = glob.glob(os.path.join(root, "**", "libjpeg.a"), recursive=True)
            if incs and libs:
                return {
                    "source": f"comma-deps-libjpeg ({root})",
                    "include_dirs": [os.path.dirname(incs[0])],
                    "library_dirs": [],
                    "libraries": [],
                    "extra_objects": [libs[0]],
                }
        except ImportError:
            pass

    cflags = _pkg_config("--cflags")
    libs = _pkg_config("--libs")
    if libs is not None:
        return {
            "source": "system (pkg-config libjpeg)",
            "include_dirs": [f[2:] for f in cflags or [] if f.startswith("-I")],
            "library_dirs": [f[2:] for f in libs if f.startswith("-L")],
            "libraries": [f[2:] for f in libs if f.startswith("-l")] or ["jpeg"],
        }
    if _try_compile('#include <stdio.h>\n#include <jpeglib.h>\nint main(void){return 0;}\n', [], ["-ljpeg"]):
        return {"source": "system (default search path)", "include_dirs": [], "library_dirs": [], "libraries": ["jpeg"]}
    raise SystemExit(
        "\nloaderlib needs libjpeg-turbo and could not find it.\n"
        "  Debian/Ubuntu:  apt-get install libjpeg62-turbo-dev pkg-config   (or libjpeg-turbo8-dev)\n"
        "  Fedora/RHEL:    dnf install libjpeg-turbo-devel pkgconf\n"
        "  Python >= 3.12 on x86_64 Linux: pip install comma-deps-libjpeg\n"
        "  Or set LOADERLIB_LIBJPEG_PREFIX to a libjpeg-turbo install prefix.\n"
    )


def extensions() -> list:
    from Cython.Build import cythonize

    omp_flags = probe_openmp()
    openmp = omp_flags is not None
    jpeg = find_libjpeg()
    sys.stderr.write(f"loaderlib build: OpenMP={'on' if openmp else 'OFF'}, libjpeg from {jpeg['source']}\n")

    cflags = ["-O0", "-g"] if DEBUG else ["-O3"]
    cflags += ["-Wno-unused-function", "-Wno-unreachable-code"]
    ldflags = list(jpeg.get("extra_link_args", []))
    if omp_flags is not None:
        cflags += omp_flags[0]
        ldflags += omp_flags[1]
    if sys.platform != "win32":
        cflags.append("-pthread")   # the chain's kernel threads (pyx/include/ll_pool.h)
        ldflags.append("-pthread")
    macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"), ("LL_OPENMP", "1" if openmp else "0")]
    libjpeg_src = jpeg["source"].replace('"', "'")
    macros.append(("LL_LIBJPEG_SOURCE", f'"{libjpeg_src}"'))

    import numpy

    # The C headers every kernel includes: editing one rebuilds the extensions (build_ext
    # compares them with the built modules; cythonize tracks only .pyx/.pxd dependencies).
    headers = sorted(glob.glob(os.path.join("pyx", "include", "*.h")))
    exts = []
    for path in sorted(glob.glob(os.path.join("pyx", "_*.pyx"))):
        name = os.path.splitext(os.path.basename(path))[0]
        exts.append(
            Extension(
                f"loaderlib._ext.{name}",
                [path],
                include_dirs=["pyx", os.path.join("pyx", "include"), numpy.get_include(), *jpeg["include_dirs"]],
                library_dirs=jpeg["library_dirs"],
                libraries=jpeg["libraries"],
                extra_objects=jpeg.get("extra_objects", []),
                extra_compile_args=cflags,
                extra_link_args=ldflags,
                define_macros=macros,
                depends=headers,
            )
        )
    directives = {
        "language_level": 3,
        "boundscheck": DEBUG,
        "wraparound": False,
        "cdivision": True,
        "initializedcheck": DEBUG,
        "embedsignature": True,
    }
    return cythonize(
        exts,
        compiler_directives=directives,
        compile_time_env={"LL_OPENMP": openmp},
        include_path=["pyx"],
        nthreads=int(os.environ.get("LOADERLIB_BUILD_JOBS", "0")) or os.cpu_count() or 1,
    )


setup(
    packages=["loaderlib", "loaderlib._datasets", "loaderlib._datasets.tokens", "loaderlib._engines", "loaderlib._ext", "loaderlib._extract", "loaderlib._extract.remote", "loaderlib._loader", "loaderlib._observe", "loaderlib._pipeline", "loaderlib.integrations",
              "loaderlib.profiling", "loaderlib.transforms"],
    package_dir={"loaderlib.profiling": "profiling"},
    package_data={"loaderlib": ["_data/*.jpg", "_data/NOTICE", "py.typed"]},
    include_package_data=False,  # exactly the files above: no .pyx/.c/.h next to the modules
    ext_modules=[] if os.environ.get("LOADERLIB_SKIP_EXT", "") not in ("", "0") else extensions(),
    zip_safe=False,
)
