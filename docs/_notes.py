"""The architecture page's generated parts: one line per module and the index of NOTE blocks.

A NOTE block is a comment (or docstring paragraph) whose first line is ``NOTE [ Title ]``
alone; other code cites it by its title, often as ``NOTE [ Title ]: why it applies here``. A
title with no such block but a line that starts with ``NOTE [ Title ]:`` and goes on to explain
(the Makefile's style) is defined there. Both lists are read from the source tree on every docs
build, so they cannot drift from the code. ``python docs/_notes.py`` prints them.
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = ("loaderlib", "profiling", "pyx", "fuzz", "benchmarks", "tests", "setup.py", "Makefile", "docs/_hooks.py")
SUFFIXES = {".py", ".pyx", ".pxd", ".h", ".c", ".sh"}
DEFINITION = re.compile(r"^\s*(?:#+|//|/\*+|\*+)?\s*NOTE \[ (?P<title>[^]]+?) \]\s*$")
COLON_DEFINITION = re.compile(r"^\s*(?:#+|//|/\*+|\*+)?\s*NOTE \[ (?P<title>[^]]+?) \]:\s*\S")
CITATION = re.compile(r"NOTE \[ (?P<title>[^]]+?) \]")

# Topic of a NOTE by where it is defined: the first matching path prefix wins.
TOPICS = [
    ("pyx/include/ll_jpeg.h", "Decoding"),
    ("pyx/include/ll_huff.h", "Decoding"),
    ("pyx/include/ll_resize.h", "Resampling"),
    ("pyx/include/ll_chain.h", "The fused chain"),
    ("pyx/include/ll_augment.h", "Augmentations"),
    ("pyx/include/ll_rng.h", "Randomness"),
    ("pyx/include/ll_pool.h", "Threads and the kernel team"),
    ("pyx/include/ll_worker.h", "Threads and the kernel team"),
    ("pyx/include", "Kernels"),
    ("pyx", "Kernels"),
    ("loaderlib/transforms", "Transforms"),
    ("loaderlib/_engines", "Engines"),
    ("loaderlib/_pipeline", "Pipeline"),
    ("loaderlib/pipeline", "Pipeline"),
    ("loaderlib/_autotune", "Autotuning"),
    ("loaderlib/records", "Formats and storage"),
    ("loaderlib/recordio", "Formats and storage"),
    ("loaderlib/webdataset", "Formats and storage"),
    ("loaderlib/_datasets/images", "Formats and storage"),
    ("loaderlib/_datasets/records", "Formats and storage"),
    ("loaderlib/_datasets/recordio", "Formats and storage"),
    ("loaderlib/_datasets/webdataset", "Formats and storage"),
    ("loaderlib/_extract", "Extract: reading ahead, sources and stores"),
    ("loaderlib/datasets", "Formats and storage"),
    ("loaderlib/decoding", "Decoding"),
    ("loaderlib/loader", "The DataLoader"),
    ("loaderlib/_loader", "The DataLoader"),
    ("loaderlib", "Core"),
    ("profiling", "Profiling"),
    ("fuzz", "Build, tests and fuzzing"),
    ("Makefile", "Build, tests and fuzzing"),
    ("setup.py", "Build, tests and fuzzing"),
    ("docs", "Build, tests and fuzzing"),
    ("tests", "Build, tests and fuzzing"),
    ("benchmarks", "Benchmarks"),
]


def source_files() -> list[pathlib.Path]:
    out = []
    for name in SOURCES:
        p = ROOT / name
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out.extend(f for f in sorted(p.rglob("*")) if f.suffix in SUFFIXES and f.is_file()
                       and "_ext" not in f.parts and not (f.suffix == ".c" and f.with_suffix(".pyx").exists()))
    return out


def topic(path: str) -> str:
    return next((t for prefix, t in TOPICS if path.startswith(prefix)), "Other")


def definitions() -> tuple[dict[str, list[tuple[str, int]]], dict[str, list[tuple[str, int]]]]:
    """``({title: [(path, line), ...]} of NOTE blocks, the same of ``NOTE [ Title ]: ...`` lines)``."""
    blocks: dict[str, list[tuple[str, int]]] = {}
    colon: dict[str, list[tuple[str, int]]] = {}
    for f in source_files():
        rel = f.relative_to(ROOT).as_posix()
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            for pattern, found in ((DEFINITION, blocks), (COLON_DEFINITION, colon)):
                m = pattern.match(line)
                if m:
                    found.setdefault(m.group("title"), []).append((rel, n))
    return blocks, colon


def notes() -> tuple[dict[str, tuple[str, int]], dict[str, int]]:
    """``({title: (path, line) of its definition}, {title: number of citations})``."""
    blocks, colon = definitions()
    defined = {t: where[0] for t, where in colon.items() if t not in blocks}
    defined.update({t: where[0] for t, where in blocks.items()})
    places = set(defined.values())
    cited: dict[str, int] = {}
    for f in source_files():
        rel = f.relative_to(ROOT).as_posix()
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            if (rel, n) in places:
                continue
            for c in CITATION.finditer(line):
                cited[c.group("title")] = cited.get(c.group("title"), 0) + 1
    return defined, cited


def notes_markdown() -> str:
    defined, cited = notes()
    by_topic: dict[str, list[str]] = {}
    for title, (path, line) in defined.items():
        by_topic.setdefault(topic(path), []).append(title)
    order = list(dict.fromkeys(t for _, t in TOPICS)) + ["Other"]
    lines = [f"{len(defined)} NOTE blocks. Each is defined once, at the place shown, and cited by its title "
             "from the code that relies on it.", ""]
    for t in order:
        if t not in by_topic:
            continue
        lines += [f"### {t}", "", "| NOTE | defined in | cited |", "|---|---|---|"]
        for title in sorted(by_topic[t], key=str.lower):
            path, line = defined[title]
            lines.append(f"| {title} | `{path}:{line}` | {cited.get(title, 0)} |")
        lines.append("")
    return "\n".join(lines)


def _first_sentence(text: str) -> str:
    para = " ".join(text.strip().split("\n\n")[0].split())
    para = re.split(r"(?<=\.)\s", para)[0] if para else ""
    para = re.sub(r":(?:func|class|meth|mod|attr):", "", para).replace("``", "`")
    return para.replace("|", "&#124;")


def _native_summary(f: pathlib.Path) -> str:
    """The first sentence of a .pyx docstring or of a C header's opening comment."""
    text = f.read_text(errors="replace")
    m = re.search(r'^"""(.*?)(?:"""|\n\s*\n)', text, re.S | re.M) if f.suffix == ".pyx" else \
        re.match(r"\s*/\*+(.*?)(?:\*/|\n\s*\*\s*\n)", text, re.S)
    return _first_sentence(re.sub(r"\n\s*\* ?", " ", m.group(1))) if m else ""


def module_lines() -> str:
    """One line per module: the installed packages, the Cython sources and the C headers."""
    rows = ["| module | what it holds |", "|---|---|"]
    for pkg, prefix in (("loaderlib", "loaderlib"), ("profiling", "loaderlib.profiling")):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            rel = f.relative_to(ROOT / pkg).with_suffix("")
            name = ".".join([prefix, *(p for p in rel.parts if p != "__init__")])
            rows.append(f"| `{name}` | {_first_sentence(ast.get_docstring(ast.parse(f.read_text())) or '')} |")
    for f in sorted((ROOT / "pyx").glob("*.pyx")) + sorted((ROOT / "pyx" / "include").glob("*.h")):
        rows.append(f"| `{f.relative_to(ROOT).as_posix()}` | {_native_summary(f)} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(module_lines())
    print()
    print(notes_markdown())
