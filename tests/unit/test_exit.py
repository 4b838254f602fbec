"""The interpreter exits while loader threads are starting or running (NOTE [ Threads at
interpreter exit ] in loaderlib/_engines/base.py). Each case runs a script in a subprocess;
the subprocess timeout only guards against a hang (which is the failure), it measures nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import cv2
import pytest

from tests.conftest import make_photo

# A slow start of the kernel team, in a module of its own: a frame of the script's own module
# on the stuck thread would keep the script's globals (and so the loader) alive past exit.
_SLOW_TEAM = r"""
import threading, time
from loaderlib import _chain as plan_module

real_team = plan_module._chain.Team
slow, entered = threading.Event(), threading.Event()


def team(n):
    # Held here with the GIL released (as the native start of the threads releases it), so
    # the interpreter exits while a driver thread is inside the team's start.
    if slow.is_set() and threading.current_thread().name in ("loaderlib-driver", "starter"):
        entered.set()
        if stuck:
            threading.Event().wait()   # never returns
        # Only keeps the thread inside the start while the script ends; no assertion depends
        # on how long (with the fix the child exits cleanly whatever the length).
        time.sleep(1.0)
    return real_team(n)


stuck = False


plan_module._chain.Team = team
"""

_WARM_TEAM_AT_EXIT = r"""
import os, sys
import loaderlib as ll
from loaderlib import transforms as T
import slowteam

folder, where = sys.argv[1], sys.argv[2]
slowteam.stuck = where == "stuck"
if where == "stuck":
    from loaderlib._engines import base
    base.EXIT_JOIN_S = 0.5   # how long exit waits for a driver that never comes back
if where == "plan":
    # A plan on its own: a thread starts its team, and the plan's owner is collected only
    # while the interpreter exits (a module global), closing the plan then.
    import threading
    import owner
    from loaderlib._chain import compile_chain
    plan = compile_chain(T.Compose([T.Decode(), T.CenterCrop(32)]))
    owner.keep(plan)
    slowteam.slow.set()
    threading.Thread(target=plan._team_for, args=(2,), name="starter", daemon=True).start()
    slowteam.entered.wait(30)
    del plan
    print("done", flush=True)
    sys.exit(0)
# A warm epoch takes over the team of the epoch before (NOTE [ One team across epochs ]); it
# starts one of its own when it cannot (that team closed first, or more threads are asked for),
# which is the start this script ends in.
from loaderlib._chain import NativePlan
NativePlan.share_team = lambda self, other: False
ds = ll.ImageListDataset(sorted(os.path.join(folder, f) for f in os.listdir(folder)))
loader = ll.DataLoader(ds.transform_first(T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip()])),
                       batch_size=4, shuffle=True, seed=0, num_threads=2)
for k, batch in enumerate(loader):
    if k == 0:
        slowteam.slow.set()   # from here on, the warm next epoch's team start is slow
del batch
if not slowteam.entered.wait(30):
    print("the warm epoch never started its team", flush=True)
    sys.exit(3)
if where == "gc":
    del loader     # dropped while its warm epoch's driver starts the team
print("done", flush=True)
"""

_OWNER = r"""
class _Owner:
    def __init__(self, plan):
        self.plan = plan

    def __del__(self):
        self.plan.close()


def keep(plan):
    global held
    held = _Owner(plan)
"""


@pytest.mark.parametrize("where", ["exit", "gc", "stuck", "plan"])
def test_exit_while_a_warm_epoch_starts_its_kernel_team(tmp_path, where):
    """A script that ends (or drops its loader) while the next epoch's run, started early
    (NOTE [ Warm epochs ]), is starting its kernel threads on its driver thread exits
    normally; so does one whose driver never comes back ("stuck"), and one whose plan is
    closed by an owner collected during the interpreter's exit while another thread starts
    the plan's team ("plan"). The driver held the plan's lock across the GIL-releasing start;
    a daemon thread that tries to take the GIL back while the interpreter exits never
    returns, so the lock stayed taken and the close at exit waited for it for ever."""
    folder = tmp_path / "img"
    folder.mkdir()
    for i in range(24):
        cv2.imwrite(str(folder / f"{i:03d}.jpg"), make_photo(64, 48, seed=i))
    script = tmp_path / "child.py"
    script.write_text(_WARM_TEAM_AT_EXIT)
    (tmp_path / "slowteam.py").write_text(_SLOW_TEAM)
    (tmp_path / "owner.py").write_text(_OWNER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    r = subprocess.run([sys.executable, str(script), str(folder), where], capture_output=True, text=True,
                       timeout=60, env=env, check=False)
    assert r.returncode == 0 and "done" in r.stdout, (r.returncode, r.stdout, r.stderr[-3000:])
