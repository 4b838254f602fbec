"""``python -m loaderlib doctor``: what this installation got, and why the defaults are what they are.

:func:`diagnose` gathers the facts into a JSON-serialisable dict; :func:`format_report` turns
it into the text the command prints. Nothing here changes loaderlib's state except that the
self-check runs the decoder (which starts the OpenMP pool).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import multiprocessing
import os
import platform
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

__all__ = ["EXTRAS", "diagnose", "format_report"]

# Optional packages loaderlib works with: (import name, what loaderlib uses it for).
EXTRAS = (
    ("torch", "torch", "output='torch', pinned memory, comparison in `bench`"),
    ("opencv", "cv2", "non-JPEG images, float resizes, `bench`"),
    ("matplotlib", "matplotlib", "Stats.plot() / Report.plot(), the dashboard's charts"),
    ("ipywidgets", "ipywidgets", "the live Dashboard in Jupyter"),
    ("webdataset", "webdataset", "writing WebDataset shards (loaderlib reads them without it)"),
    ("datasets", "datasets", "Hugging Face image columns (loaderlib.integrations.huggingface)"),
    ("ray", "ray", "decoding inside ray.data pipelines"),
    ("jax", "jax", "moving batches to JAX devices"),
    ("obstore", "obstore", "the [remote] extra: s3://, gs:// and http(s):// datasets, doctor --storage on URLs"),
)
# What installs each extra that is not found (the others: pip install NAME).
INSTALL = {"obstore": "pip install loaderlib[remote]", "opencv": "pip install opencv-python-headless"}
# The PyPI distributions that install the cv2 module (NOTE [ Optional OpenCV ]).
OPENCV_DISTRIBUTIONS = ("opencv-python-headless", "opencv-python", "opencv-contrib-python-headless",
                        "opencv-contrib-python")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _extras() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, module, use in EXTRAS:
        try:
            found = importlib.util.find_spec(module) is not None  # located, not imported
        except (ImportError, ValueError):
            found = False
        entry: dict[str, Any] = {"module": module, "found": found, "used_for": use}
        if not found:
            entry["install"] = INSTALL.get(name, f"pip install {name}")
        if name == "opencv":
            dists = [d for d in OPENCV_DISTRIBUTIONS if _version(d) is not None]
            entry["distributions"] = dists
            entry["version"] = _version(dists[0]) if dists else None
            if len(dists) > 1:
                entry["problem"] = (f"{' and '.join(dists)} are all installed and overwrite each other's cv2: "
                                    f"pip uninstall all of them, then install one")
        else:
            entry["version"] = _version(name) if found else None
        out[name] = entry
    return out


def _loaded_libraries() -> dict[str, str | None]:
    """Where the dynamic loader found libjpeg and the OpenMP runtime (Linux: /proc/self/maps)."""
    found: dict[str, str | None] = {"libjpeg": None, "openmp": None}
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[-1].strip() for line in f if "/" in line}
    except OSError:
        return found
    for path in sorted(paths):
        base = os.path.basename(path)
        if base.startswith("libjpeg") and found["libjpeg"] is None:
            found["libjpeg"] = path
        elif base.startswith(("libgomp", "libomp", "libiomp")) and found["openmp"] is None:
            found["openmp"] = path
    return found


def _threads() -> dict[str, Any]:
    from .. import _threads as th

    affinity = th._affinity_cpus()
    quota = th.cgroup_cpu_limit()
    env = os.environ.get("LOADERLIB_NUM_THREADS")
    ranks = os.environ.get("LOCAL_WORLD_SIZE")
    info: dict[str, Any] = {
        "default": None,
        "affinity_cpus": affinity,
        "cgroup_quota_cpus": quota,
        "available_cpus": th.available_cpus(),
        "LOADERLIB_NUM_THREADS": env,
        "LOCAL_WORLD_SIZE": ranks,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "os_cpu_count": os.cpu_count(),
    }
    try:
        info["default"] = th.default_num_threads()
    except ValueError as e:
        info["problem"] = str(e)
        info["reason"] = f"no default: {e}"
        return info
    if env:
        info["reason"] = f"LOADERLIB_NUM_THREADS={env} (set in the environment; it overrides everything else)"
        return info
    why = [f"{affinity} CPU(s) in this process's affinity mask"]
    if quota is not None:
        why.append(f"capped by the cgroup CPU quota of {quota:g} CPUs (rounded up: {math.ceil(quota)})")
    else:
        why.append("no cgroup CPU quota")
    if ranks:
        why.append(f"divided among LOCAL_WORLD_SIZE={ranks} ranks on this node")
    info["reason"] = "; ".join(why)
    return info


def _fork() -> dict[str, Any]:
    from .. import _threads as th

    method = multiprocessing.get_start_method(allow_none=True)
    default = multiprocessing.get_context().get_start_method()
    info: dict[str, Any] = {
        "start_method": method or default,
        "start_method_is_default": method is None,
        "at_fork_guard": hasattr(os, "register_at_fork"),
        "forked_after_parallel_kernels": th._forked_child,
    }
    if th._forked_child:
        info["summary"] = ("this process was forked after its parent ran parallel kernels: loaderlib runs "
                           "its kernels single-threaded here (GNU OpenMP would hang)")
    elif info["start_method"] == "fork":
        info["summary"] = ("safe: a child forked after loaderlib's parallel kernels ran (e.g. a PyTorch "
                           "DataLoader worker) runs its kernels single-threaded with a warning instead of "
                           "hanging; prefer 'spawn' or 'forkserver', or loaderlib's own workers")
    else:
        info["summary"] = f"safe: new processes start with '{info['start_method']}', not fork"
    return info


def self_check(seconds: float = 2.0, clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Decode the bundled sample photo for about ``seconds`` and check every result.

    Checks: each decode has the header's size; 1 thread and the default thread count give the
    same pixels; when OpenCV is installed, the pixels equal ``cv2.imdecode`` converted to RGB.
    """
    import numpy as np

    from .. import _threads as th
    from .._sample import SAMPLE_NAME, sample_jpeg
    from ..decoding import decode_batch, jpeg_info
    from ..errors import LoaderError

    data = sample_jpeg()
    out: dict[str, Any] = {"image": SAMPLE_NAME, "ok": False}
    try:
        info = jpeg_info(data)
        ref = decode_batch([data], num_threads=1).images[0]
        out["shape"] = list(ref.shape)
        if ref.shape != (info.height, info.width, 3):
            out["problem"] = f"decoded shape {ref.shape} differs from the header's {info.width}x{info.height}"
            return out
        try:
            from .._opencv import cv2

            cvimg = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
            out["matches_opencv"] = bool(np.array_equal(ref, cvimg[:, :, ::-1]))
        except ImportError:
            out["matches_opencv"] = None
        threads = th.default_num_threads()
        batch = [data] * max(4, 2 * threads)
        done = 0
        mismatches = 0
        t0 = clock()
        elapsed = 0.0
        while elapsed < seconds or done == 0:
            res = decode_batch(batch, num_threads=threads)
            mismatches += sum(not np.array_equal(img, ref) for img in res.images)
            done += len(batch)
            elapsed = clock() - t0
        out.update({"threads": threads, "images": done, "seconds": round(elapsed, 3),
                    "images_per_s": round(done / elapsed, 1) if elapsed > 0 else None,
                    "megapixels_per_s": round(done * ref.shape[0] * ref.shape[1] / elapsed / 1e6, 1)
                    if elapsed > 0 else None,
                    "mismatches": mismatches})
        if mismatches:
            out["problem"] = f"{mismatches} of {done} parallel decodes differ from the 1-thread decode"
        elif out["matches_opencv"] is False:
            out["problem"] = "the decoded pixels differ from OpenCV's decoder"
        else:
            out["ok"] = True
    except (LoaderError, ImportError, OSError, RuntimeError, ValueError) as e:  # reported, not raised
        out["problem"] = f"{type(e).__name__}: {e}"
    return out


def diagnose(seconds: float = 2.0) -> dict[str, Any]:
    """Everything ``python -m loaderlib doctor`` reports, as a JSON-serialisable dict.

    Parameters
    ----------
    seconds : float
        Length of the decode self-check (0 skips it).
    """
    import loaderlib

    from .._build import build_info

    try:
        build = dict(build_info())
    except ValueError:  # a malformed thread variable: reported under "threads", the build facts still are
        from .._ext import _jpeg

        build = dict(_jpeg.build_facts())
        build["max_threads"] = None
    build["libraries"] = _loaded_libraries()
    report: dict[str, Any] = {
        "loaderlib": {"version": loaderlib.__version__, "location": os.path.dirname(loaderlib.__file__),
                      "python": sys.version.split()[0], "platform": platform.platform()},
        "build": build,
        "threads": _threads(),
        "fork": _fork(),
        "extras": _extras(),
        "self_check": self_check(seconds) if seconds > 0 else None,
    }
    problems = []
    if not build.get("openmp"):
        problems.append("built WITHOUT OpenMP: every kernel runs on one thread; reinstall with a compiler "
                        "that supports OpenMP")
    if "problem" in report["threads"]:
        problems.append(report["threads"]["problem"])
    if "problem" in report["extras"]["opencv"]:
        problems.append(report["extras"]["opencv"]["problem"])
    if report["self_check"] is not None and not report["self_check"]["ok"]:
        problems.append(f"decode self-check failed: {report['self_check'].get('problem')}")
    report["problems"] = problems
    return report


def _yes(v: Any) -> str:
    return "yes" if v else "no"


def format_report(r: dict[str, Any]) -> str:
    """The doctor report as text (one section per topic)."""
    b, t, f, ll = r["build"], r["threads"], r["fork"], r["loaderlib"]
    lines = [f"loaderlib {ll['version']} at {ll['location']}", f"  Python {ll['python']} on {ll['platform']}", ""]
    omp_runtime = f" (runtime {b['libraries']['openmp']})" if b["libraries"].get("openmp") else ""
    jpeg_at = f" at {b['libraries']['libjpeg']}" if b["libraries"].get("libjpeg") else ""
    quota = f"{t['cgroup_quota_cpus']:g} CPUs" if t["cgroup_quota_cpus"] else "none"
    lines += ["build",
              f"  OpenMP          {'on' if b['openmp'] else 'OFF (serial build)'}{omp_runtime}",
              (f"  libjpeg-turbo   {b.get('libjpeg_turbo_version') or 'unknown'} "
               f"(libjpeg API {b.get('libjpeg_api_version')}){jpeg_at}"),
              (f"  SIMD            {_yes(b.get('simd'))} (libjpeg-turbo); loaderlib's kernels: "
               f"{b.get('kernels_simd', 'unknown')}"), ""]
    lines += ["threads",
              f"  default         {t['default'] if t['default'] is not None else '-'}: {t['reason']}",
              f"  affinity mask   {t['affinity_cpus']} CPU(s) (os.cpu_count() {t['os_cpu_count']})",
              f"  cgroup quota    {quota}",
              (f"  LOCAL_WORLD_SIZE {t['LOCAL_WORLD_SIZE'] or 'unset'}; LOADERLIB_NUM_THREADS "
               f"{t['LOADERLIB_NUM_THREADS'] or 'unset'}; OMP_NUM_THREADS {t['OMP_NUM_THREADS'] or 'unset'}"), ""]
    lines += ["fork safety",
              f"  start method    {f['start_method']}{' (the default)' if f['start_method_is_default'] else ''}",
              f"  at-fork guard   {'installed' if f['at_fork_guard'] else 'unavailable on this platform'}",
              textwrap.fill(f["summary"], 100, initial_indent="  ", subsequent_indent="  "), ""]
    lines.append("optional packages")
    for name, e in r["extras"].items():
        state = f"{e['version'] or 'found'}" if e["found"] else f"not installed ({e['install']})"
        if name == "opencv" and e.get("distributions"):
            state += f" ({', '.join(e['distributions'])})"
        lines.append(f"  {name:<15} {state:<34} {e['used_for']}")
    lines.append("")
    s = r["self_check"]
    if s is None:
        lines.append("self-check      skipped")
    elif s["ok"]:
        cv = {True: "; equal to OpenCV's decode", None: "; OpenCV not installed, not compared", False: ""}
        lines.append(f"self-check      ok: {s['images']} decodes of {s['image']} ({s['shape'][1]}x{s['shape'][0]}) "
                     f"in {s['seconds']:.2f} s on {s['threads']} thread(s), {s['images_per_s']:,.0f} images/s, "
                     f"{s['megapixels_per_s']:,.0f} Mpx/s; 1 and {s['threads']} thread(s) agree"
                     f"{cv[s['matches_opencv']]}")
    else:
        lines.append(f"self-check      FAILED: {s.get('problem')}")
    lines.append("")
    if r["problems"]:
        lines.append("problems")
        lines += [f"  - {p}" for p in r["problems"]]
    else:
        lines.append("no problems found")
    return "\n".join(lines)
