"""``benchmarks/storage.py --probe``: ``ll.probe_storage``'s predicted ceiling against the
measured default loader on the same storage.

Rows: the photos through latencyfs at ``--latencies`` ms per file (default 1, 4, 16, 64) and
over HTTP (nginx) and S3 (moto's server) at ``--rtts`` ms per request (tc netem, or the delay
proxy of ``_servers.py`` where netem is unavailable), one object per image. Per row and round, in fresh processes on the loader's CPUs:

* ``probe``: ``ll.probe_storage(files, seconds=--probe-seconds)`` with its defaults (the
  RN50 uint8 training crop, batch 64, the default thread count): its predicted ceiling
  ``min(cores, storage)``, the limit it names and the io_depth it predicts;
* ``measured``: ``DataLoader(ds.transform_first(RandomResizedCrop(224) + flip), batch_size=64,
  shuffle=True)``, the benchmark's ``loaderlib default`` column, images/s over ``--epochs``
  after a warm-up epoch.

Rounds are interleaved; medians are reported with ``measured / predicted`` (the goal: within
0.75 to 1.25).

Beside the ratio, each row shows where the loader's time went, to check the probe's model
(NOTE [ Read CPU in the ceiling ] in ``loaderlib/_observe/probe.py``): the probe's CPU per sample
(decoding alone) and per read, and during the measured run the loader process's CPU per
image, the storage side's processes' CPU per read (the latencyfs daemon; nginx and the delay
proxy, which runs in this process), and the share of the timed epochs the consumer spent
waiting at epoch starts beyond a mid-epoch batch gap (``boundary``: an epoch of 1,024 photos
starts with empty read-ahead).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time

from loader import image_files, make_dataset


def tree_cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) of the processes ``pids`` and their descendants so far."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(d)] = int(rest[1])
        cpu[int(d)] = (int(rest[11]) + int(rest[12])) / tick
    keep = set(pids)
    grew = True
    while grew:
        more = {p for p, pp in parent.items() if pp in keep} - keep
        keep |= more
        grew = bool(more)
    return sum(cpu.get(p, 0.0) for p in keep)


def self_cpu_s() -> float:
    """This process's CPU seconds (the delay proxy runs in it)."""
    t = os.times()
    return t.user + t.system


def child(spec_path: str) -> dict:
    """One probe, in this (fresh) process: the report as a dict."""
    import loaderlib as ll

    with open(spec_path) as f:
        spec = json.load(f)
    r = ll.probe_storage(spec["files"], seconds=spec["seconds"], storage_options=spec.get("storage_options"))
    return r.to_dict()


def main(a, measure, measure_remote, run_child, summary: str, split: str | None) -> None:
    """``a``: storage.py's arguments; ``measure``/``measure_remote``: its cell runners;
    ``run_child(spec) -> dict`` runs :func:`child` in a fresh process."""
    import _remote_bench
    from _latencyfs import mount

    root = a.data or make_dataset(os.path.join(os.path.dirname(os.path.abspath(__file__)), "out",
                                               f"photos-{a.images}"), a.images)
    paths = image_files(root)[0]
    latencies = [float(x) for x in a.latencies.split(",") if x]
    rtts = [float(x) for x in a.rtts.split(",") if x]
    protocols = [x for x in a.protocols.split(",") if x]
    print(summary)
    print(f"probe validation: {len(paths)} JPEGs ({sum(map(os.path.getsize, paths)) / len(paths) / 1024:.0f} KiB on "
          f"average) from {root}; probe_storage(files, seconds={a.probe_seconds:g}) against the default DataLoader "
          f"(RandomResizedCrop(224) + flip, uint8, batch 64, {a.epochs} timed epoch(s) after a warm-up); each in a "
          f"fresh process; median of {a.repeat} interleaved round(s); the machine was shared with other work (load "
          f"average {os.getloadavg()[0]:.1f} at the start)")
    print(split or "CPUs shared: the storage side (latencyfs daemons, nginx, the delay proxy) runs on the loaders' cores")
    with contextlib.ExitStack() as stack:
        rows: list[tuple[str, dict, dict]] = []   # (name, probe spec, how to measure)
        for lat in latencies:
            m = stack.enter_context(mount(root, lat, a.jitter))
            print(m.describe())
            files = [os.path.join(m.path, os.path.relpath(p, root)) for p in paths]
            rows.append((f"latencyfs {lat:g} ms", {"files": files}, {"local": m.path, "pids": [m.pid]}))
        if rtts and protocols:
            serve = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out",
                                 f"remote-{os.path.basename(root.rstrip(os.sep))}-{a.shards}")
            samples = _remote_bench.build_layouts(root, serve, a.shards)
            net = _remote_bench.Network(stack, serve, rtts, a.jitter, a.net, protocols)
            if net.moto:
                net.moto.upload_folder(_remote_bench.BUCKET, serve)
            print(net.how)
            print(f"servers: {_remote_bench.versions(net)}")
            for proto in protocols:
                for rtt in rtts:
                    base, so = net.base(proto, rtt)
                    files = [f"{base}/{s[0]}" for s in samples["objects"]]
                    spec = {"kind": "loaderlib", "layout": "objects", "base": base, "storage_options": so,
                            "cache": False, "local": False, "samples": samples["objects"], "threads": "default",
                            "epochs": a.epochs, "record_shards": samples["record_shards"],
                            "wds_shards": samples["wds_shards"]}
                    server = net.nginx if proto == "http" else net.moto
                    pids = [server.proc.pid] if server is not None and getattr(server, "proc", None) else []
                    rows.append((f"{proto} {rtt:g} ms objects", {"files": files, "storage_options": so},
                                 {"remote": spec, "pids": pids, "proxy": not net.netem}))
        runs: dict = {}
        t0 = time.perf_counter()
        for r in range(a.repeat):
            for name, probe_spec, how in rows:
                rep = run_child({**probe_spec, "seconds": a.probe_seconds})
                p = rep["prediction"]
                runs.setdefault((name, "predicted"), []).append(p["ceiling"] or 0.0)
                runs.setdefault((name, "io ceiling"), []).append(p["io_ceiling"] or 0.0)
                runs.setdefault((name, "cores"), []).append(rep["cpu_rate"] or 0.0)
                runs.setdefault((name, "io_depth"), []).append(p["io_depth"] or 0)
                runs.setdefault((name, "limit"), []).append(p["limit"])
                runs.setdefault((name, "probe s"), []).append(rep["seconds"])
                runs.setdefault((name, "latency"), []).append(p["latency_ms"] or 0.0)
                s0, p0 = tree_cpu_s(how["pids"]), self_cpu_s()
                res = (measure("loaderlib", how["local"], a.epochs, False, "default") if "local" in how
                       else measure_remote(how["remote"]))
                storage_s = tree_cpu_s(how["pids"]) - s0 + (self_cpu_s() - p0 if how.get("proxy") else 0.0)
                reads = len(files_of(probe_spec)) * (1 + a.epochs)     # every file once per epoch, warm-up included
                runs.setdefault((name, "measured"), []).append(res["images_per_s"])
                runs.setdefault((name, "read cpu"), []).append(p["read_cpu_ms"] or 0.0)
                runs.setdefault((name, "sample cpu"), []).append(p["sample_cpu_ms"] or 0.0)
                runs.setdefault((name, "cores alone"), []).append(p.get("cpu_rate") or rep["cpu_rate"] or 0.0)
                runs.setdefault((name, "loader cpu"), []).append(res.get("cpu_ms_per_image") or 0.0)
                runs.setdefault((name, "storage cpu"), []).append(1e3 * storage_s / reads)
                runs.setdefault((name, "boundary"), []).append((res.get("boundary") or {}).get("excess", 0.0))
                runs.setdefault((name, "probe loader"), []).append(p.get("loader_rate") or 0.0)
                print(f"  round {r + 1}: {name}: predicted {p['ceiling'] or 0:,.0f} img/s ({p['limit']}-bound, "
                      f"io_depth {p['io_depth']}; cores {rep['cpu_rate'] or 0:,.0f} alone, "
                      f"{p.get('cpu_ceiling') or 0:,.0f} with reads at {p.get('read_cpu_ms') or 0:.3f} CPU-ms each "
                      f"(decode {p.get('sample_cpu_ms') or 0:.3f}); storage {p['io_ceiling'] or 0:,.0f} files/s; "
                      f"probe took {rep['seconds']:.1f} s), measured {res['images_per_s']:,.0f} img/s (loader "
                      f"process {res.get('cpu_ms_per_image') or 0:.3f} CPU-ms per image, storage processes "
                      f"{1e3 * storage_s / reads:.3f} per read, epoch-start wait beyond a batch gap "
                      f"{(res.get('boundary') or {}).get('excess', 0.0):.1%}); load average {os.getloadavg()[0]:.1f}; "
                      f"probe summary: {rep['summary']}", flush=True)
            print(f"round {r + 1} of {a.repeat} done ({time.perf_counter() - t0:.0f} s; load average "
                  f"{os.getloadavg()[0]:.1f})", flush=True)
        print_table(runs, [name for name, _p, _h in rows])


def files_of(probe_spec: dict) -> list[str]:
    return probe_spec["files"]


def print_table(runs: dict, names: list[str]) -> None:
    """Medians per row: the probe's figures, the measured rate and their ratio."""
    print("\n| storage | probe: read latency | probe: cores | probe: storage | predicted ceiling (limit) | "
          "predicted io_depth | measured default | measured / predicted | per round (median) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in names:
        med = {k: statistics.median(runs[name, k]) for k in ("predicted", "io ceiling", "cores", "io_depth",
                                                              "measured", "latency")}
        limits = runs[name, "limit"]
        limit = max(set(limits), key=limits.count)
        ratio = med["measured"] / med["predicted"] if med["predicted"] else float("nan")
        # Each round's probe and loader ran one after the other: the ratio within a round sees
        # the same load on a shared machine more often than the ratio of medians does.
        rounds = [m / p for m, p in zip(runs[name, "measured"], runs[name, "predicted"]) if p]
        per = statistics.median(rounds) if rounds else float("nan")
        print(f"| {name} | {med['latency']:.1f} ms | {med['cores']:,.0f} | {med['io ceiling']:,.0f} | "
              f"{med['predicted']:,.0f} ({limit}) | {med['io_depth']:.0f} | {med['measured']:,.0f} | {ratio:.2f} | "
              f"{per:.2f} ({', '.join(f'{x:.2f}' for x in rounds)}) |", flush=True)
    print("\nwhere the time went (medians; CPU-ms): probe's decode per sample and CPU per read; measured run's "
          "loader process per image, storage processes per read, epoch-start wait beyond a batch gap\n")
    print("| storage | probe: decode / sample | probe: CPU / read | probe: cores alone -> with reads | "
          "loader process / image | storage processes / read | epoch-start wait | probe's own loader run: img/s, "
          "measured / it |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in names:
        med = {k: statistics.median(runs[name, k]) for k in ("sample cpu", "read cpu", "cores alone", "predicted",
                                                              "loader cpu", "storage cpu", "boundary", "probe loader",
                                                              "measured")}
        own = med["measured"] / med["probe loader"] if med["probe loader"] else float("nan")
        print(f"| {name} | {med['sample cpu']:.2f} | {med['read cpu']:.2f} | {med['cores alone']:,.0f} -> "
              f"{med['predicted']:,.0f} | {med['loader cpu']:.2f} | {med['storage cpu']:.2f} | "
              f"{med['boundary']:.1%} | {med['probe loader']:,.0f}, {own:.2f} |", flush=True)
    print("\nevery cell per round: " + "; ".join(f"{k[0]} / {k[1]}: {v}" for k, v in runs.items()), file=sys.stdout)
