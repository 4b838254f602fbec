"""Argument checks, the skip circuit breaker, step names in explain(), negative indices, and an
interpreter that can exit while a dataset call is stuck."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import loaderlib as ll


def _arrays(n=12):
    return ll.ArrayDataset(np.arange(n, dtype=np.float32), np.arange(n))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"batch_size": 2.5}, "batch_size must be a positive integer"),
    ({"batch_size": "4"}, "batch_size must be a positive integer"),
    ({"batch_size": True}, "batch_size must be a positive integer"),
    ({"batch_size": 2, "seed": 1.7}, "seed must be a non-negative integer"),
    ({"batch_size": 2, "timeout": -1}, "timeout must be a non-negative number"),
    ({"batch_size": 2, "on_error": "skip", "max_skipped": 1.5}, "max_skipped must be a count"),
])
def test_arguments_are_checked_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ll.DataLoader(_arrays(), **kwargs)


def test_negative_sampler_indices_are_refused():
    loader = ll.DataLoader(_arrays(), batch_size=2, sampler=[0, 1, -1, 3])
    with pytest.raises(ValueError, match="negative index"):
        list(loader)


def _broken_mostly(a, b):
    if int(b) % 4:
        raise ValueError(f"bad sample {int(b)}")
    return a, b


@pytest.mark.parametrize("limit", [3, 0.25])
def test_max_skipped_circuit_breaker(limit):
    loader = ll.DataLoader(_arrays(16).transform(_broken_mostly), batch_size=2, on_error="skip", max_skipped=limit,
                           num_threads=1)
    with pytest.raises(ll.LoaderError, match=r"more than max_skipped=(3|4): the dataset looks broken\. 1: "):
        list(loader)
    ok = ll.DataLoader(_arrays(16).transform(_broken_mostly), batch_size=2, on_error="skip", max_skipped=12,
                       num_threads=1)
    with pytest.warns(ll.SkipWarning, match="12 samples skipped"):
        assert np.concatenate([b for _, b in ok]).tolist() == [0, 4, 8, 12]


def test_explain_names_python_steps_by_qualified_name():
    def a_rather_long_and_descriptive_step_name_that_used_to_be_cut_off_in_explain_output(a, b):
        return a, b

    loader = ll.DataLoader(_arrays().transform(
        a_rather_long_and_descriptive_step_name_that_used_to_be_cut_off_in_explain_output), batch_size=2)
    assert ("test_explain_names_python_steps_by_qualified_name.<locals>."
            "a_rather_long_and_descriptive_step_name_that_used_to_be_cut_off_in_explain_output") in loader.explain()


_STUCK = r"""
import threading, numpy as np, loaderlib as ll

class Stuck:
    def __len__(self):
        return 8
    def __getitem__(self, i):
        threading.Event().wait()      # a read that never returns (a hung network mount)

loader = ll.DataLoader(Stuck(), batch_size=2, num_threads=2, timeout=1)
try:
    next(iter(loader))
except ll.LoaderTimeoutError:
    print("timed out")
"""


def test_interpreter_exits_while_a_dataset_call_is_stuck(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(_STUCK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    # The bound is generous; the point is that the process ends at all (a non-daemon pool
    # thread stuck in __getitem__ would keep it alive for ever).
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert r.returncode == 0, r.stderr
    assert "timed out" in r.stdout


def test_chw_input_is_refused_with_the_fix():
    from loaderlib import transforms as T

    chw = np.zeros((3, 64, 48), np.uint8)
    with pytest.raises(ValueError, match=r"looks like CHW: pass img.transpose\(1, 2, 0\)"):
        T.RandomResizedCrop(32)(chw, seed=0)
    assert T.RandomResizedCrop(32)(chw.transpose(1, 2, 0).copy(), seed=0).shape == (32, 32, 3)


def test_normalize_in_0_255_scale_is_refused():
    from loaderlib import transforms as T

    with pytest.raises(ValueError, match="0-1 scale mean and std .* divide them by 255"):
        T.Normalize(mean=(123.7, 116.3, 103.5), std=(58.4, 57.1, 57.4))
    T.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def test_tuple_of_arrays_and_bare_arrays_run_natively():
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    y = np.arange(10)
    tup = ll.TupleDataset(ll.ArrayDataset(x), ll.ArrayDataset(y))
    loader = ll.DataLoader(tup, batch_size=4, shuffle=True, seed=1)
    assert loader.engine == "native"
    order = ll.sampler.RandomSampler(10, seed=1).order(0)
    got = list(loader)
    np.testing.assert_array_equal(np.concatenate([a for a, _ in got]), x[order])
    np.testing.assert_array_equal(np.concatenate([b for _, b in got]), y[order])
    bare = ll.DataLoader(x, batch_size=3)
    assert bare.engine == "native"
    np.testing.assert_array_equal(np.concatenate(list(bare)), x)
