"""benchmarks/device_check.py (``make device-check``): its dry run, and the CPU orders it pins with.

The dry run is what ``make test`` can do without a GPU: every part runs at toy size or is
skipped, and the report must name each skipped part with its reason, so the script that a
lent GPU machine runs cannot rot between the sessions that have one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks import _topology as topo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PARTS = ("build", "cuda_tests", "device", "scaling_physical", "scaling_siblings")


def _fake_sysfs(tmp_path, layout):
    """A /sys/devices/system/cpu tree: ``layout`` maps cpu -> (package, core, siblings text)."""
    for cpu, (package, core, siblings) in layout.items():
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(f"{package}\n")
        (d / "core_id").write_text(f"{core}\n")
        (d / "thread_siblings_list").write_text(f"{siblings}\n")
    return str(tmp_path)


def test_cpu_list_format():
    assert topo.parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert topo.parse_cpu_list("5") == [5]
    assert topo.parse_cpu_list("") == []


def test_orders_on_a_smt_machine(tmp_path):
    # 2 packages x 2 cores x 2 threads, numbered as Linux numbers them on x86 (siblings n and n+4).
    layout = {}
    for cpu in range(8):
        first = cpu % 4
        layout[cpu] = (first // 2, first % 2, f"{first},{first + 4}")
    sysfs = _fake_sysfs(tmp_path, layout)
    cs = topo.cores(list(range(8)), sysfs=sysfs)
    assert [c.cpus for c in cs] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert topo.threads_per_core(cs) == 2
    assert topo.physical_first(cs) == [0, 1, 2, 3, 4, 5, 6, 7]     # 4 distinct cores first
    assert topo.siblings_packed(cs) == [0, 4, 1, 5, 2, 6, 3, 7]     # whole cores
    # only part of the machine allowed: a core with one allowed thread counts once
    part = topo.cores([0, 1, 4], sysfs=sysfs)
    assert [c.cpus for c in part] == [(0, 4), (1,)]
    assert topo.physical_first(part) == [0, 1, 4]


def test_orders_without_smt_or_topology(tmp_path):
    sysfs = _fake_sysfs(tmp_path, {0: (0, 0, "0"), 1: (0, 1, "1")})
    cs = topo.cores([0, 1, 2], sysfs=sysfs)        # cpu2 has no topology: a core of its own
    assert topo.threads_per_core(cs) == 1
    assert sorted(topo.physical_first(cs)) == [0, 1, 2] == sorted(topo.siblings_packed(cs))


@pytest.mark.long   # among the slowest tests: `make test` leaves it to `make test-long` (.ci/run runs both)
def test_dry_run_report(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("LOADERLIB_REAL_CUDA", None)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "device_check.py"), "--dry-run",
                        "--out", str(out)], capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    report = json.loads((out / "device_check.json").read_text())
    table = (out / "device_check.md").read_text()
    assert report["dry_run"] is True
    t = report["topology"]
    assert t["cpus_usable"] == len(os.sched_getaffinity(0))
    assert t["physical_cores"] * t["threads_per_core"] >= t["cpus_usable"] >= t["physical_cores"] >= 1
    assert "CPU" in t["lscpu_e"] or "lscpu" in t["lscpu_e"]
    assert t["python"] == sys.version.split()[0] and "version" in t["loaderlib"]
    for name in PARTS:
        part = report["parts"][name]
        assert part["status"] in ("ok", "skipped", "failed"), (name, part)
        assert part["status"] != "failed", (name, part)
        if part["status"] == "skipped":
            assert part["reason"], name
            assert f"| {name} | skipped |" in table and part["reason"] in table
    torch = t["torch"]
    if not torch.get("cuda_available"):
        for name in ("cuda_tests", "device"):
            assert report["parts"][name]["status"] == "skipped"
            assert "CUDA" in report["parts"][name]["reason"]
        if torch.get("installed"):   # device.py still ran, on the CPU at toy size
            dev = report["parts"]["device"]["results"]
            assert dev["overlap"]["step_alone_s"] > 0 and dev["copy"]["pinned"] == {"skipped": "pinned memory needs CUDA"}
    phys = report["parts"]["scaling_physical"]
    assert phys["threads"] == [1] and phys["rates"]["1"] > 0
    assert report["derived"]["efficiency_per_physical_core"] == {"1": 1.0}
    if t["threads_per_core"] < 2:
        assert "no second hardware thread" in report["parts"]["scaling_siblings"]["reason"]


def test_a_part_that_fails_is_reported_not_raised(tmp_path, monkeypatch):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import device_check as dc
    finally:
        sys.path.pop(0)
    # A child that never returns by itself (it waits for a signal): only the timeout ends it.
    rc, out = dc.sh([sys.executable, "-c", "import signal; signal.pause()"], timeout=0.5)
    assert rc == 124 and "timed out" in out
    report = {"topology": {"torch": {"installed": True, "cuda_available": True, "version": "x"}},
              "out": str(tmp_path), "parts": {}}
    monkeypatch.setattr(dc, "sh", lambda *a, **k: (3, "boom"))
    part = dc.cuda_tests(report, dry=False, timeout=5)
    assert part["status"] == "failed" and part["reason"].startswith("pytest exited 3")
