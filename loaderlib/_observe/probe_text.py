"""The storage probe's report as text: the table by concurrency, the cores, the read CPU, the
prediction and the one line (``doctor --storage``; NOTE [ Storage probe ] in ``probe.py``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["format_storage_report", "summary_line"]


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.2f}" if v < 100 else f"{v:,.0f}"


def format_storage_report(r: Any) -> str:
    """The report as text (what ``doctor --storage`` prints); ``r``: a ``StorageReport``."""
    what = (f"{r.sampled} of {r.listed} file(s), whole-file reads" if r.kind == "files" else
            f"{r.sampled} of {r.listed} shard(s), reads of {r.range_bytes:,} bytes at random offsets")
    lines = [f"storage {r.location}", f"  {what}; probed in {r.seconds:.1f} s", "",
             "  in flight  reads   files/s      MB/s   p50 ms   p95 ms   p99 ms  stuck"]
    for lv in r.levels:
        # Reads in progress at a level's end are normal; one waiting far past the others is not.
        slow = lv.unanswered and lv.oldest_unanswered_ms > max(1000.0, 10 * (lv.latency_p99_ms or 0.0))
        wait = f"{lv.unanswered} (oldest {lv.oldest_unanswered_ms / 1e3:.1f} s)" if slow else "-"
        lines.append(f"  {lv.concurrency:>9} {lv.reads:>6} {lv.files_per_s:>9,.0f} {lv.bytes_per_s / 1e6:>9,.1f} "
                     f"{_ms(lv.latency_p50_ms):>8} {_ms(lv.latency_p95_ms):>8} {_ms(lv.latency_p99_ms):>8}  {wait}")
    p = r.prediction
    lines.append("")
    if r.cpu_rate is not None:
        per = f", {p['sample_cpu_ms']:.2f} CPU-ms per sample" if p.get("sample_cpu_ms") is not None else ""
        lines.append(f"  cores      {r.cpu_rate:,.0f} samples/s on {r.threads} thread(s) ({r.cpu_source}){per}")
    else:
        lines.append(f"  cores      not measured ({r.cpu_source})")
    if p.get("read_cpu_ms") is not None:
        whose = (f"the storage's processes ({', '.join(r.storage_processes)})" if r.storage_processes else
                 "the other processes")
        how = ("the loader reading through the storage" if p["cpu_level"] == "loader" else
               f"the probe's reads at {p['cpu_level']} in flight")
        lines.append(f"  read CPU   {p['read_cpu_ms']:.2f} ms per read, measured by {how} (this machine's CPU beyond "
                     f"a warm local read: the reader's and {whose}): the cores reach {p['cpu_ceiling']:,.0f} "
                     "samples/s with the reads")
    if p.get("loader_rate") is not None:
        lines.append(f"  check      the loader read through the storage at {p['loader_rate']:,.0f} samples/s for "
                     f"{p['loader_seconds']:.1f} s (io_depth {p['io_depth']}, files the levels had read)")
    if p.get("io_ceiling") is not None:
        lines.append(f"  storage    {p['io_ceiling']:,.0f} files/s at best")
    if p.get("ceiling") is not None:
        cores = "cores with the reads' CPU" if p.get("read_cpu_ms") is not None else "cores"
        lines.append(f"  loader     ceiling {p['ceiling']:,.0f} samples/s = min({cores}, storage); Little's law: "
                     f"{p['in_flight']:.1f} reads in flight at {_ms(p['latency_ms'])} ms each, io_depth "
                     f"{p['io_depth']} with the read-ahead's headroom")
    for n in r.notes:
        lines.append(f"  note: {n}")
    lines += ["", r.summary]
    return "\n".join(lines)


def summary_line(levels: Sequence[Any], pred: dict, stalled: Sequence[str], seconds: float) -> str:
    """The report's last line: what to expect (``levels``: the ``LevelStats``)."""
    if stalled and not any(lv.reads for lv in levels):
        return (f"the storage did not answer: no read returned within {seconds:.1f} s ({stalled[0]} "
                f"{'and more ' if len(stalled) > 1 else ''}still waiting); a hung mount, a pipe without a "
                "writer or a stalled server")
    lat = pred.get("latency_ms")
    if pred.get("ceiling") is None:
        return (f"reads are {_ms(lat)} ms and the storage gives {pred['io_ceiling']:,.0f} files/s at best; the "
                "cores' rate was not measured") if pred.get("io_ceiling") else "nothing was read"
    cost = "" if pred.get("read_cpu_ms") is None else f" and cost {pred['read_cpu_ms']:.2f} ms of CPU each"
    if pred["limit"] == "cores":
        alone = ("" if pred.get("read_cpu_ms") is None or pred.get("cpu_rate") is None else
                 f", {pred['cpu_rate']:,.0f} if reads cost no CPU")
        return (f"reads are {_ms(lat)} ms{cost}; with {math.ceil(pred['in_flight'])} in flight the cores, not the "
                f"storage, limit the loader (about {pred['ceiling']:,.0f} samples/s{alone}; the adaptive io_depth "
                f"settles near {pred['io_depth']})")
    return (f"reads are {_ms(lat)} ms{cost}; the storage, not the cores, limits the loader: about "
            f"{pred['io_ceiling']:,.0f} samples/s at best where the cores could do {pred['cpu_ceiling']:,.0f}")
