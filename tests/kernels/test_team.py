"""The fused chain's persistent kernel threads (NOTE [ One queue across batches ] in
pyx/include/ll_pool.h): batches queued back to back give what one batch at a time gives, for
1 and N threads; waiting, dropping and closing never free memory the kernels still write; the
threads are joined; a forked child gets its own."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from benchmarks._synth import encode_jpeg
from loaderlib import transforms as T
from loaderlib._chain import PendingBatch, compile_chain
from loaderlib._ext import _chain
from loaderlib.decoding import status_tables
from tests.conftest import make_photo
from tests.kernels._cprog import ROOT, build_c

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def jpegs() -> list[bytes]:
    sizes = [(500, 375), (375, 500), (333, 251), (640, 480), (97, 61), (1031, 777)]
    return [encode_jpeg(make_photo(w, h, seed=k), 90, ("420", "444")[k % 2]) for k, (w, h) in enumerate(sizes)] * 4


def _make_plan():
    return compile_chain(T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.Normalize(MEAN, STD),
                                    T.ToCHW()]))


def _one_by_one(jpegs, epochs):
    """The reference: every item alone, one thread, one call each."""
    plan = _make_plan()
    ref = []
    for e in range(epochs):
        out = np.empty((len(jpegs), *plan.sample_shape), plan.dtype)
        for i, b in enumerate(jpegs):
            st = plan.run_buffers_into([b], out[i:i + 1], [i], seed=3, epoch=e, num_threads=1)
            assert st.ok.all()
        ref.append(out)
    return ref


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_queued_batches_equal_one_item_at_a_time(jpegs, threads):
    ref = _one_by_one(jpegs, 3)
    plan = _make_plan()
    outs, pend = [], []
    for e in range(3):   # three batches queued before the first is waited for
        out = np.full((len(jpegs), *plan.sample_shape), 7, plan.dtype)
        outs.append(out)
        pend.append(plan.run_buffers_into(jpegs, out, np.arange(len(jpegs)), seed=3, epoch=e, num_threads=threads,
                                          wait=False))
    assert all(isinstance(p, PendingBatch) for p in pend)
    for e, p in enumerate(pend):
        st = p.result()
        assert p.done() and st.ok.all()
        np.testing.assert_array_equal(outs[e], ref[e])
        assert p.result() is st   # the result is built once


def test_a_dropped_pending_batch_is_waited_for(jpegs):
    plan = _make_plan()
    ref = _one_by_one(jpegs, 1)[0]
    out = np.full((len(jpegs), *plan.sample_shape), 7, plan.dtype)
    p = plan.run_buffers_into([bytes(b) for b in jpegs], out, np.arange(len(jpegs)), seed=3, epoch=0, num_threads=2,
                              wait=False)
    del p   # the inputs (the only references to these bytes objects) stay alive until the kernels finish
    gc.collect()
    np.testing.assert_array_equal(out, ref)


def test_thread_limit_per_batch_and_a_larger_team_later(jpegs):
    plan = _make_plan()
    ref = _one_by_one(jpegs, 1)[0]
    for threads in (2, 1, 4, 3):
        out = np.full((len(jpegs), *plan.sample_shape), 7, plan.dtype)
        plan.run_buffers_into(jpegs, out, np.arange(len(jpegs)), seed=3, epoch=0, num_threads=threads)
        np.testing.assert_array_equal(out, ref)
    assert plan._team.size == 4


_JOIN_SCRIPT = """
import gc, os, select, sys
import numpy as np
from loaderlib import transforms as T
from loaderlib._chain import compile_chain
from benchmarks._synth import encode_jpeg
from tests.conftest import make_photo

def tids():
    return set(os.listdir("/proc/self/task"))

def exited(team):
    # A team is an OpenMP region opened by a thread of its own; closing joins that thread,
    # and the OpenMP runtime then lets the region's other threads exit, detached. A pidfd of
    # each thread (PIDFD_THREAD, which is O_EXCL) becomes readable when the thread has exited:
    # an event to wait for, not a time; the 120 s bound only turns a leak into a failure.
    for tid in team:
        try:
            fd = os.pidfd_open(int(tid), os.O_EXCL)
        except ProcessLookupError:
            continue   # gone already
        try:
            poll = select.poll()
            poll.register(fd, select.POLLIN)
            if not poll.poll(120_000):
                return False
        finally:
            os.close(fd)
    return True

jpegs = [encode_jpeg(make_photo(300, 200, seed=k), 90) for k in range(6)]
plan = compile_chain(T.Compose([T.RandomResizedCrop(48), T.ToCHW()]))
out = np.empty((6, *plan.sample_shape), plan.dtype)
before = tids()
plan.run_buffers_into(jpegs, out, np.arange(6), seed=0, epoch=0, num_threads=3)
team3 = tids() - before        # the team started before the batch ran
plan.close()
closed = exited(team3)
plan.run_buffers_into(jpegs, out, np.arange(6), seed=0, epoch=0, num_threads=2)
team2 = tids() - before
del plan
gc.collect()
collected = exited(team2)
print(len(team3), closed, len(team2), collected, len(tids() - before))
"""


def _pidfd_threads() -> bool:
    """Whether this kernel gives pidfds of threads (PIDFD_THREAD, Linux 6.9)."""
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(threading.get_native_id(), os.O_EXCL))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or not _pidfd_threads(),
                    reason="counts threads with /proc and waits for their exit with pidfds (Linux 6.9)")
def test_kernel_threads_are_joined_on_close_and_collection():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    res = subprocess.run([sys.executable, "-c", _JOIN_SCRIPT], check=False, capture_output=True, text=True, cwd=root,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["3", "True", "2", "True", "0"]


def test_team_misuse_is_refused(jpegs):
    with pytest.raises(ValueError, match="at least one thread"):
        _chain.Team(0)
    plan = _make_plan()
    team = _chain.Team(2)
    n = 2
    status, msgs = status_tables(n)
    out = np.empty((n, *plan.sample_shape), plan.dtype)
    with pytest.raises(ValueError, match="team smaller than num_threads"):
        _chain.start_into(plan._chain, team, _chain.SOURCE_BUFFERS, jpegs[:n], -1, None, out,
                             np.arange(n, dtype=np.int64), 0, 0, 3, None, status, msgs)


@pytest.mark.skipif(sys.platform == "win32" or not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_starts_its_own_threads(jpegs):
    plan = _make_plan()
    ref = _one_by_one(jpegs, 1)[0]
    out = np.empty((len(jpegs), *plan.sample_shape), plan.dtype)
    plan.run_buffers_into(jpegs, out, np.arange(len(jpegs)), seed=3, epoch=0, num_threads=2)
    old = plan._team
    pid = os.fork()
    if pid == 0:   # the child: the parent's team has no threads here
        code = 1
        try:
            if not old.usable:
                got = np.full_like(out, 7)
                plan.run_buffers_into(jpegs, got, np.arange(len(jpegs)), seed=3, epoch=0, num_threads=2)
                code = 0 if np.array_equal(got, ref) and plan._team is not old and plan._team.usable else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert old.usable and plan._team is old


def _build_and_run(tmp_path, src: str) -> str:
    """Build the C program ``src`` against the team's header (with AddressSanitizer where the
    compiler has its runtime) and run it; returns its output."""
    exe = build_c(tmp_path, src, ["-fopenmp", "-lpthread"], asan=True)
    res = subprocess.run([exe], capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0 and "bad items 0" in res.stdout, res.stdout + res.stderr
    return res.stdout


@pytest.mark.skipif(sys.platform == "win32", reason="builds a C program with cc")
def test_job_queue_runs_every_item_exactly_once_under_stress(tmp_path):
    _build_and_run(tmp_path, os.path.join(ROOT, "tests", "kernels", "pool_stress.c"))


@pytest.mark.skipif(sys.platform == "win32", reason="builds a C program with cc")
def test_gated_jobs_write_staged_items_once_when_opened_and_none_when_withdrawn(tmp_path):
    # NOTE [ Staged items ]: every item of an opened batch is written exactly once, staged or
    # not; a withdrawn one is untouched and never touched again; a batch queued while threads
    # hold staged items still runs (the program would hang otherwise: the run's timeout fails).
    out = _build_and_run(tmp_path, os.path.join(ROOT, "tests", "kernels", "gate_stress.c"))
    staged = int(out.split("staged ")[1].split(",")[0])
    assert staged > 0, out


@pytest.mark.skipif(sys.platform == "win32", reason="builds a C program with cc; POSIX signals")
def test_a_fault_in_a_team_thread_reaches_the_process_handler(tmp_path):
    # NOTE [ Fault signals reach the handler ]: a team thread that faults runs the process's
    # SIGSEGV handler (faulthandler's, in Python) instead of killing the process silently.
    exe = build_c(tmp_path, os.path.join(ROOT, "tests", "kernels", "fault_signal.c"), ["-fopenmp", "-lpthread"])
    res = subprocess.run([exe], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 3 and "handler ran" in res.stdout, (res.returncode, res.stdout, res.stderr)
