"""An emulated multi-host TPU slice on 127.0.0.1 for tests: real Ray nodes that present themselves
exactly as TPU VM hosts.

A CPU head (``num_cpus=0``, like marin's head: the training driver runs there) plus one
``ray start --block`` per emulated host with ``--resources '{"TPU": 4}'``. As on a TPU VM made by
``gcloud compute tpus tpu-vm create``, a host has no ``TPU_*`` variable: each has its own GCE metadata
server (``tests/gce_fixtures.py``: worker number, instance id, accelerator type, worker network endpoints,
tpu-env, zone, preempted), reached as ``metadata.google.internal`` through ``http_proxy``. Ray's TPU
accelerator manager reads it and adds the slice-name resource, ``TPU-<type>-head`` on worker 0 and the
TPU labels itself, as on a real slice; trajsft's hosts read it too (``trajsft.gce``). Training on these
hosts runs multi-process JAX on CPU (gloo), see ``trajsft.cluster.host``.

Hosts are started one at a time (on 2 cores, raylets started together miss Ray's 30 s
registration deadline; a host that misses it is started again). Every node is its own process
group, recorded by pid: ``kill_host`` / ``kill_slice`` SIGKILL those groups (a preemption), and
teardown stops only what was started here (never ``ray stop``).

Fixtures: ``shared_cluster`` (one per session: the head, a 2-host v5p-16 and two 1-host v5p-8 slices, every
node pointed at one fake-gcs-server) and ``slices`` (that cluster, restored to its shape with no job running
before and after each test that asks for it).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import requests

from gce_fixtures import MetadataServer, tpu_attributes
from gcs_fixtures import GcsEmulator, start_gcs
from ray_fixtures import MARKER_ENV, TEST_HEAD_ENV, RayHead, _free_port_range, _free_ports, start_ray_head

CHIPS_PER_HOST = 4
# hosts per slice (4 chips each); a v4-8 is the one-host slice a test adds beside the shape's (no job of another
# test's type lands on it, and the shape's slices stay up)
HOST_TYPES = {"v5p-8": 1, "v5p-16": 2, "v5p-32": 4, "v4-8": 1}


@dataclass
class Host:
    slice_name: str
    worker: int
    proc: subprocess.Popen
    log_path: Path
    metadata: MetadataServer  # this VM's GCE metadata server
    node_id: str | None = None  # Ray's id of the node, once it registered

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class EmulatedCluster:
    head: RayHead
    hosts: dict[tuple[str, int], Host] = field(default_factory=dict)
    hosts_started: list[tuple[str, int]] = field(default_factory=list)
    killed_node_ids: set[str] = field(default_factory=set)  # nodes SIGKILLed here, until Ray lists them dead
    node_env: dict[str, str] = field(default_factory=dict)  # given to every host when it starts (e.g. GCS endpoint)
    slice_types: dict[str, str] = field(default_factory=dict)  # slice name -> tpu type, of every slice started
    zone: str = "us-east5-a"  # every VM's zone (its metadata server says so): profiles/tpu-east5's ray.zone
    metadata_servers: list[MetadataServer] = field(default_factory=list)  # of every host started

    @property
    def address(self) -> str:
        return self.head.address

    def alive_nodes(self) -> list[dict]:
        r = requests.get(self.head.address + "/api/v0/nodes?detail=true&limit=1000", headers=self.head.headers(),
                         timeout=10)
        r.raise_for_status()
        return [n for n in r.json()["data"]["result"]["result"] if n.get("state") == "ALIVE"]

    def slice_hosts_alive(self, slice_name: str) -> int:
        return sum(1 for n in self.alive_nodes() if slice_name in (n.get("resources_total") or {}))

    def _start_host(self, slice_name: str, tpu_type: str, worker: int, python: Path | None = None) -> Host:
        n = HOST_TYPES[tpu_type]
        ray_cli = [str(Path(sys.executable).parent / "ray")] if python is None else [str(python), "-m", "ray.scripts.scripts"]
        python = Path(python or sys.executable)
        ports = _free_ports(6)
        wmin = _free_port_range(100)
        # a TPU VM of `gcloud compute tpus tpu-vm create`: no TPU_* variable, a metadata server of its own
        metadata = MetadataServer(tpu_attributes(slice_name, tpu_type, worker, ["127.0.0.1"] * n, f"2x2x{n}"),
                                  zone=self.zone)
        self.metadata_servers.append(metadata)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RAY_AUTH", "TPU_")) and k.lower() not in ("http_proxy", "no_proxy")}
        env.update(TEST_HEAD_ENV)
        env.update(self.head.client_env())
        env.update(self.node_env)
        env.update(metadata.proxy_env())
        env.update({
            "RAY_USAGE_STATS_ENABLED": "0", MARKER_ENV: self.head.marker,
            "PYTHONUNBUFFERED": "1", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
            "PATH": str(python.parent) + os.pathsep + env.get("PATH", ""),
        })
        for k in ("HF_TOKEN", "WANDB_API_KEY"):
            env.pop(k, None)
        nm, om, agent_http, agent_grpc, metrics, renv = ports
        # the host's Python runs Ray and every worker (Ray starts workers with the Python that started the node)
        cmd = [*ray_cli, "start", "--block", f"--address={self.head.gcs_address}",
               f"--node-manager-port={nm}", f"--object-manager-port={om}",
               f"--dashboard-agent-listen-port={agent_http}", f"--dashboard-agent-grpc-port={agent_grpc}",
               f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={renv}",
               f"--min-worker-port={wmin}", f"--max-worker-port={wmin + 99}",
               # a real v5p host has ~200 vCPUs; Levanter asks 8 per host task and its slice actor holds 1
               "--num-cpus=10", f"--memory={21 * 10**9}", "--object-store-memory=100000000",
               "--disable-usage-stats", f"--resources={json.dumps({'TPU': CHIPS_PER_HOST})}"]
        # its own Ray temp dir, as a separate VM has: nodes sharing one would build the same runtime-env
        # virtualenvs concurrently (short path: unix sockets live below it)
        temp = self.head.temp_dir / f"h{len(self.hosts_started)}"
        self.hosts_started.append((slice_name, worker))
        temp.mkdir()
        cmd.append(f"--temp-dir={temp}")
        # and its own disk for Hugging Face's cache: the hosts of a slice each fetch a gs:// checkpoint's config.json
        # into it at once (sharing one, a host once read the file another was writing: empty JSON)
        env["HF_HOME"] = str(temp / "hf-home")
        log_path = self.head.temp_dir / f"host-{slice_name}-{worker}.log"
        with open(log_path, "wb") as logf:
            proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, cwd=str(self.head.temp_dir))
        return Host(slice_name, worker, proc, log_path, metadata)

    def add_host(self, slice_name: str, tpu_type: str, worker: int, timeout: float = 120.0,
                 python: Path | None = None) -> Host:
        """Start one emulated host and wait until Ray lists it (retried if it misses registration). ``python``:
        the host image's interpreter (default: this venv's, see :func:`host_image_without`).

        Registration is recognised by a node id Ray did not list before (a host just killed may still
        be listed as alive for a while, so counting nodes is not enough)."""
        known = {n["node_id"] for n in self.alive_nodes()}
        self.slice_types[slice_name] = tpu_type
        for _ in range(4):
            host = self._start_host(slice_name, tpu_type, worker, python)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and host.proc.poll() is None:
                with contextlib.suppress(requests.RequestException):
                    new = [n["node_id"] for n in self.alive_nodes()
                           if n["node_id"] not in known and slice_name in (n.get("resources_total") or {})]
                    if new:
                        host.node_id = new[0]
                        self.hosts[(slice_name, worker)] = host
                        return host
                time.sleep(1.0)
            _kill_group(host.proc)
        raise RuntimeError(f"emulated host {slice_name}/{worker} did not register:\n"
                           + host.log_path.read_text(errors="replace")[-2000:])

    def add_slice(self, slice_name: str, tpu_type: str, python: Path | None = None) -> list[Host]:
        return [self.add_host(slice_name, tpu_type, k, python=python) for k in range(HOST_TYPES[tpu_type])]

    def kill_host(self, slice_name: str, worker: int) -> None:
        """Abrupt VM loss: SIGKILL the host's whole process group (raylet, workers, trainers)."""
        host = self.hosts.pop((slice_name, worker))
        _kill_group(host.proc)
        if host.node_id:
            self.killed_node_ids.add(host.node_id)

    def kill_slice(self, slice_name: str) -> None:
        for key in [k for k in self.hosts if k[0] == slice_name]:
            self.kill_host(*key)

    def complete_slices(self, tpu_type: str) -> list[str]:
        """The slices of ``tpu_type`` whose every host runs, in the order they were started."""
        return [name for name, t in self.slice_types.items() if t == tpu_type
                and all((name, k) in self.hosts and self.hosts[(name, k)].proc.poll() is None
                        for k in range(HOST_TYPES[t]))]

    def new_slice_name(self) -> str:
        """A slice name never used in this cluster (a preempted slice's successor is another VM)."""
        return f"slice-{len(self.slice_types)}-{os.urandom(2).hex()}"

    def restore(self, shape: dict[str, int], timeout: float = 180.0) -> None:
        """Put the cluster back in ``shape`` ({tpu_type: complete slices}) with no job of any test left running.

        A slice that lost a host is removed whole (its survivors are SIGKILLed, as a preempted slice's
        are), slices beyond the shape are removed, missing ones started afresh under new names; then Ray
        must list every removed node as dead (a node Ray still counts would take the next job's slice
        actor), and every job still pending or running is stopped."""
        for tpu_type in set(self.slice_types.values()):
            have = self.complete_slices(tpu_type)
            keep = have[:shape.get(tpu_type, 0)]
            for name in [n for n, t in self.slice_types.items() if t == tpu_type and n not in keep]:
                self.kill_slice(name)  # a slice that lost a host, or one beyond the shape
        for tpu_type, want in shape.items():
            for _ in range(want - len(self.complete_slices(tpu_type))):
                self.add_slice(self.new_slice_name(), tpu_type)
        deadline = time.monotonic() + timeout
        while self.killed_node_ids:
            alive = {n["node_id"] for n in self.alive_nodes()}
            self.killed_node_ids &= alive
            if not self.killed_node_ids:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"Ray still lists {len(self.killed_node_ids)} SIGKILLed host(s) as alive after "
                                   f"{timeout:g}s: {sorted(self.killed_node_ids)}")
            time.sleep(1.0)
        from trajsft.cluster import jobs as cluster_jobs

        conn = cluster_jobs.Conn(self.head.address, self.head.token)
        for job in conn.list_jobs():
            if job.status not in cluster_jobs.TERMINAL_STATUSES:
                st = cluster_jobs.stop(self.head.address, job.submission_id, 60, _conn=conn)
                if st not in cluster_jobs.TERMINAL_STATUSES:
                    raise TimeoutError(f"Ray job {job.submission_id} left by a test is still {st} 60s after "
                                       "a stop request")

    def trainer_pids(self, slice_name: str, worker: int) -> list[int]:
        """The train_lm processes running on one emulated host."""
        host = self.hosts[(slice_name, worker)]
        out = []
        with contextlib.suppress(psutil.Error):
            for p in psutil.Process(host.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if "trajsft.train.train_lm_main" in " ".join(p.cmdline()):
                        out.append(p.pid)
        return out

    def kv_keys_holding(self, needles: list[str]) -> list[str]:
        """Keys of the cluster's internal KV store (packages included) whose value holds any needle."""
        script = (
            "import io, json, sys, zipfile, ray\n"
            "from ray.experimental import internal_kv as kv\n"
            "ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
            "needles = [n.encode() for n in json.loads(sys.stdin.read())]\n"
            "hits = []\n"
            "for ns in (None, 'package', 'job', 'fun', 'session', 'dashboard'):\n"
            "    for key in kv._internal_kv_list(b'', namespace=ns):\n"
            "        val = kv._internal_kv_get(key, namespace=ns) or b''\n"
            "        if val[:2] == b'PK':  # a package: look inside its (deflated) members\n"
            "            try:\n"
            "                z = zipfile.ZipFile(io.BytesIO(val))\n"
            "                val = val + b''.join(z.read(m) for m in z.namelist())\n"
            "            except zipfile.BadZipFile:\n"
            "                pass\n"
            "        if any(n in val or n in key for n in needles):\n"
            "            hits.append(f'{ns}:{key!r}')\n"
            "print(json.dumps(hits))\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        env.update(self.head.client_env())
        # the needles go in on stdin: this script is a Ray driver, and the cluster lists every driver's command
        # line as a job (a later test checks that listing for the same secrets)
        out = subprocess.run([sys.executable, "-c", script, self.head.gcs_address], input=json.dumps(needles),
                             capture_output=True, text=True, env=env, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-2000:])
        return json.loads(out.stdout.strip().splitlines()[-1])

    def files_holding(self, needles: list[str]) -> list[str]:
        """Files of every node's Ray session (logs, extracted packages...) that hold any needle.

        The pip/uv virtualenvs Ray builds for the job (copies of installed packages) are skipped."""
        hits = []
        for f in self.head.temp_dir.rglob("*"):
            if "runtime_resources/pip" in str(f) or "runtime_resources/uv" in str(f) or not f.is_file() or f.is_symlink() or f.is_socket():
                continue
            with contextlib.suppress(OSError):
                blob = f.read_bytes()
                if any(n.encode() in blob for n in needles):
                    hits.append(str(f))
        return hits

    def stop(self) -> None:
        if self.head._stopped:
            return
        # a test cluster needs no graceful shutdown: SIGKILL every host's process group (as kill_host
        # does), then the head, which also kills whatever is left carrying its marker
        for key in list(self.hosts):
            _kill_group(self.hosts.pop(key).proc)
        self.head.stop(graceful=False)
        while self.metadata_servers:
            self.metadata_servers.pop().stop()


def host_image_without(dest: Path, *dropped: str) -> Path:
    """The Python of a host image that lacks ``dropped`` distributions (their modules and metadata), and is
    otherwise this venv: a venv on the same base interpreter whose site-packages links every other entry of
    ours (``.pth`` files included, so the project's editable install too). Its ``bin/python``."""
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True, timeout=120)
    ours = Path(sysconfig.get_paths()["purelib"])
    site = next(dest.glob("lib/python3*/site-packages"))
    drop = {d.lower().replace("-", "_") for d in dropped}
    for entry in ours.iterdir():
        top = entry.name.split("-", 1)[0].removesuffix(".py").lower() if entry.name.endswith(".dist-info") \
            else entry.name.removesuffix(".py").lower()
        if top not in drop and not (site / entry.name).exists():
            (site / entry.name).symlink_to(entry)
    return dest / "bin" / "python"


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(30)


def start_emulated_cluster(slices: dict[str, str] | None = None,
                           node_env: dict[str, str] | None = None, python: Path | None = None) -> EmulatedCluster:
    """A CPU head plus the given slices ({name: tpu_type}), hosts started one by one; ``node_env`` is given to
    every node (the head and each host, also hosts added later) when it starts; ``python``: the cluster image's
    interpreter for the head and these hosts (default: this venv's)."""
    # the head is a GCE VM too (a CPU one): its metadata server says its zone and project, not a TPU
    head_metadata = MetadataServer(zone=EmulatedCluster.zone)
    head = start_ray_head(resources={}, num_cpus=0, python=python,
                          extra_env={**TEST_HEAD_ENV, **(node_env or {}), **head_metadata.proxy_env()})
    cluster = EmulatedCluster(head, node_env=dict(node_env or {}), metadata_servers=[head_metadata])
    atexit.register(cluster.stop)  # also when pytest itself is interrupted
    try:
        for name, tpu_type in (slices or {}).items():
            cluster.add_slice(name, tpu_type, python=python)
    except BaseException:
        cluster.stop()
        raise
    return cluster


# The one emulated cluster of a test session, shared by tests/test_multihost.py and tests/test_tpu_profile.py
# (as Ray's own suite shares ``ray_start_regular_shared``): a CPU head, a 2-host v5p-16 slice and two 1-host
# v5p-8 slices. A job picks a slice by its type (the ``TPU-<type>-head`` resource), so the multi-host tests
# land on the v5p-16 and the single-host ones on a v5p-8, on the same head.
SHAPE = {"v5p-16": 1, "v5p-8": 2}  # what every test finds: {tpu_type: complete slices}
_FIRST_SLICES = {"slice-a": "v5p-16", "slice-x": "v5p-8", "slice-y": "v5p-8"}


@dataclass
class SharedCluster:
    cluster: EmulatedCluster
    gcs: GcsEmulator  # the bucket server every node was started pointing at (STORAGE_EMULATOR_HOST...)


_RUNNING: list[SharedCluster] = []  # the session's cluster while it runs
_ORDER: list[pytest.Item] = []  # the tests in the order they run (after any reordering plugin)


@pytest.fixture(scope="session")
def shared_cluster(tmp_path_factory):
    """Started once per session, when a test first asks for it, and stopped after the last test that uses it
    (not at the session's end: its five Ray nodes would idle under every later module). Every node gets the
    fake-gcs-server's endpoint when it starts (a TPU VM reaches GCS without being told); this process does
    not: a module that uses the bucket sets the variables for its own tests (tests/test_multihost.py)."""
    # its buckets are in the cluster's region, as gs://marin-us-east5 is in us-east5 (preflight checks it)
    emu = start_gcs(tmp_path_factory.mktemp("fake-gcs-slices") / "data", location="US-EAST5")
    try:
        c = start_emulated_cluster(_FIRST_SLICES, node_env=emu.env())
        shared = SharedCluster(c, emu)
        _RUNNING.append(shared)
        try:
            yield shared
        finally:
            _stop_shared()
    finally:
        emu.stop()


def _stop_shared() -> None:
    while _RUNNING:
        shared = _RUNNING.pop()
        shared.cluster.stop()
        shared.gcs.stop()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    _ORDER[:] = items


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield  # the test's own fixtures first (``slices`` restores the cluster)
    if _RUNNING and "shared_cluster" in item.fixturenames and item in _ORDER:
        if not any("shared_cluster" in i.fixturenames for i in _ORDER[_ORDER.index(item) + 1:]):
            _stop_shared()
    return result


@pytest.fixture
def slices(shared_cluster) -> EmulatedCluster:
    """The shared cluster in the promised shape (SHAPE, no job running) before the test, and put back in it
    after: a test that kills hosts or slices, or fails with a job running, leaves nothing to the next one."""
    c = shared_cluster.cluster
    c.restore(SHAPE)
    yield c
    c.restore(SHAPE)
