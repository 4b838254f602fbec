"""Token batches for language-model training: loaderlib's TokenDataset against the loaders users
would pick instead, each doing the same work per batch, per core.

The work, for every system: batches of about 128k tokens (``--batch-tokens``), at ``seq_len``
2,048 and 8,192, in a shuffled sample order, each a dict of ``input_ids`` and ``labels`` (the
next tokens) as int32 ``(B, S)``, ``position_ids`` int32 restarting after each end-of-document
token, ``cu_seqlens`` int32 and ``max_seqlen``. Each system's first batch is checked against
that definition (benchmarks/_token_peers.py ``check_batch``) before it is timed.

Systems (each in a child process of its own, driven round by round, interleaved):

* ``loaderlib``: ``DataLoader(TokenDataset(prefix, S, packing="concat"), batch_size=B,
  shuffle=True, num_threads=1)``; ``loaderlib-2t`` the same with 2 threads (scaling
  efficiency = rate(2) / (2 rate(1))); ``loaderlib-pack`` with ``packing="pack"`` (beside
  Grain's first-fit packing); ``loaderlib-mix`` a ``MixtureDataset`` of two corpora (beside
  Megatron's ``BlendedDataset``); ``loaderlib-kernel`` the row kernel alone
  (``gather_into`` in a loop into one reused batch: what the loader adds is the difference);
  ``loaderlib-pack-loader-shuffle`` ``packing="pack"`` shuffled by the loader rather than the
  dataset (NOTE [ Shuffling in blocks ]: each row re-plans a block);
* ``numpy``: the same work in vectorized numpy over nanoGPT-style memmap windows (rows of a
  shuffled permutation converted to int32 straight from the mapping into a ring of 3
  preallocated output sets, positions as index minus ``np.repeat`` of the segment starts);
  ``numpy-fancy`` the textbook form (one fancy-index gather with an int64 index array, astype,
  fresh arrays per batch);
* ``nanogpt``: nanoGPT's own ``get_batch`` (int64, torch.from_numpy, no boundaries), as users
  run it;
* with the peers' interpreter (``--peers PYTHON``, default ``.venv-tokpeers/bin/python``, which
  ``make bench-tokens`` builds): ``litdata`` (``optimize`` into chunks, ``StreamingDataset`` +
  ``TokensLoader(block_size=S+1)``, positions added per sample in torch), ``megatron``
  (Megatron-Core ``GPTDataset`` over the same .bin/.idx, ``reset_position_ids=True``,
  ``eod_mask_loss=True``, cu_seqlens from the positions), ``megatron-blend``
  (``BlendedDataset`` of the two corpora), ``grain-concat`` / ``grain-pack`` (Grain's
  ``ConcatThenSplitIterDataset`` / ``FirstFitPackIterDataset`` over shuffled documents) and
  ``hf`` (Hugging Face ``datasets``, run_clm's ``group_texts`` map, a torch DataLoader over the
  rows). A peer that cannot be installed or run is reported with the reason.

Figures: tokens/s (median of the rounds), CPU seconds per million tokens (the child process's
CPU time, all threads, including what it did ahead while others ran), and for loaderlib the
bytes written into batches per second against this machine's single-core memcpy bandwidth
(``np.copyto`` of a 256 MiB buffer in the parent, once per round; bytes written per second).

Warm-up: before the rounds each system runs unmeasured for about two passes over the corpus
(at most ``--warm-s`` seconds), so that every process has the corpus's pages mapped: on this
machine (a VM) a page fault costs microseconds, and a process's first pass over a mapping
pays one per 4 KiB (fresh output arrays pay the same per batch: ``numpy-fancy``).

Data: a synthetic web-like corpus written once with numpy as a Megatron .bin/.idx (uint16):
document lengths lognormal (median 600 tokens, sigma 1.2, clipped to 4..50,000 tokens), ids
uniform below 50,256, each document ending with the end-of-document id 50,256 (GPT-2's). It
is read once before timing so it sits in the page cache.

First batch (``--first-batch``): a corpus of 2,000 sparse Megatron pairs (``truncate``d .bin,
4 documents per .idx) of 5.12e8 tokens each, over 10^12 tokens in all, and a 20-file one for
comparison: a fresh process times ``TokenDataset(files, 2048)`` + ``DataLoader(shuffle=True)``
to its first batch and reads its peak memory (VmHWM), under a timeout and a memory cap.

Usage::

    python benchmarks/tokens.py                  # about 10 minutes on 2 cores
    python benchmarks/tokens.py --quick          # a smoke run
    make bench-tokens                            # builds .venv-tokpeers first
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CHILD = os.path.join(HERE, "_token_peers.py")
EOS = 50256
VOCAB = 50257

LOCAL = ("loaderlib", "loaderlib-2t", "loaderlib-pack", "loaderlib-mix", "loaderlib-kernel",
         "loaderlib-pack-loader-shuffle", "numpy", "numpy-fancy", "nanogpt")
PEERS = ("litdata", "megatron", "megatron-blend", "grain-concat", "grain-pack", "hf")
WHAT = {
    "loaderlib": "TokenDataset concat, DataLoader(shuffle=True, num_threads=1)",
    "loaderlib-2t": "the same, num_threads=2",
    "loaderlib-pack": "TokenDataset packing='pack' (best fit in blocks), 1 thread",
    "loaderlib-mix": "MixtureDataset of two TokenDatasets (0.7/0.3), 1 thread",
    "loaderlib-kernel": "the row kernel alone: gather_into in a loop into one reused batch, 1 thread, no loader",
    "loaderlib-pack-loader-shuffle": "packing='pack' shuffled by the loader, not the dataset (re-plans blocks)",
    "numpy": "vectorized numpy over memmap windows (row copies to int32 into reused buffers, positions by np.repeat)",
    "numpy-fancy": "numpy, one fancy-index gather (int64 index array) + astype",
    "nanogpt": "nanoGPT get_batch: int64, torch.from_numpy, no position_ids/cu_seqlens",
    "litdata": "optimize -> StreamingDataset + TokensLoader, positions per sample in torch",
    "megatron": "GPTDataset(reset_position_ids, eod_mask_loss), cu_seqlens from positions",
    "megatron-blend": "BlendedDataset of two GPTDatasets (0.7/0.3)",
    "grain-concat": "ConcatThenSplitIterDataset over shuffled documents",
    "grain-pack": "FirstFitPackIterDataset over shuffled documents",
    "hf": "datasets + run_clm group_texts, torch DataLoader, positions per sample in torch",
}
MIX = (0.7, 0.3)


# --------------------------------------------------------------------------- data


def write_megatron(prefix: str, tokens: np.ndarray, lens: np.ndarray) -> None:
    """``PREFIX.bin`` + ``PREFIX.idx`` of uint16 ``tokens`` cut into documents of ``lens``
    (Megatron-LM's MMIDIDX layout, version 1, dtype code 8)."""
    n = lens.size
    tokens.tofile(prefix + ".bin.tmp")
    with open(prefix + ".idx.tmp", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8) + struct.pack("<Q", n)
                + struct.pack("<Q", n + 1))
        f.write(lens.astype(np.int32).tobytes())
        f.write((np.concatenate([[0], np.cumsum(lens)[:-1]]) * 2).astype(np.int64).tobytes())
        f.write(np.arange(n + 1, dtype=np.int64).tobytes())
    os.replace(prefix + ".bin.tmp", prefix + ".bin")
    os.replace(prefix + ".idx.tmp", prefix + ".idx")


def doc_lengths(total: int, rng: np.random.Generator) -> np.ndarray:
    """Web-like document lengths in tokens (lognormal, median 600, sigma 1.2, 4..50,000) summing
    to ``total``."""
    out, have = [], 0
    while have < total:
        x = np.clip(rng.lognormal(np.log(600), 1.2, 1 << 16), 4, 50_000).astype(np.int64)
        out.append(x)
        have += int(x.sum())
    lens = np.concatenate(out)
    c = np.cumsum(lens)
    k = int(np.searchsorted(c, total))
    lens = lens[:k + 1]
    lens[-1] -= int(c[k]) - total
    return lens[lens > 0]


def make_corpus(folder: str, tokens: int, seed: int, name: str) -> tuple[str, dict]:
    prefix = os.path.join(folder, f"{name}-{tokens}")
    if not (os.path.exists(prefix + ".bin") and os.path.exists(prefix + ".idx")):
        os.makedirs(folder, exist_ok=True)
        rng = np.random.default_rng(seed)
        lens = doc_lengths(tokens, rng)
        data = rng.integers(0, EOS, tokens, dtype=np.uint16)
        data[np.cumsum(lens) - 1] = EOS
        write_megatron(prefix, data, lens)
        del data
    with open(prefix + ".idx", "rb") as f:
        n = struct.unpack("<Q", f.read(34)[18:26])[0]
    lens = np.fromfile(prefix + ".idx", np.int32, n, offset=34)
    meta = {"documents": int(n), "tokens": int(lens.sum()), "bin_bytes": os.path.getsize(prefix + ".bin"),
            "idx_bytes": os.path.getsize(prefix + ".idx"), "median": float(np.median(lens)),
            "mean": float(lens.mean()), "p99": float(np.percentile(lens, 99)), "max": int(lens.max()),
            "min": int(lens.min())}
    return prefix, meta


def warm(path: str) -> float:
    """Read a file once (into the page cache); returns seconds."""
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(16 << 20)
        while f.readinto(buf):
            pass
    return time.perf_counter() - t


def memcpy_gbs(mib: int = 256) -> float:
    """Single-core memcpy: bytes written per second by ``np.copyto`` of a ``mib`` MiB buffer
    (each byte also read once), best of 3."""
    src = np.ones(mib << 20, np.uint8)
    dst = np.zeros_like(src)
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = max(best, src.nbytes / (time.perf_counter() - t))
    return best / 1e9


# --------------------------------------------------------------------------- children


def ll_root() -> str:
    """The folder this process imports loaderlib from (children import the same one)."""
    import loaderlib

    return os.path.dirname(os.path.dirname(os.path.abspath(loaderlib.__file__)))


def _commit(root: str) -> str:
    """`` (git COMMIT)`` of the checkout at ``root`` (``+`` when it has changes), or nothing."""
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f" (git {head}{'+' if dirty else ''})"


class Child:
    """One system in a child process (benchmarks/_token_peers.py serve)."""

    def __init__(self, name: str, system: str, python: str, cfg: dict, log_dir: str, timeout: float) -> None:
        self.name = name
        self.err_path = os.path.join(log_dir, f"{name}-{cfg['seq_len']}.log")
        self.err = open(self.err_path, "w")
        env = dict(os.environ, PYTHONPATH=ll_root(), TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
        for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
            env.pop(k, None)
        self.proc = subprocess.Popen([python, CHILD, "serve", system, json.dumps(cfg)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, text=True, cwd=ROOT, env=env)
        self.timeout = timeout
        self.ready: dict | None = None
        self.failure: str | None = None

    def _read(self, timeout: float) -> dict | None:
        box: list = []
        t = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        if not box:
            self.fail(f"no answer within {timeout:.0f} s")
            return None
        line = box[0]
        if not line:
            self.fail("exited")
            return None
        return json.loads(line)

    def wait_ready(self) -> bool:
        self.ready = self._read(self.timeout)
        return self.ready is not None

    def run(self, n: int) -> dict | None:
        if self.failure:
            return None
        try:
            self.proc.stdin.write(json.dumps({"run": n}) + "\n")
            self.proc.stdin.flush()
        except OSError:
            self.fail("exited")
            return None
        return self._read(self.timeout)

    def fail(self, why: str) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.err.flush()
        with open(self.err_path) as f:
            lines = [ln for ln in f.read().strip().splitlines() if ln.strip()]
        errs = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b", ln)]
        tail = (errs or lines or [""])[-1]
        self.failure = f"{why}: {tail}" if tail else why

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"quit": 1}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.err.close()


def prepare(python: str, args: list[str], timeout: float) -> tuple[dict | None, str | None]:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    try:
        p = subprocess.run([python, CHILD, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                           env=env, check=False)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    if p.returncode != 0:
        lines = [ln for ln in (p.stderr or p.stdout).strip().splitlines() if ln.strip()]
        return None, lines[-1] if lines else f"exit {p.returncode}"
    return json.loads(p.stdout.strip().splitlines()[-1]), None


# --------------------------------------------------------------------------- the throughput run


def bench_seq_len(S: int, systems: list[str], pythons: dict[str, str], base_cfg: dict, rounds: int, round_s: float,
                  warm_s: float, log_dir: str, timeout: float, copy_rates: list[float]) -> dict:
    B = max(1, base_cfg["batch_tokens"] // S)
    cfg = dict(base_cfg, seq_len=S, batch=B)
    cfg["samples"] = max(4 * B, int(cfg["megatron_tokens"] // S))
    res: dict[str, dict] = {}
    kids: dict[str, Child] = {}
    for name in systems:
        if name in base_cfg["unavailable"]:
            res[name] = {"failure": base_cfg["unavailable"][name]}
            continue
        c = dict(cfg)
        if name == "loaderlib-2t":
            c["threads"] = 2
        if name in ("loaderlib-pack", "grain-pack", "loaderlib-pack-loader-shuffle"):
            c["packing"] = c["check"] = "pack"
        if name == "hf":
            c["hf_dir"] = cfg["hf_dirs"][S]
            c["hf_map_note"] = cfg["hf_notes"][S]
        real = {"loaderlib-2t": "loaderlib", "loaderlib-pack": "loaderlib"}.get(name, name)
        kid = Child(name, real, pythons[name], c, log_dir, timeout)
        kids[name] = kid
        print(f"  [{S}] starting {name} ...", flush=True)
        if not kid.wait_ready():
            res[name] = {"failure": kid.failure}
            print(f"  [{S}] {name} could not run: {kid.failure}", flush=True)
            continue
        r = kid.ready
        res[name] = {"notes": r["ready"], "setup_s": r["setup_s"], "bytes_per_token": r["bytes_per_batch"] /
                     r["tokens_per_batch"], "check": r["check"], "rates": [], "cpu_per_m": []}
        # calibrate: batches per round so that one round takes about round_s
        n, probe = 2, None
        while True:   # long enough that batches made ahead (prefetch) do not count
            probe = kid.run(n)
            if probe is None or probe["wall"] >= 0.1 * round_s or n >= 1 << 20:
                break
            n *= 4
        if probe is None:
            res[name] = {"failure": kid.failure}
            continue
        rate = probe["tokens"] / max(probe["wall"], 1e-6)
        res[name]["n"] = max(2, int(round_s * rate / (B * S)))
        print(f"  [{S}] {name}: ready in {r['setup_s']:.1f} s, {rate / 1e6:.1f} M tokens/s probe, "
              f"{res[name]['n']} batches a round", flush=True)
    live = [n for n in systems if n in kids and "failure" not in res[n]]
    for name in live:
        # Unmeasured: about two passes over the corpus (at most warm_s): a fresh process pays a
        # page fault per 4 KiB of the mapping it first touches, slow on this machine (NOTE in
        # the module docstring); every process has the corpus mapped before it is timed.
        r = res[name]
        rate = r["n"] * B * S / round_s
        n_warm = max(r["n"], min(-(-2 * base_cfg["corpus_tokens"] // (B * S)), int(warm_s * rate / (B * S))))
        if kids[name].run(n_warm) is None:
            res[name] = {"failure": kids[name].failure}
    for rd in range(rounds):
        copy_rates.append(memcpy_gbs())
        for name in live:
            if "failure" in res[name]:
                continue
            out = kids[name].run(res[name]["n"])
            if out is None:
                res[name] = {"failure": kids[name].failure}
                continue
            res[name]["rates"].append(out["tokens"] / out["wall"])
            res[name]["cpu_per_m"].append(out["cpu"] / (out["tokens"] / 1e6))
        line = ", ".join(f"{n} {res[n]['rates'][-1] / 1e6:.1f}" for n in live if res[n].get("rates"))
        print(f"  [{S}] round {rd + 1}/{rounds} (M tokens/s): {line}; memcpy {copy_rates[-1]:.2f} GB/s", flush=True)
    for kid in kids.values():
        kid.close()
    return {"batch": B, "systems": res}


# --------------------------------------------------------------------------- first batch


FIRST_BATCH_CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
import loaderlib as ll
from loaderlib.datasets import TokenDataset
t_imp = time.perf_counter()
files = json.loads(sys.argv[1])
ds = TokenDataset(files, 2048)
t_open = time.perf_counter()
loader = ll.DataLoader(ds, batch_size=64, shuffle=True, num_threads=1, seed=0)
b = next(iter(loader))
t_first = time.perf_counter()
hwm = 0
with open("/proc/self/status") as f:
    for line in f:
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) * 1024
print(json.dumps({"import_s": t_imp - t0, "open_s": t_open - t_imp, "first_batch_s": t_first - t_imp,
                  "vmhwm": hwm, "tokens": int(ds.num_tokens), "samples": len(ds), "files": len(ds.files),
                  "batch_shape": list(b["input_ids"].shape)}))
"""


def make_sparse_corpus(folder: str, files: int, tokens_per_file: int, docs_per_file: int = 4) -> list[str]:
    """``files`` Megatron pairs whose .bin are sparse (``truncate``d: holes read as token 0) and
    whose .idx hold ``docs_per_file`` documents."""
    os.makedirs(folder, exist_ok=True)
    per = tokens_per_file // docs_per_file
    lens = np.full(docs_per_file, per, np.int64)
    lens[-1] += tokens_per_file - per * docs_per_file
    idx = (b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8) + struct.pack("<Q", docs_per_file)
           + struct.pack("<Q", docs_per_file + 1) + lens.astype(np.int32).tobytes()
           + (np.concatenate([[0], np.cumsum(lens)[:-1]]) * 2).astype(np.int64).tobytes()
           + np.arange(docs_per_file + 1, dtype=np.int64).tobytes())
    prefixes = []
    for i in range(files):
        p = os.path.join(folder, f"part-{i:05d}")
        if not (os.path.exists(p + ".bin") and os.path.getsize(p + ".bin") == 2 * tokens_per_file):
            with open(p + ".bin", "wb") as f:
                f.truncate(2 * tokens_per_file)
            with open(p + ".idx", "wb") as f:
                f.write(idx)
        prefixes.append(p)
    return prefixes


def first_batch(prefixes: list[str], timeout: float, mem_cap: int) -> dict:
    """Time to the first batch in a fresh process, its peak memory; killed past ``timeout``
    seconds or ``mem_cap`` bytes of resident memory (the peak seen is then reported)."""
    env = dict(os.environ, PYTHONPATH=ll_root())
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-c", FIRST_BATCH_CHILD, json.dumps(prefixes)], stdout=out, stderr=err,
                             cwd=tempfile.gettempdir(), env=env)
        peak, why = 0, None
        while p.poll() is None:
            try:
                with open(f"/proc/{p.pid}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            peak = max(peak, int(line.split()[1]) * 1024)
            except OSError:
                pass
            if peak > mem_cap:
                why = f"killed at {peak / 2**30:.1f} GiB resident (cap {mem_cap / 2**30:.0f} GiB)"
            elif time.perf_counter() - t0 > timeout:
                why = f"no first batch within {timeout:.0f} s (killed; {peak / 2**30:.2f} GiB resident then)"
            if why:
                p.kill()
                p.wait()
                break
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        if why:
            return {"failure": why, "wall": wall, "peak_seen": peak}
        if p.returncode != 0:
            lines = [ln for ln in err.read().strip().splitlines() if ln.strip()]
            return {"failure": f"exit {p.returncode}: {lines[-1] if lines else ''}", "wall": wall, "peak_seen": peak}
        r = json.loads(out.read().strip().splitlines()[-1])
        r["wall"] = wall
        return r


# --------------------------------------------------------------------------- report


def fmt_rate(x: float) -> str:
    return f"{x / 1e6:,.1f}"


def table(results: dict[int, dict], copy_gbs: float) -> str:
    lens = sorted(results)
    head = "| system | what it does |" + "".join(f" M tokens/s @{S} | CPU s / M tokens @{S} |" for S in lens)
    rows = [head, "|" + " --- |" * (2 + 2 * len(lens))]
    names = [n for n in (*LOCAL, *PEERS) if any(n in results[S]["systems"] for S in lens)]
    for n in names:
        cells = [n, WHAT[n]]
        for S in lens:
            r = results[S]["systems"].get(n)
            if r is None or "failure" in r or not r.get("rates"):
                cells += ["not run", "-"]
            else:
                cells += [fmt_rate(statistics.median(r["rates"])), f"{statistics.median(r['cpu_per_m']):.4f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def ratios(results: dict[int, dict], copy_gbs: float) -> list[str]:
    out = []
    for S, res in sorted(results.items()):
        sy = res["systems"]

        def med(n: str) -> float | None:
            r = sy.get(n)
            return statistics.median(r["rates"]) if r and r.get("rates") else None

        ll1 = med("loaderlib")
        if ll1 is None:
            out.append(f"- seq_len {S}: loaderlib did not run ({sy.get('loaderlib', {}).get('failure')})")
            continue
        bpt = sy["loaderlib"]["bytes_per_token"]
        gbs = ll1 * bpt / 1e9
        line = [f"- seq_len {S} (batch {res['batch']} x {S}): loaderlib {fmt_rate(ll1)} M tokens/s writes "
                f"{gbs:.2f} GB/s into batches ({bpt:.1f} bytes a token) = {gbs / copy_gbs:.2f} of single-core memcpy "
                f"({copy_gbs:.2f} GB/s)"]
        two = med("loaderlib-2t")
        if two:
            line.append(f"2 threads {fmt_rate(two)} M tokens/s, scaling efficiency {two / (2 * ll1):.2f}")
        def cpu(n: str) -> float | None:
            r = sy.get(n)
            return statistics.median(r["cpu_per_m"]) if r and r.get("cpu_per_m") else None

        for n in ("numpy", "numpy-fancy", "nanogpt"):
            v = med(n)
            if v:
                line.append(f"{ll1 / v:.2f}x {n} ({cpu(n) / cpu('loaderlib'):.2f}x by CPU time)")
        peers = {n: med(n) for n in ("litdata", "megatron", "grain-concat", "hf")}
        best = max(((v, n) for n, v in peers.items() if v), default=None)
        if best:
            line.append(f"{ll1 / best[0]:.1f}x the fastest of LitData, Megatron, Grain concat and HF ({best[1]}; "
                        f"{cpu(best[1]) / cpu('loaderlib'):.1f}x by CPU time)")
        pk, gp = med("loaderlib-pack"), med("grain-pack")
        if pk and gp:
            line.append(f"pack: {pk / gp:.1f}x Grain first-fit")
        kern = med("loaderlib-kernel")
        if kern:
            line.append(f"the row kernel alone {fmt_rate(kern)} M tokens/s = {kern * bpt / 1e9 / copy_gbs:.2f} of memcpy "
                        f"(the loader keeps {ll1 / kern:.2f} of it)")
        pls = med("loaderlib-pack-loader-shuffle")
        if pk and pls:
            line.append(f"pack shuffled in the dataset {pk / pls:.1f}x the loader's shuffle ({fmt_rate(pls)} M tokens/s)")
        mx, mb = med("loaderlib-mix"), med("megatron-blend")
        if mx and mb:
            line.append(f"mixture: {mx / mb:.1f}x Megatron BlendedDataset")
        out.append("; ".join(line))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.path.join(HERE, ".data", "tokens"), help="folder for the corpora")
    p.add_argument("--tokens", type=float, default=4e8, help="tokens in the main corpus")
    p.add_argument("--seq-lens", default="2048,8192")
    p.add_argument("--batch-tokens", type=int, default=131072)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--round-s", type=float, default=1.0, help="seconds per system per round")
    p.add_argument("--warm-s", type=float, default=8.0, help="most seconds of unmeasured warm-up per system")
    p.add_argument("--systems", default=",".join(LOCAL + PEERS))
    p.add_argument("--peers", default=os.path.join(ROOT, ".venv-tokpeers", "bin", "python"),
                   help="an interpreter with litdata, megatron-core, grain, datasets and torch")
    p.add_argument("--litdata-tokens", type=float, default=3.2e7)
    p.add_argument("--hf-tokens", type=float, default=1.6e7)
    p.add_argument("--megatron-tokens", type=float, default=2e8, help="tokens of samples Megatron indexes")
    p.add_argument("--first-batch", choices=("yes", "no", "only"), default="yes")
    p.add_argument("--fb-files", type=int, default=2000)
    p.add_argument("--fb-tokens-per-file", type=float, default=5.12e8)
    p.add_argument("--fb-timeout", type=float, default=180)
    p.add_argument("--fb-mem-cap-gib", type=float, default=8)
    p.add_argument("--timeout", type=float, default=600, help="seconds a child may take to answer")
    p.add_argument("--json", help="write the results here too")
    p.add_argument("--quick", action="store_true", help="a short smoke run (tiny corpora, one round)")
    args = p.parse_args()
    if args.quick:
        args.tokens, args.rounds, args.round_s, args.warm_s = 4e6, 1, 0.2, 0.5
        args.litdata_tokens, args.hf_tokens, args.megatron_tokens = 1e6, 1e6, 2e6
        args.fb_files, args.fb_tokens_per_file, args.fb_timeout = 20, 1e8, 60
        args.data = os.path.join(args.data, "quick")

    from _report import machine_summary

    seq_lens = [int(s) for s in args.seq_lens.split(",")]
    systems = [s for s in args.systems.split(",") if s]
    print(machine_summary())
    print(f"loaderlib imported from {ll_root()}{_commit(ll_root())}")
    print(f"cores shared with other users while measuring: load average {os.getloadavg()[0]:.2f} at start")
    results: dict[int, dict] = {}
    copy_rates: list[float] = []
    fb: dict[str, dict] = {}

    if args.first_batch != "only":
        folder = args.data
        prefix, meta = make_corpus(folder, int(args.tokens), 0, "web")
        prefix_b, meta_b = make_corpus(folder, int(args.tokens) // 4, 1, "web-b")
        warm_s = warm(prefix + ".bin") + warm(prefix_b + ".bin")
        print(f"corpus: {prefix}.bin/.idx: {meta['tokens']:,} tokens in {meta['documents']:,} documents "
              f"(lengths median {meta['median']:.0f}, mean {meta['mean']:.0f}, p99 {meta['p99']:.0f}, "
              f"max {meta['max']:,}), {meta['bin_bytes'] / 2**20:,.0f} MiB .bin + {meta['idx_bytes'] / 2**20:.1f} MiB "
              f".idx; mixture's second corpus {meta_b['tokens']:,} tokens; read once into the page cache "
              f"({warm_s:.1f} s)")
        pythons = {n: sys.executable for n in LOCAL}
        unavailable: dict[str, str] = {}
        try:
            import torch  # noqa: F401
        except ImportError:
            pythons["nanogpt"] = args.peers
        peers_ok = os.path.exists(args.peers)
        for n in PEERS:
            pythons[n] = args.peers
            if not peers_ok:
                unavailable[n] = f"no peers interpreter at {args.peers} (make bench-tokens builds .venv-tokpeers)"
        base = {"prefix": prefix, "prefix_b": prefix_b, "eos": EOS, "batch_tokens": args.batch_tokens,
                "mix_weights": MIX, "cache": os.path.join(folder, "megatron-cache"), "unavailable": unavailable,
                "megatron_tokens": args.megatron_tokens, "corpus_tokens": meta["tokens"]}
        if peers_ok:
            vers, why = prepare(args.peers, ["versions"], 300)
            print(f"peers ({args.peers}): {vers if vers else why}")
        if peers_ok and "litdata" in systems:
            out = os.path.join(folder, f"litdata-{int(args.litdata_tokens)}")
            if not os.path.exists(os.path.join(out, "index.json")):
                t = time.perf_counter()
                r, why = prepare(args.peers, ["prepare-litdata", prefix, out, str(int(args.litdata_tokens))], 1800)
                if why:
                    unavailable["litdata"] = f"optimize failed: {why}"
                else:
                    print(f"litdata: optimized {r['tokens']:,} tokens in {time.perf_counter() - t:.1f} s")
            base["litdata_dir"] = out
            base["litdata_tokens"] = args.litdata_tokens
        base["hf_tokens"] = args.hf_tokens
        if peers_ok and "hf" in systems:
            base["hf_dirs"], base["hf_notes"] = {}, {}
            for S in seq_lens:
                out = os.path.join(folder, f"hf-{int(args.hf_tokens)}-{S + 1}")
                note_path = out + ".json"
                if not os.path.exists(note_path):
                    r, why = prepare(args.peers, ["prepare-hf", prefix, out, str(int(args.hf_tokens)), str(S + 1)], 1800)
                    if why:
                        unavailable["hf"] = f"group_texts map failed: {why}"
                        break
                    with open(note_path, "w") as f:
                        json.dump(r, f)
                with open(note_path) as f:
                    r = json.load(f)
                note = (f"the one-off group_texts map: {r['tokens'] / r['map_wall'] / 1e6:.2f} M tokens/s, "
                        f"{r['map_cpu'] / (r['tokens'] / 1e6):.3f} CPU s / M tokens")
                base["hf_dirs"][S], base["hf_notes"][S] = out, note
                print(f"hf, block {S + 1}: {note}")
        log_dir = os.path.join(folder, "logs")
        os.makedirs(log_dir, exist_ok=True)
        for S in seq_lens:
            print(f"seq_len {S}:", flush=True)
            results[S] = bench_seq_len(S, systems, pythons, base, args.rounds, args.round_s, args.warm_s, log_dir,
                                       args.timeout, copy_rates)

    if args.first_batch != "no":
        sparse = os.path.join(args.data, "sparse")
        for files in sorted({max(1, args.fb_files // 100), args.fb_files}):
            prefixes = make_sparse_corpus(sparse, files, int(args.fb_tokens_per_file))
            print(f"first batch, {files} sparse Megatron pairs of {args.fb_tokens_per_file:.3g} tokens "
                  f"({files * args.fb_tokens_per_file:.3g} tokens) ...", flush=True)
            fb[str(files)] = first_batch(prefixes, args.fb_timeout, int(args.fb_mem_cap_gib * 2**30))
            print(f"  {json.dumps(fb[str(files)])}", flush=True)

    # ---------------------------------------------------------------- report
    print()
    print("## Token batches: what was measured")
    print(machine_summary())
    copy_gbs = statistics.median(copy_rates) if copy_rates else memcpy_gbs()
    if results:
        print(f"single-core memcpy (np.copyto, 256 MiB, bytes written per second, median of rounds): {copy_gbs:.2f} GB/s")
        print(f"{args.rounds} interleaved rounds of about {args.round_s:.1f} s per system; medians; "
              "2 cores shared with other engineers (noisy: read ratios)")
        print()
        print(table(results, copy_gbs))
        print()
        for line in ratios(results, copy_gbs):
            print(line)
        print()
        for S, res in sorted(results.items()):
            for n, r in res["systems"].items():
                if "failure" in r:
                    print(f"- {n} @{S}: NOT RUN: {r['failure']}")
                else:
                    print(f"- {n} @{S}: {r['notes']}; first batch after {r['setup_s']:.2f} s; check {r['check']}")
    for files, r in fb.items():
        if "failure" in r:
            print(f"- first batch, {files} files: {r['failure']}")
        else:
            print(f"- first batch, {files} files ({r['tokens']:.3g} tokens, {r['samples']:,} samples): "
                  f"TokenDataset opened in {r['open_s']:.2f} s, first batch {r['first_batch_s']:.2f} s after import, "
                  f"peak memory (VmHWM) {r['vmhwm'] / 2**20:,.0f} MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": {str(k): v for k, v in results.items()}, "memcpy_gbs": copy_gbs,
                       "first_batch": fb}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
