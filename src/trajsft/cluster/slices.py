"""The driver's slice loop: one Levanter ``run_on_pod`` per attempt, our retry policy around it.

Levanter schedules (a ``SliceActor`` on a ``TPU-<type>-head``, one ``TPUHostActor`` per host, the
host function on every host with its ``TPU`` chips, cancel-all when one host fails). We call it
with no retries of its own (``max_retries_preemption = max_retries_failure = 0``) and decide here,
because this Levanter (1.2.dev1644) gets three things wrong for us:

* losing one whole host surfaces as ``OwnerDiedError``, which it counts as a *failure*, and its
  next try reuses the slice actor whose host actor is dead (``ActorDiedError`` outside its try
  block kills the orchestrator). Here every attempt is a fresh ``run_on_pod`` (new slice actor,
  new host actors) and ownership errors count as preemptions;
* losing the whole slice while the orchestrator runs on the CPU head is also counted as a failure
  (ten preemptions exhaust ``max_retries_failure``). Here preemptions and failures have separate
  limits (``ray.max_preemptions`` / ``ray.max_failures`` in the profile);
* its preemption check raises off GCE: :mod:`trajsft.cluster.hooks` bounds it.

The orchestrator task is pinned to the driver's node (the CPU head), so it is never lost with a
slice. Every attempt is reported through ``progress`` (the driver writes it to ``attempts.json``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import re
import time
from typing import Any, Callable, Optional

from ..errors import HostLost, JobEnvironmentError, SliceLimitExceeded, TrainingFailed, one_line
from . import hooks, setup_failure
from .host import HostJob, run_host

log = logging.getLogger("trajsft")

# Ray errors that mean "a worker, actor, node or object owner went away": infrastructure, not our code
_INFRA_ERRORS = ("NodeDiedError", "WorkerCrashedError", "ActorDiedError", "ActorUnavailableError",
                 "OwnerDiedError", "ObjectLostError", "ObjectReconstructionFailed", "RayActorError",
                 "LocalRayletDiedError", "TaskUnschedulableError", "ActorUnschedulableError")
_OUR_ERROR_RE = re.compile(r"\b(HostLost|TrainingFailed|JobEnvironmentError): (.+)")
# Ray could not set up the job's runtime env for an actor or task on a node: a configuration error
_SETUP_ERRORS = ("RuntimeEnvSetupError",)



@dataclasses.dataclass(frozen=True)
class Limits:
    max_preemptions: int = 100
    max_failures: int = 2


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _chain(exc: BaseException):
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend([getattr(e, "cause", None), e.__cause__, e.__context__])


def classify(exc: BaseException) -> tuple[str, str]:
    """``("preempted" | "failed" | "config", one-line cause)`` of an exception out of ``run_on_pod``.

    Our host function says what happened when it can (HostLost / TrainingFailed / JobEnvironmentError);
    exceptions come back across processes as RayTaskErrors whose text carries the remote traceback, so
    the text is read too. A runtime env Ray could not set up is a configuration error ("config"); Ray's
    worker/actor/node/owner-loss errors are preemptions; anything else is a failure.
    """
    chain = list(_chain(exc))
    for e in chain:
        if isinstance(e, HostLost):
            return "preempted", one_line(e.args[0] if e.args else e)
        if isinstance(e, TrainingFailed):
            return "failed", one_line(e.args[0] if e.args else e)
        if isinstance(e, JobEnvironmentError):
            return "config", one_line(e.args[0] if e.args else e)
    text = "\n".join(str(e) for e in chain)
    m = _OUR_ERROR_RE.search(text)
    if m:
        kind = {"HostLost": "preempted", "TrainingFailed": "failed", "JobEnvironmentError": "config"}[m.group(1)]
        return kind, one_line(m.group(2))
    names = {c.__name__ for e in chain for c in type(e).__mro__}
    for name in _SETUP_ERRORS:
        if name in names or re.search(rf"\b{name}\b", text):
            return "config", one_line(f"{name}: {_first_line(text, name)}")
    imported = setup_failure.startup_error(text)  # e.g. a host actor whose class does not import there
    if imported:
        return "config", one_line(imported)
    for name in _INFRA_ERRORS:
        if name in names or re.search(rf"\b{name}\b", text):
            return "preempted", one_line(f"{name}: {_first_line(text, name)}")
    if "preempted too many times" in text:
        return "preempted", "the TPU slice was preempted"
    return "failed", one_line(f"{type(exc).__name__}: {exc}")


def _first_line(text: str, name: str) -> str:
    for ln in text.splitlines():
        if name in ln:
            return ln.split(name, 1)[1].lstrip(": ").strip() or ln.strip()
    return text.splitlines()[0] if text else ""


def make_remote_fn(job: HostJob):
    """The no-argument remote function ``run_on_pod`` runs on every host (a fresh worker per call)."""
    import ray

    def train_on_host():
        return run_host(job)

    return ray.remote(max_calls=1, max_retries=0)(train_on_host)


def expected_hosts(tpu_type: str, num_slices: int) -> int:
    return hooks.ray_tpu().get_tpu_config(tpu_type).vm_count * num_slices


def run_on_slices(
    make_job: Callable[[str], HostJob],
    tpu_type: str,
    *,
    num_slices: int = 1,
    limits: Limits = Limits(),
    channel: Any,
    tag_prefix: str = "",
    progress: Callable[[list[dict]], None] = lambda attempts: None,
    checkpoint_step: Callable[[], Optional[int]] = lambda: None,
    poll_s: float = 5.0,
    waiting_note_s: float = 20.0,
) -> tuple[list[dict], list[dict]]:
    """Run the host function on every host of ``num_slices`` x ``tpu_type`` until it succeeds.

    A preemption (host process killed, host or slice lost) starts a new attempt on whatever slice
    Ray has next (possibly after waiting for the autoscaler); a failure does the same but counts
    against ``limits.max_failures``. Returns ``(host results, attempts)``.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    run_on_pod_ray = hooks.ray_tpu().run_on_pod_ray
    here = ray.get_runtime_context().get_node_id()
    want_hosts = expected_hosts(tpu_type, num_slices)
    attempts: list[dict] = []
    preemptions = failures = 0
    while True:
        n = len(attempts) + 1
        tag = f"{tag_prefix}s{n}"
        rec = {"slice_attempt": n, "tag": tag, "started": now(), "outcome": "waiting for slice",
               "tpu_type": tpu_type, "num_slices": num_slices, "resumed_from_step": checkpoint_step() or 0,
               "slices": [], "hosts": []}
        attempts.append(rec)
        progress(attempts)
        fn = make_remote_fn(make_job(tag))
        ref = run_on_pod_ray.options(
            num_cpus=0, max_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
        ).remote(fn, tpu_type, num_slices, 0, 0)
        t0 = time.monotonic()
        next_note = waiting_note_s
        while True:
            ready, _ = ray.wait([ref], timeout=poll_s)
            hosts = ray.get(channel.checkins.remote(tag))
            if hosts and len(hosts) != len(rec["hosts"]):
                rec["hosts"] = sorted(hosts, key=lambda h: (h["slice_id"], h["worker"]))
                rec["slices"] = sorted({h["slice"] for h in hosts})
                if len(hosts) >= want_hosts:
                    rec["outcome"] = "running"
                    rec["running_since"] = now()
                    log.info("slice attempt %d running on %s (%d hosts), from step %s", n,
                             ", ".join(rec["slices"]), len(hosts), rec["resumed_from_step"])
                progress(attempts)
            if ready:
                break
            if not hosts and time.monotonic() - t0 >= next_note:
                log.info("waiting for a %s slice (%ds so far: none free yet, the autoscaler is adding one, or its "
                         "hosts are still setting up the job's environment)",
                         tpu_type, int(time.monotonic() - t0))
                next_note += 60.0
        try:
            results = ray.get(ref)
        except Exception as e:  # noqa: BLE001 - every outcome is classified and counted
            kind, cause = classify(e)
        else:
            rec.update(outcome="succeeded", ended=now(), checkpoint_step=checkpoint_step())
            progress(attempts)
            return results, attempts
        if kind == "config":  # another slice meets the same environment: stop here, submit nothing more
            rec.update(outcome=setup_failure.OUTCOME, cause=cause, ended=now(), checkpoint_step=checkpoint_step())
            progress(attempts)
            log.error("slice attempt %d: %s: %s", n, setup_failure.OUTCOME, cause)
            raise JobEnvironmentError(cause)
        if kind == "preempted":
            preemptions += 1
        else:
            failures += 1
        rec.update(outcome=kind, cause=cause, ended=now(), checkpoint_step=checkpoint_step())
        progress(attempts)
        log.warning("slice attempt %d %s: %s (preemptions %d/%d, failures %d/%d)", n, kind, cause,
                    preemptions, limits.max_preemptions, failures, limits.max_failures)
        if preemptions > limits.max_preemptions or failures > limits.max_failures:
            what = "preemptions" if preemptions > limits.max_preemptions else "failures"
            raise SliceLimitExceeded(
                f"gave up after {preemptions} preemptions and {failures} failures (limit on {what} reached); "
                f"last: {cause}")
        ray.get(channel.forget.remote(tag))


def driver_channel(secrets: dict):
    """The actor that hands secrets to the hosts and collects their check-ins, on the driver's node.

    Secrets reach it as an actor-call argument (direct worker-to-worker transport, not stored by
    the GCS) and leave it as a return value to each host task; they are in no runtime_env, task
    spec held by the GCS, metadata or file.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0, max_restarts=0)
    class DriverChannel:
        def __init__(self):
            self._secrets: dict = {}
            self._checkins: dict[str, list] = {}

        def set_secrets(self, values: dict) -> None:
            self._secrets = dict(values)

        def secrets(self) -> dict:
            return self._secrets

        def checkin(self, tag: str, info: dict) -> None:
            self._checkins.setdefault(tag, []).append(info)

        def checkins(self, tag: str) -> list:
            return list(self._checkins.get(tag, []))

        def forget(self, tag: str) -> None:
            self._checkins.pop(tag, None)

    here = ray.get_runtime_context().get_node_id()
    ch = DriverChannel.options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote()
    ray.get(ch.set_secrets.remote(dict(secrets)))
    return ch
