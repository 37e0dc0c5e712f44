"""An emulated multi-host TPU slice on 127.0.0.1 for tests: real Ray nodes that present themselves
exactly as TPU VM hosts.

A CPU head (``num_cpus=0``, like marin's head: the training driver runs there) plus one
``ray start --block`` per emulated host, each with ``TPU_NAME``, ``TPU_WORKER_ID``,
``TPU_ACCELERATOR_TYPE``, ``TPU_TOPOLOGY``, ``TPU_WORKER_HOSTNAMES`` in its environment and
``--resources '{"TPU": 4}'``. Ray's TPU accelerator manager then adds the slice-name resource,
``TPU-<type>-head`` on worker 0 and the TPU labels itself, as on a real slice. Training on these
hosts runs multi-process JAX on CPU (gloo), see ``trajsft.cluster.host``.

Hosts are started one at a time (on 2 cores, raylets started together miss Ray's 30 s
registration deadline; a host that misses it is started again). Every node is its own process
group, recorded by pid: ``kill_host`` / ``kill_slice`` SIGKILL those groups (a preemption), and
teardown stops only what was started here (never ``ray stop``).
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
import requests

from ray_fixtures import MARKER_ENV, TEST_HEAD_ENV, RayHead, _free_port_range, _free_ports, start_ray_head

CHIPS_PER_HOST = 4
HOST_TYPES = {"v5p-8": 1, "v5p-16": 2, "v5p-32": 4}  # hosts per slice (4 chips each)


@dataclass
class Host:
    slice_name: str
    worker: int
    proc: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class EmulatedCluster:
    head: RayHead
    hosts: dict[tuple[str, int], Host] = field(default_factory=dict)
    hosts_started: list[tuple[str, int]] = field(default_factory=list)

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

    def _start_host(self, slice_name: str, tpu_type: str, worker: int) -> Host:
        n = HOST_TYPES[tpu_type]
        ports = _free_ports(6)
        wmin = _free_port_range(100)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "TPU_"))}
        env.update(TEST_HEAD_ENV)
        env.update(self.head.client_env())
        env.update({
            "TPU_NAME": slice_name, "TPU_WORKER_ID": str(worker), "TPU_ACCELERATOR_TYPE": tpu_type,
            "TPU_TOPOLOGY": f"2x2x{n}", "TPU_WORKER_HOSTNAMES": ",".join(["127.0.0.1"] * n),
            "RAY_USAGE_STATS_ENABLED": "0", MARKER_ENV: self.head.marker,
            "PYTHONUNBUFFERED": "1", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
            "PATH": str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
        })
        for k in ("HF_TOKEN", "WANDB_API_KEY"):
            env.pop(k, None)
        nm, om, agent_http, agent_grpc, metrics, renv = ports
        cmd = [str(Path(sys.executable).parent / "ray"), "start", "--block", f"--address={self.head.gcs_address}",
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
        log_path = self.head.temp_dir / f"host-{slice_name}-{worker}.log"
        with open(log_path, "wb") as logf:
            proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, cwd=str(self.head.temp_dir))
        return Host(slice_name, worker, proc, log_path)

    def add_host(self, slice_name: str, tpu_type: str, worker: int, timeout: float = 120.0) -> Host:
        """Start one emulated host and wait until Ray lists it (retried if it misses registration).

        Registration is recognised by a node id Ray did not list before (a host just killed may still
        be listed as alive for a while, so counting nodes is not enough)."""
        known = {n["node_id"] for n in self.alive_nodes()}
        for _ in range(4):
            host = self._start_host(slice_name, tpu_type, worker)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and host.proc.poll() is None:
                with contextlib.suppress(requests.RequestException):
                    if any(n["node_id"] not in known and slice_name in (n.get("resources_total") or {})
                           for n in self.alive_nodes()):
                        self.hosts[(slice_name, worker)] = host
                        return host
                time.sleep(1.0)
            _kill_group(host.proc)
        raise RuntimeError(f"emulated host {slice_name}/{worker} did not register:\n"
                           + host.log_path.read_text(errors="replace")[-2000:])

    def add_slice(self, slice_name: str, tpu_type: str) -> list[Host]:
        return [self.add_host(slice_name, tpu_type, k) for k in range(HOST_TYPES[tpu_type])]

    def kill_host(self, slice_name: str, worker: int) -> None:
        """Abrupt VM loss: SIGKILL the host's whole process group (raylet, workers, trainers)."""
        host = self.hosts.pop((slice_name, worker))
        _kill_group(host.proc)

    def kill_slice(self, slice_name: str) -> None:
        for key in [k for k in self.hosts if k[0] == slice_name]:
            self.kill_host(*key)

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
            "needles = [n.encode() for n in json.loads(sys.argv[2])]\n"
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
        out = subprocess.run([sys.executable, "-c", script, self.head.gcs_address, json.dumps(needles)],
                             capture_output=True, text=True, env=env, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-2000:])
        return json.loads(out.stdout.strip().splitlines()[-1])

    def files_holding(self, needles: list[str]) -> list[str]:
        """Files of every node's Ray session (logs, extracted packages...) that hold any needle.

        The pip virtualenvs Ray builds for the job (copies of installed packages) are skipped."""
        hits = []
        for f in self.head.temp_dir.rglob("*"):
            if "runtime_resources/pip" in str(f) or not f.is_file() or f.is_symlink() or f.is_socket():
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
        self.head.stop(timeout=5.0)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(30)


def start_emulated_cluster(slices: dict[str, str] | None = None) -> EmulatedCluster:
    """A CPU head plus the given slices ({name: tpu_type}), hosts started one by one."""
    head = start_ray_head(resources={}, num_cpus=0, extra_env=TEST_HEAD_ENV)
    cluster = EmulatedCluster(head)
    atexit.register(cluster.stop)  # also when pytest itself is interrupted
    try:
        for name, tpu_type in (slices or {}).items():
            cluster.add_slice(name, tpu_type)
    except BaseException:
        cluster.stop()
        raise
    return cluster
