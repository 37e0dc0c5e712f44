"""One host of a TPU slice: this host's JAX process of a Levanter ``train_lm`` run.

Levanter's ``run_on_pod`` runs :func:`run_host` once on every host of the slice, all started
together (each task holds that host's ``TPU`` chips). Each host launches ``train_lm`` as a child
process (it dies with the host task: PR_SET_PDEATHSIG) with the same config; process 0 writes the
launch log that the job log streams, every other host logs and keeps W&B offline files in its own
local directory (Levanter makes processes > 0 use W&B offline).

Each host knows who it is as a TPU VM does (:meth:`HostInfo.detect`): its worker id, slice and the
slice's hosts from the GCE metadata server (``TPU_*`` variables, as GKE sets them, override it). On a
real TPU slice JAX finds its peers itself from the same server. On an emulated slice (CPU nodes that
present themselves as TPU hosts, ``TRAJSFT_ALLOW_CPU_TRAINING=1`` and ``JAX_PLATFORMS=cpu`` on the
node) the coordinator address, process count and id are passed to Levanter explicitly from that
identity, and every host gets as many CPU devices as it has TPU chips.

Outcomes: a dict on success; :class:`JobEnvironmentError` when this host's Python is not the lock's,
``train_lm`` cannot import what it needs or W&B refused process 0's run (a configuration error: never retried); :class:`HostLost` when this host's process was killed by a signal or
a peer host of the slice went away (a preemption: the driver gets a new slice and resumes);
:class:`TrainingFailed` when ``train_lm`` exited with an error on a slice whose hosts are all alive.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import signal
import sys
import threading
import time
from typing import Any, Optional

from .. import io
from ..errors import HostLost, JobEnvironmentError, TrainingFailed
from ..logs import last_exception
from ..train import checkpoints, launch, levanter_config, metrics, run as train_run, tracking
from . import requirements, setup_failure

ALLOW_CPU_ENV = "TRAJSFT_ALLOW_CPU_TRAINING"  # set on emulated/test Ray nodes only, never by a profile



@dataclasses.dataclass(frozen=True)
class HostInfo:
    slice_name: str
    worker_id: int
    hostnames: tuple[str, ...]
    accelerator_type: str
    slice_id: int = 0  # multislice: MEGASCALE_SLICE_ID, set by run_on_pod

    @classmethod
    def detect(cls, env=None, get=None) -> "HostInfo":
        """This host as its TPU VM knows itself (:func:`trajsft.gce.tpu_identity`: the GCE metadata server,
        ``TPU_*`` variables override it). A host that cannot tell its worker id or its slice's hosts is a
        :class:`JobEnvironmentError` (one line): guessing "worker 0 of 1" on every host would start one
        single-process training per host, all writing the same run."""
        from .. import gce
        from ..fit import slices as tpu_slices

        env = os.environ if env is None else env
        ident = gce.tpu_identity(env, get or gce.metadata)
        where = f"TPU host {ident.slice_name or '?'}"
        if ident.worker_id is None:
            raise JobEnvironmentError(f"{where}: no worker id (no TPU_WORKER_ID, and the GCE metadata server "
                                      "gave no instance/attributes/agent-worker-number)")
        try:
            expected = tpu_slices.parse(ident.accelerator_type).hosts if ident.accelerator_type else None
        except ValueError:
            expected = None
        hosts = ident.hostnames or (("127.0.0.1",) if expected == 1 else ())
        if not hosts or (expected is not None and len(hosts) != expected):
            raise JobEnvironmentError(
                f"{where} worker {ident.worker_id}: {len(hosts)} hosts known for a "
                f"{ident.accelerator_type or 'TPU'} slice{f' of {expected} hosts' if expected else ''} (no "
                "TPU_WORKER_HOSTNAMES, and instance/attributes/worker-network-endpoints of the GCE metadata server "
                "does not list them)")
        if not 0 <= ident.worker_id < len(hosts):
            raise JobEnvironmentError(f"{where}: worker id {ident.worker_id} is not one of its {len(hosts)} hosts")
        return cls(
            slice_name=ident.slice_name,
            worker_id=ident.worker_id,
            hostnames=hosts,
            accelerator_type=ident.accelerator_type,
            slice_id=int(env.get("MEGASCALE_SLICE_ID", "0") or 0),
        )

    @property
    def num_hosts(self) -> int:
        return len(self.hostnames)

    @property
    def primary(self) -> bool:
        """Process 0 of the run: worker 0 of slice 0."""
        return self.worker_id == 0 and self.slice_id == 0

    def __str__(self) -> str:
        return f"{self.slice_name or '?'} host {self.worker_id}"


@dataclasses.dataclass(frozen=True)
class HostJob:
    """What every host of one slice attempt runs (picklable; holds no secret)."""

    levanter: dict  # the train_lm config (same on every host)
    run_dir: str  # shared run dir (gs:// on a real cluster)
    attempt_tag: str  # e.g. "a1-s3": Snakemake attempt 1, slice attempt 3
    coordinator_port: int  # emulated slices only (JAX picks its own on TPU)
    channel: Any  # DriverChannel actor handle: secrets and check-ins
    num_slices: int = 1
    failure_grace_s: float = 90.0
    stall_s: Optional[float] = None  # a train_lm whose log does not grow for this long is killed as hung


def emulated(env=None) -> bool:
    env = os.environ if env is None else env
    return env.get(ALLOW_CPU_ENV) == "1" and env.get("JAX_PLATFORMS", "") == "cpu"


def distributed_args(host: HostInfo, job: HostJob, env=None) -> list[str]:
    """Levanter's trainer.distributed for this host: explicit on an emulated slice, auto on TPU."""
    if not emulated(env):
        return []
    if job.num_slices != 1:
        raise TrainingFailed("an emulated (CPU) slice cannot run multislice training: set ray.num_slices to 1")
    return [
        f"--trainer.distributed.coordinator_address={host.hostnames[0]}:{job.coordinator_port}",
        f"--trainer.distributed.num_processes={host.num_hosts}",
        f"--trainer.distributed.process_id={host.worker_id}",
    ]


def local_dir(job: HostJob, host: HostInfo) -> str:
    """This host's own directory for logs, W&B files and the launch config."""
    if io.is_remote(job.run_dir):
        import tempfile

        return os.path.join(tempfile.gettempdir(), "trajsft-runs", job.levanter["trainer"]["id"],
                            f"host-{host.slice_id}-{host.worker_id}")
    if host.primary:
        return os.path.abspath(job.run_dir)
    return os.path.join(os.path.abspath(job.run_dir), "hosts", f"{host.slice_id}-{host.worker_id}")


def _tee(path: str, stop: threading.Event, start: int = 0, out=None) -> None:
    """Copy what the launch appends to ``path`` after byte ``start`` onto stdout (Ray forwards it into
    the job log). ``start`` is the log's size before this launch: the log is appended to by every slice
    attempt of the run, and what earlier attempts wrote is in the job log already."""
    out = out or sys.stdout.buffer
    pos = start
    while True:
        done = stop.is_set()
        try:
            with open(path, "rb") as f:
                f.seek(pos)
                chunk = f.read()
        except FileNotFoundError:
            chunk = b""
        if chunk:
            pos += len(chunk)
            out.write(chunk)
            out.flush()
        if done:
            return
        time.sleep(0.5)


def _slice_hosts_alive(slice_name: str) -> int:
    import ray

    return sum(1 for n in ray.nodes() if n.get("Alive") and slice_name in (n.get("Resources") or {}))


def _peer_lost(host: HostInfo, grace_s: float) -> Optional[str]:
    """Wait up to ``grace_s`` for Ray to notice a lost peer host; its description, or None."""
    if not host.slice_name or host.num_hosts < 2:
        return None
    deadline = time.monotonic() + grace_s
    while True:
        try:
            alive = _slice_hosts_alive(host.slice_name)
        except Exception:  # noqa: BLE001 - GCS unreachable: the cluster itself is going away
            return "the Ray cluster became unreachable"
        if alive < host.num_hosts:
            return f"{host.num_hosts - alive} of {host.num_hosts} hosts of slice {host.slice_name} went away"
        if time.monotonic() >= deadline:
            return None
        time.sleep(2.0)


# what a host's collectives say when a peer host never connects (a peer slow to start on a loaded or failing
# machine; the peer itself may still be up, so _peer_lost sees nothing), and what JAX's distributed service says on
# the other hosts then (it polled the peer's error, or the peer left the shutdown barrier alone)
_UNREACHABLE = ("Gloo context initialization failed", "Connect timeout",
                "JAX distributed service detected fatal errors", "Polled an error from coordination service")


def peers_unreachable(log_text: str) -> Optional[str]:
    """The line of a train_lm log saying the slice's collectives could not connect its hosts, or None. Such an
    exit is the slice's (a host loss, retried on the preemption budget), not the training's."""
    for ln in reversed(log_text.splitlines()):
        if any(k in ln for k in _UNREACHABLE):
            return " ".join(ln.split())[:300]
    return None


def _last_error(log_path: str) -> str:
    """The exception the host's train_lm died of (its last traceback's), else the last line that looks like an
    error, else the last line."""
    lines = io.tail(log_path, 400)
    raised = last_exception("\n".join(lines))
    if raised:
        return " ".join(raised.split())
    lines = lines[-60:]
    for ln in reversed(lines):
        if any(k in ln for k in ("Error", "error:", "Exception", "Traceback", "FAILED")):
            return " ".join(ln.split())[:300]
    return (" ".join(lines[-1].split())[:300]) if lines else ""


def run_host(job: HostJob) -> dict:
    """Run this host's train_lm process; see the module docstring for the outcomes."""
    import ray

    host = HostInfo.detect()
    started = time.time()
    # a host whose Python is not the lock's trains another program than the one `trajsft fit` compiled
    setup_failure.check_installed(str(host), requirements.REPO_DIR / requirements.OUT)
    ray.get(job.channel.checkin.remote(job.attempt_tag, {
        "slice": host.slice_name, "worker": host.worker_id, "slice_id": host.slice_id,
        "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
        "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}))
    secrets = ray.get(job.channel.secrets.remote())  # straight from the driver's memory

    work = local_dir(job, host)
    run = train_run.prepare_run(job.levanter, work, log_dir=os.path.join(work, "logs"))
    io.write_bytes(os.path.join(work, setup_failure.ENV_RECORD), setup_failure.python_environment().encode())
    cfg = run.cfg
    if emulated():
        cfg["trainer"]["require_accelerator"] = False
    # a node without internet access can force W&B offline (the profile's ray.env wins over the node's env)
    node_wandb_mode = os.environ.get("WANDB_MODE")
    if node_wandb_mode in ("offline", "disabled"):
        for t in cfg["trainer"].get("tracker") or []:
            if t.get("type") == "wandb":
                t["mode"] = node_wandb_mode
    config_path = levanter_config.write_config(levanter_config.resolve_hub_refs(cfg),
                                               os.path.join(work, f"levanter_config.{job.attempt_tag}.yaml"))
    train_run.ensure_reference_checkpoint(cfg)
    env = {**tracking.child_env(cfg), **secrets}
    if host.primary:  # process 0 names the W&B run in the run dir (on the bucket), where status reads it
        env[tracking.RECORD_ENV] = io.join(job.run_dir, tracking.RECORD)
    if emulated():
        chips = len(ray.get_runtime_context().get_accelerator_ids().get("TPU") or [])
        env.update({"JAX_NUM_CPU_DEVICES": str(max(1, chips)), "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"})
    log_path = os.path.join(work, "train.log" if host.primary else f"train-{host.slice_id}-{host.worker_id}.log")
    ckpt = checkpoints.latest_checkpoint(run.checkpoint_dir)
    header = (f"{metrics.LAUNCH_MARK} train_lm id={cfg['trainer']['id']} at {dt.datetime.now().isoformat()} "
              f"on {host} ({job.attempt_tag}; latest checkpoint: {ckpt['path'] if ckpt else None})")
    stop = threading.Event()
    tee = None
    with open(log_path, "ab") as f:
        start = f.tell()  # earlier slice attempts' lines are in the log (and the job log) already
    if host.primary:
        tee = threading.Thread(target=_tee, args=(log_path, stop, start), daemon=True)
        tee.start()
    try:
        rc = launch.run_subprocess(
            [*launch.TRAIN_CHILD, "--config_path", config_path, *distributed_args(host, job)],
            log_path, launch.levanter_env(work, env), work, header, stall_s=job.stall_s)
    except launch.Stalled as e:  # the slice's, as a lost peer's: the attempt ends and the next resumes
        raise HostLost(f"train_lm on {host} {e}: killed as hung (a collective waiting for a lost peer, a read that "
                       "never returns?); ray.stall_seconds sets the limit") from None
    finally:
        stop.set()
        if tee:
            tee.join(timeout=30)
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        raise HostLost(f"train_lm on {host} was killed by {name} (preempted, or out of memory?)")
    if rc == tracking.EXIT_CODE:  # W&B refused the run (process 0): every slice would meet the same refusal
        raise JobEnvironmentError(f"train_lm on {host}: " + (
            train_run.launch_cause(log_path) or "W&B refused the run (see its log)"))
    if rc > 0:
        with open(log_path, "rb") as f:
            f.seek(start)
            launched = f.read().decode(errors="replace")
        trained = (metrics.read_metrics(log_path)["launches"] or [{}])[-1].get("first_step") is not None
        err = None if trained else setup_failure.startup_error(launched)
        if err:
            raise JobEnvironmentError(f"train_lm on {host} cannot start: {err}")
        lost = _peer_lost(host, job.failure_grace_s)
        if lost:
            raise HostLost(f"train_lm on {host} exited with code {rc} after {lost}")
        if host.num_hosts > 1 and (unreachable := peers_unreachable(launched)):
            raise HostLost(f"train_lm on {host} exited with code {rc}: its peer hosts did not connect ({unreachable})")
        raise TrainingFailed(f"train_lm on {host} exited with code {rc}: {_last_error(log_path)}")
    out = {"slice": host.slice_name, "worker": host.worker_id, "slice_id": host.slice_id, "returncode": rc,
           "seconds": round(time.time() - started, 1)}
    if host.primary:
        ckpt = checkpoints.latest_checkpoint(run.checkpoint_dir)
        if ckpt is not None:
            out["result"] = train_run.collect_result(run, log_path, ckpt, launched=True, returncode=rc,
                                              config_path=config_path)
    return out
