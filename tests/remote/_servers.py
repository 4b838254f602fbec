"""Loopback servers for the remote-storage tests and benchmarks: nginx serving a folder,
moto's standalone S3 server, and a fault-injecting HTTP proxy.

Each server is started on 127.0.0.1 by the code that needs it and stopped by ``close()``.
A server that cannot start raises ``RuntimeError`` with the reason (its log), so a test
that depends on it fails saying why instead of being skipped.
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

START_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, log: str, what: str) -> None:
    """Poll ``url`` until it answers (any HTTP status) or ``proc`` exits; bounded."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} at start: {_tail(log)}")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{what} did not answer on {url} within {START_TIMEOUT:.0f} s: {_tail(log)}")


def _tail(path: str, n: int = 2000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:].strip() or "(empty log)"
    except OSError as e:
        return f"(no log: {e})"


class NginxServer:
    """nginx (Debian's ``nginx-light``) serving ``root`` on 127.0.0.1 with byte ranges and
    ETags (both on by default for static files).

    It runs as root with ``user root;`` so its worker can read pytest's 0700 tmp folders.
    """

    def __init__(self, root: str) -> None:
        exe = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/sbin/nginx") if os.path.exists(p)),
                                            None)
        if exe is None:
            raise RuntimeError("nginx is not installed (Debian: apt-get install nginx-light; "
                               "`make .venv/.loaderlib-test-deps` does it)")
        self.root = os.path.abspath(root)
        self.dir = tempfile.mkdtemp(prefix="ll-nginx-")
        self.port = free_port()
        log = os.path.join(self.dir, "error.log")
        temps = "\n".join(f"  {k}_temp_path {self.dir}/{k};" for k in
                          ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        conf = f"""
daemon off;
user root;
worker_processes 2;
pid {self.dir}/nginx.pid;
error_log {log} warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
{temps}
  sendfile on;
  keepalive_requests 100000;
  keepalive_timeout 60s;
  default_type application/octet-stream;
  server {{
    listen 127.0.0.1:{self.port};
    root {self.root};
  }}
}}
"""
        cfg = os.path.join(self.dir, "nginx.conf")
        with open(cfg, "w") as f:
            f.write(conf)
        with open(log, "ab") as err:
            self.proc = subprocess.Popen([exe, "-p", self.dir, "-e", log, "-c", cfg],
                                         stdout=subprocess.DEVNULL, stderr=err)
        self.url = f"http://127.0.0.1:{self.port}"
        _wait_http(self.url + "/", self.proc, log, "nginx")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class MotoServer:
    """moto's standalone S3 server (``moto[server]``) on 127.0.0.1.

    ``endpoint_url``, ``key`` and ``secret`` are what clients pass (moto accepts any
    credentials); ``client()`` returns a boto3 S3 client for setting buckets up.
    """

    key = "testing-key"
    secret = "testing-secret"
    region = "us-east-1"

    def __init__(self) -> None:
        try:
            import moto  # noqa: F401
        except ImportError as e:
            raise RuntimeError(f"moto is not installed ({e}): pip install \"moto[server]\" "
                               "(`make .venv/.loaderlib-test-deps` does it)") from e
        self.dir = tempfile.mkdtemp(prefix="ll-moto-")
        log = os.path.join(self.dir, "moto.log")
        self.port = free_port()
        with open(log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                          str(self.port)], stdout=out, stderr=subprocess.STDOUT)
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        _wait_http(self.endpoint_url + "/moto-api/", self.proc, log, "moto_server")

    @property
    def storage_options(self) -> dict:
        return {"endpoint_url": self.endpoint_url, "aws_access_key_id": self.key,
                "aws_secret_access_key": self.secret, "region_name": self.region}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, aws_access_key_id=self.key,
                            aws_secret_access_key=self.secret, region_name=self.region)

    def upload_folder(self, bucket: str, folder: str, prefix: str = "") -> None:
        c = self.client()
        try:
            c.create_bucket(Bucket=bucket)
        except c.exceptions.BucketAlreadyOwnedByYou:
            pass
        for dirpath, _, files in os.walk(folder):
            for name in files:
                full = os.path.join(dirpath, name)
                key = prefix + os.path.relpath(full, folder).replace(os.sep, "/")
                c.upload_file(full, bucket, key)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


# ------------------------------------------------------------------ fault-injecting proxy

@dataclass
class Fault:
    """One scripted fault, applied to the next request whose path contains ``match`` (and
    whose method is ``method``, when given, and that has a Range header or not, when ``ranged``
    says which).

    kind: ``"status"`` (answer ``status`` with a small body), ``"reset"`` (close the
    connection with RST before answering), ``"stall"`` (hold the request until the proxy is
    closed or ``release()`` is called, never answering), ``"truncate"`` (send the upstream's
    headers, then only ``keep`` bytes of the body and close), ``"short"`` (a well-formed
    response whose body is only the first ``keep`` bytes, Content-Length saying so, other
    headers, Content-Range included, as the upstream sent them: a body shorter than asked
    that the HTTP layer cannot see).
    ``times``: how many matching requests it applies to.
    """

    kind: str
    status: int = 503
    match: str = ""
    method: str = ""
    ranged: bool | None = None
    times: int = 1
    keep: int = 0
    headers: dict = field(default_factory=dict)


class FaultProxy:
    """A small HTTP proxy in front of ``upstream`` that injects scripted faults.

    Requests are forwarded as they are (method, path, headers, body); ``faults`` is a queue
    consumed in order by matching requests. ``requests`` records (method, path, range) of
    every request seen, faulted or not, so tests can count retries without reading clocks.
    """

    def __init__(self, upstream: str) -> None:
        assert upstream.startswith("http://")
        host, _, port = upstream[len("http://"):].rstrip("/").partition(":")
        self.upstream = (host, int(port or 80))
        self.faults: deque[Fault] = deque()
        self.requests: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()
        self.released = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy.lock:
                    proxy.requests.append((self.command, self.path, self.headers.get("Range")))
                    fault = proxy._take(self.command, self.path, self.headers.get("Range") is not None)
                if fault is not None and fault.kind == "status":
                    payload = f"injected {fault.status}".encode()
                    self.send_response(fault.status)
                    for k, v in fault.headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                    return
                if fault is not None and fault.kind == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault is not None and fault.kind == "stall":
                    proxy.released.wait(120)
                    self.close_connection = True
                    return
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(k, v)
                if fault is not None and fault.kind == "short":
                    data = data[:fault.keep]
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if fault is not None and fault.kind == "truncate":
                    if self.command != "HEAD":
                        self.wfile.write(data[:fault.keep])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="fault-proxy", daemon=True)
        self.thread.start()

    def _take(self, method: str, path: str, ranged: bool) -> Fault | None:
        for f in self.faults:
            if f.match in path and f.method in ("", method) and f.ranged in (None, ranged):
                f.times -= 1
                if f.times <= 0:
                    self.faults.remove(f)
                return f
        return None

    def add(self, kind: str, **kw) -> Fault:
        f = Fault(kind, **kw)
        with self.lock:
            self.faults.append(f)
        return f

    def count(self, match: str = "", method: str = "GET") -> int:
        with self.lock:
            return sum(1 for m, p, _ in self.requests if m == method and match in p)

    def reset(self) -> None:
        with self.lock:
            self.faults.clear()
            self.requests.clear()

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
