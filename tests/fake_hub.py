"""A Hugging Face Hub on 127.0.0.1 for tests: the HTTP endpoints ``huggingface_hub`` uses to read a model
repo at a revision (``/api/models/<repo>/revision/<rev>`` with file metadata, and ``/<repo>/resolve/<rev>/<file>``
with the commit, ETag and size headers), and a dataset repo the same way (``/api/datasets/<repo>/revision/<rev>``,
``/datasets/<repo>/resolve/<rev>/<file>``), serving files made in the test. Processes reach it through
``HF_ENDPOINT`` (read by huggingface_hub at import). Every request is recorded, so a test can tell who
went to the Hub and when; ``tamper`` serves other bytes than the metadata announces (a corrupt download),
``token`` makes every request without that bearer token a 401.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

LFS = (".safetensors", ".bin")


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


@dataclass
class Repo:
    sha: str  # the commit every revision resolves to
    files: dict[str, bytes]
    tamper: dict[str, bytes] = field(default_factory=dict)

    def sibling(self, rel: str) -> dict:
        data = self.files[rel]
        out = {"rfilename": rel, "size": len(data), "blobId": git_sha1(data)}
        if rel.endswith(LFS):
            out["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
        return out


class FakeHub:
    def __init__(self, repos: dict[str, Repo], token: str | None = None, datasets: dict[str, Repo] | None = None):
        self.repos, self.token, self.datasets = repos, token, datasets or {}
        self.requests: list[tuple[str, str]] = []  # (method, path)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "FakeHub":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def env(self) -> dict[str, str | None]:
        """A process's environment for this Hub: its endpoint, and neither of huggingface_hub's offline
        switches (HF_HUB_OFFLINE, or TRANSFORMERS_OFFLINE, which it honours too) that the tests set."""
        return {"HF_ENDPOINT": self.url, "HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None}

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _error(self, code: int, kind: str, head: bool):
                self._send(code, json.dumps({"error": kind}).encode(),
                           {"Content-Type": "application/json", "X-Error-Code": kind}, head)

            def _serve(self, head: bool):
                path = unquote(urlsplit(self.path).path)
                hub.requests.append(("HEAD" if head else "GET", path))
                if hub.token and self.headers.get("authorization") != f"Bearer {hub.token}":
                    return self._error(401, "GatedRepo", head)
                kind = "datasets" if path.startswith(("/api/datasets/", "/datasets/")) else "models"
                repos = hub.datasets if kind == "datasets" else hub.repos
                if path.startswith(f"/api/{kind}/"):
                    repo_id, _, rev = path[len(f"/api/{kind}/"):].partition("/revision/")
                    repo = repos.get(repo_id)
                    if repo is None:
                        return self._error(404, "RepoNotFound", head)
                    if rev not in (repo.sha, "main"):
                        return self._error(404, "RevisionNotFound", head)
                    info = {"id": repo_id, "modelId": repo_id, "sha": repo.sha, "private": False,
                            "siblings": [repo.sibling(r) for r in sorted(repo.files)]}
                    return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, head)
                for repo_id, repo in repos.items():
                    prefix = f"/datasets/{repo_id}/resolve/" if kind == "datasets" else f"/{repo_id}/resolve/"
                    if path.startswith(prefix):
                        rev, _, rel = path[len(prefix):].partition("/")
                        if rev not in (repo.sha, "main"):
                            return self._error(404, "RevisionNotFound", head)
                        if rel not in repo.files:
                            return self._error(404, "EntryNotFound", head)
                        s = repo.sibling(rel)
                        etag = s["lfs"]["sha256"] if "lfs" in s else s["blobId"]
                        headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{etag}"'}
                        if "lfs" in s:
                            headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(s["size"])})
                        return self._send(200, repo.tamper.get(rel, repo.files[rel]), headers, head)
                return self._error(404, "RepoNotFound", head)

            def do_GET(self):
                self._serve(head=False)

            def do_HEAD(self):
                self._serve(head=True)

        return Handler


def point_this_process(hub: FakeHub, monkeypatch, cache: str) -> None:
    """This process's huggingface_hub pointed at ``hub`` (its endpoint and cache are read at import), online, with no
    token; undone with ``monkeypatch`` (and :func:`huggingface_hub.utils._http.reset_sessions`)."""
    import huggingface_hub.constants as hc
    import huggingface_hub.file_download as fd
    from huggingface_hub.utils._http import reset_sessions

    template = hub.url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(hc, "ENDPOINT", hub.url)
    monkeypatch.setattr(hc, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(fd, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(hc, "HF_HUB_CACHE", cache)
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
    reset_sessions()  # a session made while offline (other tests set TRANSFORMERS_OFFLINE) refuses every call
    monkeypatch.delenv("HF_TOKEN", raising=False)
