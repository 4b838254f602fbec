"""Instructions per item of the native chain, counted by callgrind: a figure that does not move
with the machine's load, for comparing two builds of a kernel where timings are too noisy.

Runs the ResNet-50 training chain of benchmarks/loader.py (RandomResizedCrop(224) + flip, plus
Normalize + CHW float32 for ``--variant float``) through the DataLoader, one thread, on the
ImageNet-like photos, under ``valgrind --tool=callgrind`` with collection on only inside
``ll_chain_run`` (one item's read-to-output work: the decode, the chain's kernels and
everything they call, libjpeg's included). Prints the instructions per item in all and the
functions above ``--top-share``, each as instructions per item and share.

To compare two builds, run it twice: once as is and once with ``--build DIR``, where DIR holds
another built ``loaderlib`` package (a copy of ``loaderlib/`` from a build of the other code).

Usage::

    python benchmarks/instructions.py [--items 160] [--variant float|uint8] [--build DIR]

Needs valgrind; a run of 160 items takes about a minute.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

from _photos import add_data_kind, photos_for

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = """
import sys
from loader import rn50_chain
import loaderlib as ll
root, variant, items = sys.argv[1], sys.argv[2], int(sys.argv[3])
print(ll.__file__, flush=True)
ds = ll.ImageFolderDataset(root).transform_first(rn50_chain(variant))
loader = ll.DataLoader(ds, batch_size=32, shuffle=True, seed=0, num_threads=1, last_batch="discard")
n = 0
while n < items:
    for x, _ in loader:
        n += len(x)
        if n >= items:
            break
print(n, flush=True)
"""

LINE = re.compile(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(.*)$")


def _calls(path: str, name: str) -> int:
    """Calls of function ``name`` recorded in callgrind output file ``path``."""
    ids, total, current = {}, 0, None
    with open(path) as f:
        for line in f:
            if line.startswith(("fn=", "cfn=")):
                m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line.strip())
                if m:
                    if m.group(2):
                        ids[m.group(1)] = m.group(2)
                    current = ids.get(m.group(1)) if line.startswith("cfn=") else None
            elif line.startswith("calls=") and current == name:
                total += int(line.split("=")[1].split()[0])
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="an ImageFolder (default: benchmarks/loader.py's generated photos)")
    p.add_argument("--make", type=int, default=1024)
    add_data_kind(p)
    p.add_argument("--items", type=int, default=160, help="items run (a multiple of the batch size, 32)")
    p.add_argument("--variant", default="float", choices=("float", "uint8"))
    p.add_argument("--build", help="a directory holding another built loaderlib package to count instead")
    p.add_argument("--top-share", type=float, default=0.5, help="list functions of at least this share (%%)")
    a = p.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    from _report import machine_summary

    print(machine_summary())
    root = photos_for(a, a.make, os.path.join(HERE, "out"))
    repo = os.path.dirname(HERE)
    path = [os.path.abspath(a.build)] if a.build else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path, repo, HERE]))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        script = os.path.join(tmp, "child.py")
        with open(script, "w") as f:
            f.write(CHILD)
        run = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--collect-atstart=no",
                              "--toggle-collect=ll_chain_run", sys.executable, script, root, a.variant, str(a.items)],
                             env=env, cwd=tmp, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"the callgrind run failed:\n{run.stderr[-3000:]}")
        module = run.stdout.split()[0]
        # Items counted: calls of ll_chain_stages (once per item, from inside ll_chain_run). The
        # loader's read-ahead runs a few items past those the loop takes, so the loop's count
        # is not the count.
        items = _calls(out, "ll_chain_stages")
        ann = subprocess.run(["callgrind_annotate", "--auto=no", "--inclusive=no", out], capture_output=True,
                             text=True, check=True).stdout
    rows, total, section = [], None, False
    for line in ann.splitlines():
        if "file:function" in line:
            section = True   # the per-function table comes after this header
            continue
        m = LINE.match(line)
        if not m:
            continue
        count = int(m.group(1).replace(",", ""))
        if "PROGRAM TOTALS" in m.group(2):
            total = count
        elif section:
            rows.append((count, m.group(2)))
    if not total or not items:
        sys.exit("callgrind counted nothing inside ll_chain_run")
    print(f"build: {os.path.dirname(module)}")
    print(f"variant {a.variant}; {items} items, one thread, counted inside ll_chain_run by callgrind")
    print(f"instructions per item: {total / items:,.0f}")
    # One line per function: an inlined intrinsic's lines come under its header file's name.
    by_fn: dict = {}
    for count, name in rows:
        where, _, obj = name.partition(" [")
        fn = where.split(":")[-1]
        if fn.startswith("0x"):   # a stripped library's function: name its object
            fn = f"{os.path.basename(obj.rstrip(']'))} {fn}"
        by_fn[fn] = by_fn.get(fn, 0) + count
    for fn, count in sorted(by_fn.items(), key=lambda kv: -kv[1]):
        share = 100 * count / total
        if share < a.top_share:
            break
        print(f"  {count / items:12,.0f}  {share:5.1f}%  {fn}")


if __name__ == "__main__":
    main()
