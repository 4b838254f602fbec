"""benchmarks/storage.py --storage-cpus: the storage side keeps the CPUs it is given, and every
loader and ceiling it measures runs on the others (checked on real processes' affinities, in a
subprocess so the test run's own CPUs are left alone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")


def _in_bench(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=BENCH, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": BENCH + os.pathsep + os.environ.get("PYTHONPATH", "")})


def test_cpu_lists_parse_like_taskset():
    r = _in_bench("import storage, json; print(json.dumps([storage.parse_cpus(s) for s in "
                  "('1', '8-11', '0,2-3', ' 5 , 7 ')]))")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [[1], [8, 9, 10, 11], [0, 2, 3], [5, 7]]


def test_storage_keeps_its_cpus_and_loaders_get_the_rest():
    usable = sorted(os.sched_getaffinity(0))
    code = (
        "import os, json, subprocess, sys, storage\n"
        "line = storage.split_cpus('auto')\n"
        "child = subprocess.run(storage.on_loader_cpus([sys.executable, '-c', "
        "'import os; print(sorted(os.sched_getaffinity(0)))']), capture_output=True, text=True, check=True)\n"
        "print(json.dumps({'line': line, 'storage': sorted(os.sched_getaffinity(0)), "
        "'loader': json.loads(child.stdout)}))\n")
    r = _in_bench(code)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    quarter = max(1, len(usable) // 4)
    assert out["storage"] == usable[-quarter:]
    assert out["loader"] == usable[:-quarter]
    assert f"on {usable[-quarter:]}" in out["line"] and f"on {usable[:-quarter]}" in out["line"]


def test_a_split_that_leaves_no_cpu_is_refused():
    usable = sorted(os.sched_getaffinity(0))
    spec = ",".join(map(str, usable))
    r = _in_bench(f"import storage; storage.split_cpus({spec!r})")
    assert r.returncode != 0
    assert "leaves no CPU for the loaders" in r.stderr


def test_cpus_that_are_not_usable_are_refused():
    r = _in_bench("import storage; storage.split_cpus('100000')")
    assert r.returncode != 0
    assert "are not all usable here" in r.stderr
