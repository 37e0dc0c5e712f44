"""Preflight asks the head's Ray version first, and a dead address gets the command that opens the tunnel.
The stand-in head is a real HTTP server on loopback that answers only /api/version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from trajsft.cluster import preflight as P, submit

REPO = Path(__file__).resolve().parents[1]


class StandInHead:
    """Answers ``GET /api/version`` with ``ray_version``; 404 for anything else; records every path asked."""

    def __init__(self, ray_version: str | None, hostnames: list[str] | None = None):
        self.asked: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.asked.append(self.path)
                if self.path == "/api/version":
                    body = json.dumps({"version": "4", "session_name": "s", **(
                        {"ray_version": ray_version} if ray_version else {})}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                elif self.path == "/nodes?view=hostNameList" and hostnames is not None:  # as Ray's dashboard
                    body = json.dumps({"result": True, "msg": "Node hostname list fetched.",
                                       "data": {"hostNameList": hostnames}}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                else:
                    body = b"not found"
                    self.send_response(404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def old_head():
    h = StandInHead("2.30.0")
    yield h
    h.stop()


def test_the_heads_ray_version_outside_the_lock_minor_is_one_line():
    assert P.ray_version_problem("2.60.3", "http://h:8265", ours="2.60.0") is None
    line = P.ray_version_problem("2.30.0", "http://h:8265", ours="2.60.0")
    assert line == ("Ray 2.30.0 on http://h:8265, but this project runs Ray 2.60.x (the lock's 2.60.0): use a cluster "
                    "whose image has Ray 2.60, nothing was submitted")
    assert "did not say its version" in P.ray_version_problem(None, "http://h:8265", ours="2.60.0")
    assert P.our_ray_version() == "2.60.0"


def test_preflight_asks_the_version_first_and_nothing_else_of_an_old_head(old_head, tmp_path):
    probs = P.preflight(old_head.address, [], {"TPU-v5p-32-head": 1}, str(tmp_path / "store"), timeout_s=3)
    assert probs == [f"Ray 2.30.0 on {old_head.address}, but this project runs Ray 2.60.x (the lock's 2.60.0): use a "
                     f"cluster whose image has Ray 2.60, nothing was submitted"]
    assert old_head.asked == ["/api/version"]  # not the nodes or the cluster status it does not have


def _profile(tmp_path: Path, address: str, **ray) -> Path:
    prof = tmp_path / "profile"
    prof.mkdir()
    cluster = yaml.safe_load((REPO / "profiles/tpu-east5/cluster.yaml").read_text())
    cluster["storage_root"] = str(tmp_path / "store")
    cluster["ray"].update(address=address, **ray)
    (prof / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    (prof / "config.yaml").write_text(yaml.safe_dump({"configfiles": [str(prof / "cluster.yaml")]}))
    return prof


def _preflight_cli(prof: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(prof.parent), "HF_TOKEN": "x", "WANDB_API_KEY": "y" * 40,
           "RAY_AUTH_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "trajsft.cli", "preflight", "--profile", str(prof)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)


def test_trajsft_preflight_refuses_a_head_on_ray_2_30_in_one_line(old_head, tmp_path):
    p = _preflight_cli(_profile(tmp_path, old_head.address))
    assert p.returncode == 1, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines == [f"trajsft preflight: Ray 2.30.0 on {old_head.address}, but this project runs Ray 2.60.x (the "
                     f"lock's 2.60.0): use a cluster whose image has Ray 2.60, nothing was submitted"], p.stderr
    assert "Traceback" not in p.stderr + p.stdout


def test_a_dead_address_gets_the_command_that_opens_the_tunnel(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    t0 = time.monotonic()
    p = _preflight_cli(_profile(tmp_path, dead, cluster_config="infra/marin-us-east5-a.yaml"))
    assert p.returncode == 1 and time.monotonic() - t0 < 60
    [line] = [ln for ln in p.stderr.splitlines() if ln.strip()]
    port = dead.rsplit(":", 1)[1]
    assert line.startswith(f"trajsft preflight: unreachable: Ray dashboard {dead} unreachable")
    assert line.endswith(f"; open the tunnel to the head first: ray dashboard --port {port} infra/marin-us-east5-a.yaml")
    # the profiles name their cluster's yaml; without one the hint says where to set it
    assert submit.tunnel_hint({"address": "http://127.0.0.1:8265", "cluster_config": "infra/marin-us-east5-a.yaml"}) \
        == "open the tunnel to the head first: ray dashboard infra/marin-us-east5-a.yaml"
    assert "set ray.cluster_config" in submit.tunnel_hint({"address": "http://127.0.0.1:8266"})
    assert "--port 8266" in submit.tunnel_hint({"address": "http://127.0.0.1:8266"})
    for name in ("tpu-east5", "tpu-central1"):
        ray = yaml.safe_load((REPO / f"profiles/{name}/cluster.yaml").read_text())["ray"]
        assert ray["cluster_config"].startswith("infra/marin-us-"), name


def test_a_local_head_is_one_whose_nodes_say_they_are_here():
    """A tunnel to a remote head is 127.0.0.1 too: the cluster's own node hostnames decide."""
    import socket

    here = socket.gethostname()
    remote = StandInHead("2.60.0", hostnames=["t1v-n-4a2b-w-0", "t1v-n-4a2b-w-1"])
    local = StandInHead("2.60.0", hostnames=[here])
    mixed = StandInHead("2.60.0", hostnames=[here, "t1v-n-4a2b-w-0"])
    try:
        assert P.nodes_on_this_machine(remote.address) is False
        assert P.nodes_on_this_machine(local.address) is True
        assert P.nodes_on_this_machine(mixed.address) is False
        assert submit.on_this_machine(remote.address) is False and submit.on_this_machine(local.address) is True
        # a job is never handed a local path the remote nodes cannot read, whatever the address looks like
        with pytest.raises(Exception, match="is a local path the hosts of .* cannot read"):
            submit.refuse_foreign_paths({"storage_root": "results", "ray": {"address": remote.address,
                                                                             "tpu_type": "v5p-8"}},
                                        {"run_dir": str(Path("results/checkpoints/demo-1").resolve())})
    finally:
        for h in (remote, local, mixed):
            h.stop()
    # a head that does not answer: judged by its address (its being down is preflight's own line)
    assert P.nodes_on_this_machine("http://127.0.0.1:9") is None
    assert submit.on_this_machine("http://127.0.0.1:9") is True


class StandInJobsHead:
    """Ray 2.60's /api/version and the Jobs API of a head whose image runs ``python`` on a VM in ``zone``: a submitted
    job SUCCEEDS at once and its log is what the probe's entrypoint prints there."""

    def __init__(self, python: str, zone: str | None = None):
        self.posted: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _json(self, obj, code=200):
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                if self.path == "/api/version":
                    return self._json({"version": "4", "ray_version": "2.60.0", "session_name": "session_test_1"})
                if self.path.startswith("/api/jobs/") and self.path.endswith("/logs"):
                    said = {"python": python, "project": "p" if zone else None,
                            "zone": f"projects/1/zones/{zone}" if zone else None}
                    return self._json({"logs": f"some line\nTRAJSFT_PROBE {json.dumps(said)}\n"})
                if self.path.startswith("/api/jobs/"):
                    return self._json({"status": "SUCCEEDED", "submission_id": self.path.rsplit("/", 1)[1]})
                return self._json({}, 404)

            def do_POST(self):  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                outer.posted.append(json.loads(self.rfile.read(n)))
                return self._json({"submission_id": outer.posted[-1]["submission_id"], "job_id": None})

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_the_images_python_must_be_the_locks_minor(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert P.our_python() == "3.11"
    assert P.python_problem("3.11.9", "http://h") is None
    head = StandInJobsHead("3.10.12")
    try:
        store = str(tmp_path / "store")
        probs = P.preflight(head.address, [], {}, store, timeout_s=3, probe=True)
        assert probs == [f"Python 3.10.12 on the cluster at {head.address} (its image, as the driver and the hosts "
                         f"run it), but this project's lock is for Python 3.11: use an image with Python 3.11, "
                         f"nothing was submitted"]
        [job] = head.posted  # one probe, tagged so that status, clusters and the tests tell it from training
        assert job["metadata"] == {"trajsft_probe": "python"} and job["submission_id"].startswith("trajsft-probe-")
        assert "env_vars" not in job and "runtime_env" not in job  # the image's own Python, and no secret
        # once per head session: the next preflight asks nobody
        assert P.preflight(head.address, [], {}, store, timeout_s=3, probe=True) == probs
        assert len(head.posted) == 1
        # without the probe (the generic preflight), nothing is submitted
        assert P.preflight(head.address, [], {}, store, timeout_s=3) == [] and len(head.posted) == 1
    finally:
        head.server.shutdown()
        head.server.server_close()


def test_a_head_in_another_zone_is_refused_in_one_line_naming_both(tmp_path, monkeypatch):
    """Through a tunnel, 127.0.0.1:8265 may be another region's cluster: the probe asked the head's metadata server."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    central, unknown = StandInJobsHead("3.11.7", zone="us-central1-a"), StandInJobsHead("3.11.7")
    try:
        store = str(tmp_path / "store")
        assert P.preflight(central.address, [], {}, store, timeout_s=3, probe=True, zone="us-east5-a") == [
            f"the Ray head at {central.address} is in us-central1-a (its GCE metadata server), but this profile's "
            "cluster is in us-east5-a (ray.zone): is the tunnel open to another region's cluster? nothing was submitted"]
        # the same head for a profile of its zone, or of its region: nothing to say (the probe is not run again)
        assert P.preflight(central.address, [], {}, store, timeout_s=3, probe=True, zone="us-central1-a") == []
        assert P.preflight(central.address, [], {}, store, timeout_s=3, probe=True, zone="us-central1") == []
        assert len(central.posted) == 1
        # a head that says no zone (no metadata server): a note, not a refusal
        notes: list[str] = []
        assert P.preflight(unknown.address, [], {}, store, timeout_s=3, probe=True, zone="us-east5-a",
                           notes=notes) == []
        assert notes == [f"the Ray head at {unknown.address} did not say its zone (no GCE metadata server): "
                         "ray.zone us-east5-a was not checked"]
    finally:
        for h in (central, unknown):
            h.server.shutdown()
            h.server.server_close()


def test_the_probe_reads_the_zone_from_the_heads_metadata_server(tmp_path, monkeypatch):
    """The probe's own code, run by a Python whose http_proxy leads to a stand-in metadata server (as the head's
    job driver reaches its VM's)."""
    import base64
    import re
    import subprocess
    import sys

    from gce_fixtures import MetadataServer

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    head = StandInJobsHead("3.11.7")
    vm = MetadataServer(zone="us-east5-a", project="marin-x")
    try:
        conn = P.Conn(head.address, None)
        P.cluster_probe(conn, "s")  # what it submits
        code = re.search(r'b64decode\("([^"]+)"\)', head.posted[0]["entrypoint"]).group(1)
        out = subprocess.run([sys.executable, "-c", base64.b64decode(code).decode()], capture_output=True, text=True,
                             timeout=60, env={"PATH": os.environ.get("PATH", ""), **vm.proxy_env()})
        [line] = [ln for ln in out.stdout.splitlines() if ln.startswith("TRAJSFT_PROBE ")]
        said = json.loads(line.split(" ", 1)[1])
        assert said == {"python": sys.version.split()[0], "zone": "projects/123456789/zones/us-east5-a",
                        "project": "marin-x"}
    finally:
        vm.stop()
        head.server.shutdown()
        head.server.server_close()
