"""``worker_process_setup_hook`` of the training job: runs in every Ray worker of the job.

Levanter's ``run_on_pod`` asks the GCE metadata server whether the TPU VM is being preempted
(``levanter.infra.tpus.get_current_tpu_is_preempted``: no timeout, and it *raises* when the
server cannot be reached, e.g. on GKE or any non-GCE Ray node). ``SliceActor.healthy`` and the
error handler of ``run_on_pod`` call it, so off GCE every health check "fails". We replace it
with the same query, bounded by a timeout, answering False where there is no metadata server.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

PREEMPTED_URL = "http://metadata.google.internal/computeMetadata/v1/instance/preempted"
_state = {"off_gce": False}


def gce_preempted(timeout_s: float = 2.0) -> bool:
    """True iff the GCE metadata server says this VM is being preempted."""
    if _state["off_gce"]:
        return False
    import requests

    try:
        r = requests.get(PREEMPTED_URL, headers={"Metadata-Flavor": "Google"}, timeout=timeout_s)
    except requests.RequestException:
        _state["off_gce"] = True  # no metadata server here: never preempted by GCE
        return False
    return r.status_code == 200 and r.text.strip() == "TRUE"


def setup() -> None:
    try:
        import levanter.infra.tpus as tpus
    except ImportError:  # a worker of the job without Levanter: nothing to patch
        return
    tpus.get_current_tpu_is_preempted = gce_preempted
