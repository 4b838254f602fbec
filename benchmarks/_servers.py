"""Servers for the remote-storage tests and benchmarks: nginx serving a folder, moto's
standalone S3 server, a fault-injecting HTTP proxy, and the two ways the storage benchmark adds
network latency (a network namespace whose veth links ``tc netem`` delays, or a proxy that holds
each request for a round trip).

Each server is started on 127.0.0.1 (or in a namespace, for the benchmark) by the code that
needs it and stopped by ``close()``. A server that cannot start raises ``RuntimeError`` with
the reason (its log), so a test that depends on it fails saying why instead of being skipped.
The tests import it as ``benchmarks._servers``, the benchmarks as ``_servers`` (CONTRIBUTING.md
says why it lives here).
"""

from __future__ import annotations

import asyncio
import http.client
import os
import random
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


def _stop(proc: subprocess.Popen, folder: str) -> None:
    """Stop a server process (terminate, then kill after 10 s) and remove its working folder."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    shutil.rmtree(folder, ignore_errors=True)


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
    ``host`` is the address it listens on, ``reach`` the one its ``url`` names (``host`` when
    not given), and ``prefix`` a command it runs under (the benchmark's ``ip netns exec NAME``).
    ``limit_rate`` (nginx's syntax, e.g. ``"25m"``: bytes/s) caps each connection's rate, as a
    store's per-connection bandwidth does.
    """

    def __init__(self, root: str, host: str = "127.0.0.1", prefix: tuple[str, ...] = (),
                 reach: str | None = None, limit_rate: str | None = None) -> None:
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
    listen {host}:{self.port};
    root {self.root};{f'''
    limit_rate {limit_rate};''' if limit_rate else ''}
  }}
}}
"""
        cfg = os.path.join(self.dir, "nginx.conf")
        with open(cfg, "w") as f:
            f.write(conf)
        with open(log, "ab") as err:
            self.proc = subprocess.Popen([*prefix, exe, "-p", self.dir, "-e", log, "-c", cfg],
                                         stdout=subprocess.DEVNULL, stderr=err)
        self.url = f"http://{reach or host}:{self.port}"
        _wait_http(self.url + "/", self.proc, log, "nginx")

    def close(self) -> None:
        _stop(self.proc, self.dir)


class MotoServer:
    """moto's standalone S3 server (``moto[server]``) on 127.0.0.1.

    ``endpoint_url``, ``key`` and ``secret`` are what clients pass (moto accepts any
    credentials); ``client()`` returns a boto3 S3 client for setting buckets up. ``host``,
    ``prefix`` and ``reach`` as for :class:`NginxServer`.
    """

    key = "testing-key"
    secret = "testing-secret"
    region = "us-east-1"

    def __init__(self, host: str = "127.0.0.1", prefix: tuple[str, ...] = (), reach: str | None = None) -> None:
        try:
            import moto  # noqa: F401
        except ImportError as e:
            raise RuntimeError(f"moto is not installed ({e}): pip install \"moto[server]\" "
                               "(`make .venv/.loaderlib-test-deps` does it)") from e
        self.dir = tempfile.mkdtemp(prefix="ll-moto-")
        log = os.path.join(self.dir, "moto.log")
        self.port = free_port()
        with open(log, "ab") as out:
            self.proc = subprocess.Popen([*prefix, sys.executable, "-m", "moto.server", "-H", host, "-p",
                                          str(self.port)], stdout=out, stderr=subprocess.STDOUT)
        self.endpoint_url = f"http://{reach or host}:{self.port}"
        _wait_http(self.endpoint_url + "/moto-api/", self.proc, log, "moto_server")

    @property
    def storage_options(self) -> dict:
        return {"endpoint_url": self.endpoint_url, "aws_access_key_id": self.key,
                "aws_secret_access_key": self.secret, "region_name": self.region}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, aws_access_key_id=self.key,
                            aws_secret_access_key=self.secret, region_name=self.region)

    def upload_folder(self, bucket: str, folder: str, prefix: str = "", acl: str | None = None) -> None:
        """Put every file under ``folder`` into ``bucket`` (created if missing) at ``prefix`` +
        its relative path; ``acl="public-read"`` lets unsigned requests read them (the GCS
        tests reach moto through obstore's GCS client, which sends no AWS signature)."""
        c = self.client()
        try:
            c.create_bucket(Bucket=bucket, **({"ACL": acl} if acl else {}))
        except c.exceptions.BucketAlreadyOwnedByYou:
            pass
        extra = {"ExtraArgs": {"ACL": acl}} if acl else {}
        for dirpath, _, files in os.walk(folder):
            for name in files:
                full = os.path.join(dirpath, name)
                key = prefix + os.path.relpath(full, folder).replace(os.sep, "/")
                c.upload_file(full, bucket, key, **extra)

    def close(self) -> None:
        _stop(self.proc, self.dir)


# ------------------------------------------------------------------ fault-injecting proxy

@dataclass
class Fault:
    """One scripted fault, applied to the next request whose path contains ``match`` (and
    whose method is ``method``, when given, and that has a Range header or not, when ``ranged``
    says which, and whose Range header starts with ``range``, when given: ``"bytes=1000-"``).

    kind: ``"status"`` (answer ``status`` with a small body), ``"reset"`` (close the
    connection with RST before answering), ``"stall"`` (hold the request until the proxy is
    closed or ``released`` is set, never answering), ``"hold"`` (hold it until then, and
    then forward it: a gate; ``held`` counts the requests it held), ``"truncate"`` (send the upstream's
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
    range: str | None = None
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
        self.lock = threading.Condition()   # guards faults and requests; notified on every request
        self.released = threading.Event()
        self.held = 0
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
                    proxy.lock.notify_all()
                    fault = proxy._take(self.command, self.path, self.headers.get("Range"))
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
                if fault is not None and fault.kind == "hold":
                    with proxy.lock:
                        proxy.held += 1
                        proxy.lock.notify_all()
                    proxy.released.wait(120)
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

    def _take(self, method: str, path: str, rng: str | None) -> Fault | None:
        for f in self.faults:
            if (f.match in path and f.method in ("", method) and f.ranged in (None, rng is not None)
                    and (f.range is None or (rng or "").startswith(f.range))):
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
            return self._count(match, method)

    def _count(self, match: str, method: str) -> int:
        return sum(1 for m, p, _ in self.requests if m == method and match in p)

    def wait_for(self, match: str = "", method: str = "GET", n: int = 1, timeout: float = 30.0) -> int:
        """Block until at least ``n`` matching requests have arrived (or ``timeout`` seconds, a
        bound, not a measurement); returns the count then."""
        with self.lock:
            self.lock.wait_for(lambda: self._count(match, method) >= n, timeout)
            return self._count(match, method)

    def reset(self) -> None:
        with self.lock:
            self.faults.clear()
            self.requests.clear()

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


# ------------------------------------------------------------------ added latency (benchmarks)

def _run(cmd: list[str]) -> None:
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {(out.stderr or out.stdout).strip() or f'exit {out.returncode}'}")


class NetemNetwork:
    """A network namespace joined to this one by one veth pair per round trip, each pair's two
    ends delayed by ``tc netem`` (half the round trip each way, so a packet and its answer pay
    it once), with uniform jitter of ``rtt x jitter`` per packet, packet order kept
    (``rate 10gbit``: netem then never sends a packet before the one queued ahead of it).

    Servers started with ``prefix`` run in the namespace and listen on ``0.0.0.0``;
    ``host(rtt)`` is the address that reaches them through the link of that round trip.
    Needs root and ``ip``/``tc`` (iproute2) and the kernel's ``sch_netem``; a step that fails
    raises ``RuntimeError`` with its command and message, after undoing the others.
    """

    def __init__(self, rtts_ms: list[float], jitter: float = 0.0) -> None:
        pid = os.getpid()
        self.name = f"llnet{pid}"
        self.prefix = ("ip", "netns", "exec", self.name)
        self.commands: list[str] = []
        self._hosts: dict[float, str] = {}
        third = pid % 250
        _run(["ip", "netns", "add", self.name])
        try:
            _run([*self.prefix, "ip", "link", "set", "lo", "up"])
            for k, rtt in enumerate(rtts_ms):
                outer, inner = f"llv{pid}o{k}", f"llv{pid}i{k}"
                near, far = f"10.213.{third}.{4 * k + 1}", f"10.213.{third}.{4 * k + 2}"
                half, spread = rtt / 2, rtt / 2 * jitter
                netem = ["netem", "delay", f"{half:g}ms"] + ([f"{spread:g}ms"] if spread > 0 else [])
                netem += ["rate", "10gbit", "limit", "100000"]
                _run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", self.name])
                _run(["ip", "addr", "add", f"{near}/30", "dev", outer])
                _run(["ip", "link", "set", outer, "up"])
                _run([*self.prefix, "ip", "addr", "add", f"{far}/30", "dev", inner])
                _run([*self.prefix, "ip", "link", "set", inner, "up"])
                _run(["tc", "qdisc", "add", "dev", outer, "root", *netem])
                _run([*self.prefix, "tc", "qdisc", "add", "dev", inner, "root", *netem])
                self.commands.append(f"tc qdisc add dev <veth end> root {' '.join(netem)}  (both ends; {rtt:g} ms)")
                self._hosts[rtt] = far
        except BaseException:
            self.close()
            raise

    def host(self, rtt_ms: float) -> str:
        """The servers' address through the link that adds ``rtt_ms``."""
        return self._hosts[rtt_ms]

    def close(self) -> None:
        """Delete the namespace (and so its veth pairs); stop the servers in it first."""
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)


class DelayProxy:
    """An HTTP/1.1 proxy on 127.0.0.1 in front of ``upstream`` that holds every request for one
    round trip, ``rtt_ms x uniform[1 - jitter, 1 + jitter]``, before forwarding it: each
    request pays the delay once, whatever its size; opening a connection pays nothing (a real
    network charges it a round trip too, once per pooled connection), and the bytes flow at
    loopback speed (no bandwidth-delay limit). The stand-in for :class:`NetemNetwork` where
    namespaces or netem are unavailable.

    asyncio on a thread of its own: many connections at once, each kept alive with one upstream
    connection of its own; bodies are relayed as they arrive (Content-Length, chunked, or until
    the upstream closes). ``arrived`` counts the requests received and ``requests`` those
    forwarded (once their delay has passed), so ``arrived - requests`` are held here now.
    """

    def __init__(self, upstream: str, rtt_ms: float, jitter: float = 0.0, seed: int = 0) -> None:
        assert upstream.startswith("http://")
        host, _, port = upstream[len("http://"):].rstrip("/").partition(":")
        self.upstream = (host, int(port or 80))
        self.rtt = rtt_ms / 1000.0
        self.jitter = jitter
        self.requests = 0
        self.arrived = 0
        self._rng = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._server = None

        async def start():
            self._server = await asyncio.start_server(self._client, "127.0.0.1", 0, backlog=1024)
            ready.set()

        def run():
            self._loop.run_until_complete(start())
            self._loop.run_forever()

        self.thread = threading.Thread(target=run, name="delay-proxy", daemon=True)
        self.thread.start()
        if not ready.wait(START_TIMEOUT):
            raise RuntimeError("the delay proxy did not start")
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def _delay(self) -> float:
        return self.rtt * self._rng.uniform(1 - self.jitter, 1 + self.jitter)

    @staticmethod
    def _headers(head: bytes) -> dict[str, str]:
        out = {}
        for line in head.split(b"\r\n")[1:]:
            name, sep, value = line.partition(b":")
            if sep:
                out[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        return out

    @staticmethod
    async def _relay(reader, writer, n: int) -> None:
        while n > 0:
            chunk = await reader.read(min(n, 1 << 18))
            if not chunk:
                raise ConnectionError("upstream closed inside a body")
            writer.write(chunk)
            n -= len(chunk)
            await writer.drain()

    async def _relay_chunked(self, reader, writer) -> None:
        while True:
            line = await reader.readuntil(b"\r\n")
            writer.write(line)
            size = int(line.split(b";")[0].strip(), 16)
            if size == 0:
                while True:                       # trailers, up to the empty line
                    line = await reader.readuntil(b"\r\n")
                    writer.write(line)
                    if line == b"\r\n":
                        await writer.drain()
                        return
            await self._relay(reader, writer, size + 2)

    async def _client(self, reader, writer) -> None:
        up_r = up_w = None
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                req = self._headers(head)
                if "chunked" in req.get("transfer-encoding", "").lower():
                    return                        # not needed by the benchmark's clients
                body = await reader.readexactly(int(req.get("content-length") or 0))
                self.arrived += 1
                await asyncio.sleep(self._delay())
                if up_w is None:
                    up_r, up_w = await asyncio.open_connection(*self.upstream)
                up_w.write(head + body)
                await up_w.drain()
                self.requests += 1
                resp_head = await up_r.readuntil(b"\r\n\r\n")
                writer.write(resp_head)
                status = int(resp_head.split(b" ", 2)[1])
                resp = self._headers(resp_head)
                if head.startswith(b"HEAD ") or status in (204, 304) or 100 <= status < 200:
                    pass
                elif "content-length" in resp:
                    await self._relay(up_r, writer, int(resp["content-length"]))
                elif "chunked" in resp.get("transfer-encoding", "").lower():
                    await self._relay_chunked(up_r, writer)
                else:                             # delimited by the upstream closing
                    while chunk := await up_r.read(1 << 18):
                        writer.write(chunk)
                        await writer.drain()
                    return
                await writer.drain()
                if "close" in (req.get("connection", "") + resp.get("connection", "")).lower():
                    return
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            return
        except asyncio.CancelledError:
            # close() cancels the connections: end quietly (asyncio's stream callback would
            # print the cancellation of every open connection as an error).
            return
        finally:
            for w in (writer, up_w):
                if w is not None:
                    w.close()

    def close(self) -> None:
        async def stop():
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self.thread.join(10)
        self._loop.close()
