"""Fail early, and readably, when the compiled extensions are missing or cannot load.

NOTE [ Check the build first ]
``loaderlib/__init__.py`` imports this module before anything else (scikit-learn's
``__check_build`` does the same). A source checkout where ``make build`` never ran, a
checkout whose extensions were built for another Python, or a wheel whose bundled
libraries went missing would otherwise fail deep inside the first module that touches
``loaderlib._ext`` with "No module named 'loaderlib._ext._jpeg'" or an ``undefined symbol``,
which says nothing about what to do. Here the failure names the extension, the folder it was
looked for in, what that folder holds, and the command that fixes it.
"""

from __future__ import annotations

import importlib
import os

EXTENSIONS = ("_arena", "_jpeg", "_chain", "_transform")   # _chain cimports _jpeg: it comes after it


def _advice(package_dir: str) -> str:
    root = os.path.dirname(package_dir)
    if os.path.exists(os.path.join(root, "setup.py")) and os.path.isdir(os.path.join(root, "pyx")):
        return (
            f"This is a source checkout ({root}): build the extensions in place with\n"
            f"    make build                  (creates .venv; or `make test` / `make bench`)\n"
            f"or, in your own environment,\n"
            f"    pip install -e .            (needs gcc, libjpeg62-turbo-dev and pkg-config)\n"
            f"If you meant to use an installed loaderlib, run Python from another folder:\n"
            f"this checkout's loaderlib/ shadows it."
        )
    return (
        "Reinstall loaderlib so that its compiled modules match this Python:\n"
        "    pip install --force-reinstall --no-cache-dir loaderlib"
    )


# NOTE [ OpenMP threads wait passively ]
# GNU OpenMP's threads spin for a while (GOMP_SPINCOUNT, 300,000 turns by default) after each
# parallel region before they sleep. A loader's regions are whole batches, tens of
# milliseconds apart, so the spinning buys nothing and takes cores from the training
# process and from the loader's own Python threads: with the default, 11% of the native
# engine's CPU went to libgomp's spin loop on a busy 2-core machine
# (``python benchmarks/cpu_split.py``, load average about 5). libgomp reads its
# settings once, when it is loaded, which is when the first extension is imported here:
# unless the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT, that import sees
# OMP_WAIT_POLICY=passive, and the variable is removed again afterwards, so child processes
# and other libraries loaded later see the environment as the user left it.


def check_build() -> None:
    """Import every compiled extension; raise ImportError with advice when one fails."""
    package_dir = os.path.dirname(os.path.abspath(__file__))
    passive = "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ
    if passive:
        os.environ["OMP_WAIT_POLICY"] = "passive"   # NOTE [ OpenMP threads wait passively ]
    try:
        _import_all(package_dir)
    finally:
        if passive:
            os.environ.pop("OMP_WAIT_POLICY", None)


def _import_all(package_dir: str) -> None:
    for name in EXTENSIONS:
        try:
            importlib.import_module(f"loaderlib._ext.{name}")
        except ImportError as e:
            ext_dir = os.path.join(package_dir, "_ext")
            try:
                present = sorted(f for f in os.listdir(ext_dir) if not f.startswith("__"))
            except OSError:
                present = []
            listing = "\n".join(f"    {f}" for f in present) or "    (no compiled modules)"
            found_but_broken = "" if isinstance(e, ModuleNotFoundError) else (
                "The module file is there but did not load (the reason above is the dynamic loader's): "
                "a library it links\n(libjpeg, libgomp) is missing, or it was built for another Python or "
                "platform. Install the\nlibraries (Debian: apt-get install libjpeg62-turbo libgomp1) or a "
                "loaderlib wheel, which bundles them.\n")
            raise ImportError(
                f"loaderlib's compiled extension loaderlib._ext.{name} cannot be imported:\n"
                f"    {e}\n"
                f"It was looked for in {ext_dir}, which holds:\n{listing}\n"
                f"{found_but_broken}{_advice(package_dir)}"
            ) from e


check_build()
