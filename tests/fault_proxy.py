"""A fault-injecting HTTP proxy for tests, in front of a GCS endpoint (fake-gcs-server).

Every request gets one fate: by its number (``schedule={n: fate}``, ``every={fate: n}``: every n-th
request, so that the retry of a failed request, the next one, goes through), else drawn from a seeded
RNG with the ``p*`` rates (a run is reproducible):

- ``503``: answered ``503 Service Unavailable`` at once (never forwarded);
- ``drop``: forwarded (it reaches the server and takes effect), then the client's connection is
  closed without an answer;
- ``cut``: an upload (a request with a body) is forwarded with only half of its body, then both
  connections are closed: the server sees a write cut off mid-object;
- ``stall``: the ``stall_at``-th request waits ``stall_s`` seconds before it is forwarded (once);
- ``ok``: forwarded.

Upstream URLs in answers (``Location`` of resumable uploads, links in JSON) are rewritten to the
proxy's, so every later request of a client also goes through it. ``counts`` has every fate's count.
"""

from __future__ import annotations

import http.client
import random
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
       "content-length", "host"}


class FaultProxy:
    def __init__(self, upstream: str, *, p503: float = 0.0, pdrop: float = 0.0, pcut: float = 0.0,
                 stall_at: int | None = None, stall_s: float = 0.0, seed: int = 0, max_cuts: int | None = None,
                 on_cut=None, schedule: dict[int, str] | None = None, every: dict[str, int] | None = None):
        self.upstream = upstream.rstrip("/")
        self.p503, self.pdrop, self.pcut = p503, pdrop, pcut
        self.stall_at, self.stall_s = stall_at, stall_s
        self.max_cuts, self.on_cut = max_cuts, on_cut  # on_cut(path): called once the cut request is closed
        self.rng = random.Random(seed)
        self.schedule, self.every = dict(schedule or {}), dict(every or {})
        self.lock = threading.Lock()
        self.counts: Counter = Counter()
        self.requests = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _handle(self):
                body = self._body()
                fate = proxy._fate(bool(body))
                if fate == "503":
                    self.send_response(503)
                    self.send_header("Content-Type", "application/json")
                    msg = b'{"error": {"code": 503, "message": "injected by fault_proxy"}}'
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                if fate == "stall":
                    time.sleep(proxy.stall_s)
                up = urlsplit(proxy.upstream)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
                if fate == "cut":
                    with socket.create_connection((up.hostname, up.port)) as s:
                        head = [f"{self.command} {self.path} HTTP/1.1", f"Host: {up.netloc}",
                                f"Content-Length: {len(body)}", "Connection: close",
                                *(f"{k}: {v}" for k, v in headers.items())]
                        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body[: len(body) // 2])
                    if proxy.on_cut is not None:
                        proxy.on_cut(self.path)
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                conn = http.client.HTTPConnection(up.hostname, up.port, timeout=300)
                try:
                    conn.request(self.command, self.path, body=body if body or self.command in ("POST", "PUT")
                                 else None, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    rh = resp.getheaders()
                    status = resp.status
                finally:
                    conn.close()
                if fate == "drop":  # the server did it; the client never hears
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                data = data.replace(proxy.upstream.encode(), proxy.url.encode())
                data = data.replace(up.netloc.encode(), urlsplit(proxy.url).netloc.encode())
                self.send_response(status)
                for k, v in rh:
                    if k.lower() in HOP:
                        continue
                    self.send_header(k, v.replace(proxy.upstream, proxy.url).replace(up.netloc, urlsplit(proxy.url).netloc))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _fate(self, has_body: bool) -> str:
        with self.lock:
            self.requests += 1
            x = self.rng.random()
            n = self.requests
            by_number = self.schedule.get(n) or next((f for f, k in self.every.items() if n % k == 0), None)
            if by_number == "cut" and not has_body:
                by_number = "drop"
            if self.stall_at is not None and n == self.stall_at:
                fate = "stall"
            elif by_number:
                fate = by_number
            elif x < self.p503:
                fate = "503"
            elif x < self.p503 + self.pdrop:
                fate = "drop"
            elif (has_body and x < self.p503 + self.pdrop + self.pcut
                  and (self.max_cuts is None or self.counts["cut"] < self.max_cuts)):
                fate = "cut"
            else:
                fate = "ok"
            self.counts[fate] += 1
            return fate

    def start(self) -> "FaultProxy":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
