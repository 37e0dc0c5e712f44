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


def gce_preempted(timeout_s: float = 2.0) -> bool:
    """True iff the GCE metadata server says this VM is being preempted (no server here: False, and the
    next calls do not ask again; :func:`trajsft.gce.metadata`)."""
    from .. import gce

    return gce.metadata("instance/preempted", timeout_s=timeout_s) == "TRUE"


def setup() -> None:
    try:
        import levanter.infra.tpus as tpus
    except ImportError:  # a worker of the job without Levanter: nothing to patch
        return
    tpus.get_current_tpu_is_preempted = gce_preempted
