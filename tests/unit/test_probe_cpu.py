"""Finding the storage's local processes for the probe (NOTE [ Finding the storage's
processes ]): FUSE mounts from a mountinfo text, servers and the servers behind a proxy from a
TCP table, against hand-built fixtures; CPU samples of this process and of a child."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from loaderlib._observe.probe_cpu import (
    CpuSample,
    cpu_sample,
    fuse_mount_of,
    process_cpu_s,
    servers_of,
    storage_pids,
)

MOUNTINFO = """\
22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
40 22 0:35 / /mnt/data rw,nosuid - fuse.latencyfs latencyfs rw,user_id=0
41 40 0:36 / /mnt/data/inner rw - tmpfs tmpfs rw
42 22 0:37 / /mnt/with\\040space rw - fuse.s3fs s3fs rw
"""


def test_fuse_mount_of_takes_the_innermost_mount_and_its_type():
    assert fuse_mount_of("/mnt/data/a/b.jpg", MOUNTINFO) == "/mnt/data"
    assert fuse_mount_of("/mnt/data", MOUNTINFO) == "/mnt/data"
    assert fuse_mount_of("/mnt/data/inner/x.jpg", MOUNTINFO) is None       # a tmpfs inside it
    assert fuse_mount_of("/mnt/database/x.jpg", MOUNTINFO) is None         # a prefix, not a parent
    assert fuse_mount_of("/mnt/with space/k", MOUNTINFO) == "/mnt/with space"
    assert fuse_mount_of("/home/x.jpg", MOUNTINFO) is None


def test_servers_of_follows_a_proxy_to_the_server_behind_it():
    # pid 10 listens on 8080 (a proxy) and is connected to 9000, where pids 20 and 21 (a server
    # and its worker) listen; pid 30 listens on 7000, unrelated; pid 40 is connected to 8080
    # (the client: not a server).
    table = [(8080, 0, 100, True), (9000, 0, 200, True), (7000, 0, 300, True),
             (50001, 9000, 101, False), (9000, 50001, 201, False), (50002, 8080, 400, False)]
    sockets = {10: {100, 101}, 20: {200, 201}, 21: {200}, 30: {300}, 40: {400}}
    assert servers_of(8080, table, sockets) == {10, 20, 21}
    assert servers_of(9000, table, sockets) == {20, 21}
    assert servers_of(7000, table, sockets) == {30}
    assert servers_of(1234, table, sockets) == set()


def test_storage_pids_of_a_local_server_and_of_plain_paths(tmp_path):
    assert storage_pids(str(tmp_path / "x.jpg")) == ()          # not on a FUSE mount here
    assert storage_pids("s3://bucket/key") == ()                 # no local server
    assert storage_pids("http://192.0.2.1:9/x.jpg") == ()       # not this machine
    child = subprocess.Popen([sys.executable, "-c", "import http.server as h, sys; "
                              "s = h.HTTPServer(('127.0.0.1', 0), h.BaseHTTPRequestHandler); "
                              "print(s.server_port, flush=True); s.serve_forever()"],
                             stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        assert storage_pids(f"http://127.0.0.1:{port}/a.jpg") == (child.pid,)
        assert os.getpid() not in storage_pids(f"http://127.0.0.1:{port}/a.jpg")
    finally:
        child.kill()
        child.wait()


def test_cpu_samples_count_this_process_and_the_given_ones():
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.3: pass\nprint('done', flush=True)\ninput()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "done"
        spent = process_cpu_s(child.pid)
        assert spent is not None and spent >= 0.25
        a = cpu_sample([child.pid])
        assert isinstance(a, CpuSample) and a.storage == pytest.approx(spent, abs=0.05)
        assert cpu_sample().storage is None and a.own > 0
    finally:
        child.stdin.close()
        child.wait()
    assert process_cpu_s(child.pid) is None
