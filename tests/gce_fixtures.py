"""A stand-in GCE metadata server, one per emulated TPU VM (and one for the head), on 127.0.0.1.

It answers as ``metadata.google.internal`` does for what Ray, JAX, Levanter and trajsft read: 403 without the
``Metadata-Flavor: Google`` header, 404 for an unknown key, the header ``Metadata-Flavor: Google`` on every
answer. A process reaches it as the real one: ``http://metadata.google.internal/computeMetadata/v1/...``
through ``http_proxy=http://127.0.0.1:<port>`` (``requests`` sends the absolute URL to the proxy), with
loopback in ``no_proxy`` so the cluster's own loopback services are reached directly. See
:func:`proxy_env`.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

V1 = "/computeMetadata/v1/"


def tpu_attributes(slice_name: str, tpu_type: str, worker: int, hosts: list[str], topology: str) -> dict[str, str]:
    """``instance/attributes/*`` of one host of a TPU slice, as a TPU VM's metadata server gives them."""
    return {
        "agent-worker-number": str(worker),
        "instance-id": slice_name,
        "accelerator-type": tpu_type,
        "worker-network-endpoints": ",".join(f"{i}:{slice_name}-w-{i}:{h}" for i, h in enumerate(hosts)),
        "tpu-env": f"ACCELERATOR_TYPE: '{tpu_type}'\nTOPOLOGY: '{topology}'\nWORKER_ID: '{worker}'\n",
    }


class MetadataServer:
    """One VM's metadata: ``attributes`` (instance/attributes/*), its zone and project, the preempted flag.
    Change them while it runs (``preempted = True``); ``requests`` counts what was asked."""

    def __init__(self, attributes: dict[str, str] | None = None, zone: str = "us-east5-a",
                 project: str = "trajsft-test", project_number: int = 123456789):
        self.attributes = dict(attributes or {})
        self.zone = zone
        self.project = project
        self.project_number = project_number
        self.preempted = False
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                path = urlparse(self.path).path  # an absolute URL when reached as a proxy
                server.requests.append(path)
                if self.headers.get("Metadata-Flavor") != "Google":
                    code, body = 403, "Missing Metadata-Flavor:Google header."
                else:
                    body = server.answer(path)
                    code = 404 if body is None else 200
                    body = "not found" if body is None else body
                data = body.encode()
                self.send_response(code)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", "application/text")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=f"gce-metadata-{self.port}",
                                        daemon=True)
        self._thread.start()

    def answer(self, path: str) -> str | None:
        if not path.startswith(V1):
            return None
        key = path[len(V1):]
        if key.startswith("instance/attributes/"):
            return self.attributes.get(key[len("instance/attributes/"):])
        return {"instance/zone": f"projects/{self.project_number}/zones/{self.zone}",
                "project/project-id": self.project,
                "instance/preempted": "TRUE" if self.preempted else "FALSE"}.get(key)

    def proxy_env(self) -> dict[str, str]:
        """What a process of this VM needs to reach this server as metadata.google.internal."""
        return proxy_env(self.port)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def proxy_env(port: int) -> dict[str, str]:
    """The proxy variables, and TRAJSFT_GCE=1: an emulated VM is a GCE VM (trajsft.gce.may_be_gce), so trajsft asks
    its metadata server as it would on a real one."""
    no_proxy = "127.0.0.1,localhost,::1"
    return {"http_proxy": f"http://127.0.0.1:{port}", "HTTP_PROXY": f"http://127.0.0.1:{port}",
            "no_proxy": no_proxy, "NO_PROXY": no_proxy, "TRAJSFT_GCE": "1"}


class CountingProxy:
    """An HTTP proxy on loopback that forwards nothing: it records each request it is sent (``GET <absolute URL>``,
    or ``CONNECT host:port``) and answers 404 (a CONNECT: 403). ``env()``: a process's variables that send every
    non-loopback plain-HTTP request through it."""

    def __init__(self):
        self.requests: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _record(self, code: int) -> None:
                proxy.requests.append(f"{self.command} {self.path}")
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_CONNECT(self):
                self._record(403)

            do_GET = do_HEAD = do_POST = do_PUT = lambda self: self._record(404)  # noqa: E731

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def env(self) -> dict[str, str]:
        """Plain HTTP through the proxy (the metadata server's scheme); HTTPS goes its own way."""
        url = f"http://127.0.0.1:{self.port}"
        no_proxy = "127.0.0.1,localhost,::1"
        return {"http_proxy": url, "HTTP_PROXY": url, "no_proxy": no_proxy, "NO_PROXY": no_proxy}

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
