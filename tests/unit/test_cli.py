"""``python -m loaderlib``: exit codes, one-line errors, help with examples, pack, doctor's fields."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import multiprocessing
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import loaderlib as ll
from benchmarks._synth import encode_jpeg, photo_like
from loaderlib.__main__ import main
from loaderlib._observe import doctor as _doctor

EXTRAS = {"torch": "torch", "opencv": "cv2", "matplotlib": "matplotlib", "ipywidgets": "ipywidgets",
          "webdataset": "webdataset", "datasets": "datasets", "ray": "ray", "jax": "jax",
          "obstore": "obstore"}


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("LOADERLIB_NUM_THREADS", "LOCAL_WORLD_SIZE")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "loaderlib", *args], capture_output=True, text=True,
                          timeout=300, check=False, env=full)


def test_version_is_the_installed_distributions():
    res = _run("--version")
    assert res.returncode == 0 and res.stderr == ""
    assert res.stdout == f"loaderlib {importlib.metadata.version('loaderlib')}\n"


def test_console_script_is_the_same_command():
    script = shutil.which("loaderlib", path=os.path.dirname(sys.executable))
    assert script is not None, "the [project.scripts] entry point is not installed"
    res = subprocess.run([script, "frobnicate"], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2 and "invalid choice: 'frobnicate'" in res.stderr
    res = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0 and res.stdout == f"loaderlib {ll.__version__}\n"


@pytest.mark.parametrize(("argv", "prog", "problem"), [
    ([], "python -m loaderlib", "the following arguments are required: COMMAND"),
    (["frobnicate"], "python -m loaderlib", "invalid choice: 'frobnicate'"),
    (["bench", "--threads", "0"], "python -m loaderlib bench", "argument --threads: expected a positive integer"),
    (["bench", "--seconds", "0"], "python -m loaderlib bench", "argument --seconds: expected a number > 0"),
    (["bench", "--loaders", "loaderlib,fast"], "python -m loaderlib bench", "unknown loader(s) fast"),
    (["pack"], "python -m loaderlib pack", "required: image_dir, out"),
    (["pack", "a", "b", "--shard-size", "1XB"], "python -m loaderlib pack", "argument --shard-size: size must be a positive number of bytes"),
    (["doctor", "--seconds", "soon"], "python -m loaderlib doctor", "argument --seconds: expected a number"),
    (["doctor", "--bogus"], "python -m loaderlib", "unrecognized arguments: --bogus"),
    (["tokenize", "a.jsonl", "out", "--tokenizer", "t.json", "--batch-size", "0"], "python -m loaderlib tokenize",
     "argument --batch-size: must be at least 1, got 0"),
    (["tokenize", "a.jsonl", "out", "--tokenizer", "t.json", "--eos-id", "eos"], "python -m loaderlib tokenize",
     "argument --eos-id: expected a whole number, got 'eos'"),
])
def test_bad_command_lines_exit_2_with_one_line(capsys, argv, prog, problem):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"{prog}: error: ") and problem in err
    assert err.rstrip().endswith(f"(see '{prog} --help')")


def test_unknown_command_exit_status_in_a_real_process():
    res = _run("frobnicate")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.splitlines() == [("python -m loaderlib: error: argument COMMAND: invalid choice: 'frobnicate' "
                                        "(choose from 'bench', 'pack', 'tokenize', 'doctor') (see 'python -m loaderlib --help')")]


@pytest.mark.parametrize(("argv", "expected"), [
    (["--help"], ["bench", "pack", "tokenize", "doctor", "--version", "examples:"]),
    (["bench", "--help"], ["--data DIR", "--model-step-ms", "examples:", "python -m loaderlib bench --data"]),
    (["pack", "--help"], ["image_dir", "--shard-size SIZE", "examples:", "RecordFileDataset"]),
    (["doctor", "--help"], ["--seconds S", "--json", "examples:", "LOCAL_WORLD_SIZE"]),
    (["tokenize", "--help"], ["INPUT [INPUT ...] OUT", "--tokenizer FILE", "examples:", "IndexedDataset"]),
])
def test_help_has_options_and_examples(capsys, argv, expected):
    with pytest.raises(SystemExit, match="^0$"):
        main(argv)
    out = capsys.readouterr().out
    for text in expected:
        assert text in out


def test_pack_writes_records_that_read_back(tmp_path, capsys):
    src = tmp_path / "images"
    jpegs = {}
    for c in ("cat", "dog"):
        (src / c).mkdir(parents=True)
        for i in range(3):
            data = encode_jpeg(photo_like(40 + i, 30, seed=i + 10 * len(jpegs)), 85)
            (src / c / f"{i}.jpg").write_bytes(data)
            jpegs[(c, i)] = data
    out = tmp_path / "packed"
    assert main(["pack", str(src), str(out), "--quiet"]) == 0
    assert "packed 6 images in 2 classes into 1 shard(s)" in capsys.readouterr().out
    ds = ll.RecordFileDataset(f"{out}.llrec", raw=True)
    assert ds.synsets == ["cat", "dog"]
    got = sorted((bytes(ds[i][0]), int(ds[i][1])) for i in range(len(ds)))
    assert got == sorted((data, ["cat", "dog"].index(c)) for (c, _), data in jpegs.items())
    # The same output again without --force is refused (status 1, not a traceback).
    assert main(["pack", str(src), str(out), "--quiet"]) == 1
    assert capsys.readouterr().err.startswith("error: ")


def test_pack_of_a_missing_folder_fails_with_status_1(tmp_path, capsys):
    assert main(["pack", str(tmp_path / "nope"), str(tmp_path / "out")]) == 1
    assert "is not a folder" in capsys.readouterr().err


def test_doctor_json_fields():
    res = _run("doctor", "--json", "--seconds", "0.2", env={"LOCAL_WORLD_SIZE": "2"})
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    info = ll.build_info()
    assert r["build"]["openmp"] is True and r["build"]["openmp"] == info["openmp"]
    assert r["build"]["libjpeg_turbo_version"] == info["libjpeg_turbo_version"]
    assert r["build"]["simd"] == info["simd"]
    assert r["build"]["kernels_simd"] == info["kernels_simd"] in ("avx512", "avx2", "sse2", "scalar")
    if sys.platform == "linux":
        assert "libjpeg" in os.path.basename(r["build"]["libraries"]["libjpeg"])
        assert "gomp" in os.path.basename(r["build"]["libraries"]["openmp"])
    t = r["threads"]
    affinity = len(os.sched_getaffinity(0))
    assert t["affinity_cpus"] == affinity and t["LOCAL_WORLD_SIZE"] == "2"
    assert t["default"] == max(1, ll.available_cpus() // 2) and ll.available_cpus() <= affinity
    assert f"{affinity} CPU(s) in this process's affinity mask" in t["reason"]
    assert "LOCAL_WORLD_SIZE=2" in t["reason"]
    assert r["fork"]["start_method"] == multiprocessing.get_start_method()
    assert r["fork"]["at_fork_guard"] is True and r["fork"]["forked_after_parallel_kernels"] is False
    assert set(r["extras"]) == set(EXTRAS)
    for name, module in EXTRAS.items():
        assert r["extras"][name]["found"] == (importlib.util.find_spec(module) is not None), name
    assert "opencv-python-headless" in r["extras"]["opencv"]["distributions"]
    s = r["self_check"]
    assert s["ok"] and s["matches_opencv"] is True and s["mismatches"] == 0 and s["shape"] == [600, 512, 3]
    assert s["threads"] == t["default"] and s["images"] >= 4
    assert r["problems"] == []


def test_doctor_text_report_and_thread_override():
    res = _run("doctor", "--seconds", "0", env={"LOADERLIB_NUM_THREADS": "3"})
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    for head in ("build", "threads", "fork safety", "optional packages"):
        assert head in lines
    assert "  OpenMP          on" in "\n".join(lines)
    assert "  default         3: LOADERLIB_NUM_THREADS=3 (set in the environment; it overrides everything else)" \
        in lines
    assert "self-check      skipped" in lines and lines[-1] == "no problems found"


def test_doctor_reports_a_bad_environment_with_status_1():
    res = _run("doctor", "--json", "--seconds", "0", env={"LOCAL_WORLD_SIZE": "two"})
    assert res.returncode == 1
    r = json.loads(res.stdout)
    assert r["threads"]["default"] is None
    assert r["problems"] == ["LOCAL_WORLD_SIZE must be an integer, got 'two'"]


class _Clock:
    """A clock that jumps by ``step`` seconds per reading."""

    def __init__(self, step: float) -> None:
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def test_self_check_counts_batches_by_its_clock():
    # Readings 0.75 (start), 1.5, 2.25, 3.0: elapsed 0.75 and 1.5 are short of 2 s, 2.25 is not.
    s = _doctor.self_check(seconds=2.0, clock=_Clock(0.75))
    n = max(4, 2 * ll.default_num_threads())
    assert s["ok"] and s["images"] == 3 * n and s["seconds"] == 2.25
    assert s["images_per_s"] == round(3 * n / 2.25, 1)


def test_self_check_fails_when_a_parallel_decode_differs(monkeypatch):
    from loaderlib import decoding

    real = decoding.decode_batch

    def flaky(buffers, *args, num_threads=None, **kwargs):
        res = real(buffers, *args, num_threads=num_threads, **kwargs)
        if num_threads != 1:
            res.images[-1] = res.images[-1].copy()
            res.images[-1][0, 0, 0] ^= 1
        return res

    monkeypatch.setattr(decoding, "decode_batch", flaky)
    s = _doctor.self_check(seconds=1.0, clock=_Clock(2.0))
    assert not s["ok"] and s["mismatches"] == 1
    assert s["problem"] == f"1 of {s['images']} parallel decodes differ from the 1-thread decode"


def test_doctor_flags_two_opencv_distributions(monkeypatch):
    versions = {"opencv-python-headless": "4.10.0", "opencv-python": "4.9.0"}
    monkeypatch.setattr(_doctor, "_version", lambda dist: versions.get(dist))
    e = _doctor._extras()["opencv"]
    assert e["distributions"] == ["opencv-python-headless", "opencv-python"] and e["version"] == "4.10.0"
    assert e["problem"].startswith("opencv-python-headless and opencv-python are all installed")


def test_cli_bench_parser_is_the_profiling_one():
    """``bench`` options come from loaderlib.profiling.cli.add_arguments, not a copy."""
    from loaderlib.profiling import cli

    from loaderlib.__main__ import build_parser

    p = build_parser(["bench"])
    args = p.parse_args(["bench", "--threads", "3", "--loaders", "python"])
    assert args.threads == 3 and args.loaders == ["python"] and args.batch_size == 64
    assert cli.add_arguments.__module__ == "loaderlib.profiling.cli"
    bench_only = np.array(["--model-step-ms" in a.option_strings for a in
                           p._subparsers._group_actions[0].choices["bench"]._actions])
    assert bench_only.any()
