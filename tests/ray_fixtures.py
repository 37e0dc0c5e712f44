"""Real local Ray head for tests (importable by any test module).

Usage in a test module::

    from ray_fixtures import ray_head, ray_client_env  # noqa: F401  (fixtures)

    def test_x(ray_head):
        ray_head.address      # "http://127.0.0.1:<dashboard port>"
        ray_head.token        # auth token (None when started with auth="disabled")
        ray_head.client_env() # {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": ...}

``ray_head`` is module scoped: one ``ray start --head --block`` per test module
that asks for it, with custom resources ``{"TPU-v5p-32-head": 2, "TPU": 4}`` (two slice heads) by default,
token auth (``RAY_AUTH_MODE=token`` + a random ``RAY_AUTH_TOKEN`` in the head's
environment only; ``~/.ray/auth_token`` is never touched), a private short
``RAY_TMPDIR``/``--temp-dir`` (``/tmp/rt-XXXXXX``) and free non-default ports.
Teardown never uses ``ray stop``: it SIGTERMs the ``ray start --block`` process
(which shuts its children down), then SIGKILLs by PID whatever is left of the
process tree recorded before (plus stragglers carrying this head's unique
marker environment variable), and removes the temp dir.

Environment knobs: ``TRAJSFT_TEST_RAY_AUTH=token|disabled`` (default token).
Dashboard binds 127.0.0.1; Ray itself always advertises the machine's
non-loopback IP as node IP (``--node-ip-address=127.0.0.1`` is rewritten by
Ray), which is harmless here.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import requests

DEFAULT_RESOURCES = {"TPU-v5p-32-head": 2, "TPU": 4}  # two v5p-32 slice heads
MARKER_ENV = "TRAJSFT_TEST_RAY_HEAD"
# The test head stands in for a TPU slice head on a machine with no TPU and no internet:
# jobs may train on CPU and W&B logs offline (see trajsft.cluster.entrypoint).
# Ray's memory monitor is off on every test node (RAY_memory_monitor_refresh_ms=0): it kills a worker when the
# *machine's* real usage passes RAY_memory_usage_threshold (0.95), whatever --memory a node declares, and here
# every emulated VM shares one machine with other jobs: a loaded machine had it kill a job supervisor, failing
# a test whose own usage was a few GiB. The kernel's OOM killer still guards the machine.
# The GCS checks every node each second instead of every 3 s (RAY_health_check_period_ms; 5 failures in a row
# still mark it dead, and each check may take Ray's default 10 s to answer): a SIGKILLed host refuses the
# check at once, so a preemption is seen in ~5 s instead of ~15 s; a slow but live node is not declared dead.
# Each node's log monitor lists its log directory every 0.5 s, not on each 0.1 s pass
# (RAY_LOG_MONITOR_MANY_FILES_THRESHOLD=0: Ray's own setting for nodes with many log files): an idle 5-node
# cluster's log monitors took 4.6 CPU-s a minute in all instead of 8; a new worker's first lines reach the job's
# log up to 0.5 s later.
TEST_HEAD_ENV = {"TRAJSFT_ALLOW_CPU_TRAINING": "1", "WANDB_MODE": "offline", "JAX_PLATFORMS": "cpu",
                 "HF_HUB_OFFLINE": "1", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "RAY_memory_monitor_refresh_ms": "0",
                 "RAY_health_check_period_ms": "1000", "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0"}
# Never let these reach the head (tests check the job gets them only via our
# secret channel).
_SCRUB_ENV = ("HF_TOKEN", "WANDB_API_KEY", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS",
              "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE")


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            socks.append(s)
            if port not in ports:
                ports.append(port)
    finally:
        for s in socks:
            s.close()
    return ports


def _free_port_range(width: int, lo: int = 20000, hi: int = 30000) -> int:
    rng = secrets.SystemRandom()
    for _ in range(200):
        start = rng.randrange(lo, hi - width)
        ok = True
        for p in range(start, start + width):
            with socket.socket() as s:
                try:
                    s.bind(("0.0.0.0", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return start
    raise RuntimeError("no free port range")


@dataclass
class RayHead:
    address: str
    gcs_address: str
    dashboard_port: int
    temp_dir: Path
    token: str | None
    auth_mode: str
    resources: dict
    proc: subprocess.Popen
    marker: str
    log_path: Path
    start_seconds: float = 0.0
    _stopped: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def client_env(self) -> dict[str, str]:
        """Env vars a client process needs to talk to this head."""
        if self.auth_mode == "token":
            return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token or ""}
        return {"RAY_AUTH_MODE": "disabled"}

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def session_dir(self) -> Path | None:
        latest = self.temp_dir / "session_latest"
        return latest.resolve() if latest.exists() else None

    def _tree(self) -> dict[int, psutil.Process]:
        procs: dict[int, psutil.Process] = {}
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.proc.pid)
            procs[root.pid] = root
            for c in root.children(recursive=True):
                procs[c.pid] = c
        return procs

    def _marked(self) -> dict[int, psutil.Process]:
        """Processes (ours, by uid) whose environment carries this head's marker."""
        out = {}
        me = os.getuid()
        for p in psutil.process_iter(["uids"]):
            try:
                if p.info["uids"] is None or p.info["uids"].real != me or p.pid == os.getpid():
                    continue
                if p.environ().get(MARKER_ENV) == self.marker:
                    out[p.pid] = p
            except psutil.Error:
                continue
        return out

    def stop(self, timeout: float = 20.0, graceful: bool = True) -> None:
        """SIGTERM the head and wait ``timeout`` s for it, then end what is left of its processes (and of any carrying
        its marker); ``graceful=False``: SIGKILL them all at once (a cluster no test reads after)."""
        if self._stopped:
            return
        self._stopped = True
        tree = self._tree()
        tree.update(self._marked())
        if graceful:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.5)
        left = {pid: p for pid, p in {**tree, **self._marked()}.items() if p.is_running()}
        for p in left.values():
            with contextlib.suppress(psutil.Error):
                if graceful:
                    p.terminate()
                else:
                    p.kill()
        _, alive = psutil.wait_procs(list(left.values()), timeout=5)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(5)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def start_ray_head(
    resources: dict | None = None,
    *,
    auth: str | None = None,
    num_cpus: int = 2,
    timeout: float = 120.0,
    extra_env: dict | None = None,
    python: Path | None = None,
) -> RayHead:
    """Start ``ray start --head --block`` on 127.0.0.1 and wait until jobs can run; ``python``: the interpreter
    of the head's image (its ``ray`` script beside it; default: this venv's)."""
    auth = auth or os.environ.get("TRAJSFT_TEST_RAY_AUTH", "token")
    if auth not in ("token", "disabled"):
        raise ValueError(auth)
    resources = dict(DEFAULT_RESOURCES if resources is None else resources)
    temp_dir = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    (gcs, dash, agent_http, agent_grpc, nm, om, metrics, renv, client) = _free_ports(9)
    wmin = _free_port_range(100)
    token = secrets.token_hex(24) if auth == "token" else None
    marker = uuid.uuid4().hex

    env = {k: v for k, v in os.environ.items() if k not in _SCRUB_ENV}
    bindir = str(Path(python or sys.executable).parent)
    env.update(
        {
            "RAY_TMPDIR": str(temp_dir),
            "RAY_AUTH_MODE": auth,
            "RAY_USAGE_STATS_ENABLED": "0",
            "PATH": bindir + os.pathsep + env.get("PATH", ""),
            MARKER_ENV: marker,
            "PYTHONUNBUFFERED": "1",
            # Test head: skip the up-to-30 s node drain on SIGTERM.
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        }
    )
    if token:
        env["RAY_AUTH_TOKEN"] = token
    env.update(extra_env or {})
    ray_bin = Path(bindir) / "ray"
    cmd = [
        str(ray_bin), "start", "--head", "--block",
        f"--port={gcs}",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
        f"--dashboard-agent-listen-port={agent_http}", f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--node-manager-port={nm}", f"--object-manager-port={om}",
        f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={renv}",
        f"--ray-client-server-port={client}",
        f"--min-worker-port={wmin}", f"--max-worker-port={wmin + 99}",
        f"--num-cpus={num_cpus}", "--object-store-memory=100000000",
        f"--temp-dir={temp_dir}", "--disable-usage-stats",
        f"--resources={json.dumps(resources)}",
    ]
    log_path = temp_dir / "ray-start.log"
    t0 = time.monotonic()
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(
            cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=str(temp_dir),
        )
    head = RayHead(
        address=f"http://127.0.0.1:{dash}",
        gcs_address=f"127.0.0.1:{gcs}",
        dashboard_port=dash,
        temp_dir=temp_dir,
        token=token,
        auth_mode=auth,
        resources=resources,
        proc=proc,
        marker=marker,
        log_path=log_path,
    )
    try:
        _wait_ready(head, t0 + timeout)
    except BaseException:
        tail = log_path.read_text(errors="replace")[-3000:] if log_path.exists() else ""
        head.stop()
        raise RuntimeError(f"Ray head did not come up within {timeout}s:\n{tail}")
    head.start_seconds = time.monotonic() - t0
    return head


def _wait_ready(head: RayHead, deadline: float) -> None:
    """Dashboard answers, the node with our resources is alive, the job agent is up."""
    hdr = head.headers()
    want = set(head.resources)
    while time.monotonic() < deadline:
        if head.proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {head.proc.returncode}")
        try:
            r = requests.get(head.address + "/api/cluster_status", headers=hdr, timeout=3)
            if r.status_code == 200:
                usage = (
                    ((r.json().get("data") or {}).get("clusterStatus") or {})
                    .get("loadMetricsReport", {})
                    .get("usage", {})
                )
                if want <= set(usage):
                    # The jobs API needs the head node's dashboard agent.
                    r2 = requests.get(head.address + "/api/jobs/", headers=hdr, timeout=5)
                    if r2.status_code == 200:
                        return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise TimeoutError("Ray head not ready")


_RUNNING: dict = {"head": None}  # the head while a module uses it (stopped at exit if pytest is interrupted)


def _stop_running_at_exit() -> None:
    head = _RUNNING.get("head")
    if head is not None:
        head.stop()


atexit.register(_stop_running_at_exit)


@pytest.fixture(scope="module")
def ray_head():
    """A real Ray head for the module's tests, stopped after its last one: an idle head (GCS, raylet, dashboard
    and its agents, log monitor) takes about 8 CPU-seconds a minute, which it would take from every later module
    of the session; starting one takes a few seconds."""
    head = _RUNNING["head"] = start_ray_head(extra_env=TEST_HEAD_ENV)
    try:
        yield head
    finally:
        _RUNNING["head"] = None
        head.stop()


@pytest.fixture
def ray_client_env(ray_head, monkeypatch):
    """Point this test's process (and children) at ``ray_head`` via env vars."""
    for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(k, raising=False)
    for k, v in ray_head.client_env().items():
        monkeypatch.setenv(k, v)
    return ray_head
