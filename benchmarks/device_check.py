"""One short check of loaderlib on a machine with a GPU and many cores (``make device-check``).

Builds loaderlib in place (``--build``), records the machine (``lscpu -e``, the physical cores
and their hardware threads, ``nvidia-smi``, Python, numpy, torch, JAX and loaderlib's build),
then runs, each part in its own process with a time limit:

``cuda_tests``
    tests/unit/test_accelerator.py and tests/unit/test_pinned_processes.py with
    ``LOADERLIB_REAL_CUDA=1``: the simulated CUDA of those tests is off and the CUDA paths
    (side-stream copies, events, ``record_stream``, pinned slots, ``pin_memory_device``,
    ``cudaHostRegister`` of the processes engine's slots, ``to_device`` with torch and JAX)
    run for real.
``device``
    benchmarks/device.py: pinned against pageable copies, and the copy/compute overlap of
    ``to_device`` with a real model step (torch; JAX too when it sees the GPU).
``scaling_physical`` / ``scaling_siblings``
    benchmarks/scaling.py --pin at 1, 2, 4, 8, 16 threads on one hardware thread per physical
    core, then at 2, 4, 8, 16 threads on whole cores (both hardware threads of each): the
    efficiency per physical core, and the yield of a core's second hardware thread
    (``rate(2c threads on c cores) / rate(c threads on c cores)``).

Every part that cannot run here is named in the report with the reason (no CUDA, no second
hardware thread per core, a timeout, a failure). Writes ``device_check.json`` and
``device_check.md`` (a markdown table) under ``--out`` (default ``$OUT``, else
``benchmarks/out/device-check``). ``--dry-run`` runs every part at toy size in about a minute
(tests/unit/test_device_check.py runs it, so the script cannot rot); the full run fits in 8
minutes on 16 cores.

On a lent machine (no network there: the copied tree is built with the machine's own Python,
which has torch, JAX, numpy, OpenCV, Cython and pytest; libjpeg-turbo comes as the
``comma-deps-libjpeg`` wheel, carried in ``.whl/`` and installed by ``--wheels`` into a folder
on ``PYTHONPATH``, docs/measurements.md says how)::

    PYTHONUNBUFFERED=1 python3 benchmarks/device_check.py --build --wheels .whl --out $OUT
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _topology import cores, physical_first, siblings_packed, threads_per_core  # noqa: E402

#: Thread counts of the scaling runs (the physical series stops at the physical cores there are).
COUNTS = (1, 2, 4, 8, 16)


def sh(cmd: list[str], timeout: float = 60, env: dict | None = None, cwd: str = ROOT) -> tuple[int, str]:
    """Run ``cmd``; its exit code and output (stdout and stderr), or 124 and what it said on a timeout."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"") + (e.stderr or b"")
        return 124, (out.decode(errors="replace") if isinstance(out, bytes) else out) + f"\n[timed out after {timeout} s]"
    except OSError as e:
        return 127, str(e)


def install_wheels(folder: str, target: str) -> dict:
    """``pip install --no-index`` every wheel of ``folder`` into ``target`` (put on ``PYTHONPATH``):
    the packages a machine without network lacks (libjpeg-turbo for the build)."""
    wheels = sorted(os.path.join(folder, w) for w in os.listdir(folder) if w.endswith(".whl"))
    if not wheels:
        return {"status": "skipped", "reason": f"no wheel in {folder}"}
    rc, out = sh([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                  "--upgrade", "--target", target, *wheels], timeout=120)
    if rc != 0:
        return {"status": "failed", "reason": f"pip install of {len(wheels)} wheel(s) exited {rc}", "log_tail": out[-2000:]}
    os.environ["PYTHONPATH"] = target + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    sys.path.insert(0, target)
    return {"status": "ok", "wheels": [os.path.basename(w) for w in wheels], "target": target}


def child_env() -> dict:
    """The environment of every part: this tree's loaderlib first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def probe(code: str, timeout: float = 120) -> dict:
    """Run ``code`` in a fresh interpreter (the tree's loaderlib on the path); the JSON it prints."""
    rc, out = sh([sys.executable, "-c", code], timeout=timeout, env=child_env())
    if rc != 0:
        return {"error": out.strip().splitlines()[-1] if out.strip() else f"exit {rc}"}
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": out[-500:]}


TORCH_PROBE = """
import json
try:
    import torch
except ImportError as e:
    print(json.dumps({"installed": False, "why": str(e)})); raise SystemExit
d = {"installed": True, "version": torch.__version__, "cuda": torch.version.cuda,
     "cuda_available": torch.cuda.is_available()}
if d["cuda_available"]:
    p = torch.cuda.get_device_properties(0)
    d.update(devices=torch.cuda.device_count(), name=p.name, memory_gib=round(p.total_memory / 2**30, 1),
             capability=f"{p.major}.{p.minor}", multiprocessors=p.multi_processor_count)
print(json.dumps(d))
"""

JAX_PROBE = """
import json
try:
    import jax
except ImportError as e:
    print(json.dumps({"installed": False, "why": str(e)})); raise SystemExit
try:
    gpus = [str(d) for d in jax.devices("gpu")]
except RuntimeError:
    gpus = []
print(json.dumps({"installed": True, "version": jax.__version__, "backend": jax.default_backend(), "gpus": gpus}))
"""

LOADERLIB_PROBE = """
import json, numpy, loaderlib as ll
print(json.dumps({"version": ll.__version__, "file": ll.__file__, "numpy": numpy.__version__,
                  "build": {k: str(v) for k, v in ll.build_info().items()}}))
"""


def topology() -> dict:
    """The machine: CPUs, physical cores and their hardware threads, memory, GPU, software."""
    cs = cores()
    rc, lscpu = sh(["lscpu", "-e"], timeout=20)
    rc2, lscpu_summary = sh(["lscpu"], timeout=20)
    model = ""
    for line in lscpu_summary.splitlines():
        if line.strip().startswith("Model name"):
            model = line.split(":", 1)[1].strip()
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f.readline().split(":", 1)[1].strip()
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    gpu: dict = {"nvidia_smi": "not found"}
    if smi:
        rc3, q = sh([smi, "--query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current,"
                     "clocks.max.sm", "--format=csv"], timeout=30)
        rc4, full = sh([smi], timeout=30)
        rc5, topo = sh([smi, "topo", "-m"], timeout=30)
        gpu = {"query": q.strip(), "nvidia_smi": full.strip(), "topo": topo.strip()}
    return {
        "cpu_model": model or platform.processor(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "physical_cores": len(cs),
        "threads_per_core": threads_per_core(cs),
        "cores": [{"package": c.package, "core": c.core, "cpus": list(c.cpus)} for c in cs],
        "lscpu_e": lscpu.strip() if rc == 0 else f"lscpu -e failed: {lscpu.strip()[:200]}",
        "memory": mem,
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "gpu": gpu,
        "torch": probe(TORCH_PROBE),
        "jax": probe(JAX_PROBE),
        "loaderlib": probe(LOADERLIB_PROBE),
    }


def link_profiling() -> str | None:
    """``loaderlib.profiling`` lives in ``profiling/`` (setup.py's package_dir); an editable
    install maps it, an in-place build does not: link it as the development checkouts do."""
    link = os.path.join(ROOT, "loaderlib", "profiling")
    if os.path.lexists(link):
        return None
    os.symlink(os.path.join("..", "profiling"), link)
    atexit.register(_unlink, link)   # leave no untracked file in the checkout
    return ("linked loaderlib/profiling -> ../profiling for this run (an in-place build has no package_dir "
            "mapping); removed at exit")


def _unlink(link: str) -> None:
    if os.path.islink(link):
        os.unlink(link)


def build(report: dict, jobs: int) -> dict:
    """``setup.py build_ext --inplace`` with this Python (no install, no network)."""
    t0 = time.perf_counter()
    rc, out = sh([sys.executable, "setup.py", "-q", "build_ext", "--inplace", "-j", str(jobs)], timeout=300,
                 env=child_env())
    part = {"status": "ok" if rc == 0 else "failed", "seconds": time.perf_counter() - t0, "log_tail": out[-3000:],
            "linked": link_profiling()}
    if rc != 0:
        part["reason"] = f"setup.py build_ext exited {rc}" + (
            " (no libjpeg-turbo: carry the comma-deps-libjpeg wheel and pass --wheels)" if "libjpeg" in out else "")
    return part


def cuda_tests(report: dict, dry: bool, timeout: float) -> dict:
    """The accelerator tests with LOADERLIB_REAL_CUDA=1 (fakes off)."""
    torch = report["topology"]["torch"]
    if not torch.get("installed"):
        return {"status": "skipped", "reason": f"torch is not installed ({torch.get('why', torch.get('error'))})"}
    if not torch.get("cuda_available"):
        return {"status": "skipped", "reason": f"no CUDA: torch {torch.get('version')} sees no CUDA device, so the "
                "tests would run against their simulated CUDA (make test does that)"}
    if dry:
        return {"status": "skipped", "reason": "--dry-run"}
    env = child_env()
    env["LOADERLIB_REAL_CUDA"] = "1"
    xml = os.path.join(report["out"], "cuda_tests.xml")
    t0 = time.perf_counter()
    rc, out = sh([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", "not timing",
                  f"--junitxml={xml}", "tests/unit/test_accelerator.py", "tests/unit/test_pinned_processes.py"],
                 timeout=timeout, env=env)
    part: dict = {"seconds": time.perf_counter() - t0, "exit": rc, "log_tail": out[-4000:]}
    part.update(junit_counts(xml))
    if rc == 0:
        part["status"] = "ok"
    else:
        part["status"] = "failed"
        part["reason"] = "timed out" if rc == 124 else f"pytest exited {rc} ({part.get('failed', '?')} failed)"
    return part


def junit_counts(path: str) -> dict:
    """Tests, failures, errors and skips of a pytest junit XML (empty when there is none)."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {}
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return {}
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    skipped = [f"{c.get('name')}: {s.get('message', '')}" for c in suite.iter("testcase") for s in c.findall("skipped")]
    return {"tests": n["tests"], "failed": n["failures"] + n["errors"], "skipped": n["skipped"],
            "passed": n["tests"] - n["failures"] - n["errors"] - n["skipped"], "skips": skipped}


def device_bench(report: dict, dry: bool, timeout: float) -> dict:
    """benchmarks/device.py (on the CPU with toy sizes in a dry run: a check that it runs)."""
    torch = report["topology"]["torch"]
    if not torch.get("installed"):
        return {"status": "skipped", "reason": f"torch is not installed ({torch.get('why', torch.get('error'))})"}
    js = os.path.join(report["out"], "device.json")
    cuda = bool(torch.get("cuda_available"))
    if cuda and not dry:
        args = ["--batches", "20", "--rounds", "3"]
    else:
        args = ["--device", "cpu" if not cuda else "cuda", "--batch", "4", "--size", "32", "--batches", "2",
                "--repeat", "2", "--rounds", "1", "--slots", "2", "--threads", "1"]
    t0 = time.perf_counter()
    rc, out = sh([sys.executable, os.path.join(HERE, "device.py"), *args, "--json", js], timeout=timeout,
                 env=child_env())
    part: dict = {"seconds": time.perf_counter() - t0, "log_tail": out[-3000:]}
    try:
        with open(js) as f:
            part["results"] = json.load(f)
    except (OSError, ValueError):
        part["results"] = None
    if rc != 0:
        part.update(status="failed", reason="timed out" if rc == 124 else f"device.py exited {rc}")
    elif not cuda:
        part.update(status="skipped", reason=f"no CUDA: torch {torch.get('version')} sees no CUDA device (device.py "
                    "ran on the CPU at toy size, as a check that it runs)")
    elif dry:
        part.update(status="skipped", reason="--dry-run (device.py ran at toy size)")
    else:
        part["status"] = "ok"
    return part


def scaling(report: dict, series: str, dry: bool, timeout: float, variant: str) -> dict:
    """benchmarks/scaling.py --pin on the CPUs in ``series`` order ("physical" or "siblings")."""
    cs = cores()
    tpc = threads_per_core(cs)
    if series == "physical":
        order = physical_first(cs)
        counts = [n for n in COUNTS if n <= len(cs)]
        if len(cs) not in counts and len(cs) < COUNTS[-1]:
            counts.append(len(cs))
    else:
        if tpc < 2:
            return {"status": "skipped", "reason": f"no second hardware thread: each of the {len(cs)} physical cores "
                    "has one (lscpu -e / thread_siblings_list), so the physical series is the whole machine"}
        order = siblings_packed(cs)
        counts = [n for n in COUNTS if 2 <= n <= len(order) and n % tpc == 0]
    if dry:
        counts = counts[:1]
    js = os.path.join(report["out"], f"scaling_{series}.json")
    args = ["--pin", "--cpus", ",".join(map(str, order)), "--threads", ",".join(map(str, counts)),
            "--variant", variant, "--json", js]
    args += ["--make", "64", "--epochs", "1", "--repeat", "1"] if dry else ["--make", "2048", "--epochs", "2",
                                                                             "--repeat", "2"]
    t0 = time.perf_counter()
    rc, out = sh([sys.executable, os.path.join(HERE, "scaling.py"), *args], timeout=timeout, env=child_env())
    part: dict = {"seconds": time.perf_counter() - t0, "cpus": order, "threads": counts, "log_tail": out[-3000:]}
    if rc != 0:
        part.update(status="failed", reason="timed out" if rc == 124 else f"scaling.py exited {rc}")
        return part
    with open(js) as f:
        res = json.load(f)
    med = {int(k): v for k, v in res["median"]["default"].items()}
    part["rates"] = {str(k): v for k, v in med.items()}
    per_core: dict = {}
    for n, r in med.items():
        phys = n if series == "physical" else n // tpc   # physical cores the run had
        per_core[str(n)] = {"cores": phys, "img_s": r, "img_s_per_core": r / phys}
    part["per_core"] = per_core
    part["status"] = "skipped" if dry else "ok"
    if dry:
        part["reason"] = "--dry-run (scaling.py ran one setting at toy size)"
    return part


def derive(report: dict) -> None:
    """Efficiency per physical core and the yield of the second hardware thread."""
    phys = report["parts"].get("scaling_physical", {})
    sib = report["parts"].get("scaling_siblings", {})
    out: dict = {}
    if phys.get("rates"):
        r = {int(k): v for k, v in phys["rates"].items()}
        one = r.get(1)
        if one:
            out["efficiency_per_physical_core"] = {str(n): v / (n * one) for n, v in sorted(r.items())}
        if sib.get("rates"):
            tpc = report["topology"]["threads_per_core"]
            ys = {}
            for k, v in sib["rates"].items():
                c = int(k) // tpc
                if c in r:
                    ys[f"{k} threads on {c} cores"] = v / r[c]
            out["hardware_thread_yield"] = ys
    report["derived"] = out


def markdown(report: dict) -> str:
    t = report["topology"]
    lines = [f"# device check ({'dry run' if report['dry_run'] else 'full run'}, {report['date']})", "",
             f"- machine: {t['cpu_model']}; {t['cpus_usable']} usable CPUs = {t['physical_cores']} physical cores x "
             f"{t['threads_per_core']} hardware thread(s); {t['memory']}; kernel {t['kernel']}",
             f"- Python {t['python']}; torch {t['torch'].get('version', 'absent')} (CUDA {t['torch'].get('cuda')}, "
             f"available: {t['torch'].get('cuda_available', False)}); JAX {t['jax'].get('version', 'absent')} "
             f"(GPUs: {t['jax'].get('gpus', [])}); loaderlib {t['loaderlib'].get('version', '?')}",
             f"- GPU: {t['torch'].get('name', 'none')}" + (f", {t['torch'].get('memory_gib')} GiB" if
                                                            t['torch'].get('name') else ""),
             "", "| part | status | seconds | note |", "|---|---|---|---|"]
    for name, part in report["parts"].items():
        note = part.get("reason", "")
        if name == "cuda_tests" and "tests" in part:
            note = (f"{part['passed']} passed, {part['failed']} failed, {part['skipped']} skipped"
                    + (f"; {note}" if note else ""))
        lines.append(f"| {name} | {part['status']} | {part.get('seconds', 0):.0f} | {note} |")
    dev = (report["parts"].get("device") or {}).get("results") or {}
    if dev.get("copy") and report["parts"]["device"]["status"] == "ok":
        lines += ["", "| copy | GB/s | ms per batch |", "|---|---|---|"]
        for k, v in dev["copy"].items():
            if "GB_per_s" in v:
                lines.append(f"| {k} | {v['GB_per_s']:.1f} | {1000 * v['seconds']:.2f} |")
        ov = dev.get("overlap", {})
        lines += ["", f"Step alone {1000 * ov.get('step_alone_s', 0):.2f} ms/batch.", "",
                  "| host memory | inline copy + step, ms | to_device, ms | copy hidden |", "|---|---|---|---|"]
        for k in ("pageable", "pinned"):
            if k in ov:
                h = ov[k]["hidden"]
                lines.append(f"| {k} | {1000 * ov[k]['inline_s']:.2f} | {1000 * ov[k]['to_device_s']:.2f} | "
                             f"{'n/a' if h is None else f'{100 * h:.0f}%'} |")
        j = dev.get("jax", {})
        if "skipped" not in j and j:
            h = j["hidden"]
            lines.append(f"| JAX {j['jax']} | {1000 * j['inline_s']:.2f} | {1000 * j['to_device_s']:.2f} | "
                         f"{'n/a' if h is None else f'{100 * h:.0f}%'} |")
    d = report.get("derived", {})
    if report["parts"].get("scaling_physical", {}).get("per_core"):
        lines += ["", "| series | threads | physical cores | img/s | img/s per physical core | efficiency |",
                  "|---|---|---|---|---|---|"]
        eff = d.get("efficiency_per_physical_core", {})
        for series in ("scaling_physical", "scaling_siblings"):
            for n, v in (report["parts"].get(series, {}).get("per_core") or {}).items():
                e = eff.get(n, "") if series == "scaling_physical" else ""
                lines.append(f"| {series.split('_')[1]} | {n} | {v['cores']} | {v['img_s']:.0f} | "
                             f"{v['img_s_per_core']:.0f} | {e if e == '' else f'{e:.2f}'} |")
    if d.get("hardware_thread_yield"):
        lines += ["", "Second hardware thread's yield (rate on whole cores / rate on one thread per core, same "
                  "cores): " + ", ".join(f"{k} {v:.2f}x" for k, v in d["hardware_thread_yield"].items())]
    skipped = [f"{k} ({v.get('reason', '')})" for k, v in report["parts"].items() if v["status"] != "ok"]
    if skipped:
        lines += ["", "Not run or not passed: " + "; ".join(skipped)]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT") or os.path.join(HERE, "out", "device-check"))
    p.add_argument("--build", action="store_true", help="build the extensions in place first (setup.py build_ext)")
    p.add_argument("--wheels", default=None,
                   help="a folder of wheels to install first (pip --no-index --target, then on PYTHONPATH)")
    p.add_argument("--dry-run", action="store_true", help="every part at toy size (about a minute; make test)")
    p.add_argument("--variant", default="float", choices=("float", "uint8"), help="scaling runs' output")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds the whole check may take (default 450; a dry run's parts are limited only against "
                        "hangs, 1800)")
    a = p.parse_args()
    if a.budget is None:
        a.budget = 1800.0 if a.dry_run else 450.0
    os.makedirs(a.out, exist_ok=True)
    t_start = time.perf_counter()
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "dry_run": a.dry_run,
                              "out": a.out, "parts": {}}

    def left(share: float) -> float:
        """A part's time limit: ``share`` of what is left of the budget (at least 30 s)."""
        return max(30.0, (a.budget - (time.perf_counter() - t_start)) * share)

    def save() -> None:
        with open(os.path.join(a.out, "device_check.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)
        with open(os.path.join(a.out, "device_check.md"), "w") as f:
            f.write(markdown(report))

    if a.wheels:
        report["parts"]["wheels"] = install_wheels(a.wheels, os.path.join(a.out, "site") if a.dry_run else
                                                   "/tmp/loaderlib-device-site")
    if a.build:
        report["parts"]["build"] = build(report, os.cpu_count() or 2)
    else:
        report["parts"]["build"] = {"status": "skipped", "reason": "no --build: the extensions already built here "
                                    "are used"}
    report["topology"] = topology()
    if "error" in report["topology"]["loaderlib"]:
        report["parts"]["import"] = {"status": "failed", "reason": f"import loaderlib failed: "
                                     f"{report['topology']['loaderlib']['error']}"}
        save()
        print(markdown(report))
        return 1
    print(f"topology: {report['topology']['physical_cores']} physical cores x {report['topology']['threads_per_core']} "
          f"threads; torch {report['topology']['torch']}; jax {report['topology']['jax']}", flush=True)
    steps = [("cuda_tests", lambda: cuda_tests(report, a.dry_run, left(0.4))),
             ("device", lambda: device_bench(report, a.dry_run, left(0.35))),
             ("scaling_physical", lambda: scaling(report, "physical", a.dry_run, left(0.6), a.variant)),
             ("scaling_siblings", lambda: scaling(report, "siblings", a.dry_run, left(0.95), a.variant))]
    for name, fn in steps:
        t0 = time.perf_counter()
        try:
            part = fn()
        except Exception as e:  # noqa: BLE001 - one part's failure is reported, the others still run
            part = {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
        part.setdefault("seconds", time.perf_counter() - t0)
        report["parts"][name] = part
        print(f"{name}: {part['status']}" + (f" ({part['reason']})" if part.get("reason") else "")
              + f", {part['seconds']:.0f} s", flush=True)
        save()
    derive(report)
    report["seconds"] = time.perf_counter() - t_start
    save()
    print(markdown(report))
    return 1 if any(v["status"] == "failed" for v in report["parts"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
