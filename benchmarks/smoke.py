"""Run every benchmark script in benchmarks/ once with tiny sizes: a check that each still runs.

The figures these runs print mean nothing (a few dozen small images, one round); what counts
is that every script gets from its command line to its report without an error, so a
refactor of loaderlib cannot silently break a benchmark until the next time someone measures.
Scripts whose tools are missing here (``perf``, a torchvision side environment, torchrun,
Chromium) are reported as skipped, with what they need; every other failure fails the run.

Run::

    python benchmarks/smoke.py [--only decode,loader] [--timeout 300]

(``make bench-smoke``.) Each script gets an ImageFolder of 192 small photo-like JPEGs made
here, or its own tiny-size flags; scripts without size flags take ``--smoke``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from _synth import encode_jpeg, photo_like

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = "{data}"   # replaced by the tiny ImageFolder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _needs_perf() -> str | None:
    if shutil.which("perf") is None:
        return "perf (linux-perf)"
    probe = subprocess.run(["perf", "stat", "-e", "task-clock", "true"], capture_output=True, check=False)
    return None if probe.returncode == 0 else "a perf that may read this process's events"


def _needs(module: str, what: str):
    return lambda: None if _has_module(module) else what


def _needs_tv_venv() -> str | None:
    py = os.path.join(ROOT, ".venv-tv", "bin", "python")
    return None if os.path.exists(py) else "the torchvision side environment (make check-torchvision)"


def _needs_chromium() -> str | None:
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        return "Chromium (apt-get install chromium)"
    return None if _has_module("nbconvert") else "nbconvert"


def _needs_valgrind() -> str | None:
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        return "valgrind (apt-get install valgrind)"
    return None


def _needs_objpeers() -> str | None:
    exe = os.path.join(ROOT, ".venv-objpeers", "bin", "python")
    return None if os.path.exists(exe) else "the object-store peers' venv (make bench-storage-peers builds .venv-objpeers)"


def _needs_torchrun() -> str | None:
    if not _has_module("torch"):
        return "torch (torchrun)"
    import torch.distributed as dist

    return None if dist.is_available() and dist.is_gloo_available() else "torch with gloo"


# script -> (arguments, a check that returns what is missing or None). Every script in
# benchmarks/ that is not a helper module must appear here (checked at start).
RUNS: dict[str, tuple[list[str], object]] = {
    "augment.py": (["--data", DATA, "--images", "64", "--threads", "1", "--workers", "1", "--repeat", "1",
                    "--smoke"], None),
    "bombs.py": (["--smoke"], None),
    "check_torchvision.py": (["--smoke"], _needs_tv_venv),
    "cpu_split.py": (["--data", DATA, "--images", "64", "--threads", "1"], _needs_perf),
    "decode.py": (["--images", "6", "--rounds", "1"], None),
    "device.py": (["--batch", "8", "--size", "32", "--batches", "2", "--repeat", "1"], None),
    "device_check.py": (["--dry-run", "--out", os.path.join(HERE, "out", "device-check-smoke")], None),
    "elastic.py": (["--rounds", "1", "--steps", "2", "--ranks", "4", "--new-ranks", "3"], None),
    "distributed.py": (["--images", "32", "--batch-size", "8", "--epochs", "1", "--size", "32", "--data", DATA + "-dist"],
                       _needs_torchrun),
    "epochs.py": (["--data", DATA, "--rounds", "1", "--threads", "1"], None),
    "fast_decode.py": (["--images", "6", "--rounds", "1"], None),
    "io_mechanism.py": (["--data", DATA, "--latency", "1", "--depths", "1,4", "--repeat", "1"], None),
    "hybrid.py": (["--data", DATA, "--images", "64", "--threads", "1", "--step-ms", "0.1", "--repeat", "1"], None),
    "instructions.py": (["--data", DATA, "--items", "32"], _needs_valgrind),
    "instrumentation.py": (["--data", DATA, "--rounds", "1", "--threads", "1", "--epochs-per-round", "1"], None),
    "loader.py": (["--data", DATA, "--images", "64", "--threads", "1", "--workers", "1", "--repeat", "1"], None),
    "mixture.py": (["--data", DATA, "--rounds", "1", "--epochs", "1", "--threads", "1"], None),
    "objstore_peers.py": (["--data", DATA, "--repeat", "1", "--workers", "2", "--shard-mb", "1"], _needs_objpeers),
    "pipeline.py": (["--data", DATA, "--images", "64", "--rounds", "1", "--epochs", "2"], None),
    "pack.py": (["--data", DATA, "--rounds", "1", "--epochs", "1", "--threads", "1"], None),
    "ray_map_batches.py": (["--images", "32", "--rounds", "1", "--batch-size", "16"], _needs("ray", "ray[data]")),
    "ranges_while_caching.py": (["--images", "64", "--rounds", "1", "--shard-mb", "1", "--limit-rate", "0"], None),
    "remote_loader.py": (["--images", "32", "--rounds", "1", "--epochs", "1", "--threads", "1"], None),
    "remote_protocols.py": (["--shards", "2", "--shard-mb", "1", "--ranges", "16", "--rounds", "1", "--conc", "1,4"],
                            _needs("s3fs", "fsspec and s3fs (pip install s3fs)")),
    "scaling.py": (["--data", DATA, "--threads", "1", "--epochs", "1", "--repeat", "1"], None),
    "screenshot_notebooks.py": (["notebooks/01_quickstart.ipynb"], _needs_chromium),
    "serial.py": (["--data", DATA, "--mode", "cpu", "--batches", "16", "--variants", "uint8", "--small", "1",
                   "--large", "2", "--epochs", "1"], None),
    "shards.py": (["--data", DATA, "--rounds", "1", "--threads", "1"], None),
    "storage.py": (["--data", DATA, "--latencies", "1", "--repeat", "1", "--epochs", "1", "--torch-workers", "2",
                    "--io-depths", "4", "--no-cold"], None),
    "slot_pages.py": (["--data", DATA, "--rounds", "1", "--epochs", "2"], None),
    "soak.py": (["--data", DATA, "--epochs", "2", "--abandon", "3", "--images", "64"], None),
    "token_ranges.py": (["--files", "2", "--mb", "2", "--rounds", "1", "--batches", "4", "--limit-rate", "0"], None),
    "token_slots.py": (["--data", DATA + "-tokens", "--tokens", "4000000", "--seq-lens", "2048", "--repeats", "1",
                        "--rounds", "1", "--round-s", "0.2"], None),
    "tokens.py": (["--quick", "--seq-lens", "2048", "--data", DATA + "-tokens"], None),
    "transforms.py": (["--rounds", "1", "--copies", "1"], None),
    "verdict_check.py": (["--smoke"], None),
}
# Scripts run a second time in another mode with code of its own: label -> (script, argv, check).
MODES = {
    "storage.py --remote": ("storage.py", ["--remote", "--data", DATA, "--rtts", "5", "--protocols", "http,s3",
                                           "--repeat", "1", "--epochs", "1", "--torch-workers", "2", "--shards", "2",
                                           "--io-conc", "8"], None),
}
HELPERS = {"_epochs.py", "_latencyfs.py", "_photos.py", "_probe_bench.py", "_remote_bench.py", "_report.py",
           "_servers.py", "_synth.py", "_token_peers.py", "_topology.py", "_torchvision.py", "smoke.py"}


def make_folder(root: str, n: int = 192) -> None:
    for i in range(n):
        d = os.path.join(root, f"class_{i % 2}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"{i:04d}.jpg"), "wb") as f:
            f.write(encode_jpeg(photo_like(96 + 8 * (i % 5), 72 + 8 * (i % 3), seed=i)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", help="comma-separated script names (default: all)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per script")
    args = p.parse_args()

    scripts = sorted(f for f in os.listdir(HERE) if f.endswith(".py") and f not in HELPERS)
    unknown = sorted(set(scripts) - set(RUNS))
    if unknown:
        print(f"benchmarks without a smoke run (add them to RUNS in benchmarks/smoke.py): {unknown}")
        return 1
    if args.only:
        wanted = {s if s.endswith(".py") else s + ".py" for s in args.only.split(",")}
        scripts = [s for s in scripts if s in wanted]

    failed, skipped = [], []
    with tempfile.TemporaryDirectory(prefix="ll-bench-smoke-") as tmp:
        data = os.path.join(tmp, "photos")
        make_folder(data)
        env = dict(os.environ, XDG_CACHE_HOME=os.path.join(tmp, "cache"), MPLBACKEND="Agg")
        jobs = [(script, script, *RUNS[script]) for script in scripts]
        jobs += [(label, script, *rest) for label, (script, *rest) in MODES.items() if script in scripts]
        for label, script, argv, check in jobs:
            missing = check() if callable(check) else None
            if missing:
                skipped.append(label)
                print(f"SKIP {label}: needs {missing}", flush=True)
                continue
            exe, run_env = sys.executable, env
            if script == "check_torchvision.py":   # its own environment, loaderlib from this tree
                exe = os.path.join(ROOT, ".venv-tv", "bin", "python")
                run_env = dict(env, PYTHONPATH=ROOT)
            cmd = [exe, os.path.join(HERE, script), *(a.replace(DATA, data) for a in argv)]
            if script == "distributed.py":   # two ranks under torchrun, gloo on loopback
                cmd[1:1] = ["-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                            f"--master_port={_free_port()}"]
                run_env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
            if script == "screenshot_notebooks.py":
                cmd += ["--out", os.path.join(tmp, "notebooks")]
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(cmd, cwd=ROOT, env=run_env, capture_output=True, text=True,
                                      timeout=args.timeout, check=False)
                rc, out = proc.returncode, proc.stdout + proc.stderr
            except subprocess.TimeoutExpired as e:
                rc, out = "timeout", f"{e.stdout or ''}{e.stderr or ''}"
            took = time.perf_counter() - t0
            if rc == 0:
                print(f"ok   {label} ({took:.1f} s)", flush=True)
            else:
                failed.append(label)
                tail = "\n".join(str(out).strip().splitlines()[-25:])
                print(f"FAIL {label} (exit {rc}, {took:.1f} s): {' '.join(cmd[1:])}\n{tail}\n", flush=True)
    ran = len(jobs) - len(skipped)
    print(f"bench-smoke: {ran - len(failed)} passed, {len(failed)} failed, {len(skipped)} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
