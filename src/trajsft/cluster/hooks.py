"""``worker_process_setup_hook`` of the training job: runs in every Ray worker of the job.

Levanter's ``run_on_pod`` asks the GCE metadata server whether the TPU VM is being preempted
(``levanter.infra.tpus.get_current_tpu_is_preempted``: no timeout, and it *raises* when the
server cannot be reached, e.g. on GKE or any non-GCE Ray node). ``SliceActor.healthy`` and the
error handler of ``run_on_pod`` call it, so off GCE every health check "fails". We replace it
with the same query, bounded by a timeout, answering False where there is no metadata server.

The replacement is made when ``levanter.infra.tpus`` is imported, not by importing it: most of a
job's workers (the driver's channel, the host tasks, Ray's spare workers) never use Levanter, and
importing it (all of ``levanter``: JAX, datasets, equinox) costs each of them about 3 CPU-seconds
and a few hundred MB.
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
import types
from typing import Callable

log = logging.getLogger(__name__)

TARGET = "levanter.infra.tpus"


def gce_preempted(timeout_s: float = 2.0) -> bool:
    """True iff the GCE metadata server says this VM is being preempted (no server here: False, and the
    next calls do not ask again; :func:`trajsft.gce.metadata`)."""
    from .. import gce

    return gce.metadata("instance/preempted", timeout_s=timeout_s) == "TRUE"


def patch(tpus: types.ModuleType) -> None:
    tpus.get_current_tpu_is_preempted = gce_preempted


class _Loader(importlib.abc.Loader):
    """The module's own loader, then ``after(module)``."""

    def __init__(self, loader: importlib.abc.Loader, after: Callable[[types.ModuleType], None]):
        self.loader, self.after = loader, after

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.after(module)

    def __getattr__(self, name):  # get_resource_reader, is_package, ...: the real loader's
        return getattr(self.loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds ``name`` with the other finders and has ``after(module)`` run once the module has executed."""

    def __init__(self, name: str, after: Callable[[types.ModuleType], None]):
        self.name, self.after = name, after

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:  # as the import system would without this finder (e.g. an editable install's)
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader, self.after)
        return spec


def after_import(name: str, after: Callable[[types.ModuleType], None]) -> None:
    """Run ``after(module)`` on module ``name`` now if it is imported, else right after its import."""
    if name in sys.modules:
        after(sys.modules[name])
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, after))


def setup() -> None:
    after_import(TARGET, patch)
