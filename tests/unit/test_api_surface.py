"""The public API surface is unchanged by refactors: ``dir()`` of the public modules against a snapshot.

The surface of a module is what a user can build on: the names in its ``__all__`` plus every
public (no leading underscore) class and function that the module or one of its private
submodules defines. Names a module merely imports (numpy, typing helpers, functions of
another loaderlib module) are not part of it. A snapshot name must still be reachable as an
attribute of its module (moving a class to a private module and importing it back keeps it),
and a name that joins the surface must be added to the snapshot on purpose.

The listing runs in a fresh interpreter, so which submodules other tests imported first
cannot change it. After a deliberate API change, rewrite the snapshot with
``python tests/unit/test_api_surface.py --update`` and commit it with the change.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SNAPSHOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "api_surface.json")

PUBLIC_MODULES = [
    "loaderlib",
    "loaderlib.arena",
    "loaderlib.batchify",
    "loaderlib.datasets",
    "loaderlib.decoding",
    "loaderlib.errors",
    "loaderlib.integrations.huggingface",
    "loaderlib.integrations.ray",
    "loaderlib.loader",
    "loaderlib.pipeline",
    "loaderlib.recordio",
    "loaderlib.records",
    "loaderlib.sampler",
    "loaderlib.stats",
    "loaderlib.transforms",
    "loaderlib.typing",
    "loaderlib.webdataset",
    "loaderlib.profiling",
    "loaderlib.profiling.baselines",
    "loaderlib.profiling.dashboard",
    "loaderlib.profiling.demo",
    "loaderlib.profiling.harness",
    "loaderlib.profiling.report",
    "loaderlib.profiling.verdict",
]


def surface(module_names: list[str]) -> dict[str, dict[str, list[str]]]:
    """``{module: {"surface": sorted public names, "reachable": every attribute}}`` (see the
    module docstring)."""
    import importlib
    import inspect

    out = {}
    for name in module_names:
        mod = importlib.import_module(name)
        declared = set(getattr(mod, "__all__", ()))
        names = set(declared)
        for attr in dir(mod):
            if attr.startswith("_"):
                continue
            value = getattr(mod, attr)
            if not (inspect.isclass(value) or inspect.isfunction(value)):
                continue
            home = getattr(value, "__module__", None) or ""
            if home == name or home.startswith(name + "."):
                names.add(attr)
        out[name] = {"surface": sorted(names), "reachable": sorted(set(dir(mod)) | declared)}
    return out


def _listing() -> dict[str, dict[str, list[str]]]:
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import test_api_surface as s; "
            "print(json.dumps(s.surface(s.PUBLIC_MODULES)))")
    proc = subprocess.run([sys.executable, "-c", code, os.path.dirname(os.path.abspath(__file__))],
                          cwd=ROOT, capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_public_api_matches_snapshot():
    with open(SNAPSHOT) as f:
        expected = json.load(f)
    got = _listing()
    assert sorted(got) == sorted(expected), "the list of public modules changed: update PUBLIC_MODULES and the snapshot"
    problems = []
    for mod, names in expected.items():
        missing = sorted(set(names) - set(got[mod]["reachable"]))
        added = sorted(set(got[mod]["surface"]) - set(names))
        if missing:
            problems.append(f"{mod}: no longer has {missing}")
        if added:
            problems.append(f"{mod}: new public names {added}")
    assert not problems, ("the public API changed (if on purpose, run python tests/unit/test_api_surface.py "
                          "--update):\n" + "\n".join(problems))


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/unit/test_api_surface.py --update")
    with open(SNAPSHOT, "w") as f:
        json.dump({mod: lists["surface"] for mod, lists in _listing().items()}, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {SNAPSHOT}")
